"""Traces without tracekit attributes (plain OTel SDK spans) still get useful stages."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request as attribution
from tracekit.analysis.store import Store

MS = 1_000_000
T0 = 1_767_225_600 * 1_000_000_000


class CountingIds(IdGenerator):
    """Deterministic ids: the SDK's own id path, fed by a counter."""

    def __init__(self) -> None:
        self.n = 0

    def generate_span_id(self) -> int:
        self.n += 1
        return 0x1000 + self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return 0xABC0000 + self.n


def _row(span: ReadableSpan) -> tuple[object, ...]:
    """A span row the way ingest would store it (a minimal local decoder)."""
    ctx = span.get_span_context()
    res = dict(span.resource.attributes)
    return (
        f"{ctx.trace_id:032x}",
        f"{ctx.span_id:016x}",
        f"{span.parent.span_id:016x}" if span.parent else None,
        span.name,
        span.kind.name,
        span.start_time,
        span.end_time,
        span.status.status_code.name,
        res.get(cv.SERVICE_NAME),
        res.get(cv.SERVICE_VERSION),
        None,
        None,
        None,
        None,
        None,
        None,
        1.0,
        json.dumps(dict(span.attributes or {})),
        json.dumps(res),
        None,
        "sdk",
    )


@pytest.fixture
def sdk_spans() -> Iterator[list[ReadableSpan]]:
    exporter = InMemorySpanExporter()
    ids = CountingIds()
    providers = {
        name: TracerProvider(
            resource=Resource.create({cv.SERVICE_NAME: name, cv.SERVICE_VERSION: "1.0"}),
            id_generator=ids,
        )
        for name in ("shop", "inventory")
    }
    for p in providers.values():
        p.add_span_processor(SimpleSpanProcessor(exporter))
    shop = providers["shop"].get_tracer("test")
    inventory = providers["inventory"].get_tracer("test")

    def at(ms: float) -> int:
        return T0 + int(ms * MS)

    root = shop.start_span(
        "GET /orders/{id}",
        kind=trace.SpanKind.SERVER,
        start_time=at(0),
        attributes={cv.HTTP_ROUTE: "/orders/{id}"},
    )
    ctx = trace.set_span_in_context(root)
    validate = shop.start_span("Validate Order 12345", context=ctx, start_time=at(0))
    validate.end(end_time=at(10))
    db = shop.start_span(
        "orders", context=ctx, start_time=at(10), attributes={"db.system": "postgresql"}
    )
    db.end(end_time=at(25))
    call = shop.start_span("GET", kind=trace.SpanKind.CLIENT, context=ctx, start_time=at(25))
    server = inventory.start_span(
        "GET /stock",
        kind=trace.SpanKind.SERVER,
        context=trace.set_span_in_context(call),
        start_time=at(27),
    )
    lookup = inventory.start_span(
        "lookup", context=trace.set_span_in_context(server), start_time=at(28)
    )
    lookup.end(end_time=at(60))
    server.end(end_time=at(63))
    call.end(end_time=at(65))
    render = shop.start_span("render", context=ctx, start_time=at(65))
    render.end(end_time=at(75))
    root.end(end_time=at(80))
    yield list(exporter.get_finished_spans())
    for p in providers.values():
        p.shutdown()


def test_plain_sdk_trace_gets_fallback_stages(store: Store, sdk_spans: list[ReadableSpan]) -> None:
    store.insert_spans([_row(s) for s in sdk_spans])
    report = attribution.refresh(store)
    assert report.requests == 1 and report.fallback_traces == 1
    rows = store.con.execute(
        "SELECT stage, time_kind, critical_ns FROM request_stages ORDER BY stage"
    ).fetchall()
    got = {stage: (kind, ns / MS) for stage, kind, ns in rows}
    assert got == {
        cv.DOWNSTREAM: (cv.WAIT, 55.0),  # the db span 15 + the call 40, callee included
        "validate order {id}": (cv.COMPUTE, 10.0),  # ids masked so names group
        "render": (cv.COMPUTE, 10.0),
        cv.UNATTRIBUTED: (cv.WAIT, 5.0),  # time in no stage: no evidence of computing
    }
    (route,) = store.con.execute("SELECT route FROM requests").fetchone()
    assert route == "/orders/{id}"


def test_fallback_is_off_when_any_span_carries_a_stage(
    store: Store, sdk_spans: list[ReadableSpan]
) -> None:
    rows = [list(_row(s)) for s in sdk_spans]
    render = next(r for r in rows if r[3] == "render")
    render[12] = cv.POSTPROCESS
    store.insert_spans([tuple(r) for r in rows])
    report = attribution.refresh(store)
    assert report.fallback_traces == 0
    got = dict(store.con.execute("SELECT stage, critical_ns FROM request_stages").fetchall())
    assert got == {cv.POSTPROCESS: 10 * MS, cv.UNATTRIBUTED: 70 * MS}
