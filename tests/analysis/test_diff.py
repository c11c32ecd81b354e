"""compute_diff names the stage that explains the tail growth, with the right kind.

These tests build :class:`ReleaseData` directly (seeded per-stage distributions), so
they pin the statistics and the counterfactual rule without the store; the store path
(spans → attribution → diff) is pinned in test_diff_store.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.cohorts import counterfactual as cf
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.compare.diff import compute_diff
from tracekit.render.diff import render_json, render_markdown, render_table

N = 4000

# median ms and log-sd of each built-in stage's critical-path time
BASE = {
    cv.FEATURE_RETRIEVAL: (8.0, 0.3),
    cv.PREPROCESS: (5.0, 0.2),
    cv.BATCH_QUEUE: (10.0, 0.5),
    cv.MODEL_EXECUTE: (15.0, 0.2),
    cv.POSTPROCESS: (3.0, 0.2),
    cv.DOWNSTREAM: (20.0, 0.4),
}


def draw(
    rng: np.random.Generator,
    override: dict[str, tuple[float, float]] | None = None,
    n: int = N,
) -> dict[str, np.ndarray]:
    spec = {**BASE, **(override or {})}
    return {s: rng.lognormal(np.log(m), sd, n) for s, (m, sd) in spec.items()}


def release(
    label: str,
    stages: dict[str, np.ndarray],
    *,
    cpu: dict[str, np.ndarray] | None = None,
    cpu_utilization: float | None = None,
    rng: np.random.Generator | None = None,
) -> ReleaseData:
    names = cv.order_stages(list(stages))
    n = len(next(iter(stages.values())))
    crit = np.column_stack([stages[s] for s in names])
    cpu_ms = np.full((n, len(names)), np.nan)
    for s, values in (cpu or {}).items():
        cpu_ms[:, names.index(s)] = values
    util = np.full(n, np.nan)
    if cpu_utilization is not None:
        util = cpu_utilization + (rng or np.random.default_rng(0)).uniform(-0.03, 0.03, n)
    return ReleaseData(
        label=label,
        trace_ids=np.array([f"{label}{i:030d}" for i in range(n)], dtype=object),
        start_ns=np.arange(n, dtype=np.int64) * 1_000_000,
        duration_ms=crit.sum(axis=1),
        weights=np.ones(n),
        is_error=np.zeros(n, dtype=bool),
        stages=names,
        stage_ms=crit,
        stage_wall_ms=crit.copy(),
        stage_cpu_ms=cpu_ms,
        stage_gpu_ms=np.full((n, len(names)), np.nan),
        time_kinds={s: cv.default_time_kind(s) for s in names},  # what refresh stores
        instance_ids=np.array(["ranker-0"] * n, dtype=object),
        inflight=np.full(n, np.nan),
        queue_depth=np.full(n, np.nan),
        cpu_utilization=util,
        gpu_utilization=np.full(n, np.nan),
    )


@pytest.mark.parametrize("stage", cv.STAGES)
def test_each_stage_regressing_alone_is_named_with_its_kind(stage: str) -> None:
    rng = np.random.default_rng(list(cv.STAGES).index(stage))
    before = release("v1", draw(rng))
    median, sd = BASE[stage]
    after = release("v2", draw(rng, {stage: (median * 3.0, sd + 0.2)}))
    result = compute_diff(before, after, seed=1)
    assert result.verdict.primary_stage == stage
    assert result.verdict.kind == cv.default_time_kind(stage)
    assert result.verdict.share > 0.6
    assert stage in result.verdict.summary
    assert result.verdict.summary.startswith("p99 grew")


def test_cache_miss_regression_is_not_blamed_on_heavy_tailed_downstream() -> None:
    # The pitfall DESIGN describes: downstream has a heavy tail in both releases; the
    # after release misses the feature cache far more often (and a miss takes 60 ms).
    rng = np.random.default_rng(7)

    def stages(miss_rate: float) -> dict[str, np.ndarray]:
        s = draw(rng, {cv.DOWNSTREAM: (20.0, 0.6)})
        miss = rng.random(N) < miss_rate
        s[cv.FEATURE_RETRIEVAL] = np.where(miss, rng.normal(60.0, 4.0, N), rng.normal(2.0, 0.3, N))
        return s

    result = compute_diff(release("v1", stages(0.02)), release("v2", stages(0.4)), seed=2)
    assert result.verdict.primary_stage == cv.FEATURE_RETRIEVAL
    assert result.verdict.kind == cv.WAIT
    by_name = {s.name: s for s in result.stages}
    assert by_name[cv.DOWNSTREAM].share < 0.2
    assert by_name[cv.FEATURE_RETRIEVAL].share > 0.6


def test_unattributed_growth_is_primary_unattributed() -> None:
    rng = np.random.default_rng(3)
    b = draw(rng)
    b[cv.UNATTRIBUTED] = rng.uniform(0.5, 1.5, N)
    a = draw(rng)
    a[cv.UNATTRIBUTED] = rng.uniform(0.5, 1.5, N) + rng.exponential(25.0, N)
    result = compute_diff(release("v1", b), release("v2", a), seed=3)
    assert result.verdict.primary_stage == cv.UNATTRIBUTED
    assert result.verdict.kind == cv.WAIT
    by_name = {s.name: s for s in result.stages}
    assert by_name[cv.UNATTRIBUTED].time_kind == cv.WAIT
    assert not by_name[cv.UNATTRIBUTED].hidden_wait
    summary = result.verdict.summary
    assert "of it is unattributed time (in no stage)" in summary
    assert "add a tracekit.stage around it" in summary
    assert "compute" not in summary and "unattributed wait" not in summary


def test_unattributed_kind_defaults_to_wait_when_no_release_declares_it() -> None:
    rng = np.random.default_rng(4)
    b, a = draw(rng), draw(rng)
    a[cv.UNATTRIBUTED] = rng.exponential(25.0, N)
    before, after = release("v1", b), release("v2", a)
    after.time_kinds.pop(cv.UNATTRIBUTED)
    assert cf.declared_kind(before, after, cv.UNATTRIBUTED) == cv.WAIT


def _model_cpu(
    rng: np.random.Generator, wall: np.ndarray, cpu_follows: bool, base: np.ndarray
) -> np.ndarray:
    return (wall if cpu_follows else base) * rng.uniform(0.9, 0.95, len(wall))


def test_compute_stage_whose_cpu_time_stayed_flat_is_hidden_wait() -> None:
    rng = np.random.default_rng(4)
    b = draw(rng)
    a = draw(rng, {cv.MODEL_EXECUTE: (40.0, 0.4)})
    before = release("v1", b, cpu={cv.MODEL_EXECUTE: b[cv.MODEL_EXECUTE] * 0.9})
    # wall time of model_execute grew, the CPU it used did not (contention, GIL)
    after = release("v2", a, cpu={cv.MODEL_EXECUTE: rng.lognormal(np.log(13.5), 0.2, N)})
    result = compute_diff(before, after, seed=4)
    assert result.verdict.primary_stage == cv.MODEL_EXECUTE
    assert result.verdict.kind == cv.HIDDEN_WAIT
    assert "hidden_wait" in {f.code for f in result.flags}
    assert "not the model's compute" in result.verdict.summary


def test_compute_stage_whose_cpu_time_grew_with_it_is_compute() -> None:
    rng = np.random.default_rng(5)
    b = draw(rng)
    a = draw(rng, {cv.MODEL_EXECUTE: (40.0, 0.4)})
    before = release("v1", b, cpu={cv.MODEL_EXECUTE: b[cv.MODEL_EXECUTE] * 0.9})
    after = release("v2", a, cpu={cv.MODEL_EXECUTE: a[cv.MODEL_EXECUTE] * 0.9})
    result = compute_diff(before, after, seed=5)
    assert result.verdict.kind == cv.COMPUTE
    assert not any(s.hidden_wait for s in result.stages)


def test_no_change_gives_verdict_none() -> None:
    rng = np.random.default_rng(6)
    result = compute_diff(release("v1", draw(rng)), release("v2", draw(rng)), seed=6)
    assert result.verdict.kind == "none"
    assert result.verdict.primary_stage is None
    assert result.verdict.summary.startswith("No significant tail change")
    p99 = next(r for r in result.latency if r.quantile == "p99")
    assert p99.ci_low < 0 < p99.ci_high


def test_small_samples_widen_the_cohort_and_say_so() -> None:
    rng = np.random.default_rng(8)
    before = release("v1", draw(rng, n=60))
    after = release("v2", draw(rng, {cv.BATCH_QUEUE: (60.0, 0.5)}, n=60))
    result = compute_diff(before, after, seed=8)
    assert result.tail.widened and result.tail.cohort == "p95"
    codes = {f.code for f in result.flags}
    assert {"tail_widened", "few_requests"} <= codes
    assert result.verdict.summary.startswith("p95")


def test_flat_cpu_while_tail_grew_raises_wrong_scaling_signal() -> None:
    rng = np.random.default_rng(9)
    before = release("v1", draw(rng), cpu_utilization=0.33, rng=rng)
    after = release("v2", draw(rng, {cv.BATCH_QUEUE: (45.0, 0.6)}), cpu_utilization=0.35, rng=rng)
    flags = {f.code: f.message for f in compute_diff(before, after, seed=9).flags}
    assert "wrong_scaling_signal" in flags
    assert "could not have fired" in flags["wrong_scaling_signal"]

    busy = release("v2", draw(rng, {cv.BATCH_QUEUE: (45.0, 0.6)}), cpu_utilization=0.9, rng=rng)
    assert "wrong_scaling_signal" not in {f.code for f in compute_diff(before, busy).flags}


def test_exemplars_carry_most_primary_stage_time_and_jaeger_links() -> None:
    rng = np.random.default_rng(10)
    before = release("v1", draw(rng))
    after = release("v2", draw(rng, {cv.DOWNSTREAM: (60.0, 0.6)}))
    result = compute_diff(before, after, jaeger_url="http://jaeger:16686/")
    assert len(result.exemplars) == 3
    assert all(e.duration_ms >= result.tail.threshold_after_ms for e in result.exemplars)
    assert result.exemplars[0].url == f"http://jaeger:16686/trace/{result.exemplars[0].trace_id}"
    stage_ms = [e.primary_stage_ms for e in result.exemplars]
    assert stage_ms == sorted(stage_ms, reverse=True)


def test_json_carries_every_contract_field() -> None:
    rng = np.random.default_rng(11)
    before = release("v1", draw(rng))
    after = release("v2", draw(rng, {cv.BATCH_QUEUE: (45.0, 0.6)}))
    doc = json.loads(render_json(compute_diff(before, after)))
    assert doc["before"] == {"label": "v1", "requests": N, "estimated_requests": N}
    assert doc["after"]["label"] == "v2"
    assert [r["quantile"] for r in doc["latency"]] == ["p50", "p90", "p95", "p99"]
    latency_keys = {
        "before",
        "after",
        "delta",
        "ci_low",
        "ci_high",
        "rel_delta",
        "rel_ci_low",
        "rel_ci_high",
    }
    assert latency_keys <= set(doc["latency"][0])
    assert set(doc["tail"]) >= {
        "cohort", "threshold_before_ms", "threshold_after_ms", "requests_before",
        "requests_after", "widened", "reason",
    }  # fmt: skip
    stage_keys = {
        "name", "time_kind", "tail_before_ms", "tail_after_ms", "tail_delta_ms", "share",
        "counterfactual_p99_removed_ms", "cpu_tail_before_ms", "gpu_tail_after_ms", "hidden_wait",
    }  # fmt: skip
    assert all(stage_keys <= set(s) for s in doc["stages"])
    assert set(doc["verdict"]) >= {"primary_stage", "kind", "summary"}
    assert doc["verdict"]["kind"] in {"wait", "compute", "hidden_wait", "none"}
    assert isinstance(doc["attributes"], list) and isinstance(doc["flags"], list)
    assert {"trace_id", "duration_ms", "url"} <= set(doc["exemplars"][0])
    shares = [s["share"] for s in doc["stages"] if s["share"]]
    assert sum(shares) <= 1.0 + 1e-9


def test_table_and_markdown_lead_with_the_verdict() -> None:
    rng = np.random.default_rng(12)
    result = compute_diff(
        release("v1", draw(rng)), release("v2", draw(rng, {cv.BATCH_QUEUE: (45.0, 0.6)}))
    )
    table = render_table(result)
    assert table.splitlines()[0].startswith("p99 grew")
    assert "batch_queue" in table and "p99" in table
    markdown = render_markdown(result)
    assert f"**{result.verdict.summary}**" in markdown
    assert "| batch_queue |" in markdown
