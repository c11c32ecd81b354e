"""Stages derived from vLLM's latency attributes, through the real ``tracekit ingest`` path.

Spans are made with the OpenTelemetry SDK as vLLM makes them (span ``llm_request``, kind
SERVER, started at the request's arrival; latencies in seconds under vLLM's
``SpanAttributes`` names), encoded by the SDK's OTLP encoder, then written as OTLP JSON
lines (``tracekit ingest``), sent as OTLP protobuf through the collector's decoder and
store path (``tracekit collect``), or written as Jaeger JSON, and ingested into a real
DuckDB file.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer

from tracekit import conventions as cv
from tracekit.analysis.ingest import genai
from tracekit.cli import main

T0 = 1_767_225_600_000_000_000
"""2026-01-01T00:00:00Z in ns: every request arrives on a whole second after it."""
S = 1_000_000_000
MS = 1_000_000

# A V1 request as OutputProcessor.do_tracing writes it: queue, prefill and decode from the
# engine core's timestamps, ttft and e2e from the frontend's arrival.
V1 = {
    cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: 0.045,
    cv.GEN_AI_LATENCY_E2E: 2.15,
    cv.GEN_AI_LATENCY_TIME_IN_QUEUE: 0.012,
    cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: 0.031,
    cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: 2.1,
    cv.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE: 2.131,
    cv.GEN_AI_USAGE_PROMPT_TOKENS: 128,
    cv.GEN_AI_USAGE_COMPLETION_TOKENS: 512,
    cv.GEN_AI_REQUEST_MAX_TOKENS: 512,
    cv.GEN_AI_REQUEST_N: 1,
    cv.GEN_AI_REQUEST_ID: "cmpl-1",
    "gen_ai.request.temperature": 0.7,
    "gen_ai.response.finish_reasons": '["length"]',
}
V1_SPAN_NS = 2_151 * MS
"""The span ends when do_tracing runs, just after the iteration that gave e2e."""

# A v0 request as LLMEngine.create_trace_span writes it: no prefill or decode attribute;
# time_in_queue is first scheduled − arrival, ttft and e2e from arrival.
V0 = {
    cv.GEN_AI_RESPONSE_MODEL: "facebook/opt-125m",
    cv.GEN_AI_REQUEST_ID: "0",
    cv.GEN_AI_REQUEST_MAX_TOKENS: 256,
    cv.GEN_AI_REQUEST_N: 1,
    "gen_ai.usage.num_sequences": 1,
    cv.GEN_AI_USAGE_PROMPT_TOKENS: 6,
    cv.GEN_AI_USAGE_COMPLETION_TOKENS: 256,
    cv.GEN_AI_LATENCY_TIME_IN_QUEUE: 0.0625,
    cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: 0.1,
    cv.GEN_AI_LATENCY_E2E: 1.25,
    cv.GEN_AI_LATENCY_TIME_IN_SCHEDULER: 0.004,
    cv.GEN_AI_LATENCY_TIME_IN_MODEL_FORWARD: 0.9,
    cv.GEN_AI_LATENCY_TIME_IN_MODEL_EXECUTE: 1.05,
}
V0_SPAN_NS = 1_251 * MS


def ns(seconds: float) -> int:
    return round(seconds * S)


# --- spans as the engine writes them --------------------------------------------------


class Export:
    """An SDK tracer whose finished spans become one OTLP export request."""

    def __init__(self, service: str = "vllm", version: str = "v1") -> None:
        self.exporter = InMemorySpanExporter()
        resource = Resource.create({cv.SERVICE_NAME: service, cv.SERVICE_VERSION: version})
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = provider.get_tracer("vllm.llm_engine")

    def request(self, i: int, attrs: dict[str, Any], duration_ns: int) -> trace.Span:
        """One ``llm_request`` span arriving at second ``i``."""
        span = self.tracer.start_span(
            genai.LLM_REQUEST_SPAN, kind=SpanKind.SERVER, start_time=T0 + i * S, attributes=attrs
        )
        span.end(end_time=T0 + i * S + duration_ns)
        return span

    def protobuf(self) -> bytes:
        return encode_spans(self.exporter.get_finished_spans()).SerializeToString()

    def jsonl(self, path: Path) -> Path:
        """OTLP JSON as an exporter writes it (hex ids, not protobuf's base64)."""
        doc = json_format.MessageToDict(
            encode_spans(self.exporter.get_finished_spans()), use_integers_for_enums=True
        )
        for rs in doc["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if span.get(key):
                            span[key] = base64.b64decode(span[key]).hex()
        path.write_text(json.dumps(doc) + "\n")
        return path


def trace_id(span: trace.Span) -> str:
    return f"{span.get_span_context().trace_id:032x}"


def span_id(span: trace.Span) -> str:
    return f"{span.get_span_context().span_id:016x}"


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def ingest(path: Path, db: Path) -> dict[str, Any]:
    """``tracekit ingest PATH --db DB --format json``: its JSON document."""
    rc, out, err = cli("ingest", str(path), "--db", str(db), "--format", "json")
    assert rc == 0, err
    return json.loads(out)


@contextlib.contextmanager
def db(path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        yield con
    finally:
        con.close()


def stages(path: Path, trace: str) -> dict[str, int]:
    """The request's critical-path ns per stage, as attribution stored them."""
    with db(path) as con:
        rows = con.execute(
            "SELECT stage, critical_ns FROM request_stages WHERE trace_id = ?", [trace]
        ).fetchall()
    return dict(rows)


def derived_spans(path: Path, trace: str) -> list[tuple[Any, ...]]:
    """(name, stage, time_kind, start − arrival, end − arrival, parent, derived mark)."""
    with db(path) as con:
        return con.execute(
            "SELECT s.name, s.stage, s.time_kind, s.start_ns - r.start_ns, s.end_ns - r.start_ns, "
            "s.parent_span_id, json_extract_string(s.attributes, ?), s.span_id FROM spans s "
            "JOIN requests r USING (trace_id) "
            "WHERE trace_id = ? AND s.stage IS NOT NULL ORDER BY s.start_ns",
            ['$."' + cv.STAGE_DERIVED + '"', trace],
        ).fetchall()


# --- one case per layout, all in one file ingested once ---------------------------------


def journey_pair(t: Tracer, at_ns: int) -> trace.Span:
    """vLLM journey tracing: ``llm_request`` (API layer) over ``llm_core`` (engine core,
    QUEUED to FINISHED), the per-state times as span events, no latency attribute."""
    api = t.start_span(
        genai.LLM_REQUEST_SPAN,
        kind=SpanKind.SERVER,
        start_time=at_ns,
        attributes={cv.GEN_AI_REQUEST_ID: "chatcmpl-1", cv.GEN_AI_USAGE_PROMPT_TOKENS: 1083},
    )
    api.add_event("api.ARRIVED", timestamp=at_ns)
    core = t.start_span(
        genai.LLM_CORE_SPAN,
        context=trace.set_span_in_context(api),
        kind=SpanKind.INTERNAL,
        start_time=at_ns + 3 * MS,
        attributes={cv.GEN_AI_REQUEST_ID: "chatcmpl-1"},
    )
    for name, ms in (("QUEUED", 3), ("SCHEDULED", 150), ("FIRST_TOKEN", 350), ("FINISHED", 900)):
        core.add_event(f"journey.{name}", {"phase": "decode"}, timestamp=at_ns + ms * MS)
    core.end(end_time=at_ns + 900 * MS)
    api.add_event("api.DEPARTED", timestamp=at_ns + 902 * MS)
    api.end(end_time=at_ns + 902 * MS)
    return api


def generation(t: Tracer, at_ns: int) -> trace.Span:
    """tracekit's own ``generation()`` under a SERVER span: the same attributes, plus its
    first-token mark, and queue/prefill/decode written as child spans."""
    attrs = {**V1, cv.GENERATION_FIRST_TOKEN_NS: at_ns + 45 * MS}
    root = t.start_span("POST /generate", kind=SpanKind.SERVER, start_time=at_ns, attributes=attrs)
    ctx = trace.set_span_in_context(root)
    for stage, lo, hi in ((cv.QUEUE, 2, 14), (cv.PREFILL, 14, 45), (cv.DECODE, 45, 2145)):
        kind = cv.default_time_kind(stage)
        s = t.start_span(
            stage, ctx, start_time=at_ns + lo * MS, attributes={cv.STAGE: stage, cv.TIME_KIND: kind}
        )
        s.end(end_time=at_ns + hi * MS)
    root.end(end_time=at_ns + V1_SPAN_NS)
    return root


@dataclass
class Layouts:
    """One request of each layout in one OTLP JSON-lines file, ingested once."""

    path: Path
    store: Path
    doc: dict[str, Any]
    spans: dict[str, trace.Span]

    def trace(self, layout: str) -> str:
        return trace_id(self.spans[layout])

    def problems(self, layout: str) -> list[dict[str, Any]]:
        span = self.spans[layout]
        ids = {span_id(span)} | {
            f"{s.context.span_id:016x}"
            for s in self.exporter_spans
            if s.context.trace_id == span.get_span_context().trace_id
        }
        return [p for p in self.doc["problems"] if any(f"span {i} " in p["reason"] for i in ids)]

    exporter_spans: list[Any]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> Layouts:
    tmp = tmp_path_factory.mktemp("layouts")
    e = Export()
    spans = {
        genai.VLLM_V1: e.request(0, V1, V1_SPAN_NS),
        genai.VLLM_V0: e.request(3, V0, V0_SPAN_NS),
        genai.VLLM_JOURNEY: journey_pair(e.tracer, T0 + 6 * S),
        genai.TRACEKIT: generation(e.tracer, T0 + 9 * S),
    }
    path, store = e.jsonl(tmp / "layouts.jsonl"), tmp / "t.duckdb"
    doc = ingest(path, store)
    return Layouts(path, store, doc, spans, list(e.exporter.get_finished_spans()))


def test_vllm_v1_span_gets_its_queue_prefill_and_decode(layouts: Layouts) -> None:
    t, span = layouts.trace(genai.VLLM_V1), layouts.spans[genai.VLLM_V1]
    assert layouts.problems(genai.VLLM_V1) == []
    got = stages(layouts.store, t)
    queue, prefill, decode = ns(0.012), ns(0.031), ns(2.1)
    assert (got[cv.QUEUE], got[cv.PREFILL], got[cv.DECODE]) == (queue, prefill, decode)
    assert got[cv.UNATTRIBUTED] == V1_SPAN_NS - queue - prefill - decode
    # Prefill ends at the first token; before the queue, the API server's own time.
    ttft = ns(0.045)
    parent = span_id(span)
    mark = cv.DERIVED_FROM_ATTRIBUTES
    want = [
        (cv.QUEUE, "wait", ttft - prefill - queue, ttft - prefill),
        (cv.PREFILL, "compute", ttft - prefill, ttft),
        (cv.DECODE, "compute", ttft, ttft + decode),
    ]
    assert derived_spans(layouts.store, t) == [
        (stage, stage, kind, lo, hi, parent, mark, genai.derived_span_id(t, parent, stage))
        for stage, kind, lo, hi in want
    ]


def test_vllm_v0_span_reads_prefill_and_decode_from_ttft_and_e2e(layouts: Layouts) -> None:
    t = layouts.trace(genai.VLLM_V0)
    assert layouts.problems(genai.VLLM_V0) == []
    got = stages(layouts.store, t)
    # vLLM v0's own request_prefill_time / request_decode_time: ttft − queue, e2e − ttft.
    assert got[cv.QUEUE] == ns(0.0625)
    assert got[cv.PREFILL] == ns(0.1) - ns(0.0625)
    assert got[cv.DECODE] == ns(1.25) - ns(0.1)
    assert got[cv.UNATTRIBUTED] == V0_SPAN_NS - ns(1.25)
    # The queue counts from arrival: the span's start.
    placed = [(name, lo, hi) for name, _, _, lo, hi, *_ in derived_spans(layouts.store, t)]
    assert placed == [
        (cv.QUEUE, 0, ns(0.0625)),
        (cv.PREFILL, ns(0.0625), ns(0.1)),
        (cv.DECODE, ns(0.1), ns(1.25)),
    ]


def test_journey_pair_keeps_its_times_in_events_so_nothing_is_derived(layouts: Layouts) -> None:
    t = layouts.trace(genai.VLLM_JOURNEY)
    [problem] = layouts.problems(genai.VLLM_JOURNEY)
    assert problem["kind"] == "llm_missing" and "span events" in problem["reason"]
    assert derived_spans(layouts.store, t) == []
    # No tracekit.stage in the trace: the fallback names the engine core's span as a stage.
    assert stages(layouts.store, t) == {genai.LLM_CORE_SPAN: 897 * MS, cv.UNATTRIBUTED: 5 * MS}


def test_tracekit_generation_spans_are_real_so_nothing_is_derived(layouts: Layouts) -> None:
    t = layouts.trace(genai.TRACEKIT)
    assert layouts.problems(genai.TRACEKIT) == []
    assert [row[6] for row in derived_spans(layouts.store, t)] == [None, None, None]
    got = stages(layouts.store, t)
    assert (got[cv.QUEUE], got[cv.PREFILL], got[cv.DECODE]) == (12 * MS, 31 * MS, 2100 * MS)


def test_the_report_counts_the_journey_pair_once(layouts: Layouts) -> None:
    assert layouts.doc["problem_counts"] == {"llm_missing": 1}  # the journey pair
    assert layouts.doc["requests_attributed"] == 4


def test_explain_says_the_stages_came_from_attributes(layouts: Layouts) -> None:
    t = layouts.trace(genai.VLLM_V1)
    rc, out, err = cli("explain", t, "--db", str(layouts.store))
    assert rc == 0, err
    assert "queue (from attributes)" in out and "decode (from attributes)" in out
    assert "derived at ingest from the engine's latency attributes" in out
    rc, out, _ = cli("explain", t, "--db", str(layouts.store), "--format", "json")
    doc = json.loads(out)
    by_stage = {s["stage"]: s["derived"] for s in doc["stages"]}
    mark = cv.DERIVED_FROM_ATTRIBUTES
    assert by_stage == {cv.QUEUE: mark, cv.PREFILL: mark, cv.DECODE: mark, cv.UNATTRIBUTED: None}
    assert [s["derived"] for s in doc["spans"]] == [None, mark, mark, mark]


# --- every format, the collector, re-ingest ---------------------------------------------


def test_reingesting_the_same_file_adds_no_span(layouts: Layouts, tmp_path: Path) -> None:
    store = tmp_path / "t.duckdb"
    rc, out, _ = cli("ingest", str(layouts.path), "--db", str(store))
    assert rc == 0 and "8 spans (8 new)" in out
    assert "stages derived from attributes for 2 requests" in out
    with db(store) as con:
        count = con.execute("SELECT count(*) FROM spans").fetchall()[0][0]
    again = ingest(layouts.path, store)
    assert (again["spans_read"], again["spans_stored"]) == (8, 0)
    # Derived once: the second ingest derives (and counts) nothing.
    assert again["stages_derived"] == 0
    with db(store) as con:
        assert con.execute("SELECT count(*) FROM spans").fetchall()[0][0] == count == 8 + 6
    for layout in (genai.VLLM_V1, genai.VLLM_V0):
        assert stages(store, layouts.trace(layout)) == stages(layouts.store, layouts.trace(layout))


def test_otlp_protobuf_through_the_collector_store_path(tmp_path: Path) -> None:
    """What ``tracekit collect`` does with an OTLP/HTTP protobuf body: its decoder, then
    the store worker's ``ingest_otlp_payloads`` (the same staging as ``tracekit ingest``)."""
    from tracekit.analysis.attribution.payloads import ingest_otlp_payloads
    from tracekit.analysis.store import open_store
    from tracekit.collect.decode import PROTOBUF, Limits, decode_request

    e = Export()
    span = e.request(0, V1, V1_SPAN_NS)
    decoded = decode_request(e.protobuf(), PROTOBUF, None, Limits())
    assert decoded.accepted == 1
    path = tmp_path / "t.duckdb"
    with open_store(path) as store:
        first = ingest_otlp_payloads(store, [decoded.line], source="collect")
        report = ingest_otlp_payloads(store, [decoded.line], source="collect")  # a retry
        assert (first.stages_derived, first.requests_attributed) == (1, 1)
        assert (report.stages_derived, report.spans_stored) == (0, 0)
    got = stages(path, trace_id(span))
    assert (got[cv.QUEUE], got[cv.PREFILL], got[cv.DECODE]) == (ns(0.012), ns(0.031), ns(2.1))


def test_jaeger_json_gets_the_same_stages(tmp_path: Path) -> None:
    """Jaeger's query-API JSON (µs times, typed tags) of a v0 request."""
    trace64 = "00000000000000000123456789abcdef"
    tags = [{"key": "span.kind", "type": "string", "value": "server"}]
    for key, value in V0.items():
        kind = (
            "string" if isinstance(value, str) else "int64" if isinstance(value, int) else "float64"
        )
        tags.append({"key": key, "type": kind, "value": value})
    doc = {
        "data": [
            {
                "traceID": trace64,
                "spans": [
                    {
                        "traceID": trace64,
                        "spanID": "00000000000000a1",
                        "operationName": genai.LLM_REQUEST_SPAN,
                        "references": [],
                        "startTime": T0 // 1000,
                        "duration": V0_SPAN_NS // 1000,
                        "tags": tags,
                        "logs": [],
                        "processID": "p1",
                    }
                ],
                "processes": {"p1": {"serviceName": "vllm", "tags": []}},
            }
        ]
    }
    path, store = tmp_path / "jaeger.json", tmp_path / "t.duckdb"
    path.write_text(json.dumps(doc))
    assert ingest(path, store)["problem_counts"] == {}
    got = stages(store, trace64)
    assert (got[cv.QUEUE], got[cv.PREFILL], got[cv.DECODE]) == (
        ns(0.0625),
        ns(0.1) - ns(0.0625),
        ns(1.25) - ns(0.1),
    )


def test_real_stage_spans_arriving_later_replace_the_derived_ones(tmp_path: Path) -> None:
    """A collector batch may carry the request span before its own stage spans."""
    e = Export(service="ranker")
    t = e.tracer
    root = t.start_span("POST /generate", kind=SpanKind.SERVER, start_time=T0, attributes=V1)
    root.end(end_time=T0 + V1_SPAN_NS)
    store = tmp_path / "t.duckdb"
    ingest(e.jsonl(tmp_path / "0.jsonl"), store)
    assert {r[6] for r in derived_spans(store, trace_id(root))} == {cv.DERIVED_FROM_ATTRIBUTES}
    later = Export(service="ranker")
    ctx = trace.set_span_in_context(trace.NonRecordingSpan(root.get_span_context()))
    s = later.tracer.start_span(
        cv.QUEUE, ctx, start_time=T0, attributes={cv.STAGE: cv.QUEUE, cv.TIME_KIND: cv.WAIT}
    )
    s.end(end_time=T0 + 40 * MS)
    ingest(later.jsonl(tmp_path / "1.jsonl"), store)
    assert [r[6] for r in derived_spans(store, trace_id(root))] == [None]
    assert stages(store, trace_id(root)) == {
        cv.QUEUE: 40 * MS,
        cv.UNATTRIBUTED: V1_SPAN_NS - 40 * MS,
    }


# --- what cannot be trusted is counted, the request kept -----------------------------------


def _v1(**changes: Any) -> dict[str, Any]:
    """V1's attributes with some changed (None: left out), named as in conventions."""
    attrs = {**V1, **{getattr(cv, k): v for k, v in changes.items()}}
    return {k: v for k, v in attrs.items() if v is not None}


CASES: dict[str, tuple[dict[str, Any], dict[str, int], set[str]]] = {
    # name: (attributes, problems by kind, stages derived)
    "queue_longer_than_e2e": (
        _v1(GEN_AI_LATENCY_TIME_IN_QUEUE=3.0),
        {"llm_inconsistent": 1},
        {cv.PREFILL, cv.DECODE},
    ),
    "queue_plus_prefill_past_e2e": (
        _v1(GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL=2.2),
        {"llm_inconsistent": 1},
        {cv.QUEUE, cv.DECODE},
    ),
    "negative_time": (
        _v1(GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL=-0.031),
        {"llm_invalid": 1},
        {cv.QUEUE, cv.DECODE},
    ),
    "not_finite": (
        _v1(GEN_AI_LATENCY_TIME_IN_MODEL_DECODE=math.inf),
        {"llm_invalid": 1},
        {cv.QUEUE, cv.PREFILL},
    ),
    "not_a_number": (
        _v1(GEN_AI_LATENCY_TIME_IN_QUEUE="soon"),
        {"llm_invalid": 1},
        {cv.PREFILL, cv.DECODE},
    ),
    "decode_absent": (
        _v1(GEN_AI_LATENCY_TIME_IN_MODEL_DECODE=None),
        {"llm_missing": 1},
        {cv.QUEUE, cv.PREFILL},
    ),
    "tokens_absent": (
        _v1(GEN_AI_USAGE_PROMPT_TOKENS=None, GEN_AI_USAGE_COMPLETION_TOKENS=None),
        {"llm_missing": 1},
        {cv.QUEUE, cv.PREFILL, cv.DECODE},
    ),
    "seconds_as_text": (  # as a ClickHouse exporter's string map keeps them: accepted
        _v1(GEN_AI_LATENCY_TIME_IN_QUEUE="0.012"),
        {},
        {cv.QUEUE, cv.PREFILL, cv.DECODE},
    ),
    "e2e_longer_than_the_span": (
        _v1(GEN_AI_LATENCY_E2E=9.0),
        {"llm_inconsistent": 1},
        {cv.QUEUE, cv.PREFILL, cv.DECODE},
    ),
}
V1_MEASURES = dict(next(x for x in genai.LAYOUTS if x.name == genai.VLLM_V1).stages)


@dataclass
class Untrusted:
    """Every case in one file, ingested once."""

    doc: dict[str, Any]
    """``tracekit ingest --format json``."""
    store: Path
    traces: dict[str, str]
    spans: dict[str, str]

    def problems(self, name: str) -> dict[str, int]:
        """The case's problems by kind, found by its span id in the reasons."""
        seen: dict[str, int] = {}
        for p in self.doc["problems"]:
            if f"span {self.spans[name]} " in p["reason"]:
                seen[p["kind"]] = seen.get(p["kind"], 0) + 1
        return seen


@pytest.fixture(scope="module")
def untrusted(tmp_path_factory: pytest.TempPathFactory) -> Untrusted:
    tmp = tmp_path_factory.mktemp("untrusted")
    e = Export()
    made = {name: e.request(i, case[0], V1_SPAN_NS) for i, (name, case) in enumerate(CASES.items())}
    store = tmp / "t.duckdb"
    doc = ingest(e.jsonl(tmp / "untrusted.jsonl"), store)
    traces = {name: trace_id(span) for name, span in made.items()}
    return Untrusted(doc, store, traces, {name: span_id(span) for name, span in made.items()})


@pytest.mark.parametrize("name", list(CASES))
def test_untrusted_attributes_are_counted_and_the_request_kept(
    untrusted: Untrusted, name: str
) -> None:
    attrs, want_problems, want_stages = CASES[name]
    assert untrusted.problems(name) == want_problems
    got = stages(untrusted.store, untrusted.traces[name])
    assert set(got) - {cv.UNATTRIBUTED} == want_stages
    for stage in want_stages:
        assert got[stage] == ns(float(attrs[V1_MEASURES[stage][0]]))
    # The request is kept whole: its stages still add up to its duration.
    assert sum(got.values()) == V1_SPAN_NS


def test_the_report_counts_every_untrusted_case(untrusted: Untrusted) -> None:
    want: dict[str, int] = {}
    for _, problems, _ in CASES.values():
        for kind, n in problems.items():
            want[kind] = want.get(kind, 0) + n
    assert untrusted.doc["problem_counts"] == want
    assert untrusted.doc["requests_attributed"] == len(CASES)
    assert untrusted.doc["exit_code"] == 0
