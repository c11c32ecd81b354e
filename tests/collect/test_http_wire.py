"""OTLP/HTTP on the wire: raw HTTP/1.1 on loopback sockets against the collector's uvicorn
receiver — chunked and compressed bodies, pipelining, keep-alive, truncated and malformed
requests, the limits of :class:`Limits`, per-span rejection, the status codes and the
idle/slow-client timeouts. Every response is parsed here (:mod:`.wire`), not by a client
library, so a malformed or missing response fails the test instead of being papered over.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tracekit.analysis.store import open_store
from tracekit.collect import Collector, Limits
from tracekit.errors import ConfigError

from .wire import (
    JSON,
    PROTOBUF,
    RESOURCE,
    ROW_SQL,
    Closed,
    Conn,
    SpanSpec,
    exchange,
    gz,
    json_body,
    json_span,
    make_spans,
    pb_body,
    pb_field,
    pb_request,
    peak_rss_growth,
    request,
    split,
)

Start = Callable[..., Collector]
TOKEN = "s3cret-token-0123456789"


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Start collectors on free loopback ports (each its own store); all stopped after."""
    made: list[Collector] = []

    def make(**kwargs: Any) -> Collector:
        kwargs.setdefault("port", 0)
        kwargs.setdefault("flush_interval", 0.05)
        c = Collector(str(tmp_path / f"live{len(made)}.duckdb"), **kwargs)
        c.start()
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop(timeout=10)


@pytest.fixture(autouse=True)
def no_tracebacks(capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    """Whatever a test sends, the receiver logs no traceback (uvicorn, asyncio, threads)."""
    yield
    out, err = capfd.readouterr()
    for needle in ("Traceback", "Exception in", "Task exception"):
        assert needle not in err + out, (err + out)[-4000:]


def stored(c: Collector) -> list[tuple[Any, ...]]:
    """Stop ``c`` and return its spans as :meth:`SpanSpec.row` tuples (plus the resource)."""
    c.stop(timeout=10)
    with open_store(c.writer.db, read_only=True) as store:
        rows = store.run(ROW_SQL)
    return [(*r[:7], json.loads(r[7]), json.loads(r[8])) for r in rows]


def expected(*groups: list[SpanSpec]) -> list[tuple[Any, ...]]:
    rows = [(*s.row(), RESOURCE) for g in groups for s in g]
    return sorted(rows, key=lambda r: (r[0], r[1]))


def span_count(c: Collector) -> int:
    c.stop(timeout=10)
    with open_store(c.writer.db, read_only=True) as store:
        return int(store.run("SELECT count(*) FROM spans")[0][0])


def assert_ok(r: Any, kind: str, rejected: int = 0) -> None:
    assert r.status == 200, (r.status, r.body[:300])
    assert r.header("content-type") == kind
    if kind == JSON:
        doc = r.json()
        got = int(doc.get("partialSuccess", {}).get("rejectedSpans", "0"))
    else:
        got = ExportTraceServiceResponse.FromString(r.body).partial_success.rejected_spans
    assert got == rejected, r.body[:300]


def status_message(r: Any) -> str:
    """The google.rpc.Status message of an error response (JSON or protobuf)."""
    if r.header("content-type") == PROTOBUF:
        return status_pb2.Status.FromString(r.body).message
    doc = r.json()
    assert isinstance(doc.get("code"), int), doc
    return str(doc["message"])


# --- 1. chunked bodies ------------------------------------------------------------------


def test_chunked_bodies_in_every_framing_store_every_field(start: Start) -> None:
    c = start()
    sent: list[SpanSpec] = []
    tag = 0
    for kind in (PROTOBUF, JSON):
        for gzipped in (False, True):
            for chunk_size in (None, 7):  # one chunk; many 7-byte chunks
                tag += 1
                spans = make_spans(4, tag)
                body = pb_body(spans) if kind == PROTOBUF else json_body(spans)
                headers = [("Content-Encoding", "gzip")] if gzipped else []
                if gzipped:
                    body = gz(body)
                chunks = [body] if chunk_size is None else split(body, chunk_size)
                r = exchange(c.port, request(content_type=kind, headers=headers, chunks=chunks))
                assert_ok(r, kind)
                sent.extend(spans)
    assert stored(c) == expected(sent)


def test_chunked_body_with_chunk_extensions_and_trailers(start: Start) -> None:
    c = start()
    spans = make_spans(3, 1)
    body = pb_body(spans)
    head = request(content_type=PROTOBUF, chunks=[]).split(b"\r\n\r\n", 1)[0] + b"\r\n\r\n"
    half = len(body) // 2
    raw = (
        head
        + b"%x;ext=1\r\n%s\r\n" % (half, body[:half])
        + b"%X\r\n%s\r\n" % (len(body) - half, body[half:])
        + b"0\r\nX-Trailer: yes\r\n\r\n"
    )
    assert_ok(exchange(c.port, raw), PROTOBUF)
    assert stored(c) == expected(spans)


# --- 2, 3. pipelining and keep-alive ----------------------------------------------------


def test_pipelined_requests_are_answered_in_order_and_all_stored(start: Start) -> None:
    c = start()
    a, b, d = make_spans(2, 1), make_spans(3, 2), make_spans(2, 3)
    bad = {"traceId": "0" * 32, "spanId": "00000000000000aa", "name": "zero trace"}
    raw = (
        request(json_body(a), content_type=JSON)
        + request(content_type=PROTOBUF, chunks=split(pb_body(b), 50))
        + request(json_body([*map(json_span, d), bad]), content_type=JSON)
    )
    with Conn(c.port) as conn:
        conn.send(raw)  # all three in one write
        assert_ok(conn.read_response(), JSON)
        assert_ok(conn.read_response(), PROTOBUF)
        assert_ok(conn.read_response(), JSON, rejected=1)
    assert stored(c) == expected(a, b, d)


def test_pipelined_request_after_one_refused_unread_is_still_served(start: Start) -> None:
    """A 404 answered without reading its body must not let that body be taken for the
    next request's head (nor drop the next request)."""
    c = start()
    spans = make_spans(2, 1)
    # The refused body is itself a whole HTTP request: read as one it would be stored.
    smuggled = request(pb_body(make_spans(2, 9)), content_type=PROTOBUF)
    raw = request(smuggled, content_type=PROTOBUF, path="/v1/logs") + request(
        pb_body(spans), content_type=PROTOBUF
    )
    with Conn(c.port) as conn:
        conn.send(raw)
        first = conn.read_response()
        assert first.status == 404
        assert_ok(conn.read_response(), PROTOBUF)
        conn.shutdown_write()
        assert conn.closed_by_server(5.0)
        assert conn.buf == b"", "a third response: the refused body was taken for a request"
    assert stored(c) == expected(spans)


def test_keep_alive_serves_many_requests_on_one_connection(start: Start) -> None:
    c = start()
    sent: list[SpanSpec] = []
    with Conn(c.port) as conn:
        for i in range(6):
            spans = make_spans(2, i + 1)
            if i == 3:  # a refusal in between leaves the connection usable
                conn.send(request(pb_body(spans), content_type=PROTOBUF, path="/nope"))
                assert conn.read_response().status == 404
            if i % 2:
                raw = request(json_body(spans), content_type=JSON)
            else:
                raw = request(content_type=PROTOBUF, chunks=split(pb_body(spans), 33))
            conn.send(raw)
            r = conn.read_response()
            assert_ok(r, JSON if i % 2 else PROTOBUF)
            assert (r.header("connection") or "").lower() != "close"
            sent.extend(spans)
    assert stored(c) == expected(sent)


def test_expect_100_continue_is_honoured_and_skipped_when_refused(start: Start) -> None:
    c = start(limits=Limits(max_body_bytes=1 << 20))
    spans = make_spans(2, 1)
    body = pb_body(spans)
    raw = request(body, headers=[("Expect", "100-continue")])
    head, _, _ = raw.partition(b"\r\n\r\n")
    with Conn(c.port) as conn:
        conn.send(head + b"\r\n\r\n")
        interim = conn.read_response(informational=True)
        assert interim.status == 100, interim
        conn.send(body)
        assert_ok(conn.read_response(), PROTOBUF)
    # Over the limit: the final answer comes at once, no 100 before it.
    with Conn(c.port) as conn:
        conn.send(request(headers=[("Expect", "100-continue")], length=2 << 20))
        r = conn.read_response(informational=True)
        assert r.status == 413, r
    assert stored(c) == expected(spans)


# --- 4. truncated bodies -------------------------------------------------------------------


def _no_success(conn: Conn) -> None:
    """The server answers with an error or closes: never a 200."""
    try:
        r = conn.read_response(timeout=10)
    except Closed:
        return
    assert r.status != 200 and r.status >= 400, (r.status, r.body)


@pytest.mark.parametrize("how", ["shutdown", "close"])
def test_truncated_bodies_are_never_acknowledged_nor_stored(start: Start, how: str) -> None:
    c = start(body_timeout=5.0)
    # Each prefix sent is a complete, valid request body on its own.
    whole = pb_body(make_spans(3, 7))
    cut_bodies = [
        # Content-Length says 1000 more bytes than come.
        request(whole, content_type=PROTOBUF, length=len(whole) + 1000),
        # chunked: a whole chunk, then a chunk cut short.
        request(content_type=PROTOBUF, chunks=[whole]).removesuffix(b"0\r\n\r\n")
        + b"400\r\n"
        + b"\x0a" * 40,
        # chunked: every chunk, but not the last-chunk.
        request(content_type=PROTOBUF, chunks=split(whole, 64)).removesuffix(b"0\r\n\r\n"),
        # chunked: cut inside a chunk-size line.
        request(content_type=PROTOBUF, chunks=[whole]).removesuffix(b"0\r\n\r\n") + b"4",
    ]
    good = make_spans(2, 1)
    for raw in cut_bodies:
        conn = Conn(c.port)
        try:
            conn.send(raw)
            time.sleep(0.05)
            if how == "shutdown":
                conn.shutdown_write()
                _no_success(conn)
        finally:
            conn.close()
    # The collector keeps serving others.
    assert_ok(exchange(c.port, request(pb_body(good), content_type=PROTOBUF)), PROTOBUF)
    assert stored(c) == expected(good)


# --- 5. malformed requests ---------------------------------------------------------------


def _malformed() -> dict[str, bytes]:
    body = pb_body(make_spans(2, 5))
    head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\n".encode()
    n = len(body)
    return {
        "content-length -1": head + b"Content-Length: -1\r\n\r\n" + body,
        "content-length abc": head + b"Content-Length: abc\r\n\r\n" + body,
        "content-length +n": head + b"Content-Length: +%d\r\n\r\n" % n + body,
        "two content-lengths": head
        + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (n, n + 1)
        + body,
        "content-length list": head + b"Content-Length: %d, %d\r\n\r\n" % (n, n + 1) + body,
        "bad chunk size": head
        + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n"
        + body
        + b"\r\n0\r\n\r\n",
        "negative chunk size": head
        + b"Transfer-Encoding: chunked\r\n\r\n-5\r\n"
        + body
        + b"\r\n0\r\n\r\n",
        "chunk without crlf": head
        + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % n
        + body
        + b"XX0\r\n\r\n",
        "unknown transfer-encoding": head + b"Transfer-Encoding: gzip\r\n\r\n" + body,
        "garbage request line": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 hello\r\n\r\n",
        "request line without version": b"POST /v1/traces\r\n\r\n",
        "header without colon": head + b"Content-Length %d\r\n\r\n" % n + body,
        "space before colon": head + b"Content-Length : %d\r\n\r\n" % n + body,
        "headers of 1 MiB": head + b"X-Big: " + b"a" * (1 << 20) + b"\r\n\r\n",
        "http/1.1 without host": (
            f"POST /v1/traces HTTP/1.1\r\nContent-Type: {PROTOBUF}\r\n".encode()
            + b"Content-Length: %d\r\n\r\n" % n
            + body
        ),
    }


def test_malformed_requests_get_a_4xx_response_and_store_nothing(start: Start) -> None:
    c = start()
    failures = []
    for name, raw in _malformed().items():
        with Conn(c.port, timeout=5) as conn:
            try:
                conn.send(raw)
                r = conn.read_response(timeout=5)
            except (Closed, TimeoutError, OSError) as exc:
                failures.append(f"{name}: no response ({exc})")
                continue
            if r.version != "HTTP/1.1" or not 400 <= r.status < 500:
                failures.append(f"{name}: {r.version} {r.status} {r.body[:200]!r}")
    assert not failures, "\n".join(failures)
    # Still serving.
    good = make_spans(1, 1)
    assert_ok(exchange(c.port, request(pb_body(good), content_type=PROTOBUF)), PROTOBUF)
    assert stored(c) == expected(good)


# --- 6. limits -----------------------------------------------------------------------------


LIMIT = 64 << 10


def padded(body: bytes, size: int) -> bytes:
    """``body`` grown to ``size`` bytes with an unknown field (which decoders skip)."""
    n = size - len(body)
    while len(out := body + pb_field(99, b"\x00" * n)) > size:
        n -= 1
    assert len(out) == size
    return out


def test_declared_content_length_over_the_limit_is_413_before_the_body(start: Start) -> None:
    c = start(limits=Limits(max_body_bytes=LIMIT))
    with Conn(c.port, timeout=5) as conn:
        conn.send(request(content_type=PROTOBUF, length=LIMIT + 1))  # headers only
        r = conn.read_response(timeout=5)
    assert r.status == 413
    assert "body over" in status_message(r)
    # Exactly the limit is fine.
    spans = make_spans(2, 1)
    body = padded(pb_body(spans), LIMIT)
    assert len(body) == LIMIT
    assert_ok(exchange(c.port, request(body, content_type=PROTOBUF)), PROTOBUF)
    assert stored(c) == expected(spans)


def test_chunked_body_over_the_limit_is_413(start: Start) -> None:
    c = start(limits=Limits(max_body_bytes=LIMIT))
    body = padded(pb_body(make_spans(2, 1)), LIMIT + 10)
    with Conn(c.port, timeout=5) as conn:
        conn.send(request(content_type=PROTOBUF, chunks=split(body, 4096)))
        r = conn.read_response(timeout=5)
    assert r.status == 413, r
    assert span_count(c) == 0


def test_gzip_bomb_is_refused_without_inflating_it(start: Start) -> None:
    c = start(limits=Limits(max_body_bytes=1 << 20))
    bomb = gz(bytes(64 << 20))  # 64 MiB of zeros in about 64 KB
    assert len(bomb) < 1 << 20
    with peak_rss_growth() as growth:
        r = exchange(
            c.port,
            request(bomb, content_type=PROTOBUF, headers=[("Content-Encoding", "gzip")]),
        )
    assert r.status in (400, 413), r
    assert growth[0] < 16 << 20, f"peak RSS grew {growth[0] >> 20} MiB inflating a bomb"
    # A chunked gzip bomb too.
    r = exchange(
        c.port,
        request(content_type=JSON, headers=[("Content-Encoding", "gzip")], chunks=split(bomb, 999)),
    )
    assert r.status in (400, 413), r
    assert span_count(c) == 0


def _many_empty(shape: str, n: int) -> bytes:
    if shape == "resourceSpans":
        return b"\x0a\x00" * n  # ExportTraceServiceRequest.resource_spans, empty
    if shape == "scopeSpans":
        return pb_field(1, b"\x12\x00" * n)  # one ResourceSpans of n empty ScopeSpans
    if shape == "spans":
        return pb_field(1, pb_field(2, b"\x12\x00" * n))  # one ScopeSpans of n empty Spans
    return b"\x7a\x00" * n  # n empty unknown fields (15): skipped, or refused


def _answer_time(port: int, body: bytes) -> tuple[Any, float]:
    t0 = time.perf_counter()
    with Conn(port, timeout=30) as conn:
        conn.send(request(body, content_type=PROTOBUF))
        r = conn.read_response(timeout=30)
    return r, time.perf_counter() - t0


@pytest.mark.parametrize("shape", ["resourceSpans", "scopeSpans", "spans", "unknown fields"])
def test_millions_of_empty_protobuf_messages_are_refused_fast_and_small(
    start: Start, shape: str
) -> None:
    c = start()
    body = _many_empty(shape, 2_000_000)  # about 4 MB
    # The yardstick: a body of the same size refused at its first byte (wire type 7).
    first_byte, baseline = _answer_time(c.port, b"\x0f" + bytes(len(body) - 1))
    assert first_byte.status == 400, first_byte
    with peak_rss_growth() as growth:
        r, took = _answer_time(c.port, body)
    problems = []
    # Receiving and copying the body costs a few times its size; walking it may not
    # record each of its 2 million fields.
    if growth[0] >= 20 * len(body):
        problems.append(f"peak RSS grew {growth[0] / len(body):.0f}x the {len(body):,}-byte body")
    if shape == "unknown fields" and r.status == 200:  # skipped: an empty export
        assert not problems, problems
        assert_ok(r, PROTOBUF)
        return
    assert r.status == 400, r  # or refused once more fields than the limits allow
    assert "limit" in status_message(r)
    # Counting may stop at the limit (10,000 of them) instead of walking 2 million.
    if took >= 5 * baseline + 0.5:
        problems.append(f"took {took:.2f}s where a first-byte refusal took {baseline:.2f}s")
    assert not problems, "; ".join(problems)


def test_millions_of_empty_json_resource_spans_are_400(start: Start) -> None:
    c = start()
    body = b'{"resourceSpans":[' + b",".join([b"{}"] * 2_000_000) + b"]}"
    with peak_rss_growth() as growth:
        r = exchange(c.port, request(body, content_type=JSON), timeout=30)
    assert r.status == 400, r
    assert status_message(r)
    assert growth[0] < 20 * len(body), f"peak RSS grew {growth[0] / len(body):.0f}x the body"


def _huge_span(n_attributes: int) -> bytes:
    """A Span of ``n_attributes`` KeyValue{key:"a"} (5 bytes each), hand-encoded."""
    return (
        pb_field(1, b"\x02" * 16)
        + pb_field(2, b"\x03" * 8)
        + pb_field(5, b"huge")
        + pb_field(9, pb_field(1, b"a")) * n_attributes
    )


def test_a_span_with_a_million_attributes_is_rejected_alone(start: Start) -> None:
    c = start()
    good = make_spans(3, 1)
    req = pb_request(good)
    scope = req.resource_spans[0].scope_spans[0].SerializeToString()
    scope += pb_field(2, _huge_span(10**6))
    resource = req.resource_spans[0].resource.SerializeToString()
    body = pb_field(1, pb_field(1, resource) + pb_field(2, scope))
    with peak_rss_growth() as growth:
        t0 = time.perf_counter()
        r = exchange(c.port, request(body, content_type=PROTOBUF), timeout=30)
        took = time.perf_counter() - t0
    assert_ok(r, PROTOBUF, rejected=1)
    message = ExportTraceServiceResponse.FromString(r.body).partial_success.error_message
    assert "attributes" in message and "spans[3]" in message, message
    assert growth[0] < 20 * len(body), f"peak RSS grew {growth[0] / len(body):.0f}x the body"
    assert took < 3.0, f"took {took:.2f}s"
    assert stored(c) == expected(good)


@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_json_nested_100000_deep_is_400_with_a_json_status(start: Start, padded: bool) -> None:
    """Dense nesting is refused by its brace count; padded with whitespace it reaches the
    JSON parser, which must turn its recursion limit into a 400."""
    c = start()
    depth = 100_000
    opener = b"[" + (b" " * 15 if padded else b"")
    body = b'{"resourceSpans":' + opener * depth + b"]" * depth + b"}"
    with Conn(c.port, timeout=15) as conn:
        conn.send(request(body, content_type=JSON))
        r = conn.read_response(timeout=15)
    assert r.status == 400, r
    assert r.header("content-type") == JSON
    doc = r.json()
    assert set(doc) == {"code", "message"} and doc["code"] == 3, doc
    if padded:
        assert "deep" in doc["message"], doc
    assert span_count(c) == 0


def _nested_json_value(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {"stringValue": "leaf"}
    for _ in range(levels):
        value = {"arrayValue": {"values": [value]}}
    return value


def _nested_pb_value(levels: int) -> AnyValue:
    value = AnyValue(string_value="leaf")
    for _ in range(levels):
        outer = AnyValue()
        outer.array_value.values.append(value)
        value = outer
    return value


def _nested_pb_bytes(levels: int) -> bytes:
    """An AnyValue ``levels`` arrays deep, hand-encoded (past any parser's own limit)."""
    value = pb_field(1, b"leaf")
    for _ in range(levels):
        value = pb_field(5, pb_field(1, value))
    return value


@pytest.mark.parametrize(
    ("kind", "levels"), [(JSON, 40), (PROTOBUF, 40), (PROTOBUF, 10_000)], ids=str
)
def test_attribute_nested_past_max_depth_rejects_that_span_alone(
    start: Start, kind: str, levels: int
) -> None:
    c = start()
    good = make_spans(3, 1)
    deep = make_spans(1, 2)[0]
    if kind == JSON:
        bad = json_span(deep)
        bad["attributes"].append({"key": "deep", "value": _nested_json_value(levels)})
        body = json_body([json_span(good[0]), bad, *map(json_span, good[1:])])
    elif levels < 100:
        req = pb_request([good[0], deep, *good[1:]])
        kv = req.resource_spans[0].scope_spans[0].spans[1].attributes.add()
        kv.key = "deep"
        kv.value.CopyFrom(_nested_pb_value(levels))
        body = req.SerializeToString()
    else:
        req = pb_request(good)
        scope = req.resource_spans[0].scope_spans[0]
        bad_span = pb_request([deep]).resource_spans[0].scope_spans[0].spans[0]
        raw_bad = bad_span.SerializeToString() + pb_field(
            9, pb_field(1, b"deep") + pb_field(2, _nested_pb_bytes(levels))
        )
        spans = [s.SerializeToString() for s in scope.spans]
        scope_raw = pb_field(1, scope.scope.SerializeToString()) + b"".join(
            pb_field(2, x) for x in [spans[0], raw_bad, *spans[1:]]
        )
        resource = req.resource_spans[0].resource.SerializeToString()
        body = pb_field(1, pb_field(1, resource) + pb_field(2, scope_raw))
    r = exchange(c.port, request(body, content_type=kind))
    assert_ok(r, kind, rejected=1)
    if kind == JSON:
        message = r.json()["partialSuccess"]["errorMessage"]
    else:
        message = ExportTraceServiceResponse.FromString(r.body).partial_success.error_message
    assert "spans[1]" in message, message
    if levels < 100:
        assert "nested more than 32" in message, message
    assert stored(c) == expected(good)


# --- 7. a bad record among concurrent requests ----------------------------------------


def test_a_bad_span_is_rejected_alone_while_its_batch_is_stored(start: Start) -> None:
    c = start(flush_interval=0.3)
    groups = [make_spans(3, i + 1) for i in range(4)]
    bad = json_span(make_spans(1, 99)[0])
    bad["links"] = 5
    bodies = [json_body(g) for g in groups[:3]]
    bodies.append(json_body([json_span(groups[3][0]), bad, *map(json_span, groups[3][1:])]))
    results: list[Any] = [None] * 4
    barrier = threading.Barrier(4)

    def post(i: int) -> None:
        with Conn(c.port) as conn:
            barrier.wait(5)
            conn.send(request(bodies[i], content_type=JSON))
            results[i] = conn.read_response()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    for r in results[:3]:
        assert_ok(r, JSON)
    assert_ok(results[3], JSON, rejected=1)
    assert results[3].json()["partialSuccess"]["rejectedSpans"] == "1"
    assert "links is not a list" in results[3].json()["partialSuccess"]["errorMessage"]
    c.stop(timeout=10)
    with open_store(c.writer.db, read_only=True) as store:
        batches = store.run("SELECT DISTINCT regexp_extract(source, '#([0-9]+)', 1) FROM spans")
    assert len(batches) == 1 and batches[0][0], f"the requests did not share a batch: {batches}"
    assert stored(c) == expected(*groups)


# --- 8. status codes --------------------------------------------------------------------


def test_status_codes_for_path_method_and_media_type(start: Start) -> None:
    c = start()
    body = pb_body(make_spans(2, 1))
    r = exchange(c.port, request(body, path="/v1/metrics"))
    assert r.status == 404 and status_message(r)
    r = exchange(c.port, request(body, path="/"))
    assert r.status == 404
    r = exchange(c.port, request(method="GET", content_type=None))
    assert r.status == 405
    assert r.header("allow") == "POST"
    r = exchange(c.port, request(body, method="PUT"))
    assert r.status == 405 and r.header("allow") == "POST"
    r = exchange(c.port, request(body, content_type="text/plain"))
    assert r.status == 415 and r.header("content-type") == JSON
    assert "text/plain" in status_message(r)
    r = exchange(c.port, request(body, headers=[("Content-Encoding", "br")]))
    assert r.status == 415
    assert span_count(c) == 0


def test_bearer_token_is_required_when_configured(start: Start) -> None:
    c = start(auth_token=TOKEN)
    spans = make_spans(2, 1)
    body = pb_body(spans)
    for auth in (None, "Bearer wrong-token-0123456789", f"Basic {TOKEN}", TOKEN, "Bearer "):
        headers = [("Authorization", auth)] if auth is not None else []
        r = exchange(c.port, request(body, headers=headers))
        assert r.status == 401, (auth, r)
        assert (r.header("www-authenticate") or "").startswith("Bearer"), r.headers
    r = exchange(c.port, request(body, headers=[("Authorization", f"Bearer {TOKEN}")]))
    assert_ok(r, PROTOBUF)
    assert stored(c) == expected(spans)


# --- 9. idle and slow connections -------------------------------------------------------

IDLE = 1.0


def test_a_silent_connection_is_closed_after_the_idle_timeout(start: Start) -> None:
    c = start(idle_timeout=IDLE, body_timeout=IDLE)
    with Conn(c.port) as conn:
        t0 = time.monotonic()
        assert conn.closed_by_server(IDLE + 4), "still open"
        took = time.monotonic() - t0
        assert conn.buf == b""
    assert took >= IDLE * 0.5, f"closed after {took:.2f}s, before the idle timeout"


def test_a_connection_idle_after_a_response_is_closed(start: Start) -> None:
    c = start(idle_timeout=IDLE, body_timeout=IDLE)
    with Conn(c.port) as conn:
        conn.send(request(pb_body(make_spans(1, 1))))
        assert_ok(conn.read_response(), PROTOBUF)
        assert conn.closed_by_server(IDLE + 4), "still open"


def test_trickled_request_headers_are_cut_off(start: Start) -> None:
    c = start(idle_timeout=IDLE, body_timeout=IDLE)
    raw = request(pb_body(make_spans(1, 1)))
    with Conn(c.port) as conn:
        t0 = time.monotonic()
        closed = False
        for i in range(len(raw)):
            if time.monotonic() - t0 > IDLE + 4:
                break
            try:
                conn.send(raw[i : i + 1])
            except OSError:
                closed = True
                break
            if conn.closed_by_server(0.3):
                closed = True
                break
        assert closed, f"still open after {time.monotonic() - t0:.1f}s of trickled headers"
        assert b"200 OK" not in conn.buf
    assert span_count(c) == 0


def test_a_body_that_stalls_gets_408_or_a_close(start: Start) -> None:
    c = start(idle_timeout=IDLE, body_timeout=IDLE)
    body = pb_body(make_spans(2, 1))
    for raw in (
        request(body, length=len(body) + 100),
        request(chunks=[body]).removesuffix(b"0\r\n\r\n"),
    ):
        with Conn(c.port) as conn:
            conn.send(raw)
            t0 = time.monotonic()
            try:
                r = conn.read_response(timeout=IDLE + 4)
            except Closed:
                r = None
            took = time.monotonic() - t0
            if r is not None:
                assert r.status == 408, r
            assert took < IDLE + 4
    assert span_count(c) == 0


def test_hundreds_of_idle_connections_hold_no_threads_and_are_closed(start: Start) -> None:
    idle = 2.0
    c = start(idle_timeout=idle, body_timeout=idle)
    exchange(c.port, request(pb_body(make_spans(1, 1))))  # warm: decode pool, writer
    threads_before = threading.active_count()
    conns: list[socket.socket] = []
    sel = selectors.DefaultSelector()
    try:
        t0 = time.monotonic()
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", c.port), timeout=5)
            s.setblocking(False)
            conns.append(s)
            sel.register(s, selectors.EVENT_READ)
        opened = time.monotonic() - t0
        time.sleep(0.2)
        grown = threading.active_count() - threads_before
        assert grown < 30, f"{grown} more threads for 300 idle connections"
        # A normal client is served meanwhile, well before the idle ones time out.
        t1 = time.monotonic()
        spans = make_spans(2, 2)
        assert_ok(exchange(c.port, request(pb_body(spans)), timeout=idle), PROTOBUF)
        assert time.monotonic() - t1 < idle
        # ... and every idle one is closed by the server.
        open_ = set(conns)
        deadline = time.monotonic() + idle + 5 + opened
        while open_ and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                s = key.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(1024)
                except ConnectionResetError:
                    data = b""
                except BlockingIOError:
                    continue
                assert data == b"", data
                sel.unregister(s)
                open_.discard(s)
        assert not open_, f"{len(open_)} of 300 idle connections still open"
    finally:
        sel.close()
        for s in conns:
            s.close()
    rows = stored(c)
    assert len(rows) == 3


# --- 10. constructor ----------------------------------------------------------------------


def test_listening_beyond_loopback_needs_a_token_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--auth-token-file"):
        Collector(str(tmp_path / "a.duckdb"), host="0.0.0.0", port=0)
    c = Collector(str(tmp_path / "b.duckdb"), host="0.0.0.0", port=0, insecure=True)
    try:
        c.start()
        assert c.address.startswith("0.0.0.0:")
        spans = make_spans(1, 1)
        assert_ok(exchange(c.port, request(pb_body(spans))), PROTOBUF)
    finally:
        c.stop(timeout=10)
    with open_store(c.writer.db, read_only=True) as store:
        assert store.run("SELECT count(*) FROM spans")[0][0] == 1
    c = Collector(str(tmp_path / "c.duckdb"), host="0.0.0.0", port=0, auth_token=TOKEN)
    c.start()
    c.stop(timeout=10)
