"""Summary and slow-vs-fast on one release (pure functions over ReleaseData)."""

from __future__ import annotations

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.compare.summary import compute_slow_fast, compute_summary


def one_release(n: int, seed: int) -> ReleaseData:
    rng = np.random.default_rng(seed)
    stages = (cv.BATCH_QUEUE, cv.MODEL_EXECUTE, cv.DOWNSTREAM)
    queue = rng.exponential(10.0, n)  # the heavy-tailed stage
    model = rng.normal(20.0, 1.0, n)
    down = rng.normal(30.0, 2.0, n)
    crit = np.column_stack([queue, model, down])
    nan = np.full((n, 3), np.nan)
    return ReleaseData(
        label="v1",
        trace_ids=np.array([f"{i:032x}" for i in range(n)], dtype=object),
        start_ns=np.arange(n, dtype=np.int64),
        duration_ms=crit.sum(axis=1),
        weights=np.ones(n),
        is_error=np.zeros(n, dtype=bool),
        stages=stages,
        stage_ms=crit,
        stage_wall_ms=crit.copy(),
        stage_cpu_ms=nan,
        stage_gpu_ms=nan.copy(),
        time_kinds={s: cv.default_time_kind(s) for s in stages},
        instance_ids=np.array(["a"] * n, dtype=object),
        inflight=np.full(n, np.nan),
        queue_depth=np.full(n, np.nan),
        cpu_utilization=np.full(n, np.nan),
        gpu_utilization=np.full(n, np.nan),
    )


def test_summary_splits_the_tail_and_names_the_queue() -> None:
    s = compute_summary(one_release(3000, 1))
    assert s.cohort == "p99" and not s.flags
    assert abs(sum(st.tail_share for st in s.stages) - 1.0) < 1e-9
    assert max(s.stages, key=lambda st: st.tail_share).name == cv.BATCH_QUEUE
    assert "batch_queue wait" in s.summary and "not the model" in s.summary
    assert s.latency["p50"] < s.latency["p90"] < s.latency["p99"]


def test_slow_vs_fast_blames_the_queue_and_widens_small_cohorts() -> None:
    r = compute_slow_fast(one_release(3000, 2))
    assert r.primary_stage == cv.BATCH_QUEUE and r.kind == cv.WAIT
    assert abs(sum(g.share for g in r.stages) - 1.0) < 1e-9
    assert len(r.exemplars) == 3
    small = compute_slow_fast(one_release(200, 3))
    assert small.widened and small.cohort == "p95"
    assert {"tail_widened"} <= {f.code for f in small.flags}
