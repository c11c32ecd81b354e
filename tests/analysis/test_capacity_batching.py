"""Batching advice: the execution reader, the cost curve, the batcher replay, the pick."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.capacity import batching as bt
from tracekit.analysis.capacity.model import BatchOption, Curve
from tracekit.testing import EPOCH_NS, RequestBuilder, TraceBuilder

MS = 1_000_000


def _batched_release(
    builder: TraceBuilder,
    *,
    batches: int = 20,
    size: int = 4,
    every_ms: float = 20.0,
    intercept_ms: float = 2.0,
    per_request_ms: float = 0.5,
    version: str = "v1",
    sizes: list[int] | None = None,
) -> None:
    """Batches as the instrumentation writes them: per member a batch_queue stage and a
    model_execute stage linked to the batch; per batch a tracekit.batch span with a
    model_execute child."""
    for k in range(batches):
        n = sizes[k % len(sizes)] if sizes else size
        t0 = k * every_ms
        close = t0 + n - 1  # members arrive 1 ms apart; the batch is full at the last
        run = intercept_ms + per_request_ms * n
        members = []
        for m in range(n):
            arrive = t0 + m
            r = builder.request(
                start_ms=arrive, duration_ms=close - arrive + run + 1, version=version
            )
            attrs = {
                cv.BATCH_ID: f"b{k}",
                cv.BATCH_SIZE: n,
                cv.QUEUE_FILL_WAIT_NS: round((close - arrive) * MS),
                cv.QUEUE_WORKER_WAIT_NS: 0,
            }
            r.stage(cv.BATCH_QUEUE, start_ms=0, duration_ms=close - arrive, attributes=attrs)
            r.stage(
                cv.MODEL_EXECUTE,
                start_ms=close - arrive,
                duration_ms=run,
                attributes={cv.BATCH_ID: f"b{k}", cv.BATCH_SIZE: n},
            )
            members.append(r)
        span = builder.batch(members, start_ms=close, duration_ms=run + 0.2)
        RequestBuilder(builder, span).stage(
            cv.MODEL_EXECUTE, start_ms=0.1, duration_ms=run, gpu_ms=run * 0.8
        )


# --- replay ---------------------------------------------------------------------------


def test_replay_steady_arrivals_fill_batches_and_wait_for_the_worker() -> None:
    # every 1 ms; full at 4; each batch runs 2 + 1×4 = 6 ms on one worker
    curve = Curve(intercept_ms=2.0, per_request_ms=1.0, batches=0)
    r = bt.replay(np.arange(12.0), max_wait_ms=10.0, max_batch=4, workers=1, curve=curve)
    assert r.sizes.tolist() == [4, 4, 4]
    # batch 1 closes at 3 and starts; batch 2 closes at 7, starts at 9 (worker busy);
    # batch 3 closes at 11, starts at 15
    assert r.fill_ms.tolist() == [3, 2, 1, 0] * 3
    assert r.wait_ms.tolist() == [3, 2, 1, 0, 5, 4, 3, 2, 7, 6, 5, 4]
    assert r.exec_ms == pytest.approx(18.0)


def test_replay_closes_a_batch_at_max_wait_after_its_first_arrival() -> None:
    curve = Curve(intercept_ms=1.0, per_request_ms=0.0, batches=0)
    r = bt.replay([0.0, 1.0, 30.0], max_wait_ms=10.0, max_batch=4, workers=1, curve=curve)
    assert r.sizes.tolist() == [2, 1]
    assert r.wait_ms.tolist() == [10.0, 9.0, 10.0]


def test_replay_takes_what_queued_while_the_collector_waited_for_a_worker() -> None:
    # max wait 0: batches would be singletons, but a 10 ms execution lets the queue grow
    curve = Curve(intercept_ms=10.0, per_request_ms=0.0, batches=0)
    r = bt.replay([0.0, 1.0, 2.0, 3.0], max_wait_ms=0.0, max_batch=8, workers=1, curve=curve)
    # batch {0} runs 0–10; batch {1} closes at 1, starts at 10; meanwhile 2 and 3 queue
    # behind the collector, which took batch {1} at 10, so they go at 20
    assert r.sizes.tolist() == [1, 1, 2]
    assert r.wait_ms.tolist() == [0.0, 9.0, 18.0, 17.0]


def test_replay_with_two_workers_overlaps_batches() -> None:
    curve = Curve(intercept_ms=10.0, per_request_ms=0.0, batches=0)
    r = bt.replay([0.0, 1.0, 2.0], max_wait_ms=0.0, max_batch=1, workers=2, curve=curve)
    assert r.wait_ms.tolist() == [0.0, 0.0, 8.0]


def test_simulate_reports_the_worse_of_normal_and_peak() -> None:
    arrivals = (np.array([0, 1, 100, 101, 102, 103, 104, 105]) * MS).astype(np.int64)
    a = bt._split(arrivals, np.ones(8), [(100 * MS, 200 * MS)], replicas=1)
    curve = Curve(intercept_ms=5.0, per_request_ms=0.0, batches=0)
    opt = bt.simulate(a, max_wait_ms=0.0, max_batch=1, workers=1, curve=curve)
    # normal waits 0 and 4 ms; the peak's six requests 1 ms apart, each run 5 ms, wait
    # 0, 4, 8 … 20 ms: its p95 is the worse
    assert opt.p95_queue_ms == pytest.approx(20.0)
    assert opt.gpu_ms_per_request == pytest.approx(5.0)


# --- curve ----------------------------------------------------------------------------


def test_curve_recovers_intercept_and_slope() -> None:
    rng = np.random.default_rng(1)
    size = rng.integers(1, 33, 500)
    ms = 3.0 + 0.25 * size + rng.normal(0, 0.01, 500)
    c = bt.fit_curve(size, ms)
    assert c.intercept_ms == pytest.approx(3.0, abs=0.01)
    assert c.per_request_ms == pytest.approx(0.25, abs=0.001)
    assert c.batches == 500 and c.r2 is not None and c.r2 > 0.99


def test_curve_clamps_a_negative_slope_and_charges_one_size_per_request() -> None:
    c = bt.fit_curve([1, 2, 3], [5.0, 4.0, 3.0])
    assert c.per_request_ms == 0.0 and c.intercept_ms == pytest.approx(4.0)
    one = bt.fit_curve([4, 4], [8.0, 8.0])
    assert (one.intercept_ms, one.per_request_ms, one.r2) == (0.0, 2.0, None)


# --- pick -----------------------------------------------------------------------------


def test_pick_is_the_cheapest_option_within_the_budget() -> None:
    options = [
        BatchOption(0.0, 1, p95_queue_ms=1.0, gpu_ms_per_request=5.0),
        BatchOption(5.0, 8, p95_queue_ms=6.0, gpu_ms_per_request=1.0),
        BatchOption(2.0, 4, p95_queue_ms=3.0, gpu_ms_per_request=2.0),
        BatchOption(1.0, 4, p95_queue_ms=2.5, gpu_ms_per_request=2.0),
    ]
    assert bt.pick_option(options, 5.0) == options[3]
    assert bt.pick_option(options, 10.0) == options[1]
    assert bt.pick_option(options, 0.5) is None


def test_configs_implement_the_pick() -> None:
    opt = BatchOption(2.5, 16, p95_queue_ms=1.0, gpu_ms_per_request=1.0)
    assert bt.triton_config(opt) == (
        "dynamic_batching {\n  max_queue_delay_microseconds: 2500\n"
        "  preferred_batch_size: [ 16 ]\n}"
    )
    assert (
        bt.tracekit_batcher(opt, 2)
        == "DynamicBatcher(max_batch_size=16, max_wait_ms=2.5, workers=2)"
    )


def test_observed_max_wait_snaps_to_the_grid_past_event_loop_lag() -> None:
    assert bt.observed_max_wait(5.3) == 5.0
    assert bt.observed_max_wait(3.04) == 3.0
    assert bt.observed_max_wait(0.02) == 0.0


# --- reading the store ----------------------------------------------------------------


def test_read_executions_counts_a_batch_once(store) -> None:
    b = TraceBuilder()
    _batched_release(b, batches=3, size=4)
    b.load(store)
    ex = bt.read_executions(store, "v1")
    assert ex is not None
    assert len(ex) == 3
    assert ex.size.tolist() == [4, 4, 4]
    assert ex.batched.all()
    # the batch span's model_execute child: 4 ms, 3.2 ms of device time
    assert ((ex.end_ns - ex.start_ns) / MS).tolist() == pytest.approx([4.0] * 3)
    assert ex.gpu_ns.tolist() == pytest.approx([3.2 * MS] * 3)
    assert ex.instance.tolist() == ["ranker-0"] * 3


def test_read_executions_falls_back_to_the_batch_span_and_to_unbatched_requests(store) -> None:
    b = TraceBuilder()
    r = b.request(start_ms=0, duration_ms=10)
    b.batch([r], start_ms=1, duration_ms=3)
    for i in range(2):
        u = b.request(start_ms=100 + 50 * i, duration_ms=20, version="v2")
        u.stage(cv.MODEL_EXECUTE, start_ms=1, duration_ms=10)
    b.load(store)
    one = bt.read_executions(store, "v1")
    assert one is not None and len(one) == 1
    assert (one.end_ns - one.start_ns).tolist() == [3 * MS] and math.isnan(one.gpu_ns[0])
    two = bt.read_executions(store, "v2")
    assert two is not None and two.size.tolist() == [1, 1] and not two.batched.any()
    assert bt.read_executions(store, "v3") is None


def test_advise_without_batch_spans_gives_none_and_the_flag(store) -> None:
    b = TraceBuilder()
    u = b.request(start_ms=0, duration_ms=20)
    u.stage(cv.MODEL_EXECUTE, start_ms=1, duration_ms=10)
    b.load(store)
    result, flags = bt.advise(
        store,
        "v1",
        arrivals_ns=np.array([EPOCH_NS]),
        weights=np.ones(1),
        peak=[],
        queue_budget_ms=10.0,
    )
    assert result is None
    assert [f.code for f in flags] == [bt.NO_BATCH_SPANS]


def test_advise_replays_the_traced_batcher_and_picks_within_budget(store) -> None:
    b = TraceBuilder()
    _batched_release(b, batches=40, sizes=[1, 2, 4, 8], every_ms=20.0)
    b.load(store)
    # steady arrivals every 2 ms for 2 s; a denser second half is the peak
    arrivals = (
        EPOCH_NS + np.concatenate([np.arange(0, 1000, 2.0), 1000 + np.arange(0, 1000, 1.0)]) * MS
    )
    result, flags = bt.advise(
        store,
        "v1",
        arrivals_ns=arrivals.astype(np.int64),
        weights=np.ones(len(arrivals)),
        peak=[(EPOCH_NS + 1000 * MS, EPOCH_NS + 2000 * MS)],
        queue_budget_ms=10.0,
    )
    assert flags == []
    assert result is not None
    assert result.curve.intercept_ms == pytest.approx(2.0, abs=1e-3)
    assert result.curve.per_request_ms == pytest.approx(0.5, abs=1e-3)
    assert result.workers == 1
    assert result.batch_size_p50 == pytest.approx(3.0)
    assert result.fill_wait_ms_p95 == pytest.approx(7.0)
    assert result.worker_wait_ms_p95 == 0.0
    assert result.observed is not None and result.observed.max_batch == 8
    pick = result.pick
    assert pick is not None and pick.p95_queue_ms <= 10.0
    # the pick is the cheapest of the whole grid within the budget
    grid = bt._split(
        arrivals.astype(np.int64),
        np.ones(len(arrivals)),
        [(EPOCH_NS + 1000 * MS, EPOCH_NS + 2000 * MS)],
        1,
    )
    for w in bt.MAX_WAIT_GRID_MS:
        for mb in bt.MAX_BATCH_GRID:
            o = bt.simulate(grid, max_wait_ms=w, max_batch=mb, workers=1, curve=result.curve)
            if o.p95_queue_ms <= 10.0:
                assert pick.gpu_ms_per_request <= o.gpu_ms_per_request + 1e-9
    # at 1 request per ms, singletons (2.5 ms each) cannot keep up: batching must help
    assert pick.max_batch > 1
    assert pick in result.options
    assert [(o.max_batch, o.max_wait_ms) for o in result.options] == sorted(
        (o.max_batch, o.max_wait_ms) for o in result.options
    )
    assert result.triton is not None and f"[ {pick.max_batch} ]" in result.triton
    assert result.tracekit_batcher == bt.tracekit_batcher(pick, 1)


def test_advise_flags_when_no_option_fits_the_budget(store) -> None:
    b = TraceBuilder()
    _batched_release(b, batches=8, sizes=[1, 4])
    b.load(store)
    arrivals = (EPOCH_NS + np.arange(0, 200, 0.1) * MS).astype(np.int64)
    result, flags = bt.advise(
        store,
        "v1",
        arrivals_ns=arrivals,
        weights=np.ones(len(arrivals)),
        peak=[],
        queue_budget_ms=0.01,
    )
    assert result is not None and result.pick is None and result.triton is None
    assert [f.code for f in flags] == [bt.NO_BATCHING_OPTION]


def test_read_executions_wraps_store_errors(store, monkeypatch) -> None:
    import duckdb

    from tracekit.errors import QueryError

    def broken(sql, params=None):
        raise duckdb.CatalogException("no spans")

    monkeypatch.setattr(store, "run", broken)
    with pytest.raises(QueryError):
        bt.read_executions(store, "v1")
