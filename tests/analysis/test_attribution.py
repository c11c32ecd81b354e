"""attribution.refresh: requests and request_stages from spans in a real DuckDB file."""

from __future__ import annotations

from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request as attribution
from tracekit.analysis.cohorts.release import load_release
from tracekit.analysis.store import SPAN_COLUMNS, Store
from tracekit.testing import RequestBuilder, TraceBuilder, worked_example

MS = 1_000_000


def stage_ms(store: Store, trace_id: str) -> dict[str, float]:
    """Critical-path ms per stage of one request; asserts the exact-sum invariant."""
    rows = store.con.execute(
        "SELECT stage, critical_ns FROM request_stages WHERE trace_id = ?", [trace_id]
    ).fetchall()
    (duration,) = store.con.execute(
        "SELECT duration_ns FROM requests WHERE trace_id = ?", [trace_id]
    ).fetchone()
    assert sum(ns for _, ns in rows) == duration
    return {stage: ns / MS for stage, ns in rows if ns}


def stage_row(store: Store, trace_id: str, stage: str) -> dict[str, Any]:
    cur = store.con.execute(
        "SELECT * FROM request_stages WHERE trace_id = ? AND stage = ?", [trace_id, stage]
    )
    names = [d[0] for d in cur.description]
    row = cur.fetchone()
    assert row is not None, f"no {stage} row"
    return dict(zip(names, row, strict=True))


def request_row(store: Store, trace_id: str) -> dict[str, Any]:
    cur = store.con.execute("SELECT * FROM requests WHERE trace_id = ?", [trace_id])
    names = [d[0] for d in cur.description]
    return dict(zip(names, cur.fetchone(), strict=True))


def serial(b: TraceBuilder, **durations: float) -> RequestBuilder:
    """A request whose stages run one after another, with no gaps."""
    r = b.request(duration_ms=sum(durations.values()))
    at = 0.0
    for stage, ms in durations.items():
        r.stage(stage, start_ms=at, duration_ms=ms)
        at += ms
    return r


def test_worked_example_splits_exactly_into_the_seed_stages(store: Store) -> None:
    r = worked_example()
    r.builder.load(store)
    assert stage_ms(store, r.trace_id) == {
        cv.FEATURE_RETRIEVAL: 15,
        cv.PREPROCESS: 10,
        cv.BATCH_QUEUE: 55,
        cv.MODEL_EXECUTE: 20,
        cv.DOWNSTREAM: 45,
        cv.POSTPROCESS: 10,
        cv.UNATTRIBUTED: 5,
    }
    req = request_row(store, r.trace_id)
    assert req["release"] == "v2" and req["route"] == "/predict" and req["inflight"] == 12
    assert req["queue_depth"] == 9 and req["cpu_utilization"] == 0.35
    assert req["gpu_utilization"] is None and req["is_error"] is False
    assert req["span_count"] == 9 and req["skewed_spans"] == 0
    model = stage_row(store, r.trace_id, cv.MODEL_EXECUTE)
    assert model["time_kind"] == cv.COMPUTE and model["gpu_time_ns"] == 18 * MS
    assert stage_row(store, r.trace_id, cv.BATCH_QUEUE)["cpu_time_ns"] is None
    # load_release reads the tables back: rows sum to the request durations
    data = load_release(store, "v2")
    assert data.stage_ms.sum(axis=1).tolist() == data.duration_ms.tolist() == [160.0]


@pytest.mark.parametrize("slow", cv.STAGES)
def test_each_stage_regressing_alone_is_charged_to_that_stage(store: Store, slow: str) -> None:
    b = TraceBuilder(seed=1)
    base = dict.fromkeys(cv.STAGES, 10.0)
    fast = serial(b, **base)
    slow_r = serial(b, **{**base, slow: 60.0})
    b.load(store)
    before, after = stage_ms(store, fast.trace_id), stage_ms(store, slow_r.trace_id)
    grew = {s: after[s] - before[s] for s in before if after[s] != before[s]}
    assert grew == {slow: 50.0}


def test_regression_hidden_behind_a_longer_concurrent_sibling_gets_no_blame(store: Store) -> None:
    b = TraceBuilder(seed=2)
    reqs = []
    for retrieval_ms in (10, 35):  # retrieval regresses but still ends before downstream
        r = b.request(duration_ms=60)
        r.stage(cv.FEATURE_RETRIEVAL, start_ms=0, duration_ms=retrieval_ms)
        r.stage(cv.DOWNSTREAM, start_ms=0, duration_ms=40)
        r.stage(cv.MODEL_EXECUTE, start_ms=40, duration_ms=20)
        reqs.append(r)
    b.load(store)
    for r in reqs:
        assert stage_ms(store, r.trace_id) == {cv.DOWNSTREAM: 40, cv.MODEL_EXECUTE: 20}
    hidden = stage_row(store, reqs[1].trace_id, cv.FEATURE_RETRIEVAL)
    assert hidden["critical_ns"] == 0 and hidden["wall_ns"] == 35 * MS


def test_gaps_on_the_path_are_unattributed(store: Store) -> None:
    b = TraceBuilder(seed=3)
    r = b.request(duration_ms=100)
    r.stage(cv.PREPROCESS, start_ms=10, duration_ms=20)
    r.span("plain helper", start_ms=40, duration_ms=30)  # no stage anywhere above it
    r.stage(cv.POSTPROCESS, start_ms=70, duration_ms=20)
    b.load(store)
    assert stage_ms(store, r.trace_id) == {
        cv.PREPROCESS: 20,
        cv.POSTPROCESS: 20,
        cv.UNATTRIBUTED: 60,
    }


def test_downstream_services_spans_inherit_the_downstream_stage(store: Store) -> None:
    b = TraceBuilder(seed=4)
    r = b.request(duration_ms=100)
    call = r.stage(cv.DOWNSTREAM, start_ms=0, duration_ms=100)
    server = r.span(
        "GET /price", start_ms=5, duration_ms=90, kind="SERVER", parent=call, service="pricing"
    )
    r.span("compute price", start_ms=10, duration_ms=50, parent=server, service="pricing")
    r.span("SELECT", start_ms=60, duration_ms=30, kind="CLIENT", parent=server, service="pricing")
    b.load(store)
    assert stage_ms(store, r.trace_id) == {cv.DOWNSTREAM: 100}


def test_instrumented_dependencys_own_stages_count_as_downstream(store: Store) -> None:
    # The embedder runs tracekit too: its model_execute is the ranker's dependency time,
    # not the ranker's model time.
    b = TraceBuilder(seed=14)
    r = b.request(duration_ms=100)
    r.stage(cv.PREPROCESS, start_ms=0, duration_ms=10, cpu_ms=9)
    call = r.stage(cv.DOWNSTREAM, start_ms=10, duration_ms=90, name="POST /embed")
    server = r.span(
        "POST /embed", start_ms=12, duration_ms=86, kind="SERVER", parent=call, service="embedder"
    )
    r.stage(
        cv.MODEL_EXECUTE,
        start_ms=20,
        duration_ms=70,
        cpu_ms=5,
        gpu_ms=60,
        parent=server,
        service="embedder",
    )
    r.stage(cv.PREPROCESS, start_ms=14, duration_ms=5, cpu_ms=4, parent=server, service="embedder")
    b.load(store)
    assert stage_ms(store, r.trace_id) == {cv.PREPROCESS: 10, cv.DOWNSTREAM: 90}
    stages = {s for (s,) in store.con.execute("SELECT stage FROM request_stages").fetchall()}
    assert cv.MODEL_EXECUTE not in stages
    down = stage_row(store, r.trace_id, cv.DOWNSTREAM)
    assert down["time_kind"] == cv.WAIT and down["wall_ns"] == 90 * MS
    assert down["cpu_time_ns"] is None and down["gpu_time_ns"] is None
    pre = stage_row(store, r.trace_id, cv.PREPROCESS)
    assert pre["wall_ns"] == 10 * MS and pre["cpu_time_ns"] == 9 * MS  # not the embedder's


def test_another_services_stages_outside_a_downstream_call_keep_their_stage(
    store: Store,
) -> None:
    # A gateway's request span above the ranker: the ranker's stages are the request's.
    b = TraceBuilder(seed=15)
    r = b.request(duration_ms=100, service="gateway")
    server = r.span("POST /predict", start_ms=0, duration_ms=100, kind="SERVER", service="ranker")
    r.stage(cv.MODEL_EXECUTE, start_ms=10, duration_ms=80, parent=server, service="ranker")
    b.load(store)
    assert stage_ms(store, r.trace_id) == {cv.UNATTRIBUTED: 20, cv.MODEL_EXECUTE: 80}


def test_nested_same_stage_span_adds_no_cpu_time(store: Store) -> None:
    b = TraceBuilder(seed=16)
    r = b.request(duration_ms=20)
    outer = r.stage(cv.PREPROCESS, start_ms=0, duration_ms=10, cpu_ms=9, gpu_ms=2)
    r.stage(cv.PREPROCESS, start_ms=2, duration_ms=6, cpu_ms=5, gpu_ms=1, parent=outer)
    # preprocess again inside another stage: still inside the outer preprocess's thread
    model = r.stage(cv.MODEL_EXECUTE, start_ms=8, duration_ms=2, parent=outer)
    r.stage(cv.PREPROCESS, start_ms=8, duration_ms=1, cpu_ms=1, parent=model)
    b.load(store)
    pre = stage_row(store, r.trace_id, cv.PREPROCESS)
    assert pre["wall_ns"] == 10 * MS
    assert pre["cpu_time_ns"] == 9 * MS and pre["gpu_time_ns"] == 2 * MS


def test_unattributed_time_reads_wait_not_compute(store: Store) -> None:
    b = TraceBuilder(seed=17)
    r = b.request(duration_ms=30)
    r.stage(cv.PREPROCESS, start_ms=0, duration_ms=10)
    b.load(store)
    row = stage_row(store, r.trace_id, cv.UNATTRIBUTED)
    assert row["critical_ns"] == 20 * MS and row["time_kind"] == cv.WAIT


def test_nested_stage_span_takes_its_own_stage(store: Store) -> None:
    b = TraceBuilder(seed=5)
    r = b.request(duration_ms=50)
    feat = r.stage(cv.FEATURE_RETRIEVAL, start_ms=0, duration_ms=50)
    r.stage(cv.DOWNSTREAM, start_ms=10, duration_ms=30, parent=feat)
    b.load(store)
    assert stage_ms(store, r.trace_id) == {cv.FEATURE_RETRIEVAL: 20, cv.DOWNSTREAM: 30}


def test_clock_skewed_children_are_clipped_never_negative(store: Store) -> None:
    b = TraceBuilder(seed=6)
    r = b.request(duration_ms=100)
    r.stage(cv.PREPROCESS, start_ms=0, duration_ms=20)
    call = r.stage(cv.DOWNSTREAM, start_ms=20, duration_ms=80)
    # the pricing host's clock runs 15 ms ahead: its span overflows the client span
    r.span("GET /price", start_ms=35, duration_ms=78, kind="SERVER", parent=call, service="pricing")
    r.span("way off", start_ms=500, duration_ms=5, parent=call, service="pricing")
    r.span("before start", start_ms=-10, duration_ms=15, parent=r)  # overlaps the start
    b.load(store)
    got = stage_ms(store, r.trace_id)
    assert got == {cv.PREPROCESS: 20, cv.DOWNSTREAM: 80}
    req = request_row(store, r.trace_id)
    assert req["skewed_spans"] == 3  # two clipped, one wholly outside and ignored
    assert req["duration_ns"] == 100 * MS
    rows = store.con.execute(
        "SELECT min(critical_ns), min(wall_ns) FROM request_stages WHERE trace_id = ?",
        [r.trace_id],
    ).fetchone()
    assert min(rows) >= 0
    assert stage_row(store, r.trace_id, cv.DOWNSTREAM)["wall_ns"] == 80 * MS


def test_batch_root_traces_are_not_requests(store: Store) -> None:
    b = TraceBuilder(seed=7)
    r = serial(b, batch_queue=5, model_execute=10)
    b.batch([r], start_ms=5, duration_ms=10)
    b.load(store)
    report = attribution.refresh(store)
    assert (report.traces, report.requests, report.batch_traces) == (2, 1, 1)
    assert store.con.execute("SELECT count(*) FROM requests").fetchone() == (1,)


def test_traces_without_timestamps_are_skipped_and_counted(store: Store) -> None:
    b = TraceBuilder(seed=8)
    good = serial(b, preprocess=10)
    broken = b.request(duration_ms=10)
    broken.span("no clock", start_ms=None, duration_ms=None)
    b.load(store)
    report = attribution.refresh(store)
    assert report.skipped_no_timestamps == 1 and report.requests == 1
    ids = [t for (t,) in store.con.execute("SELECT trace_id FROM requests").fetchall()]
    assert ids == [good.trace_id]


def test_orphans_inside_the_root_are_walked_under_it(store: Store) -> None:
    b = TraceBuilder(seed=9)
    r = b.request(duration_ms=50)
    r.stage(cv.PREPROCESS, start_ms=0, duration_ms=10)
    r.stage(cv.MODEL_EXECUTE, start_ms=10, duration_ms=40, parent="00000000deadbeef")
    r.span("far away", start_ms=900, duration_ms=10, parent="00000000feedface")
    b.load(store)
    report = attribution.refresh(store)
    assert (report.orphans_attached, report.orphans_dropped) == (1, 1)
    assert stage_ms(store, r.trace_id) == {cv.PREPROCESS: 10, cv.MODEL_EXECUTE: 40}


def test_request_fields_from_the_root_span(store: Store) -> None:
    b = TraceBuilder(seed=10)
    r = b.request(duration_ms=10, weight=20, error=True, attributes={cv.GPU_UTILIZATION: 0.9})
    b.load(store)
    req = request_row(store, r.trace_id)
    assert req["is_error"] is True and req["sample_weight"] == 20.0
    assert req["gpu_utilization"] == 0.9 and req["inflight"] is None
    assert stage_ms(store, r.trace_id) == {cv.UNATTRIBUTED: 10}


def test_refresh_is_idempotent_and_partial_refresh_leaves_others(store: Store) -> None:
    b = TraceBuilder(seed=11)
    r1 = serial(b, preprocess=10, model_execute=20)
    r2 = serial(b, preprocess=5)
    b.load(store)
    snapshot = store.con.execute("SELECT * FROM request_stages ORDER BY ALL").fetchall()
    attribution.refresh(store)
    attribution.refresh(store, [r1.trace_id])
    assert store.con.execute("SELECT * FROM request_stages ORDER BY ALL").fetchall() == snapshot
    # change r1's spans behind refresh's back: only the refreshed trace changes
    store.con.execute(
        "UPDATE spans SET stage = ? WHERE trace_id = ? AND stage = ?",
        [cv.POSTPROCESS, r1.trace_id, cv.MODEL_EXECUTE],
    )
    store.con.execute(
        "UPDATE spans SET stage = ? WHERE trace_id = ?", [cv.POSTPROCESS, r2.trace_id]
    )
    report = attribution.refresh(store, [r1.trace_id])
    assert report.requests == 1
    assert stage_ms(store, r1.trace_id) == {cv.PREPROCESS: 10, cv.POSTPROCESS: 20}
    assert stage_ms(store, r2.trace_id) == {cv.PREPROCESS: 5}
    assert attribution.refresh(store, []).traces == 0


def test_rows_inserted_directly_work_without_the_builder_load(store: Store) -> None:
    b = TraceBuilder(seed=12)
    r = serial(b, feature_retrieval=3, preprocess=4)
    rows = [dict(zip(SPAN_COLUMNS, row, strict=True)) for row in b.rows()]
    store.insert_spans([tuple(row.values()) for row in rows])
    report = attribution.refresh(store)
    assert report.requests == 1 and report.spans == 3
    assert stage_ms(store, r.trace_id) == {cv.FEATURE_RETRIEVAL: 3, cv.PREPROCESS: 4}


def test_partial_refresh_of_many_traces_rebuilds_and_keeps_the_rest(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attribution, "_REBUILD_ABOVE", 0)  # take the rebuild path
    b = TraceBuilder(seed=13)
    r1 = serial(b, preprocess=10)
    r2 = serial(b, model_execute=7)
    b.load(store)
    store.con.execute(
        "UPDATE spans SET stage = ? WHERE trace_id = ?", [cv.POSTPROCESS, r1.trace_id]
    )
    attribution.refresh(store, [r1.trace_id])
    assert stage_ms(store, r1.trace_id) == {cv.POSTPROCESS: 10}
    assert stage_ms(store, r2.trace_id) == {cv.MODEL_EXECUTE: 7}
    assert store.con.execute("SELECT count(*) FROM requests").fetchone() == (2,)
