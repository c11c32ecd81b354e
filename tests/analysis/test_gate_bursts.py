"""The gate's intervals respect bursts: one slow second is one piece of evidence.

On a busy machine slow requests arrive together (a scheduler hiccup, a neighbour's
compile step): counted as independent draws, one burst that lands on the after release
fails an unchanged release. The gate resamples whole one-second arrival windows, as
``tracekit diff`` does (:mod:`tracekit.analysis.compare.intervals`); these tests pin
that down on :class:`ReleaseData` built directly (no store), seeded, a minute of traffic.

Where a test contrasts with the old behaviour it runs the *same requests* with their
arrivals squeezed into fewer than ``MIN_CLUSTERS`` one-second windows: there the gate
falls back to the independent bootstrap it used before, and fails.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.analysis.test_gate import latency_release, lognormal, release
from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.stats import deltas_from_replicates, window_bootstrap_quantiles
from tracekit.analysis.compare.intervals import (
    MIN_CLUSTERS,
    clustered_quantile_deltas,
    release_replicates,
)
from tracekit.analysis.gate.budgets import parse_budgets
from tracekit.analysis.gate.evaluate import BURSTY_TAIL, evaluate_gate
from tracekit.analysis.results import FAIL, PASS
from tracekit.render.gate import render_json

SECONDS = 60
RATE = 50  # requests per second: 3,000 per release, p99 rests on 30 of them


def _arrivals(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.sort(rng.uniform(0.0, SECONDS * 1000.0, n))


def _squeezed(r: ReleaseData) -> ReleaseData:
    """The same requests arriving within a few seconds: fewer windows than MIN_CLUSTERS."""
    t0 = r.start_ns.min()
    start = t0 + (r.start_ns - t0) // (SECONDS // 5)
    out = ReleaseData(**{**r.__dict__, "start_ns": start.astype(np.int64)})
    assert (out.start_ns.max() - t0) / 1e9 < MIN_CLUSTERS
    return out


def unchanged_with_burst(seed: int, burst: int = 45) -> tuple[ReleaseData, ReleaseData]:
    """Both releases from one distribution; the after release also got ``burst`` requests
    within one second, mid-run, each 150 ms slower (a stall every request in it shared)."""
    rng = np.random.default_rng(seed)
    n = SECONDS * RATE
    before = latency_release("v1", lognormal(rng, n), start_ms=_arrivals(rng, n))
    start = np.concatenate([_arrivals(rng, n), 30_000.0 + rng.uniform(0.0, 1000.0, burst)])
    values = np.concatenate([lognormal(rng, n), lognormal(rng, burst) + 150.0])
    order = np.argsort(start, kind="stable")
    return before, latency_release("v2", values[order], start_ms=start[order])


def regressed_over_time(seed: int) -> tuple[ReleaseData, ReleaseData]:
    """5% of the after release's requests, spread over the whole minute, 80 ms slower."""
    rng = np.random.default_rng(seed)
    n = SECONDS * RATE
    before = latency_release("v1", lognormal(rng, n), start_ms=_arrivals(rng, n))
    slow = np.where(rng.random(n) < 0.05, 80.0, 0.0)
    return before, latency_release("v2", lognormal(rng, n) + slow, start_ms=_arrivals(rng, n))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_slow_burst_in_an_unchanged_release_does_not_fail(seed: int) -> None:
    before, after = unchanged_with_burst(seed)
    result = evaluate_gate(before, after)
    assert result.result != FAIL, [(c.name, c.result, c.ci_low, c.ci_high) for c in result.checks]
    p99 = next(c for c in result.checks if c.quantile == 0.99)
    # The interval is wide enough to hold "no change": the burst may or may not recur.
    assert p99.ci_low < 0.10 < p99.ci_high
    codes = [w.code for w in result.warnings]
    assert codes.count(BURSTY_TAIL) == 1
    # Request-level resampling (the old gate) reads the burst as 45 independent slow
    # requests and fails p99: the same requests, arrivals squeezed into a few windows.
    old = evaluate_gate(_squeezed(before), _squeezed(after))
    assert old.result == FAIL
    assert BURSTY_TAIL not in [w.code for w in old.warnings]


@pytest.mark.parametrize("seed", [100, 101, 102])
def test_a_regression_spread_over_time_still_fails(seed: int) -> None:
    before, after = regressed_over_time(seed)
    result = evaluate_gate(before, after)
    assert result.result == FAIL
    assert all(c.result == FAIL for c in result.checks)
    assert BURSTY_TAIL not in [w.code for w in result.warnings]
    # Independent arrivals: windows change the interval little (about the design
    # effect, ~1), so a real regression does not read as "none" on a quiet run either.
    old = evaluate_gate(_squeezed(before), _squeezed(after))
    for new_check, old_check in zip(result.checks, old.checks, strict=True):
        new_width = new_check.ci_high - new_check.ci_low
        old_width = old_check.ci_high - old_check.ci_low
        assert new_width < 1.6 * old_width


def test_a_burst_in_a_stage_budget_is_widened_too() -> None:
    rng = np.random.default_rng(7)
    n = SECONDS * RATE
    start_b, start_a = _arrivals(rng, n), _arrivals(rng, n)
    queue_a = lognormal(rng, n, 8.0, 0.5)
    burst = (start_a >= 20_000.0) & (start_a < 21_000.0)
    queue_a[burst] += 120.0  # one second of a stalled batch queue: every request in it
    before = release(
        "v1",
        {cv.BATCH_QUEUE: lognormal(rng, n, 8.0, 0.5), cv.MODEL_EXECUTE: lognormal(rng, n, 20.0)},
        start_ms=start_b,
    )
    after = release(
        "v2", {cv.BATCH_QUEUE: queue_a, cv.MODEL_EXECUTE: lognormal(rng, n, 20.0)}, start_ms=start_a
    )
    budgets = parse_budgets(["stage.batch_queue.p99 <= +20%"])
    result = evaluate_gate(before, after, budgets)
    assert result.result != FAIL
    burst_warning = next(w for w in result.warnings if w.code == BURSTY_TAIL)
    assert "batch_queue p99" in burst_warning.message
    assert evaluate_gate(_squeezed(before), _squeezed(after), budgets).result == FAIL


def test_an_absolute_budget_ignores_bursts_in_the_baseline() -> None:
    # The burst is in the before release; an absolute budget reads only the after one.
    after, before = unchanged_with_burst(3)
    before = ReleaseData(**{**before.__dict__, "label": "v1"})
    after = ReleaseData(**{**after.__dict__, "label": "v2"})
    result = evaluate_gate(before, after, parse_budgets(["p99 < 500ms"]))
    assert result.result == PASS
    assert BURSTY_TAIL not in [w.code for w in result.warnings]
    relative = evaluate_gate(before, after, parse_budgets(["p99 <= +10%"]))
    warning = next(w for w in relative.warnings if w.code == BURSTY_TAIL)
    assert "v1 ×" in warning.message and "v2 ×" not in warning.message


def test_bursty_tail_is_in_the_json_and_the_seed_reproduces_the_result() -> None:
    before, after = unchanged_with_burst(0)
    first = json.loads(render_json(evaluate_gate(before, after, seed=11, n_boot=500)))
    again = json.loads(render_json(evaluate_gate(before, after, seed=11, n_boot=500)))
    assert first == again
    (warning,) = [w for w in first["warnings"] if w["code"] == BURSTY_TAIL]
    assert warning["message"].startswith("requests at or above p")
    other = json.loads(render_json(evaluate_gate(before, after, seed=12, n_boot=500)))
    assert [c["ci_high"] for c in other["checks"]] != [c["ci_high"] for c in first["checks"]]


def test_fewer_windows_than_min_clusters_is_the_independent_bootstrap() -> None:
    rng = np.random.default_rng(5)
    n = 2000
    values = lognormal(rng, n)
    weights = np.where(rng.random(n) < 0.2, 4.0, 1.0)
    # Arrivals every 5 ms: ten one-second windows, fewer than MIN_CLUSTERS.
    start_ns = (np.arange(n) * 5e6).astype(np.int64)
    reps, effects, windows = release_replicates(
        values, weights, start_ns, [0.95, 0.99], n_boot=300, rng=np.random.default_rng(9)
    )
    independent = window_bootstrap_quantiles(
        values, [0.95, 0.99], weights, n_boot=300, rng=np.random.default_rng(9)
    )
    assert windows == 10 < MIN_CLUSTERS
    assert effects == [1.0, 1.0]
    np.testing.assert_array_equal(reps, independent)


def test_release_replicates_are_the_draws_the_diff_makes() -> None:
    # The gate and the diff resample alike: the diff's intervals rebuilt from
    # release_replicates (before, then after, one generator) are the diff's own.
    before, after = unchanged_with_burst(4)
    qs = [0.5, 0.95, 0.99]
    rng = np.random.default_rng(21)
    rb, eb, kb = release_replicates(
        before.duration_ms, before.weights, before.start_ns, qs, n_boot=200, rng=rng
    )
    ra, ea, ka = release_replicates(
        after.duration_ms, after.weights, after.start_ns, qs, n_boot=200, rng=rng
    )
    assert kb >= MIN_CLUSTERS and ka >= MIN_CLUSTERS
    deltas, effects = clustered_quantile_deltas(
        before, after, qs, confidence=0.95, seed=21, n_boot=200
    )
    rebuilt = deltas_from_replicates(
        before.duration_ms,
        after.duration_ms,
        qs,
        np.array([d.before for d in deltas]),
        np.array([d.after for d in deltas]),
        rb,
        ra,
        confidence=0.95,
    )
    assert rebuilt == deltas
    assert effects == list(zip(eb, ea, strict=True))


@pytest.mark.parametrize("near_se", [8.0, 0.05])
def test_the_gate_reads_replicates_near_the_rank_exactly(
    near_se: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The gate's faster read of the cluster bootstrap gives the diff's replicates, also
    # with fractional weights and when most replicates fall outside the slice it reads
    # (a tiny slice: every such replicate is redone over all requests).
    from tracekit.analysis.compare import intervals as iv

    monkeypatch.setattr(iv, "_NEAR_SE", near_se)
    rng = np.random.default_rng(8)
    n = 4000
    x = lognormal(rng, n)
    start_ns = np.sort(rng.uniform(0.0, 40e9, n)).astype(np.int64)
    x[(start_ns > 10e9) & (start_ns < 11e9)] += 150.0  # a burst
    w = np.where(rng.random(n) < 0.3, 2.5, 1.0)
    windows = iv._Windows(w, iv.time_clusters(start_ns))
    qs = [0.5, 0.95, 0.99]
    effects = [windows.design_effect(x, float(p)) for p in iv.weighted_quantiles(x, qs, w)]
    full = iv._window_resample(x, qs, windows, 300, np.random.default_rng(2))
    near = iv._window_resample_near(x, qs, windows, effects, 300, np.random.default_rng(2))
    np.testing.assert_allclose(near, full, rtol=0, atol=0)
