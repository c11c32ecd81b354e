"""tracekit explain: the Explanation, its renderers, and the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.attribution.explain import explain_trace
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import Store
from tracekit.cli import main
from tracekit.errors import QueryError
from tracekit.render.explain import (
    PATH_GLYPH,
    STAR,
    headline,
    render_json,
    render_markdown,
    render_table,
)
from tracekit.testing import TraceBuilder, worked_example


@pytest.fixture
def example(store: Store) -> str:
    r = worked_example()
    r.builder.load(store)
    return r.trace_id


def test_explanation_has_spans_in_waterfall_order_and_exact_stage_totals(
    store: Store, example: str
) -> None:
    e = explain_trace(store, example)
    assert e.duration_ms == 160 and e.release == "v2" and e.service == "ranker"
    assert [s.name for s in e.spans][:3] == ["POST /predict", cv.FEATURE_RETRIEVAL, cv.PREPROCESS]
    assert [s.depth for s in e.spans] == [0, 1, 1, 1, 1, 1, 2, 3, 1]
    assert sum(s.critical_ms for s in e.stages) == e.duration_ms
    assert sum(s.critical_ms for s in e.spans) == e.duration_ms
    assert [s.stage for s in e.stages][-1] == cv.UNATTRIBUTED
    select = next(s for s in e.spans if s.name == "SELECT prices")
    assert select.stage == cv.DOWNSTREAM and select.service == "pricing"
    assert select.path == [(105.0, 135.0)] and select.time_kind == cv.WAIT


def test_span_hidden_behind_a_concurrent_sibling_is_not_marked(store: Store) -> None:
    b = TraceBuilder(seed=21)
    r = b.request(duration_ms=50)
    r.stage(cv.FEATURE_RETRIEVAL, start_ms=0, duration_ms=20)
    r.stage(cv.DOWNSTREAM, start_ms=0, duration_ms=50)
    b.load(store)
    e = explain_trace(store, r.trace_id)
    marks = {s.name: s.on_critical_path for s in e.spans}
    assert marks == {"POST /predict": False, cv.FEATURE_RETRIEVAL: False, cv.DOWNSTREAM: True}
    table = render_table(e)
    retrieval_line = next(line for line in table.splitlines() if cv.FEATURE_RETRIEVAL in line)
    assert STAR not in retrieval_line and PATH_GLYPH not in retrieval_line


def test_table_marks_the_path_and_leads_with_the_headline(store: Store, example: str) -> None:
    text = render_table(explain_trace(store, example))
    lines = text.splitlines()
    assert lines[1].startswith("Most of this request's 160.0 ms went to batch_queue 55.0 ms")
    queue = next(line for line in lines if line.lstrip(STAR + " ").startswith(cv.BATCH_QUEUE))
    assert queue.startswith(STAR) and PATH_GLYPH * 10 in queue
    assert "total" in text and "160.0 ms" in text


def test_json_schema(store: Store, example: str) -> None:
    doc = json.loads(render_json(explain_trace(store, example)))
    assert {"trace_id", "duration_ms", "spans", "stages", "summary", "release"} <= set(doc)
    span = doc["spans"][1]
    assert {
        "span_id",
        "name",
        "depth",
        "start_ms",
        "end_ms",
        "stage",
        "time_kind",
        "critical_ms",
        "on_critical_path",
        "service",
        "kind",
        "status",
        "path",
    } <= set(span)
    assert span["path"] == [{"start_ms": 0.0, "end_ms": 15.0}]
    stages = {s["stage"]: s for s in doc["stages"]}
    assert (
        stages[cv.BATCH_QUEUE]["critical_ms"] == 55.0
        and stages[cv.BATCH_QUEUE]["time_kind"] == "wait"
    )
    assert round(sum(s["critical_ms"] for s in doc["stages"]), 6) == doc["duration_ms"]


def test_markdown_has_both_tables(store: Store, example: str) -> None:
    md = render_markdown(explain_trace(store, example))
    assert "| stage | kind |" in md and "| ★ | span |" in md and "**total**" in md


def test_prefix_lookup_and_errors(store: Store, example: str) -> None:
    assert explain_trace(store, example[:8].upper()).trace_id == example
    with pytest.raises(QueryError, match="8"):
        explain_trace(store, example[:7])
    with pytest.raises(QueryError, match="ingest it first"):
        explain_trace(store, "0" * 32)
    b = TraceBuilder(seed=22)
    b.batch([], start_ms=0, duration_ms=5)
    store.insert_spans(b.rows())
    with pytest.raises(QueryError, match="batch"):
        explain_trace(store, b.trace_ids()[0])


def test_cli_explain_formats_and_errors(
    store: Store, example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = store.path
    store.close()
    assert main(["explain", example[:12], "--db", db]) == 0
    out = capsys.readouterr().out
    assert example in out and STAR in out and "batch_queue" in out
    assert main(["explain", example, "--db", db, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["trace_id"] == example
    assert main(["explain", "ffffffffff", "--db", db]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tracekit explain: error: no trace ffffffffff") and err.count("\n") == 1
    assert main(["explain", example, "--db", str(Path(db).with_name("missing.duckdb"))]) == 2


def test_a_called_services_own_stage_counts_as_downstream_and_keeps_its_label(
    store: Store,
) -> None:
    b = TraceBuilder(seed=21)
    r = b.request(duration_ms=100)
    call = r.stage(cv.DOWNSTREAM, start_ms=10, duration_ms=90, name="POST /embed")
    server = r.span(
        "POST /embed", start_ms=12, duration_ms=86, kind="SERVER", parent=call, service="embedder"
    )
    r.stage(cv.MODEL_EXECUTE, start_ms=20, duration_ms=70, parent=server, service="embedder")
    b.load(store)
    e = explain_trace(store, r.trace_id)
    assert {s.stage: s.critical_ms for s in e.stages} == {cv.UNATTRIBUTED: 10, cv.DOWNSTREAM: 90}
    model = next(s for s in e.spans if s.name == cv.MODEL_EXECUTE)
    assert model.stage == cv.DOWNSTREAM and model.own_stage == cv.MODEL_EXECUTE
    assert model.time_kind == cv.WAIT
    assert all(s.own_stage is None for s in e.spans if s is not model)
    assert "downstream (model_execute)" in render_table(e)
    assert json.loads(render_json(e))["spans"][-1]["own_stage"] == cv.MODEL_EXECUTE


def test_hotrod_headline_names_operations_and_json_carries_them(
    store: Store, corpus_dir: Path
) -> None:
    ingest_paths(store, [corpus_dir / "otlp/jaegerv3_n_plus_one_full_serial.json"])
    e = explain_trace(store, "fe65c5be")
    assert headline(e).startswith(
        "Most of this request's 1117.0 ms went to downstream 1115.3 ms (100%, wait): "
        "route GET /route ×10 serial 558.9 ms, mysql SQL SELECT 311.7 ms, "
        "redis-manual GetDriver ×13 serial 205.7 ms, …"
    )
    doc = json.loads(render_json(e))
    assert list(doc)[-4:] == ["summary", "operations", "patterns", "profiles"]
    assert set(doc["operations"][0]) == {
        "service",
        "operation",
        "stage",
        "path_ms",
        "calls",
        "calls_on_path",
        "serial",
        "errors",
    }
    assert set(doc["patterns"][0]) == {
        "kind",
        "span_id",
        "service",
        "operation",
        "count",
        "evidence",
    }
    assert {p["kind"] for p in doc["patterns"]} == {"n_plus_one", "retry"}
    table, md = render_table(e), render_markdown(e)
    assert "Per operation" in table and "Patterns" in table
    assert "n_plus_one  redis-manual GetDriver ×13: 13 serial calls" in table
    assert "| downstream | redis-manual | GetDriver | 205.7 ms | 13 | 13 | yes | 3 |" in md
    assert "- `retry` redis-manual GetDriver ×3: 3 repeated calls" in md


def _stored_operations(store: Store, trace_id: str) -> list[tuple[object, ...]]:
    got = store.run(
        "SELECT stage, service, operation, critical_ns, calls, calls_on_path, overlapping, "
        "errors FROM request_operations WHERE trace_id = $t",
        {"t": trace_id},
    )
    return sorted(
        (stage, svc, op, crit / 1e6, calls, on, over == 0, err)
        for stage, svc, op, crit, calls, on, over, err in got
    )


@pytest.mark.parametrize("trace", ["serial", "concurrent", "demo"])
def test_explain_shows_the_operation_rows_the_store_keeps(
    store: Store, corpus_dir: Path, trace: str
) -> None:
    if trace == "demo":
        b = TraceBuilder(service="ranker", version="v1", seed=4)
        r = worked_example(b)
        r.span(  # a failed call the status leaves unset: the 503 says so
            "GET /stock",
            start_ms=150,
            duration_ms=4,
            kind="CLIENT",
            attributes={cv.SERVER_ADDRESS: "stock", cv.HTTP_RESPONSE_STATUS_CODE: 503},
        )
        b.load(store)
        trace_id = r.trace_id
    else:
        name = f"otlp/jaegerv3_n_plus_one_full_{trace}"
        ingest_paths(store, [corpus_dir / f"{name}.json"])
        per_request.refresh(store)
        trace_id = json.loads((corpus_dir / f"{name}.manifest.json").read_text())["trace_id"]
    e = explain_trace(store, trace_id)
    shown = sorted(
        (o.stage, o.service, o.operation, o.path_ms, o.calls, o.calls_on_path, o.serial, o.errors)
        for o in e.operations
    )
    assert shown == _stored_operations(store, e.trace_id)
    assert [o.path_ms for o in e.operations] == sorted(
        (o.path_ms for o in e.operations), reverse=True
    )
    # HotROD's three redis timeouts; the demo's 503
    assert sum(o.errors for o in e.operations) == (1 if trace == "demo" else 3)
