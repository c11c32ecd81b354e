"""The OTLP/HTTP trace receiver: ``POST /v1/traces`` into the batching writer.

Responses follow the OTLP/HTTP specification:

* **200** with an ``ExportTraceServiceResponse`` in the request's encoding once the
  spans are committed to the store (with the tail sampler: once the sampler holds them);
  ``partial_success`` carries the number of spans rejected and why;
* **400** with a ``google.rpc.Status`` for a body that cannot be decoded (not retryable);
* **429** with ``Retry-After`` when the pending spans reach their memory bound, **503**
  with ``Retry-After`` when the store could not be written in time or the collector is
  stopping: both retryable, and nothing in them was acknowledged;
* 404 / 405 / 413 / 415 for another path, method, an oversized body or media type.

The server is the standard library's threading HTTP server (HTTP/1.1, keep-alive), bound
to 127.0.0.1 unless told otherwise; each connection's thread decodes its own bodies.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tracekit.analysis.collect import decode
from tracekit.analysis.collect.sampler import SamplerFull, SamplerStats, TailSampler
from tracekit.analysis.collect.writer import Backpressure, BatchWriter, FlushStats

TRACES_PATH = "/v1/traces"
RETRY_AFTER_S = 1
"""Seconds a client is asked to wait after 429/503 (the OTLP exporters honour it)."""


@dataclass(frozen=True)
class SamplingPolicy:
    """``--keep-slowest``, ``--sample-rest``, ``--decision-wait`` of ``tracekit collect``."""

    keep_slowest: float
    sample_rest: float
    decision_wait: float = 5.0
    window: int = 1000


@dataclass
class CollectStatus:
    """A snapshot for the status line and for tests."""

    address: str
    spans_received: int
    spans_accepted: int
    spans_rejected: int
    requests_refused: int
    """429/503 answers: retryable refusals, nothing acknowledged."""
    spans_per_s: float
    requests_stored: int
    releases: list[str]
    pending_spans: int
    sampler: SamplerStats | None
    errors: list[str] = field(default_factory=list)


class Collector:
    """``tracekit collect`` as a library: start, watch :meth:`status`, :meth:`stop`."""

    def __init__(
        self,
        db: str,
        *,
        host: str = "127.0.0.1",
        port: int = 4318,
        sampling: SamplingPolicy | None = None,
        max_pending_spans: int = 200_000,
        batch_spans: int = 20_000,
        flush_interval: float = 0.5,
        max_body_bytes: int = 64 << 20,
        ack_timeout: float = 8.0,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.max_body_bytes = max_body_bytes
        self.ack_timeout = ack_timeout
        self._lock = threading.Lock()
        self._received = self._accepted = self._rejected = self._refused = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._last_flush: FlushStats | None = None
        self._errors: list[str] = []
        self._on_error = on_error
        self._inflight = 0
        self.writer = BatchWriter(
            db,
            max_pending_spans=max_pending_spans,
            batch_spans=batch_spans,
            flush_interval=flush_interval,
            on_flush=self._flushed,
            on_error=self._error,
        )
        self.sampler: TailSampler | None = None
        if sampling is not None:
            self.sampler = TailSampler(
                keep_slowest=sampling.keep_slowest,
                sample_rest=sampling.sample_rest,
                decision_wait=sampling.decision_wait,
                window=sampling.window,
                max_spans=max_pending_spans,
                emit=lambda doc, n: self.writer.submit(doc, n, force=True),
            )
        self._httpd = ThreadingHTTPServer((host, port), _handler(self))
        self._httpd.daemon_threads = True
        host_bound, port_bound = self._httpd.server_address[:2]
        self.address = f"{host_bound!s}:{port_bound}"
        self.writer.source = f"collect:{self.address}"  # the bound port, also for --port 0
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self.writer.start()
        serve = threading.Thread(target=self._httpd.serve_forever, name="tracekit-collect-http")
        self._threads.append(serve)
        if self.sampler is not None:
            tick = threading.Thread(target=self._decide_loop, name="tracekit-collect-sampler")
            self._threads.append(tick)
        for t in self._threads:
            t.daemon = True
            t.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop accepting, decide every held trace, write everything accepted, answer."""
        if self._stop.is_set():
            return
        self._httpd.shutdown()
        self._stop.set()
        if self.sampler is not None:
            self.sampler.decide_due(everything=True)
        self.writer.close(timeout)
        # Handlers waiting on their ticket have them now; let them send the answer.
        deadline = time.monotonic() + 5.0
        while self._inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        self._httpd.server_close()

    def status(self) -> CollectStatus:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - 5.0:
                self._recent.popleft()
            span = max(now - self._recent[0][0], 1.0) if self._recent else 1.0
            rate = sum(n for _, n in self._recent) / span
            flush = self._last_flush
            return CollectStatus(
                address=self.address,
                spans_received=self._received,
                spans_accepted=self._accepted,
                spans_rejected=self._rejected,
                requests_refused=self._refused,
                spans_per_s=rate,
                requests_stored=flush.requests_total if flush else 0,
                releases=list(flush.releases) if flush else [],
                pending_spans=self.writer.pending_spans
                + (self.sampler.held_spans if self.sampler else 0),
                sampler=self.sampler.stats if self.sampler else None,
                errors=list(self._errors[-5:]),
            )

    def _decide_loop(self) -> None:
        assert self.sampler is not None
        while not self._stop.wait(0.1):
            self.sampler.decide_due()

    def _flushed(self, stats: FlushStats) -> None:
        with self._lock:
            self._last_flush = stats

    def _error(self, message: str) -> None:
        with self._lock:
            self._errors.append(message)
        if self._on_error:
            self._on_error(message)

    def export(self, body: bytes, content_type: str | None, encoding: str | None) -> _Answer:
        """Handle one ``POST /v1/traces`` body; the HTTP layer only frames the answer."""
        kind = decode.media_type(content_type)
        try:
            raw = decode.decompress(body, encoding, limit=self.max_body_bytes)
            screened = decode.screen(decode.decode_body(raw, content_type))
        except decode.BadBody as exc:
            return _status(400, kind, exc.reason)
        with self._lock:
            self._received += screened.accepted + screened.rejected
            self._rejected += screened.rejected
        if screened.accepted:
            refused = self._hand_over(screened, kind)
            if refused is not None:
                with self._lock:
                    self._refused += 1
                return refused
        with self._lock:
            self._accepted += screened.accepted
            self._recent.append((time.monotonic(), screened.accepted))
        return _success(kind, screened.rejected, screened.message)

    def _hand_over(self, screened: decode.Screened, kind: str) -> _Answer | None:
        """None once the spans are safe (written, or held by the sampler); else the refusal."""
        if self.sampler is not None:
            try:
                self.sampler.add(screened.doc, screened.accepted)
            except SamplerFull as exc:
                return _status(429, kind, f"collector busy: {exc}", retry=True)
            except Backpressure as exc:  # late spans of a decided trace, while stopping
                return _status(503, kind, f"collector stopping: {exc}", retry=True)
            return None
        try:
            ticket = self.writer.submit(screened.doc, screened.accepted)
        except Backpressure as exc:
            return _status(429, kind, f"collector busy: {exc}", retry=True)
        if not ticket.done.wait(self.ack_timeout):
            # Still queued: it will most likely be written, and the client's retry is
            # then deduplicated by (trace_id, span_id); but it is not acknowledged.
            return _status(503, kind, "the store is busy; retry", retry=True)
        if ticket.error:
            return _status(503, kind, f"could not write the store: {ticket.error}", retry=True)
        return None


@dataclass(frozen=True)
class _Answer:
    code: int
    content_type: str
    body: bytes
    retry_after: int | None = None


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
    """A ``google.rpc.Status`` body (gRPC code INVALID_ARGUMENT or UNAVAILABLE)."""
    grpc_code = 14 if retry else 3
    retry_after = RETRY_AFTER_S if retry else None
    if kind == decode.JSON:
        body = json.dumps({"code": grpc_code, "message": message}).encode()
        return _Answer(code, decode.JSON, body, retry_after)
    from google.rpc import status_pb2

    body = status_pb2.Status(code=grpc_code, message=message).SerializeToString()
    return _Answer(code, decode.PROTOBUF, body, retry_after)


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "tracekit-collect"

        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.split("?", 1)[0] != TRACES_PATH:
                self._send(_status(404, decode.JSON, f"only {TRACES_PATH} is served here"))
                return
            kind = decode.media_type(self.headers.get("Content-Type"))
            if kind not in (decode.JSON, decode.PROTOBUF):
                self._send(_status(415, decode.JSON, f"unsupported Content-Type {kind!r}"))
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > collector.max_body_bytes:
                self.close_connection = True
                self._send(_status(413, kind, f"body over {collector.max_body_bytes:,} bytes"))
                return
            body = self.rfile.read(length)
            with collector._lock:
                collector._inflight += 1
            try:
                answer = collector.export(
                    body, self.headers.get("Content-Type"), self.headers.get("Content-Encoding")
                )
            finally:
                with collector._lock:
                    collector._inflight -= 1
            self._send(answer)

        def do_GET(self) -> None:  # noqa: N802
            self._send(_status(405, decode.JSON, f"POST OTLP spans to {TRACES_PATH}"))

        def _send(self, answer: _Answer) -> None:
            self.send_response(answer.code)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            if answer.retry_after is not None:
                self.send_header("Retry-After", str(answer.retry_after))
            if collector._stop.is_set():
                # Stopping: a kept-alive connection would keep this thread serving.
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(answer.body)

        def log_message(self, format: str, *args: Any) -> None:
            # The status line reports traffic; per-request access logs would drown it.
            return

    return Handler
