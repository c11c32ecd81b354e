"""LLM stages in ClickHouse: ``tracekit attribute`` derives them from the spans as ingest does.

A vLLM V1 ``llm_request`` span made with the OpenTelemetry SDK is written to the
exporter's table with ``tracekit ingest --store`` (the derived stages stay out of the
table), attributed with :func:`tracekit.analysis.attribute.attribute`, and its stage rows
compared with what ``tracekit ingest`` stores in a DuckDB file.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribute import attribute
from tracekit.analysis.facade import Analysis
from tracekit.analysis.store.attributed import AttributedNames
from tracekit.analysis.store.clickhouse import connect
from tracekit.analysis.store.url import StoreURL, parse_store_url
from tracekit.cli import main

T0 = 1_767_225_600_000_000_000
V1 = {
    cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: 0.045,
    cv.GEN_AI_LATENCY_E2E: 2.15,
    cv.GEN_AI_LATENCY_TIME_IN_QUEUE: 0.012,
    cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: 0.031,
    cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE: 2.1,
    cv.GEN_AI_USAGE_PROMPT_TOKENS: 128,
    cv.GEN_AI_USAGE_COMPLETION_TOKENS: 512,
}


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def vllm_file(path: Path) -> Path:
    """Two V1 requests (the second without decode: counted, kept) as OTLP JSON lines."""
    import base64

    from google.protobuf import json_format
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({cv.SERVICE_NAME: "vllm"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("vllm.llm_engine")
    no_decode = {k: v for k, v in V1.items() if k != cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE}
    for i, attrs in enumerate((V1, no_decode)):
        start = T0 + i * 10**9
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=start)
        span.set_attributes(attrs)
        span.end(end_time=start + 2_151_000_000)
    doc = json_format.MessageToDict(
        encode_spans(exporter.get_finished_spans()), use_integers_for_enums=True
    )
    for span_doc in doc["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        for key in ("traceId", "spanId"):
            span_doc[key] = base64.b64decode(span_doc[key]).hex()
    path.write_text(json.dumps(doc) + "\n")
    return path


@pytest.fixture
def url(clickhouse_url: str) -> Iterator[StoreURL]:
    """A fresh spans table (``url.table``), dropped with its attributed tables after."""
    table = f"otel_traces_llm_{uuid.uuid4().hex[:10]}"
    parsed = parse_store_url(clickhouse_url, table=table)
    yield parsed
    client = connect(parsed)
    try:
        for name in (table, *AttributedNames.for_table(table).all()):
            client.command(f"DROP TABLE IF EXISTS `{parsed.database}`.`{name}`")
    finally:
        client.close()


def test_attribute_derives_the_stages_ingest_derives(
    url: StoreURL, clickhouse_url: str, tmp_path: Path
) -> None:
    f = vllm_file(tmp_path / "vllm.jsonl")
    rc, _, err = run("ingest", str(f), "--store", clickhouse_url, "--table", url.table)
    assert rc == 0, err
    client = connect(url)
    try:
        spans = client.query(f"SELECT count() FROM `{url.database}`.`{url.table}`").result_rows
    finally:
        client.close()
    assert spans[0][0] == 2  # what the exporter would have written: no derived span

    duck = tmp_path / "t.duckdb"
    assert run("ingest", str(f), "--db", str(duck))[0] == 0
    sql = "SELECT trace_id, stage, time_kind, critical_ns FROM request_stages ORDER BY 1, 2"
    with Analysis.open(str(duck)) as local:
        want = local.store.run(sql)
    # Read where it lives before `tracekit attribute` ran: the pull derives them too.
    with Analysis.open(clickhouse_url, table=url.table) as direct:
        pulled = direct.store.run(sql)
    assert [tuple(r) for r in pulled] == [tuple(r) for r in want]

    report = attribute(url, settle_s=0)
    assert (report.requests, report.stages_derived) == (2, 2)
    assert report.problems == {"llm_missing": 1}
    assert any("derived from latency attributes for 2 requests" in n for n in report.notes)

    with Analysis.open(clickhouse_url, table=url.table) as fleet:
        got = fleet.store.run(sql)
    assert [tuple(r) for r in got] == [tuple(r) for r in want]
    assert {r[1] for r in want} == {cv.QUEUE, cv.PREFILL, cv.DECODE, cv.UNATTRIBUTED}

    # SpansSeen counts the table's spans, not the derived ones: a second run writes nothing.
    again = attribute(url, settle_s=0, since_ns=0)
    assert (again.requests, again.already) == (0, 2)
