"""Diff intervals widen where slow requests come in bursts, and only there.

Releases are built as arrays (no store): requests arrive over a time line of one-second
windows, and in the bursty ones a window's conditions slow every request in it together,
as a CPU burst on a busy machine does.
"""

from __future__ import annotations

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.stats import quantile_deltas
from tracekit.analysis.compare.intervals import (
    clustered_quantile_deltas,
    design_effect,
    time_clusters,
)

N = 240
SECONDS = 80


def release(label: str, durations: np.ndarray, start_s: np.ndarray) -> ReleaseData:
    n = len(durations)
    names = (cv.DOWNSTREAM,)
    crit = durations[:, None].copy()
    return ReleaseData(
        label=label,
        trace_ids=np.array([f"{label}{i:030d}" for i in range(n)], dtype=object),
        start_ns=(start_s * 1e9).astype(np.int64),
        duration_ms=durations,
        weights=np.ones(n),
        is_error=np.zeros(n, dtype=bool),
        stages=names,
        stage_ms=crit,
        stage_wall_ms=crit.copy(),
        stage_cpu_ms=np.full((n, 1), np.nan),
        stage_gpu_ms=np.full((n, 1), np.nan),
        time_kinds={cv.DOWNSTREAM: cv.WAIT},
        instance_ids=np.array(["r"] * n, dtype=object),
        inflight=np.full(n, np.nan),
        queue_depth=np.full(n, np.nan),
        cpu_utilization=np.full(n, np.nan),
        gpu_utilization=np.full(n, np.nan),
    )


def bursty(rng: np.random.Generator, label: str, shift_ms: float = 0.0) -> ReleaseData:
    """Three requests per window; one window in twenty is a burst that slows all three."""
    start = np.repeat(np.arange(SECONDS, dtype=np.float64), N // SECONDS)
    start += rng.uniform(0.0, 0.1, N)
    burst = rng.random(SECONDS) < 0.05
    slow = np.repeat(np.where(burst, rng.uniform(40.0, 160.0, SECONDS), 0.0), N // SECONDS)
    return release(label, rng.lognormal(np.log(20.0), 0.3, N) + slow + shift_ms, start)


def independent(rng: np.random.Generator, label: str) -> ReleaseData:
    start = np.sort(rng.uniform(0.0, SECONDS, N))
    return release(label, rng.lognormal(np.log(20.0), 0.5, N), start)


def test_time_clusters_are_dense_windows_of_arrival() -> None:
    start_ns = (np.array([0.0, 0.5, 2.2, 2.9, 7.0]) * 1e9).astype(np.int64)
    assert time_clusters(start_ns).tolist() == [0, 0, 1, 1, 2]


def test_a_burst_counts_once_in_the_design_effect() -> None:
    rng = np.random.default_rng(0)
    rel = bursty(rng, "v1")
    cut = float(np.quantile(rel.duration_ms, 0.95))
    assert design_effect(rel.duration_ms, rel.weights, time_clusters(rel.start_ns), cut) > 1.5
    # Too few windows to tell: the independent interval stands.
    one_window = np.zeros(N, dtype=np.int64)
    assert design_effect(rel.duration_ms, rel.weights, one_window, cut) == 1.0


def test_independent_arrivals_keep_the_independent_intervals() -> None:
    rng = np.random.default_rng(1)
    b, a = independent(rng, "v1"), independent(rng, "v2")
    plain = quantile_deltas(b.duration_ms, a.duration_ms, [0.5, 0.95], seed=3)
    clustered, effects = clustered_quantile_deltas(b, a, [0.5, 0.95], confidence=0.95, seed=3)
    for p, c, (eb, ea) in zip(plain, clustered, effects, strict=True):
        # Windows of independent requests resample like requests: about the same width.
        width, plain_width = c.ci_high - c.ci_low, p.ci_high - p.ci_low
        assert 0.7 * plain_width <= width <= 1.4 * plain_width
        assert eb < 1.6 and ea < 1.6
        assert c.delta == p.delta


def test_bursts_in_an_unchanged_release_are_not_a_regression() -> None:
    # The same system twice: how often does p95 "grow significantly"? Counted as
    # independent requests, bursts make that several times the nominal 2.5%.
    independent_hits = clustered_hits = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        b, a = bursty(rng, "v1"), bursty(rng, "v2")
        (plain,) = quantile_deltas(b.duration_ms, a.duration_ms, [0.95], seed=seed, n_boot=200)
        (c,), _ = clustered_quantile_deltas(b, a, [0.95], confidence=0.95, seed=seed, n_boot=200)
        independent_hits += plain.ci_low > 0
        clustered_hits += c.ci_low > 0
    # Four bursts a release on average: few enough that resampling windows cannot reach
    # the nominal rate either, but it no longer counts each burst three times.
    assert independent_hits >= 6
    assert clustered_hits < independent_hits and clustered_hits <= 6


def test_a_real_shift_in_bursty_releases_is_still_found() -> None:
    rng = np.random.default_rng(7)
    b, a = bursty(rng, "v1"), bursty(rng, "v2", shift_ms=150.0)
    (c,), _ = clustered_quantile_deltas(b, a, [0.95], confidence=0.95, seed=7)
    assert c.ci_low > 50.0
