"""`tracekit collect`'s OTLP/gRPC receiver on loopback: the SDK's gRPC exporter beside the
file exporter, raw calls and their status codes, backpressure with RetryInfo, bearer
token, TLS on both protocols, request limits, and stopping with calls in flight."""

from __future__ import annotations

import json
import random
import shutil
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.rpc import error_details_pb2, status_pb2
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import open_store
from tracekit.collect import Collector, Limits
from tracekit.instrumentation.exporters import OTLPJsonFileExporter

from .helpers import file_held, running

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
TOKEN = "s3cret-token-0123456789"
CALL_TIMEOUT = 10.0

_ROWS = "SELECT * EXCLUDE (source) FROM spans ORDER BY trace_id, span_id"
_REQUESTS = "SELECT * FROM requests ORDER BY trace_id"
_STAGES = "SELECT * FROM request_stages ORDER BY trace_id, stage"

Key = tuple[str, str]


# --- helpers --------------------------------------------------------------------------


def _request(n_spans: int, rng: random.Random) -> tuple[bytes, set[Key]]:
    """An ExportTraceServiceRequest of one trace: a root and ``n_spans - 1`` children."""
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    for key, value in ((cv.SERVICE_NAME, "ranker"), (cv.SERVICE_VERSION, "v1")):
        attr = rs.resource.attributes.add()
        attr.key = key
        attr.value.string_value = value
    ss = rs.scope_spans.add()
    ss.scope.name = "test"
    trace_id = rng.randbytes(16)
    root = rng.randbytes(8)
    start = 1_700_000_000_000_000_000 + rng.randrange(10**12)
    keys = set()
    for i in range(n_spans):
        span = ss.spans.add()
        span.trace_id = trace_id
        span.span_id = root if i == 0 else rng.randbytes(8)
        if i:
            span.parent_span_id = root
        span.name = "POST /predict" if i == 0 else f"stage {i}"
        span.kind = 2 if i == 0 else 1
        span.start_time_unix_nano = start + i * 1000
        span.end_time_unix_nano = start + 10_000_000 - i * 1000
        keys.add((trace_id.hex(), span.span_id.hex()))
    return request.SerializeToString(), keys


def _export(
    target: str,
    body: bytes,
    *,
    metadata: tuple[tuple[str, str], ...] | None = None,
    compression: grpc.Compression | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    options: tuple[tuple[str, Any], ...] = (),
    timeout: float = CALL_TIMEOUT,
) -> tuple[grpc.StatusCode, ExportTraceServiceResponse | None, grpc.Call | None]:
    """One raw Export call on a fresh channel: (code, response when OK, the call)."""
    if credentials is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        channel = grpc.secure_channel(target, credentials, options=options)
    with channel:
        stub = channel.unary_unary(
            EXPORT,
            request_serializer=None,
            response_deserializer=ExportTraceServiceResponse.FromString,
        )
        try:
            response, call = stub.with_call(
                body, timeout=timeout, metadata=metadata, compression=compression
            )
        except grpc.RpcError as exc:
            return exc.code(), None, exc  # type: ignore[attr-defined,return-value]
        return call.code(), response, call


def _stored(db: Path) -> dict[str, list[Any]]:
    with open_store(str(db), read_only=True) as store:
        return {q: store.run(q) for q in (_ROWS, _REQUESTS, _STAGES)}


def _stored_keys(db: Path) -> set[Key]:
    with open_store(str(db), read_only=True) as store:
        return {(r[0], r[1]) for r in store.run("SELECT trace_id, span_id FROM spans")}


def _file_store(db: Path, jsonl: Path) -> dict[str, list[Any]]:
    with open_store(str(db)) as store:
        report = ingest_paths(store, [jsonl])
        per_request.refresh(store, report.trace_ids)
        return {q: store.run(q) for q in (_ROWS, _REQUESTS, _STAGES)}


def _wait_until(predicate: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _self_signed(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for localhost and 127.0.0.1 (cert.pem, key.pem)."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    try:
        from cryptography import x509  # noqa: F401
    except ImportError:
        openssl = shutil.which("openssl")
        if openssl is None:
            pytest.skip("neither the cryptography package nor the openssl CLI is available")
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"]
            + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"]
            + ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return cert, key
    return _self_signed_cryptography(cert, key)


def _self_signed_cryptography(cert: Path, key: Path) -> tuple[Path, Path]:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert, key


def _json_body(rng: random.Random) -> bytes:
    """One span in OTLP/JSON, for the HTTP side."""
    span = {
        "traceId": rng.randbytes(16).hex(),
        "spanId": rng.randbytes(8).hex(),
        "name": "GET /",
        "kind": 2,
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000001000000",
    }
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


# --- 1. the SDK's gRPC exporter -------------------------------------------------------


@pytest.mark.parametrize(
    "compression",
    [grpc.Compression.Gzip, grpc.Compression.NoCompression],
    ids=["gzip", "none"],
)
def test_otel_sdk_grpc_exporter_lands_as_the_file_exporter_writes(
    tmp_path: Path, compression: grpc.Compression
) -> None:
    db = tmp_path / "live.duckdb"
    jsonl = tmp_path / "sdk.jsonl"
    with running(db) as c:
        exporter = OTLPSpanExporter(
            endpoint=f"http://{c.grpc_address}",
            insecure=True,
            compression=compression,
            timeout=CALL_TIMEOUT,
        )
        provider = TracerProvider(
            resource=Resource.create({cv.SERVICE_NAME: "ranker", cv.SERVICE_VERSION: "v7"})
        )
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter(jsonl)))
        tracer = provider.get_tracer("test", "1.2.3")
        linked = []
        for i in range(3):
            with tracer.start_as_current_span(
                "POST /predict",
                kind=SpanKind.SERVER,
                attributes={cv.HTTP_ROUTE: "/predict"},
                links=[Link(linked[-1], {"link.why": "follows"})] if linked else (),
            ) as root:
                linked.append(root.get_span_context())
                with tracer.start_as_current_span(
                    "model",
                    attributes={
                        cv.STAGE: cv.MODEL_EXECUTE,
                        cv.GPU_TIME_NS: 12 + i,
                        "batch.size": 32,
                        "score": 0.25 + i,
                        "cache.hit": i % 2 == 0,
                        "model.name": "bert",
                        "features": ["a", "b", f"c{i}"],
                    },
                ) as model:
                    model.add_event("retry", {"attempt": 2, "reason": "timeout"})
                    if i == 1:
                        model.set_status(Status(StatusCode.ERROR, "boom"))
        provider.shutdown()
    # c.stop() ran: everything acknowledged is written.
    live = _stored(db)
    files = _file_store(tmp_path / "files.duckdb", jsonl)
    assert len(live[_ROWS]) == 6
    assert live == files
    assert len(live[_REQUESTS]) == 3
    assert any("ERROR" in row for row in live[_ROWS])
    assert sum(1 for row in live[_ROWS] if "follows" in json.dumps(row, default=str)) == 2
    assert c.status().spans_accepted == 6
    assert c.status().requests_refused == 0


# --- 2. raw calls ---------------------------------------------------------------------


def test_raw_calls_get_the_otlp_status_codes(tmp_path: Path) -> None:
    rng = random.Random(1)
    with running(tmp_path / "live.duckdb") as c:
        assert c.grpc_address is not None
        target = c.grpc_address

        code, _, call = _export(target, b"\xff\xff\xff\xff garbage")
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert call is not None and "protobuf" in (call.details() or "")
        # Not retryable: no RetryInfo.
        assert "google.rpc.retryinfo-bin" not in dict(call.trailing_metadata() or ())

        body, keys = _request(3, rng)
        request = ExportTraceServiceRequest.FromString(body)
        spans = request.resource_spans[0].scope_spans[0].spans
        spans[1].trace_id = b"\x01\x02\x03"
        bad_key = (spans[0].trace_id.hex(), spans[1].span_id.hex())
        code, response, _ = _export(target, request.SerializeToString())
        assert code == grpc.StatusCode.OK
        assert response is not None
        assert response.partial_success.rejected_spans == 1
        assert "traceId is not 16 bytes" in response.partial_success.error_message
        assert "spans[1]" in response.partial_success.error_message

        code, response, _ = _export(target, b"")
        assert code == grpc.StatusCode.OK
        assert response is not None and not response.HasField("partial_success")

        status = c.status()
        assert status.spans_accepted == 2
        assert status.spans_rejected == 1
        assert status.requests_bad == 1
    assert _stored_keys(tmp_path / "live.duckdb") == keys - {bad_key}


# --- 3. backpressure ------------------------------------------------------------------


def test_pending_spans_at_their_bound_get_resource_exhausted_with_retry_info(
    tmp_path: Path,
) -> None:
    db = tmp_path / "live.duckdb"
    rng = random.Random(3)
    calls: list[tuple[grpc.StatusCode, set[Key], dict[str, Any], str]] = []
    peak = 0
    with running(db, max_pending_spans=10) as c:
        assert c.grpc_address is not None

        def send() -> grpc.StatusCode:
            nonlocal peak
            body, keys = _request(4, rng)
            code, _, call = _export(c.grpc_address, body)  # type: ignore[arg-type]
            assert call is not None
            metadata = dict(call.trailing_metadata() or ())
            calls.append((code, keys, metadata, call.details() or ""))
            peak = max(peak, c.status().pending_spans)
            return code

        with file_held(db) as release:
            # The writer cannot open the file: the first two calls (8 spans) are taken
            # into the write-ahead log and acknowledged; the next would pass
            # max_pending_spans (RESOURCE_EXHAUSTED, nothing taken).
            for _ in range(6):
                send()
            release()
        # The reader is gone: the writer catches up, and calls succeed again.
        _wait_until(lambda: c.status().pending_spans == 0, "the writer to catch up")
        for _ in range(2):
            send()
        refused_requests = c.status().requests_refused
    codes = [code for code, *_ in calls]
    ok, busy = grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED
    assert codes == [ok] * 2 + [busy] * 4 + [ok] * 2
    assert peak <= 10
    assert refused_requests == 4
    for code, _, metadata, details in calls:
        if code == ok:
            continue
        # Every retryable refusal carries RetryInfo both ways, with a 1 s delay.
        status = status_pb2.Status.FromString(metadata["grpc-status-details-bin"])
        assert status.code == code.value[0]
        assert status.message == details
        assert len(status.details) == 1
        info = error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(info)
        assert (info.retry_delay.seconds, info.retry_delay.nanos) == (1, 0)
        assert error_details_pb2.RetryInfo.FromString(metadata["google.rpc.retryinfo-bin"]) == info
    stored = _stored_keys(db)
    keys_of = {code: set().union(*(k for c, k, *_ in calls if c == code)) for code in set(codes)}
    assert keys_of[ok] <= stored
    assert not keys_of[busy] & stored  # nothing of a RESOURCE_EXHAUSTED request was taken


# --- 4. bearer token ------------------------------------------------------------------


def test_a_bearer_token_is_required_on_both_protocols(tmp_path: Path) -> None:
    rng = random.Random(4)
    with running(tmp_path / "live.duckdb", auth_token=TOKEN) as c:
        assert c.grpc_address is not None
        body, keys = _request(2, rng)
        code, _, _ = _export(c.grpc_address, body)
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _, _ = _export(c.grpc_address, body, metadata=(("authorization", "Bearer wrong"),))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, response, _ = _export(
            c.grpc_address, body, metadata=(("authorization", f"Bearer {TOKEN}"),)
        )
        assert code == grpc.StatusCode.OK
        assert response is not None and not response.HasField("partial_success")

        url = f"http://{c.address}/v1/traces"
        headers = {"Content-Type": "application/json"}
        with httpx.Client(timeout=CALL_TIMEOUT) as http:
            r = http.post(url, content=_json_body(rng), headers=headers)
            assert r.status_code == 401
            assert r.headers["www-authenticate"].startswith("Bearer")
            r = http.post(
                url,
                content=_json_body(rng),
                headers={**headers, "Authorization": f"Bearer {TOKEN}"},
            )
            assert r.status_code == 200, r.text
        assert c.status().requests_bad == 3
    assert keys <= _stored_keys(tmp_path / "live.duckdb")


# --- 5. TLS ---------------------------------------------------------------------------


def test_tls_on_both_protocols(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    rng = random.Random(5)
    with running(tmp_path / "live.duckdb", tls_cert=cert, tls_key=key) as c:
        assert c.grpc_address is not None
        body, keys = _request(2, rng)
        credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
        code, response, _ = _export(
            c.grpc_address,
            body,
            credentials=credentials,
            options=(("grpc.ssl_target_name_override", "localhost"),),
        )
        assert code == grpc.StatusCode.OK
        assert response is not None
        # Plain text to the TLS port is no call.
        code, _, _ = _export(c.grpc_address, body, timeout=5)
        assert code == grpc.StatusCode.UNAVAILABLE

        context = ssl.create_default_context(cafile=str(cert))
        r = httpx.post(
            f"https://{c.address}/v1/traces",
            content=_json_body(rng),
            headers={"Content-Type": "application/json"},
            verify=context,
            timeout=CALL_TIMEOUT,
        )
        assert r.status_code == 200, r.text
        with pytest.raises(httpx.HTTPError):
            httpx.post(
                f"http://{c.address}/v1/traces",
                content=_json_body(rng),
                headers={"Content-Type": "application/json"},
                timeout=5,
            )
        assert c.status().spans_accepted == 3
    assert keys <= _stored_keys(tmp_path / "live.duckdb")


# --- 6. limits ------------------------------------------------------------------------


def test_a_message_over_the_body_limit_is_refused_by_grpcio(tmp_path: Path) -> None:
    rng = random.Random(6)
    with running(tmp_path / "live.duckdb", limits=Limits(max_body_bytes=64 << 10)) as c:
        assert c.grpc_address is not None
        request = ExportTraceServiceRequest.FromString(_request(1, rng)[0])
        attr = request.resource_spans[0].scope_spans[0].spans[0].attributes.add()
        attr.key = "payload"
        attr.value.string_value = "x" * (100 << 10)
        big = request.SerializeToString()
        code, _, call = _export(c.grpc_address, big)
        # grpcio refuses it before the handler runs (max_receive_message_length).
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert call is not None and "larger than max" in (call.details() or "")
        # The limit counts decompressed bytes: gzip does not get it through.
        code, _, _ = _export(c.grpc_address, big, compression=grpc.Compression.Gzip)
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Under the limit it is taken.
        small, keys = _request(2, rng)
        code, _, _ = _export(c.grpc_address, small, compression=grpc.Compression.Gzip)
        assert code == grpc.StatusCode.OK
        assert c.status().spans_received == 2
    assert _stored_keys(tmp_path / "live.duckdb") == keys


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


_BOMBS = {
    # ExportTraceServiceRequest of n empty ResourceSpans: b"\x0a\x00" * n
    "resourceSpans": lambda n: b"\x0a\x00" * n,
    # one ResourceSpans of n empty ScopeSpans
    "scopeSpans": lambda n: _field(1, b"\x12\x00" * n),
    # one ResourceSpans, one ScopeSpans of n empty Spans
    "spans": lambda n: _field(1, _field(2, b"\x12\x00" * n)),
}


@pytest.mark.parametrize("what", list(_BOMBS))
def test_millions_of_empty_messages_are_refused_after_the_limit(tmp_path: Path, what: str) -> None:
    """2,000,000 empty messages (4 MB) are INVALID_ARGUMENT, and quickly: the limit is
    applied while walking (decode.py: "a request of millions of empty messages is refused
    after ``max_resource_spans`` of them"), so refusing 2,000,000 takes about as long as
    refusing 10,001 — not 200 times as long (nor hundreds of MB of field tuples)."""
    limit = 10_000
    limits = Limits(max_resource_spans=limit, max_scope_spans=limit, max_spans=limit)

    def refuse(n: int) -> float:
        started = time.perf_counter()
        code, _, call = _export(c.grpc_address, _BOMBS[what](n), timeout=30)  # type: ignore[arg-type]
        took = time.perf_counter() - started
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert call is not None and f"{limit:,} {what}" in (call.details() or "")
        return took

    with running(tmp_path / "live.duckdb", limits=limits) as c:
        assert c.grpc_address is not None
        just_over = min(refuse(limit + 1) for _ in range(3))
        bomb = refuse(2_000_000)
        assert c.status().requests_bad == 4
        assert c.status().spans_received == 0
    # Relative, not absolute: 2,000,000 (4 MB) against 10,001 (20 kB), same machine;
    # the 0.25 s covers moving 4 MB over loopback.
    assert bomb < 20 * just_over + 0.25, (bomb, just_over)


# --- 7. stopping ----------------------------------------------------------------------


def test_what_a_drain_could_not_write_is_written_at_the_next_start(tmp_path: Path) -> None:
    """Calls are acknowledged from the write-ahead log while a reader holds the file; a
    stop that runs out of time leaves them there, and the next collector writes them."""
    db = tmp_path / "live.duckdb"
    rng = random.Random(7)
    bodies = [_request(4, rng) for _ in range(6)]
    c = Collector(str(db), port=0, grpc_port=0, flush_interval=0.05)
    c.start()
    assert c.grpc_address is not None
    target = c.grpc_address
    try:
        with file_held(db) as release:
            codes = [_export(target, body, timeout=30)[0] for body, _ in bodies]
            assert codes == [grpc.StatusCode.OK] * len(bodies)  # in the log, not the store
            assert c.status().pending_spans == 24
            c.stop(timeout=2)  # the file is still held: the drain runs out of time
            assert not c.written_all
            release()
    finally:
        c.stop(timeout=30)
    assert not _stored_keys(db) & set().union(*(keys for _, keys in bodies))
    again = Collector(str(db), port=0, grpc_port=0, flush_interval=0.05)
    again.start()
    again.stop(timeout=30)
    assert again.written_all and again.writer.replayed_spans == 24
    sent = set().union(*(keys for _, keys in bodies))
    assert sent <= _stored_keys(db)
    assert not list(again.wal.directory.glob("*.wal"))  # all written: no segment left
    # After stop the port is closed: connection refused.
    code, _, call = _export(target, bodies[0][0], timeout=5)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert call is not None
    assert "refused" in (call.details() or "").lower() or "connect" in (call.details() or "")
