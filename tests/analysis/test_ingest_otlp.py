"""Ingest of OTLP JSON produced by the real OpenTelemetry SDK and its OTLP encoder.

Spans are made with the SDK (``TracerProvider`` + ``InMemorySpanExporter``), encoded
by ``opentelemetry.exporter.otlp.proto.common.trace_encoder.encode_spans`` and written
with ``google.protobuf.json_format`` (ids turned from protobuf's base64 into the hex
that OTLP/JSON prescribes), so these are the bytes an OTLP exporter would send.
"""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from tracekit import conventions as cv
from tracekit.analysis.ingest import fast, ingest_paths, staging
from tracekit.analysis.store import SPAN_COLUMNS, open_store
from tracekit.errors import IngestError

JSON_COLUMNS = ("attributes", "resource_attributes", "links")


def sdk_export(
    n_requests: int = 3, *, version: str | None = "v1", arrays: bool = False
) -> dict[str, Any]:
    """An ExportTraceServiceRequest as OTLP/JSON: requests of a root and three stages."""
    attrs = {cv.SERVICE_NAME: "ranker", cv.SERVICE_INSTANCE_ID: "ranker-0", cv.HOST_NAME: "node-1"}
    if version:
        attrs[cv.SERVICE_VERSION] = version
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    t = 1_767_225_600_000_000_000
    for i in range(n_requests):
        base = t + i * 1_000_000_000
        root = tracer.start_span(
            "POST /predict",
            kind=SpanKind.SERVER,
            start_time=base,
            attributes={cv.HTTP_ROUTE: "/predict", cv.INFLIGHT: 3},
        )
        ctx = _ctx(root)
        f = tracer.start_span(
            cv.FEATURE_RETRIEVAL,
            context=ctx,
            start_time=base + 1_000_000,
            attributes={
                cv.STAGE: cv.FEATURE_RETRIEVAL,
                cv.CACHE_HIT: i % 2 == 0,
                cv.SAMPLE_WEIGHT: 2.5,
            },
        )
        f.end(end_time=base + 16_000_000)
        m_attrs: dict[str, Any] = {
            cv.STAGE: cv.MODEL_EXECUTE,
            cv.TIME_KIND: cv.COMPUTE,
            cv.CPU_TIME_NS: 4_000_000,
            cv.GPU_TIME_NS: 15_000_000,
        }
        if arrays:
            m_attrs["tracekit.test.labels"] = ["a", "b"]
        m = tracer.start_span(
            cv.MODEL_EXECUTE,
            context=ctx,
            start_time=base + 20_000_000,
            attributes=m_attrs,
            links=[Link(f.get_span_context(), {"why": "batch"})],
        )
        m.end(end_time=base + 40_000_000)
        d = tracer.start_span(
            "GET /price",
            context=ctx,
            kind=SpanKind.CLIENT,
            start_time=base + 40_000_000,
            attributes={cv.STAGE: cv.DOWNSTREAM},
        )
        d.set_status(Status(StatusCode.ERROR, "timeout"))
        d.end(end_time=base + 90_000_000)
        root.end(end_time=base + 100_000_000)
    request = encode_spans(exporter.get_finished_spans())
    doc = json_format.MessageToDict(request, use_integers_for_enums=True)
    _hex_ids(doc)
    return doc


def _ctx(span: Any) -> Any:
    from opentelemetry import trace

    return trace.set_span_in_context(span)


def _hex_ids(doc: dict[str, Any]) -> None:
    """protobuf's JSON mapping writes bytes as base64; OTLP/JSON wants hex."""

    def fix(obj: dict[str, Any]) -> None:
        for key in ("traceId", "spanId", "parentSpanId"):
            if obj.get(key):
                obj[key] = base64.b64decode(obj[key]).hex()

    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                fix(span)
                for link in span.get("links", ()):
                    fix(link)


def split_lines(doc: dict[str, Any]) -> list[str]:
    """One export request per span, as a Collector file exporter might batch them."""
    lines = []
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                one = {"resourceSpans": [{**rs, "scopeSpans": [{**ss, "spans": [span]}]}]}
                lines.append(json.dumps(one, separators=(",", ":")))
    return lines


def rows(store: Any) -> list[tuple[Any, ...]]:
    cols = ", ".join(c for c in SPAN_COLUMNS if c != "source")
    out = []
    for row in store.con.execute(f"SELECT {cols} FROM spans ORDER BY trace_id, span_id").fetchall():
        named = dict(zip([c for c in SPAN_COLUMNS if c != "source"], row, strict=True))
        for c in JSON_COLUMNS:
            named[c] = json.loads(named[c])
        out.append(tuple(named.items()))
    return out


def test_sdk_document_ingests_with_hex_ids_enums_and_columns(store, tmp_path: Path) -> None:
    path = tmp_path / "export.json"
    path.write_text(json.dumps(sdk_export(), indent=2))
    report = ingest_paths(store, [path])
    assert (report.spans_read, report.spans_stored, report.traces) == (12, 12, 3)
    assert report.releases == ["v1"] and report.skipped == 0 and report.counts == {}
    got = store.con.execute(
        "SELECT kind, status_code, stage, time_kind, cpu_time_ns, gpu_time_ns, sample_weight, "
        "service_name, service_version, instance_id, host_name, links, attributes "
        "FROM spans WHERE name = ? LIMIT 1",
        [cv.MODEL_EXECUTE],
    ).fetchone()
    assert got[:11] == (
        "INTERNAL",
        "UNSET",
        cv.MODEL_EXECUTE,
        cv.COMPUTE,
        4_000_000,
        15_000_000,
        1.0,
        "ranker",
        "v1",
        "ranker-0",
        "node-1",
    )
    (link,) = json.loads(got[11])
    assert len(link["trace_id"]) == 32 and link["attributes"] == {"why": "batch"}
    assert json.loads(got[12])[cv.CPU_TIME_NS] == 4_000_000
    client = store.con.execute(
        "SELECT kind, status_code FROM spans WHERE name = 'GET /price' LIMIT 1"
    ).fetchone()
    assert client == ("CLIENT", "ERROR")
    weight, hit = store.con.execute(
        "SELECT sample_weight, attributes->>'$.\"tracekit.cache.hit\"' FROM spans WHERE stage = ? "
        "ORDER BY start_ns LIMIT 1",
        [cv.FEATURE_RETRIEVAL],
    ).fetchone()
    assert (weight, hit) == (2.5, "true")


def test_fast_sql_path_and_python_path_store_identical_rows(tmp_path: Path) -> None:
    doc = sdk_export(4)
    jsonl = tmp_path / "export.jsonl"
    jsonl.write_text("\n".join(split_lines(doc)) + "\n")
    pretty = tmp_path / "export.json"
    pretty.write_text(json.dumps(doc, indent=1))

    with open_store(tmp_path / "fast.duckdb") as a:
        staging.create(a)
        odd = fast.stage_lines(a, str(jsonl), gzip=False, file_no=0, display="x")
        assert odd == []  # every line was decoded in SQL, none handed to Python
        staging.run(a, staging.sql("drop_stage"))
        ingest_paths(a, [jsonl])
        fast_rows = rows(a)
    with open_store(tmp_path / "python.duckdb") as b:
        ingest_paths(b, [pretty])
        python_rows = rows(b)
    assert len(fast_rows) == 16
    assert fast_rows == python_rows


def test_odd_lines_fall_back_to_python_and_still_match(tmp_path: Path) -> None:
    """Arrays, upper-case ids and string enum names are left to Python by the SQL path."""
    doc = sdk_export(2, arrays=True)
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["traceId"] = span["traceId"].upper()
    span["kind"] = "SPAN_KIND_SERVER"
    jsonl = tmp_path / "odd.jsonl"
    jsonl.write_text("\n".join(split_lines(doc)) + "\n")
    with open_store(tmp_path / "a.duckdb") as a:
        staging.create(a)
        odd = fast.stage_lines(a, str(jsonl), gzip=False, file_no=0, display="x")
        assert odd  # some lines needed Python
        staging.run(a, staging.sql("drop_stage"))
        ingest_paths(a, [jsonl])
        got = rows(a)
    pretty = tmp_path / "odd.json"
    pretty.write_text(json.dumps(doc))
    with open_store(tmp_path / "b.duckdb") as b:
        ingest_paths(b, [pretty])
        assert got == rows(b)
    labels = [dict(r)["attributes"].get("tracekit.test.labels") for r in got]
    assert ["a", "b"] in labels
    assert all(dict(r)["trace_id"] == dict(r)["trace_id"].lower() for r in got)


def test_malformed_lines_are_reported_by_line_and_the_good_ones_kept(store, tmp_path: Path) -> None:
    lines = split_lines(sdk_export(1))
    lines.insert(1, '{"resourceSpans": [ {"broken"')
    lines.insert(3, "not json at all")
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = ingest_paths(store, [path])
    assert report.spans_stored == 4
    assert report.skipped == 2 and report.counts == {"malformed": 2}
    assert [p.where for p in report.skipping_problems] == [f"{path}:2", f"{path}:4"]
    assert "invalid JSON" in report.skipping_problems[0].reason


def test_strict_stops_at_the_first_skipping_problem_and_stores_nothing(
    store, tmp_path: Path
) -> None:
    lines = split_lines(sdk_export(1))
    lines.insert(2, "{oops")
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(IngestError) as err:
        ingest_paths(store, [path], strict=True)
    assert err.value.where == f"{path}:3"
    assert store.span_count() == 0


def test_gzip_is_detected_from_magic_bytes_not_the_name(store, tmp_path: Path) -> None:
    data = ("\n".join(split_lines(sdk_export(2))) + "\n").encode()
    (tmp_path / "spans.bin").write_bytes(gzip.compress(data))
    (tmp_path / "doc.json.gz").write_bytes(gzip.compress(json.dumps(sdk_export(1)).encode()))
    report = ingest_paths(store, [tmp_path / "spans.bin", tmp_path / "doc.json.gz"])
    assert report.files == 2 and report.spans_read == 12 and report.skipped == 0


def test_directories_are_read_recursively_and_reingest_stores_nothing(
    store, tmp_path: Path
) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "one.jsonl").write_text("\n".join(split_lines(sdk_export(1))))
    (tmp_path / "a" / "b" / "two.json").write_text(json.dumps(sdk_export(2)))
    (tmp_path / "a" / "b" / "copy.jsonl").write_text((tmp_path / "a" / "one.jsonl").read_text())
    (tmp_path / "a" / "empty.json").write_text("  \n")
    first = ingest_paths(store, [tmp_path / "a"])
    assert first.files == 4 and first.spans_stored == 12 and first.skipped == 0
    assert first.counts == {"duplicate": 4, "empty_file": 1}
    again = ingest_paths(store, [tmp_path / "a"])
    assert again.spans_read == 16 and again.spans_stored == 0 and store.span_count() == 12


def test_version_labels_only_spans_without_service_version(store, tmp_path: Path) -> None:
    unlabelled = tmp_path / "unlabelled.json"
    unlabelled.write_text(json.dumps(sdk_export(1, version=None)))
    report = ingest_paths(store, [unlabelled], version="v9")
    assert report.releases == ["v9"]
    labelled = sdk_export(1, version="v1")
    for rs in labelled["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                span["traceId"] = "f" * 32
    path = tmp_path / "labelled.json"
    path.write_text(json.dumps(labelled))
    ingest_paths(store, [path], version="v9")
    got = dict(
        store.con.execute(
            "SELECT trace_id = repeat('f', 32), any_value(service_version) FROM spans GROUP BY 1"
        ).fetchall()
    )
    assert got == {True: "v1", False: "v9"}


def test_negative_durations_missing_times_and_huge_attributes_are_counted(
    store, tmp_path: Path
) -> None:
    doc = sdk_export(1)
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["endTimeUnixNano"] = str(int(spans[0]["startTimeUnixNano"]) - 5)
    del spans[1]["startTimeUnixNano"]
    spans[2]["attributes"].append({"key": "blob", "value": {"stringValue": "x" * 10_000}})
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps(doc))
    report = ingest_paths(store, [path])
    assert report.skipped == 0 and report.spans_stored == 4
    assert report.counts["negative_duration"] == 1
    assert report.counts["no_timestamps"] == 1 and report.counts["huge_attribute"] == 1
    bad = store.con.execute("SELECT count(*) FROM spans WHERE end_ns < start_ns").fetchone()
    assert bad == (0,)
    blob = store.con.execute(
        "SELECT length(attributes->>'$.blob') FROM spans WHERE attributes->>'$.blob' IS NOT NULL"
    ).fetchone()
    assert blob == (4096,)
