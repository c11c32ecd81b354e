"""OTLP/HTTP: ``POST /v1/traces`` on uvicorn (h11), a small ASGI app over the collector.

uvicorn gives the HTTP/1.1 a real client needs: keep-alive, pipelining, chunked request
bodies (Node's and Java's OkHttp exporters stream every body), and a well-formed 400 for
a request line or header h11 cannot parse (``Content-Length: -1``, ``: abc``). On top:

* a connection must send its request headers within ``idle_timeout`` of opening (or of
  its last response), and its whole body within ``body_timeout`` of them (408
  otherwise): an idle or slow client holds a socket for a bounded time, and no thread;
* the body is read in chunks up to the body limit (413 as soon as it is passed, declared
  or not) and counted against ``max_buffered_bytes`` across requests (429 past it);
* decoding (in worker processes) and the append to the write-ahead log run on handler
  threads, off the event loop;
* a request whose body did not fully arrive is never answered with success.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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

TRACES_PATH = "/v1/traces"
MAX_HEADER_BYTES = 64 << 10
HANDLER_THREADS = 16
"""Threads that hand bodies to the decoding workers and append to the log (mostly waiting:
several at once let one log sync cover several requests)."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _protocol_class(header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol, closing a connection that sends no complete request head.

    uvicorn times out an idle keep-alive connection only after a response; a connection
    that never sends a request, or trickles its headers, would stay open forever.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)  # type: ignore[arg-type]
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(header_timeout, self._head_expired)

        def _head_expired(self) -> None:
            self._head_timer = None
            waiting_for_head = self.cycle is None or self.cycle.response_complete
            if waiting_for_head and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            serving = self.cycle is not None and not self.cycle.response_complete
            if serving and self._head_timer is not None:  # the head is in: body timeouts rule
                self._head_timer.cancel()
                self._head_timer = None

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None
            super().connection_lost(exc)

    return Protocol


def _server_class() -> type[Any]:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, closing at shutdown the connections its grace period left.

        At the end of its graceful shutdown uvicorn cancels the requests still running
        but leaves their sockets open (a client that never reads its response would
        keep one until the process exits)."""

        async def shutdown(self, sockets: Any = None) -> None:
            await super().shutdown(sockets)
            for connection in list(self.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None and not transport.is_closing():
                    transport.abort()
            await asyncio.sleep(0)

    return Server


class HttpReceiver:
    """The uvicorn server on its own thread and event loop."""

    def __init__(self, collector: Receiving, host: str, port: int) -> None:
        import uvicorn

        self.collector = collector
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host.strip("[]"), port))
        except OSError:
            self.sock.close()
            raise
        self.sock.set_inheritable(True)
        bound = self.sock.getsockname()
        self.port = int(bound[1])
        shown = f"[{bound[0]}]" if family == socket.AF_INET6 else bound[0]
        self.address = f"{shown}:{self.port}"
        self.pool = ThreadPoolExecutor(
            max_workers=HANDLER_THREADS, thread_name_prefix="tracekit-collect-http"
        )
        sec = collector.security
        self.scheme = "https" if sec.tls_cert else "http"
        self.config = uvicorn.Config(
            OtlpHttpApp(collector, self.pool),
            http=_protocol_class(collector.idle_timeout),
            loop="asyncio",
            lifespan="off",
            log_level="warning",
            access_log=False,
            timeout_keep_alive=max(1, int(min(collector.idle_timeout, 30))),
            limit_concurrency=2048,
            backlog=1024,
            h11_max_incomplete_event_size=MAX_HEADER_BYTES,
            ssl_certfile=str(sec.tls_cert) if sec.tls_cert else None,
            ssl_keyfile=str(sec.tls_key) if sec.tls_key else None,
            server_header=False,
            date_header=False,
        )
        self.server = _server_class()(self.config)
        self.thread = threading.Thread(
            target=self._serve, name="tracekit-collect-http", daemon=True
        )
        self.failed: BaseException | None = None

    def _serve(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self.failed = exc

    def start(self) -> None:
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            self.thread.join(0.01)
        if not self.server.started:
            raise OSError(f"the OTLP/HTTP receiver did not start: {self.failed!r}")

    def stop(self, timeout: float) -> None:
        """Stop accepting; requests in flight get ``timeout`` seconds to be answered."""
        self.config.timeout_graceful_shutdown = max(1, int(timeout))
        self.server.should_exit = True
        if self.thread.ident is not None:  # started
            self.thread.join(timeout + 2.0)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class OtlpHttpApp:
    """The ASGI application: one route, the OTLP/HTTP status codes, nothing else."""

    def __init__(self, collector: Receiving, pool: ThreadPoolExecutor) -> None:
        self.collector = collector
        self.pool = pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        c = self.collector
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        kind = decode.media_type(headers.get("content-type"))
        answer_kind = kind if kind in (decode.JSON, decode.PROTOBUF) else decode.JSON
        if scope["path"] != TRACES_PATH:
            await _send(send, _status(404, answer_kind, f"only {TRACES_PATH} is served here"))
            return
        if scope["method"] != "POST":
            extra = [(b"allow", b"POST")]
            msg = f"POST OTLP spans to {TRACES_PATH}"
            await _send(send, _status(405, answer_kind, msg), extra)
            return
        if not c.security.allows(headers.get("authorization")):
            c.refuse(BAD, "unauthenticated", 401)
            extra = [(b"www-authenticate", b'Bearer realm="tracekit collect"')]
            msg = "a valid Authorization: Bearer token is required"
            await _send(send, _status(401, answer_kind, msg), extra)
            return
        if kind not in (decode.JSON, decode.PROTOBUF):
            c.refuse(BAD, "media type", 415)
            msg = f"unsupported Content-Type {kind!r} ({decode.PROTOBUF} or {decode.JSON})"
            await _send(send, _status(415, decode.JSON, msg))
            return
        declared = headers.get("content-length")
        limit = c.limits.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            c.refuse(BAD, "too large", 413)
            await _send(send, _status(413, kind, f"body over {limit:,} bytes"), close=True)
            return
        body, failure = await self._read_body(receive, limit)
        if failure is not None:
            if failure.http_status:  # 0: the client went away, there is no one to answer
                await _send(send, _frame(failure, kind), close=True)
            return
        assert body is not None
        try:
            outcome = await asyncio.get_running_loop().run_in_executor(
                self.pool,
                c.receive,
                body,
                headers.get("content-type"),
                headers.get("content-encoding"),
            )
        except RuntimeError:  # the pool is shut down: stopping
            outcome = c.refuse(UNAVAILABLE, "collector stopping; retry", 503)
        finally:
            c.release_body(len(body))
        await _send(send, _frame(outcome, kind), close=c.stopping)

    async def _read_body(self, receive: Receive, limit: int) -> tuple[bytes | None, Outcome | None]:
        """The whole body, or the outcome that ends the request (http_status 0: gone)."""
        c = self.collector
        chunks: list[bytes] = []
        size = reserved = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + c.body_timeout  # for the whole body: a trickle ends too
        try:
            while True:
                try:
                    message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    return None, c.refuse(BAD, "body timeout", 408)
                if message["type"] == "http.disconnect":
                    return None, Outcome(BAD, "client went away", http_status=0)
                chunk = message.get("body", b"")
                if chunk:
                    size += len(chunk)
                    if size > limit:
                        return None, c.refuse(BAD, f"body over {limit:,} bytes", 413)
                    if not c.reserve_body(len(chunk)):
                        return None, c.refuse(
                            BUSY, "collector busy: too many request bodies in memory", 429
                        )
                    reserved += len(chunk)
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    reserved = 0  # handed over with the body: the caller releases it
                    return b"".join(chunks), None
        finally:
            if reserved:
                c.release_body(reserved)


class _Answer:
    __slots__ = ("code", "content_type", "body", "retry_after")

    def __init__(
        self, code: int, content_type: str, body: bytes, retry_after: int | None = None
    ) -> None:
        self.code = code
        self.content_type = content_type
        self.body = body
        self.retry_after = retry_after


def _frame(outcome: Outcome, kind: str) -> _Answer:
    if outcome.kind == OK:
        return _success(kind, outcome.rejected, outcome.message)
    retry = outcome.kind in (BUSY, UNAVAILABLE)
    return _status(outcome.http_status, kind, outcome.message, retry=retry)


def _success(kind: str, rejected: int, message: str) -> _Answer:
    if kind == decode.JSON:
        doc: dict[str, Any] = {}
        if rejected:
            doc["partialSuccess"] = {"rejectedSpans": str(rejected), "errorMessage": message}
        return _Answer(200, decode.JSON, json.dumps(doc).encode())
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    response = ExportTraceServiceResponse()
    if rejected:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    return _Answer(200, decode.PROTOBUF, response.SerializeToString())


def _status(code: int, kind: str, message: str, *, retry: bool = False) -> _Answer:
    """A ``google.rpc.Status`` body (gRPC code INVALID_ARGUMENT, UNAVAILABLE, …)."""
    grpc_code = {401: 16, 404: 5, 405: 12, 413: 8, 415: 3, 429: 8}.get(code, 14 if retry else 3)
    retry_after = RETRY_AFTER_S if retry else None
    if kind != decode.PROTOBUF:
        body = json.dumps({"code": grpc_code, "message": message}).encode()
        return _Answer(code, decode.JSON, body, retry_after)
    from google.rpc import status_pb2

    body = status_pb2.Status(code=grpc_code, message=message).SerializeToString()
    return _Answer(code, decode.PROTOBUF, body, retry_after)


async def _send(
    send: Send,
    answer: _Answer,
    extra: list[tuple[bytes, bytes]] | None = None,
    *,
    close: bool = False,
) -> None:
    headers = [
        (b"content-type", answer.content_type.encode()),
        (b"content-length", str(len(answer.body)).encode()),
    ]
    if answer.retry_after is not None:
        headers.append((b"retry-after", str(answer.retry_after).encode()))
    if close:
        headers.append((b"connection", b"close"))
    headers.extend(extra or ())
    await send({"type": "http.response.start", "status": answer.code, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body})
