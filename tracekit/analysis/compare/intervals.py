"""Quantile-delta intervals that respect requests arriving in bursts of shared conditions.

The bootstrap of :mod:`tracekit.analysis.cohorts.stats` treats every request as an
independent draw. Requests that arrive within the same second are not: a garbage
collection, a CPU burst of a neighbour, a slow second of a dependency slows them
together, and on a busy machine the tail cohort is a handful of such bursts, five slow
requests from one of them. Counted as independent evidence, one burst that happened to
land on the after release makes an unchanged release "significantly" slower.

So the interval of each quantile delta is widened by that quantile's **design effect**
(Kish), estimated from the data: requests are grouped by arrival time into windows of
:data:`CLUSTER_S`, and the design effect is the ratio of the cluster-robust variance of
the quantile's estimating equation (the share of requests at or above it, summed per
window) to its variance under independence — the sandwich estimator's ratio, as in
Woodruff's interval for quantiles of a cluster sample. A release's bootstrap replicates
are spread around its point estimate by the square root of that ratio, never narrowed
(a ratio below one is read as one), and only with at least :data:`MIN_CLUSTERS` windows:
with fewer, the data cannot say how requests cluster, and the independent bootstrap
stands. When requests arrive independently the ratio is about one and the intervals are
those of :func:`~tracekit.analysis.cohorts.stats.quantile_deltas`, replicate for
replicate (the same seed draws the same resamples).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.stats import (
    DEFAULT_BOOTSTRAP,
    QuantileDelta,
    deltas_from_replicates,
    weighted_quantiles,
    window_bootstrap_quantiles,
)

CLUSTER_S = 1.0
"""Width of the arrival-time windows whose requests may share conditions. A second spans
the bursts seen on a loaded machine (a scheduler hiccup, a neighbour's compile step, a
collector flush) while leaving minutes of traffic hundreds of windows to estimate from."""
MIN_CLUSTERS = 20
"""Fewest non-empty windows for the design effect to be estimated at all."""


def time_clusters(
    start_ns: npt.NDArray[np.int64], width_s: float = CLUSTER_S
) -> npt.NDArray[np.int64]:
    """Window index (0, 1, …, dense) of each request's arrival, windows ``width_s`` wide."""
    if len(start_ns) == 0:
        return np.zeros(0, dtype=np.int64)
    bins = (start_ns - start_ns.min()) // max(1, int(width_s * 1e9))
    steps = np.diff(bins)
    if np.all(steps >= 0):
        # Requests in arrival order (as a release is loaded): number the windows by
        # counting where the window changes, without np.unique's sort.
        return np.concatenate(([0], np.cumsum(steps > 0))).astype(np.int64)
    _, dense = np.unique(bins, return_inverse=True)
    return dense.astype(np.int64)


def design_effect(
    values: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    clusters: npt.NDArray[np.int64],
    cut: float,
) -> float:
    """Cluster-robust over independent variance of the share of requests at or above
    ``cut`` (weighted); 1.0 when it cannot be estimated or is below one."""
    return _Windows(weights, clusters).design_effect(values, cut)


class _Windows:
    """Per-window sums of one release, computed once for all of its quantiles."""

    def __init__(self, weights: npt.NDArray[np.float64], clusters: npt.NDArray[np.int64]) -> None:
        self.weights = weights
        self.clusters = clusters
        self.k = int(clusters.max()) + 1 if len(clusters) else 0
        self.mass = np.bincount(clusters, weights=weights, minlength=self.k)
        self.total = float(self.mass.sum())
        # Unit weights (unsampled): Σw² is the count, exactly. np.dot would give the same
        # number but wakes OpenBLAS's threads for a million requests, which then spin on
        # the core the diff's other thread needs (~0.3 s CPU per diff at 2 x 1M).
        self.unit = bool(len(weights) == 0 or (weights[0] == 1.0 and np.all(weights == 1.0)))
        self.squares = float(len(weights)) if self.unit else float(np.dot(weights, weights))

    def design_effect(self, values: npt.NDArray[np.float64], cut: float) -> float:
        if self.k < MIN_CLUSTERS or not math.isfinite(cut) or self.total <= 0:
            return 1.0
        # Only the requests at or above the cut are touched: for p99 of a million
        # requests that is ten thousand, not a million.
        above = np.flatnonzero(values >= cut)
        w = self.weights[above]
        p = float(w.sum()) / self.total
        tail_squares = float(len(w)) if self.unit else float(np.dot(w, w))
        # Σ w²(z - p)², split by z = 1 (at or above the cut) and z = 0.
        independent = (1.0 - p) ** 2 * tail_squares + p**2 * (self.squares - tail_squares)
        if independent <= 0:
            return 1.0
        per_window = np.bincount(self.clusters[above], weights=w, minlength=self.k) - p * self.mass
        clustered = float(np.dot(per_window, per_window)) * self.k / (self.k - 1)
        return max(1.0, clustered / independent)


def clustered_quantile_deltas(
    before: ReleaseData,
    after: ReleaseData,
    qs: Sequence[float],
    *,
    confidence: float,
    seed: int = 0,
    n_boot: int = DEFAULT_BOOTSTRAP,
    width_s: float = CLUSTER_S,
) -> tuple[list[QuantileDelta], list[tuple[float, float]]]:
    """Quantile changes with bootstrap intervals that resample whole arrival windows.

    Returns the deltas and, per quantile, each release's (before, after) design effect.
    """
    rng = np.random.default_rng(seed)
    b, a = before.duration_ms, after.duration_ms
    qb = weighted_quantiles(b, qs, before.weights)
    qa = weighted_quantiles(a, qs, after.weights)
    wb = _Windows(before.weights, time_clusters(before.start_ns, width_s))
    wa = _Windows(after.weights, time_clusters(after.start_ns, width_s))
    # Drawn in quantile_deltas' order (before, then after) from the same generator.
    rb = _replicates(b, qs, qb, wb, n_boot, rng)
    ra = _replicates(a, qs, qa, wa, n_boot, rng)
    effects = [
        (wb.design_effect(b, float(qb[i])), wa.design_effect(a, float(qa[i])))
        for i in range(len(qs))
    ]
    return deltas_from_replicates(b, a, qs, qb, qa, rb, ra, confidence=confidence), effects


def release_replicates(
    values: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    start_ns: npt.NDArray[np.int64],
    qs: Sequence[float],
    *,
    n_boot: int,
    rng: np.random.Generator,
    width_s: float = CLUSTER_S,
) -> tuple[npt.NDArray[np.float64], list[float], int]:
    """One release's bootstrap replicates (n_boot × len(qs)) of the quantiles of
    ``values`` (its durations or a stage's column), drawn as
    :func:`clustered_quantile_deltas` draws them, with each quantile's design effect and
    the number of arrival windows. For callers that combine replicates themselves (the
    gate's relative, delta and absolute budgets)."""
    windows = _Windows(weights, time_clusters(start_ns, width_s))
    point = weighted_quantiles(values, qs, weights)
    effects = [windows.design_effect(values, float(p)) for p in point]
    if windows.k >= MIN_CLUSTERS and len(values) <= MAX_CLUSTER_BOOTSTRAP:
        # The gate draws five times the diff's replicates: read each replicate's quantile
        # near its rank instead of summing every request (same draws, same quantiles).
        reps = _window_resample_near(values, qs, windows, effects, n_boot, rng)
    else:
        reps = _replicates(values, qs, point, windows, n_boot, rng)
    return reps, effects, windows.k


_NEAR_SE = 8.0
"""Half-width, in standard errors of the rank (design effect included), of the slice of
sorted requests :func:`_window_resample_near` reads; replicates outside it are redone."""


def _window_resample_near(
    x: npt.NDArray[np.float64],
    qs: Sequence[float],
    windows: _Windows,
    effects: Sequence[float],
    n_boot: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.float64]:
    """:func:`_window_resample`'s replicates (the same Poisson counts, drawn in the same
    order) without a cumulative sum over every request per replicate: the mass below a
    slice around the quantile's rank is one dot product of the window counts with each
    window's mass below the slice, so only the slice is summed request by request."""
    n, k = len(x), windows.k
    order = np.argsort(x, kind="stable")
    xs, ws, cs = x[order], windows.weights[order], windows.clusters[order]
    cum = np.cumsum(ws)
    out = np.empty((n_boot, len(qs)))
    counts_all = rng.poisson(1.0, size=(n_boot, k)).astype(np.float64)
    totals = counts_all @ windows.mass
    for j, q in enumerate(qs):
        centre = int(np.searchsorted(cum, q * cum[-1], side="left"))
        se = math.sqrt(max(effects[j], 1.0) * n * q * (1.0 - q))
        half = math.ceil(_NEAR_SE * se) + 16
        lo, hi = max(0, centre - half), min(n, centre + half + 1)
        below = np.bincount(cs[:lo], weights=ws[:lo], minlength=k)
        chunk = max(1, 5_000_000 // max(hi - lo, k, 1))
        for start in range(0, n_boot, chunk):
            counts = counts_all[start : start + chunk]
            total = totals[start : start + chunk]
            target = q * total
            seg = np.cumsum(counts[:, cs[lo:hi]] * ws[lo:hi], axis=1) + (counts @ below)[:, None]
            idx = lo + (seg < target[:, None]).sum(axis=1)
            # Outside the slice (or a replicate that drew no window): the full sum.
            redo = (total <= 0) | ((lo > 0) & (seg[:, 0] >= target))
            redo |= (hi < n) & (seg[:, -1] < target)
            for r in np.flatnonzero(redo):
                full = np.cumsum(counts[r, cs] * ws) if total[r] > 0 else cum
                idx[r] = np.searchsorted(full, q * full[-1], side="left")
            out[start : start + len(counts), j] = xs[np.clip(idx, 0, n - 1)]
    return out


MAX_CLUSTER_BOOTSTRAP = 100_000
"""Largest release resampled window by window; above it, the independent bootstrap's
replicates are spread by the design effect (the same variance, at a fraction of the cost)."""


def _replicates(
    x: npt.NDArray[np.float64],
    qs: Sequence[float],
    point: npt.NDArray[np.float64],
    windows: _Windows,
    n_boot: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.float64]:
    """Bootstrap replicates (n_boot × len(qs)) of one release's quantiles."""
    if windows.k < MIN_CLUSTERS:
        return window_bootstrap_quantiles(x, qs, windows.weights, n_boot=n_boot, rng=rng)
    if len(x) <= MAX_CLUSTER_BOOTSTRAP:
        return _window_resample(x, qs, windows, n_boot, rng)
    reps = window_bootstrap_quantiles(x, qs, windows.weights, n_boot=n_boot, rng=rng)
    for i in range(len(qs)):
        effect = windows.design_effect(x, float(point[i]))
        reps[:, i] = point[i] + math.sqrt(effect) * (reps[:, i] - point[i])
    return reps


def _window_resample(
    x: npt.NDArray[np.float64],
    qs: Sequence[float],
    windows: _Windows,
    n_boot: int,
    rng: np.random.Generator,
) -> npt.NDArray[np.float64]:
    """Poisson bootstrap of whole arrival windows: every request of a window gets the
    window's count, so a burst is in or out of a replicate as one. Quantiles stay values
    the release really had (scaling replicates would not, on a tail with gaps)."""
    order = np.argsort(x, kind="stable")
    xs, ws, cs = x[order], windows.weights[order], windows.clusters[order]
    q = np.asarray(qs, dtype=np.float64)
    out = np.empty((n_boot, len(q)))
    chunk = max(1, min(n_boot, 5_000_000 // max(len(x), 1)))
    done = 0
    while done < n_boot:
        m = min(chunk, n_boot - done)
        counts = rng.poisson(1.0, size=(m, windows.k)).astype(np.float64)
        cum = np.cumsum(counts[:, cs] * ws, axis=1)
        empty = cum[:, -1] <= 0
        cum[empty] = np.cumsum(ws)  # a replicate that drew no window keeps the sample
        for r in range(m):
            idx = np.searchsorted(cum[r], q * cum[r, -1], side="left")
            out[done + r] = xs[np.clip(idx, 0, len(xs) - 1)]
        done += m
    return out
