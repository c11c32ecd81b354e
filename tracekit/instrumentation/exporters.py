"""Span export: the OTLP-JSON-lines file exporter and the drop-counting pipeline.

:class:`OTLPJsonFileExporter` writes exactly what the OpenTelemetry Collector's
``file`` exporter writes: one ``{"resourceSpans": [...]}`` object per line and per
export call, lower-case hex ids, nanosecond times as decimal strings, enums as
integers, ``parentSpanId: ""`` on roots and ``status: {}`` when unset. Any OTLP-JSON
reader (the Collector's ``otlpjsonfile`` receiver, ``tracekit ingest``) reads it.

:class:`ExportPipeline` wraps one exporter in OTel's ``BatchSpanProcessor`` so no
request ever waits for an export, counts the spans that never reach the exporter's
destination (failed exports, full queue), logs the first failure once and the total
once at shutdown — never once per request.
"""

from __future__ import annotations

import base64
import json
import logging
import math
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, StatusCode

from tracekit.instrumentation._guard import logger
from tracekit.instrumentation._otel_internals import batch_queue

# OTLP SpanFlags bits beside the W3C trace flags (opentelemetry-proto trace.proto).
_FLAG_HAS_IS_REMOTE = 0x100
_FLAG_IS_REMOTE = 0x200


# --- OTLP JSON encoding ----------------------------------------------------------


def encode_value(v: Any) -> dict[str, Any]:
    """One OTLP ``AnyValue`` in proto3 JSON, as the Collector writes it.

    Also what :mod:`tracekit.testing` and the ingest benchmark write, so that every
    OTLP document tracekit produces spells values one way.
    """
    # bool before int: bool is an int subclass.
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        if math.isfinite(v):
            return {"doubleValue": v}
        # protojson spells non-finite doubles as strings
        return {"doubleValue": "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")}
    if isinstance(v, str):
        return {"stringValue": v}
    if isinstance(v, bytes | bytearray):
        return {"bytesValue": base64.b64encode(bytes(v)).decode("ascii")}
    if isinstance(v, Mapping):
        return {"kvlistValue": {"values": encode_attributes(v)}}
    if isinstance(v, Sequence):
        return {"arrayValue": {"values": [encode_value(x) for x in v]}}
    return {"stringValue": str(v)}


def encode_attributes(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """OTLP ``KeyValue`` list of ``attrs`` (none: an empty list)."""
    return [{"key": k, "value": encode_value(v)} for k, v in (attrs or {}).items()]


def _flags(own: SpanContext | None, parent: SpanContext | None) -> int:
    flags = _FLAG_HAS_IS_REMOTE | (int(own.trace_flags) if own is not None else 0)
    if parent is not None and parent.is_remote:
        flags |= _FLAG_IS_REMOTE
    return flags


def _span(span: ReadableSpan) -> dict[str, Any]:
    ctx = span.get_span_context()
    assert ctx is not None  # an SDK span always has one
    out: dict[str, Any] = {"traceId": f"{ctx.trace_id:032x}", "spanId": f"{ctx.span_id:016x}"}
    if ctx.trace_state:
        out["traceState"] = ctx.trace_state.to_header()
    out["parentSpanId"] = f"{span.parent.span_id:016x}" if span.parent is not None else ""
    out["flags"] = _flags(ctx, span.parent)
    out["name"] = span.name
    out["kind"] = span.kind.value + 1  # SDK INTERNAL=0 .. CONSUMER=4; OTLP INTERNAL=1 .. CONSUMER=5
    out["startTimeUnixNano"] = str(span.start_time or 0)
    out["endTimeUnixNano"] = str(span.end_time or 0)
    if span.attributes:
        out["attributes"] = encode_attributes(span.attributes)
    if span.dropped_attributes:
        out["droppedAttributesCount"] = span.dropped_attributes
    if span.events:
        events = []
        for event in span.events:
            e: dict[str, Any] = {"timeUnixNano": str(event.timestamp), "name": event.name}
            if event.attributes:
                e["attributes"] = encode_attributes(event.attributes)
            events.append(e)
        out["events"] = events
    if span.dropped_events:
        out["droppedEventsCount"] = span.dropped_events
    if span.links:
        links = []
        for link in span.links:
            lk: dict[str, Any] = {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
            }
            if link.context.trace_state:
                lk["traceState"] = link.context.trace_state.to_header()
            if link.attributes:
                lk["attributes"] = encode_attributes(link.attributes)
            lk["flags"] = _flags(link.context, link.context)
            links.append(lk)
        out["links"] = links
    if span.dropped_links:
        out["droppedLinksCount"] = span.dropped_links
    status: dict[str, Any] = {}
    if span.status.status_code is not StatusCode.UNSET:
        if span.status.description:
            status["message"] = span.status.description
        status["code"] = 1 if span.status.status_code is StatusCode.OK else 2
    out["status"] = status
    return out


def encode_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """One OTLP ``ExportTraceServiceRequest`` in the Collector's JSON form."""
    grouped: dict[Any, dict[Any, list[ReadableSpan]]] = {}
    for span in spans:
        grouped.setdefault(span.resource, {}).setdefault(span.instrumentation_scope, []).append(
            span
        )
    resource_spans = []
    for resource, scopes in grouped.items():
        scope_spans = []
        for scope, members in scopes.items():
            scope_json: dict[str, Any] = {}
            if scope is not None:
                scope_json["name"] = scope.name
                if scope.version:
                    scope_json["version"] = scope.version
                if scope.attributes:
                    scope_json["attributes"] = encode_attributes(scope.attributes)
            entry: dict[str, Any] = {"scope": scope_json, "spans": [_span(s) for s in members]}
            if scope is not None and scope.schema_url:
                entry["schemaUrl"] = scope.schema_url
            scope_spans.append(entry)
        rs: dict[str, Any] = {
            "resource": {"attributes": encode_attributes(resource.attributes)},
            "scopeSpans": scope_spans,
        }
        if resource.schema_url:
            rs["schemaUrl"] = resource.schema_url
        resource_spans.append(rs)
    return {"resourceSpans": resource_spans}


class OTLPJsonFileExporter(SpanExporter):
    """Appends each export as one OTLP-JSON line to ``path`` (created with its folders).

    Each line is one ``write`` on an ``O_APPEND`` descriptor, so the worker processes
    of one service (forked after ``configure()``, or each configured on its own) can
    share one file without interleaving their lines.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._closed = False
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork_in_child)
            os.register_at_fork(after_in_child=lambda: _call(ref))

    def _after_fork_in_child(self) -> None:
        # the parent's export thread may have held the lock at the fork; the
        # descriptor stays valid and shared, appends stay whole lines
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        line = json.dumps(encode_otlp_json(spans), separators=(",", ":"), allow_nan=False)
        data = memoryview((line + "\n").encode("utf-8"))
        with self._lock:
            if self._closed:
                return SpanExportResult.FAILURE
            try:
                if self._fd is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
                    self._fd = os.open(self.path, flags, 0o644)
                while data:  # a regular file takes it in one write unless the disk is full
                    data = data[os.write(self._fd, data) :]
            except OSError as exc:
                logger.warning("tracekit: cannot write traces to %s: %s", self.path, exc)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _call(ref: weakref.WeakMethod[Any]) -> None:
    method = ref()
    if method is not None:
        method()


# --- export pipeline -------------------------------------------------------------


class _RepeatFilter(logging.Filter):
    """Lets each distinct message of an exporter's logger through once per process."""

    def __init__(self) -> None:
        super().__init__("tracekit-repeats")
        self._seen: set[Any] = set()
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.msg)
        if key in self._seen:
            self.suppressed += 1
            return False
        self._seen.add(key)
        return True


_REPEATS = _RepeatFilter()


def quiet_repeats(logger_name: str) -> None:
    """Stop ``logger_name`` from logging the same failure once per batch."""
    target = logging.getLogger(logger_name)
    if _REPEATS not in target.filters:
        target.addFilter(_REPEATS)


class _CountingExporter(SpanExporter):
    """Passes spans on and counts those whose export failed."""

    def __init__(self, inner: SpanExporter, target: str) -> None:
        self.inner = inner
        self.target = target
        self.failed_spans = 0
        self._warned = False
        self._shut = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shut:
            result = SpanExportResult.FAILURE
        else:
            try:
                result = self.inner.export(spans)
            except Exception as exc:  # an exporter bug must not kill the export thread
                logger.debug("tracekit: exporter %s raised %r", self.target, exc)
                result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            with self._lock:
                self.failed_spans += len(spans)
                first = not self._warned
                self._warned = True
            if first and not self._shut:
                logger.warning(
                    "tracekit: exporting spans to %s failed; requests are not affected. "
                    "Dropped spans are counted and reported once at shutdown.",
                    self.target,
                )
        return result

    def shutdown(self) -> None:
        # idempotent: a timer and the batch processor may both call it
        with self._lock:
            if self._shut:
                return
            self._shut = True
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class ExportPipeline(SpanProcessor):
    """One exporter behind a ``BatchSpanProcessor``, with its dropped spans counted."""

    def __init__(self, exporter: SpanExporter, target: str) -> None:
        self.target = target
        self._counting = _CountingExporter(exporter, target)
        self._batch = BatchSpanProcessor(self._counting)
        self.queue_dropped = 0
        self._closed = False
        # the SDK logs the spans a full queue drops but keeps no count; tracekit counts them
        self._queue, self._queue_max = batch_queue(self._batch)

    @property
    def exporter(self) -> SpanExporter:
        return self._counting.inner

    @property
    def backlog(self) -> float:
        """How full the batch queue is, 0..1."""
        return len(self._queue) / self._queue_max

    @property
    def dropped(self) -> int:
        """Spans that did not reach the destination: failed exports plus queue overflow."""
        return self._counting.failed_spans + self.queue_dropped

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._batch.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        if len(self._queue) >= self._queue_max:
            self.queue_dropped += 1
        self._batch.on_end(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._batch.force_flush(timeout_millis)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush and close within about ``timeout_s``, then report drops once."""
        if self._closed:
            return
        self._closed = True
        # An export stuck in retries against a dead endpoint would hold the batch
        # processor's shutdown for the exporter's whole timeout; closing the
        # exporter half-way through aborts those retries.
        timer = threading.Timer(timeout_s / 2, self._counting.shutdown)
        timer.daemon = True
        timer.start()
        try:
            self._batch.shutdown()  # type: ignore[no-untyped-call]
        finally:
            timer.cancel()
            self._counting.shutdown()
        if self.dropped:
            logger.warning(
                "tracekit: %d spans were dropped by the exporter to %s (%d in failed exports, "
                "%d on a full queue).",
                self.dropped,
                self.target,
                self._counting.failed_spans,
                self.queue_dropped,
            )
