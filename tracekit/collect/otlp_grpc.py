"""OTLP/gRPC: ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` on grpcio.

The service name and the response message are opentelemetry-proto's generated ones; the
request arrives as bytes (no deserializer) so that it is decoded by
:mod:`tracekit.collect.decode` with every limit applied while decoding, exactly as an
OTLP/HTTP protobuf body is — generated service code would parse the whole message first. gzip
(``grpc-encoding: gzip``) is undone by grpcio, bounded by the same body limit
(``grpc.max_receive_message_length`` counts decompressed bytes).

Status codes (OTLP specification, "OTLP/gRPC Response"): ``OK`` with
``partial_success``; ``INVALID_ARGUMENT`` for a request that cannot be decoded or breaks
a limit (not retryable); ``RESOURCE_EXHAUSTED`` with ``RetryInfo`` when pending spans are
at their bound, ``UNAVAILABLE`` with ``RetryInfo`` when the store is not written in time
or the collector is stopping (both retryable); ``UNAUTHENTICATED`` without the bearer
token. ``RetryInfo`` travels in ``grpc-status-details-bin`` (a ``google.rpc.Status``, as
Go and Java read it) and in ``google.rpc.retryinfo-bin`` (as the Python SDK reads it).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import grpc

from tracekit.collect import decode
from tracekit.collect.outcome import (
    BAD,
    BUSY,
    OK,
    RETRY_AFTER_S,
    UNAVAILABLE,
    Outcome,
    Receiving,
)

METHOD = "Export"
MAX_CONCURRENT_RPCS = 1024
WORKERS = 64
"""Threads answering RPCs; most of them only wait for the writer's ticket."""


def service_name() -> str:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

    return str(trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name)


class _Status(NamedTuple):
    """A ``grpc.Status`` (code, details, trailing metadata) for ``abort_with_status``."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, bytes | str], ...]


class GrpcReceiver:
    """A grpcio server with one generic handler, on its own thread pool."""

    def __init__(self, collector: Receiving, host: str, port: int) -> None:
        self.collector = collector
        limit = collector.limits.max_body_bytes
        options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", 4 << 20),
            ("grpc.max_connection_idle_ms", int(collector.idle_timeout * 1000)),
            ("grpc.so_reuseport", 0),
        ]
        self.pool = ThreadPoolExecutor(
            max_workers=WORKERS, thread_name_prefix="tracekit-collect-grpc"
        )
        self.server = grpc.server(
            self.pool,
            options=options,
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        handler = grpc.unary_unary_rpc_method_handler(self._export)
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service_name(), {METHOD: handler}),)
        )
        target = f"{host}:{port}" if ":" not in host else f"[{host.strip('[]')}]:{port}"
        sec = collector.security
        try:
            if sec.tls_cert is not None and sec.tls_key is not None:
                credentials = grpc.ssl_server_credentials(
                    [(sec.tls_key.read_bytes(), sec.tls_cert.read_bytes())]
                )
                bound = self.server.add_secure_port(target, credentials)
            else:
                bound = self.server.add_insecure_port(target)
        except RuntimeError:  # grpcio raises "Failed to bind" where older ones returned 0
            bound = 0
        if not bound:
            raise OSError(98, f"cannot listen on {target} for OTLP/gRPC", target)
        self.port = int(bound)
        shown = host if ":" not in host else f"[{host.strip('[]')}]"
        self.address = f"{shown}:{self.port}"

    def start(self) -> None:
        self.server.start()

    def stop(self, timeout: float) -> None:
        """Stop accepting; RPCs in flight get ``timeout`` seconds to be answered."""
        self.server.stop(grace=timeout).wait(timeout + 2.0)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        c = self.collector
        metadata = dict(context.invocation_metadata() or ())
        if not c.security.allows(_text(metadata.get("authorization"))):
            c.refuse(BAD, "unauthenticated", 401)
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "a valid authorization: Bearer token is required"
            )
        if not c.reserve_body(len(request)):
            outcome = c.refuse(BUSY, "collector busy: too many request bodies in memory", 429)
            context.abort_with_status(_abort(outcome))
        try:
            outcome = c.receive(request, decode.PROTOBUF, None)
        finally:
            c.release_body(len(request))
        if outcome.kind == OK:
            return _success(outcome)
        context.abort_with_status(_abort(outcome))
        raise AssertionError("abort_with_status returns only by raising")


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def _success(outcome: Outcome) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    response = ExportTraceServiceResponse()
    if outcome.rejected:
        response.partial_success.rejected_spans = outcome.rejected
        response.partial_success.error_message = outcome.message
    return bytes(response.SerializeToString())


def _abort(outcome: Outcome) -> _Status:
    from google.protobuf import any_pb2, duration_pb2
    from google.rpc import error_details_pb2, status_pb2

    if outcome.kind == BUSY:
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    elif outcome.kind == UNAVAILABLE:
        code = grpc.StatusCode.UNAVAILABLE
    else:
        code = grpc.StatusCode.INVALID_ARGUMENT
    if outcome.kind not in (BUSY, UNAVAILABLE):
        return _Status(code, outcome.message, ())
    retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=RETRY_AFTER_S))
    detail = any_pb2.Any()
    detail.Pack(retry)
    status = status_pb2.Status(code=code.value[0], message=outcome.message, details=[detail])
    return _Status(
        code,
        outcome.message,
        (
            ("grpc-status-details-bin", status.SerializeToString()),
            ("google.rpc.retryinfo-bin", retry.SerializeToString()),
        ),
    )
