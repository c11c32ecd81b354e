"""Statistics for tails: weighted quantiles and bootstrap intervals on quantile deltas.

Latency distributions are skewed and their tails are what matters, so everything here
works on raw per-request values (no trimming, no normal approximation). Weights carry
``tracekit.sample.weight`` (a request kept 1 in N stands for N requests).

The bootstrap is a Poisson bootstrap on sorted values: each replicate reweights every
request by a Poisson(1) count. :func:`bootstrap_quantiles` does that literally;
:func:`window_bootstrap_quantiles` draws the same distribution by drawing individual
counts only near each quantile's rank, which keeps 100k requests × 2000 replicates
well under a second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

DEFAULT_QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
DEFAULT_BOOTSTRAP = 400
DEFAULT_CONFIDENCE = 0.95


def _prepare(values: npt.ArrayLike, weights: npt.ArrayLike | None) -> tuple[FloatArray, FloatArray]:
    x = np.asarray(values, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    if x.shape != w.shape:
        raise ValueError("values and weights differ in length")
    if _all_ones(w):
        # Unsampled data (every weight 1): sorting the values alone gives the same pairs
        # at a fraction of an argsort and two gathers over a million requests.
        return np.sort(x), w
    order = np.argsort(x, kind="stable")
    return x[order], w[order]


def _all_ones(w: FloatArray) -> bool:
    return bool(len(w) == 0 or (w[0] == 1.0 and np.all(w == 1.0)))


def _quantiles_sorted(x: FloatArray, cum: FloatArray, qs: FloatArray) -> FloatArray:
    """Inverse-CDF quantiles of sorted ``x`` with cumulative weights ``cum`` (last = total)."""
    total = cum[..., -1:]
    idx = np.empty(cum.shape[:-1] + (len(qs),), dtype=np.int64)
    targets = qs * total  # broadcast: (..., len(qs))
    if cum.ndim == 1:
        idx = np.searchsorted(cum, targets, side="left")
    else:
        for i in range(cum.shape[0]):
            idx[i] = np.searchsorted(cum[i], targets[i], side="left")
    idx = np.clip(idx, 0, len(x) - 1)
    return x[idx]


def weighted_quantiles(
    values: npt.ArrayLike, qs: Sequence[float], weights: npt.ArrayLike | None = None
) -> FloatArray:
    """Quantiles ``qs`` (0..1) of ``values`` weighted by ``weights`` (inverse CDF, type 1).

    The q-quantile is the smallest value whose cumulative weight reaches q of the total,
    so p99 of 100 equal-weight values is the 99th smallest. Empty input gives NaN.
    """
    q = np.asarray(qs, dtype=np.float64)
    if weights is None or _all_ones(np.asarray(weights, dtype=np.float64)):
        x = np.asarray(values, dtype=np.float64)
        if weights is not None and np.shape(weights) != x.shape:
            raise ValueError("values and weights differ in length")
        n = len(x)
        if n == 0:
            return np.full(len(q), np.nan)
        # Cumulative weights are 1..n: the searchsorted of the general case lands on
        # ceil(q·n) - 1, and a partial sort (NaN last, as in a sort) finds those ranks.
        idx = np.clip(np.ceil(q * float(n)).astype(np.int64) - 1, 0, n - 1)
        return np.partition(x, np.unique(idx))[idx]
    x, w = _prepare(values, weights)
    if len(x) == 0 or w.sum() <= 0:
        return np.full(len(q), np.nan)
    return _quantiles_sorted(x, np.cumsum(w), q)


def weighted_quantile(
    values: npt.ArrayLike, q: float, weights: npt.ArrayLike | None = None
) -> float:
    """One weighted quantile; see :func:`weighted_quantiles`."""
    return float(weighted_quantiles(values, [q], weights)[0])


def bootstrap_quantiles(
    values: npt.ArrayLike,
    qs: Sequence[float],
    weights: npt.ArrayLike | None = None,
    *,
    n_boot: int = DEFAULT_BOOTSTRAP,
    rng: np.random.Generator,
) -> FloatArray:
    """Replicates of the quantiles: an array of shape (n_boot, len(qs))."""
    q = np.asarray(qs, dtype=np.float64)
    x, w = _prepare(values, weights)
    out = np.full((n_boot, len(q)), np.nan)
    if len(x) == 0:
        return out
    # Chunk replicates so memory stays near 40 MB whatever the sample size.
    chunk = max(1, min(n_boot, 5_000_000 // max(len(x), 1)))
    done = 0
    while done < n_boot:
        k = min(chunk, n_boot - done)
        counts = rng.poisson(1.0, size=(k, len(x))).astype(np.float64)
        cum = np.cumsum(counts * w, axis=1)
        empty = cum[:, -1] <= 0
        cum[empty] = np.cumsum(w)  # a replicate that drew nothing keeps the sample
        out[done : done + k] = _quantiles_sorted(x, cum, q)
        done += k
    return out


_MAX_WEIGHT_CLASSES = 16
"""With more distinct weights than this, fall back to the full bootstrap."""
_WINDOW_SE = 8.0


def _class_sums(
    rng: np.random.Generator, classes: FloatArray, counts: npt.NDArray[np.int64], n_boot: int
) -> FloatArray:
    """Per replicate, Σ over weight classes of weight × Poisson(requests in that class)."""
    total = np.zeros(n_boot)
    for weight, k in zip(classes, counts, strict=True):
        if k > 0:
            total += weight * rng.poisson(float(k), size=n_boot)
    return total


def window_bootstrap_quantiles(
    values: npt.ArrayLike,
    qs: Sequence[float],
    weights: npt.ArrayLike | None = None,
    *,
    n_boot: int,
    rng: np.random.Generator,
) -> FloatArray:
    """Replicates (n_boot × len(qs)) of weighted quantiles under the Poisson bootstrap.

    The same distribution as :func:`bootstrap_quantiles` at a fraction of the cost: a
    replicate's q-quantile depends on individual counts only near rank q·n; below and
    above that window only the sums of counts matter, and a sum of k Poisson(1) counts
    is Poisson(k) — per distinct sample weight, so ``tracekit.sample.weight`` stays
    exact. The window spans ±8 standard errors of the quantile's rank; a replicate that
    lands outside it (odds about 1e-15) is recomputed in full. Each quantile gets its
    own draws (replicate i of p95 and of p99 come from different resamples).
    """
    x = np.asarray(values, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    out = np.full((n_boot, len(qs)), np.nan)
    if len(x) == 0:
        return out
    unit = _all_ones(w)
    if unit:
        x = np.sort(x)
    else:
        order = np.argsort(x, kind="stable")
        x, w = x[order], w[order]
    classes, cls = np.unique(w, return_inverse=True)
    if len(classes) > _MAX_WEIGHT_CLASSES:
        return bootstrap_quantiles(x, qs, w, n_boot=n_boot, rng=rng)
    # Per weight class, how many requests lie below each rank (prefix counts).
    prefix = np.zeros((len(classes), len(x) + 1), dtype=np.int64)
    for k in range(len(classes)):
        prefix[k, 1:] = np.cumsum(cls == k)
    cum = np.cumsum(w)
    n = len(x)
    for j, q in enumerate(qs):
        centre = int(np.searchsorted(cum, q * cum[-1], side="left"))
        half = math.ceil(_WINDOW_SE * math.sqrt(n * q * (1.0 - q))) + 16
        lo, hi = max(0, centre - half), min(n, centre + half + 1)
        below = _class_sums(rng, classes, prefix[:, lo], n_boot)
        above = _class_sums(rng, classes, prefix[:, n] - prefix[:, hi], n_boot)
        draws = rng.poisson(1.0, size=(n_boot, hi - lo))
        # Whole counts sum exactly in integers: the same values, without the
        # multiplication and the float cumsum over every replicate's window.
        inside = np.cumsum(draws if unit else draws * w[lo:hi], axis=1)
        total = below + inside[:, -1] + above
        target = q * total
        reach = below[:, None] + inside
        # Rows of ``reach`` are non-decreasing: counting entries below the target is a
        # vectorised searchsorted(side="left").
        pos = np.count_nonzero(reach < target[:, None], axis=1)
        ok = (below < target) | (lo == 0)
        ok &= (pos < hi - lo) | (hi == n)
        ok &= total > 0
        out[:, j] = x[np.clip(lo + pos, 0, n - 1)]
        missed = np.flatnonzero(~ok)
        if len(missed):
            full = bootstrap_quantiles(x, [q], w, n_boot=len(missed), rng=rng)
            out[missed, j] = full[:, 0]
    return out


@dataclass(frozen=True)
class QuantileDelta:
    """Change of one quantile from ``before`` to ``after``, with a bootstrap interval."""

    q: float
    before: float
    after: float
    delta: float
    ci_low: float
    ci_high: float
    rel_delta: float
    """after / before - 1 (NaN when before is 0)."""
    rel_ci_low: float
    rel_ci_high: float
    before_tail_n: int
    """Sampled before-requests at or above the quantile (see :func:`tail_samples`)."""
    after_tail_n: int
    replicates: FloatArray = field(repr=False, compare=False)
    """Bootstrap replicates of after - before (for p-values and other levels)."""
    rel_replicates: FloatArray = field(repr=False, compare=False)

    @property
    def significant(self) -> bool:
        """The interval excludes zero."""
        return self.ci_low > 0 or self.ci_high < 0


MIN_TAIL_SAMPLES = 10
"""Fewest sampled requests at or above a quantile for it to be estimated at all (the
diff widens p99 to p95 below it; the gate calls such a check inconclusive)."""


def tail_samples(values: npt.ArrayLike, cut: float) -> int:
    """Sampled requests (not weighted: a weight adds no information) at or above ``cut``."""
    x = np.asarray(values, dtype=np.float64)
    return int(np.count_nonzero(x >= cut)) if math.isfinite(cut) else 0


def quantile_deltas(
    before: npt.ArrayLike,
    after: npt.ArrayLike,
    qs: Sequence[float] = DEFAULT_QUANTILES,
    *,
    before_weights: npt.ArrayLike | None = None,
    after_weights: npt.ArrayLike | None = None,
    n_boot: int = DEFAULT_BOOTSTRAP,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> list[QuantileDelta]:
    """Quantile changes with percentile-bootstrap intervals at ``confidence``.

    Before and after are resampled independently (Poisson bootstrap, windowed around
    each quantile's rank so 100k requests cost milliseconds, not seconds).
    """
    rng = np.random.default_rng(seed)
    b = np.asarray(before, dtype=np.float64)
    a = np.asarray(after, dtype=np.float64)
    qb = weighted_quantiles(b, qs, before_weights)
    qa = weighted_quantiles(a, qs, after_weights)
    rb = window_bootstrap_quantiles(b, qs, before_weights, n_boot=n_boot, rng=rng)
    ra = window_bootstrap_quantiles(a, qs, after_weights, n_boot=n_boot, rng=rng)
    return deltas_from_replicates(b, a, qs, qb, qa, rb, ra, confidence=confidence)


def deltas_from_replicates(
    before: FloatArray,
    after: FloatArray,
    qs: Sequence[float],
    qb: FloatArray,
    qa: FloatArray,
    rb: FloatArray,
    ra: FloatArray,
    *,
    confidence: float,
) -> list[QuantileDelta]:
    """One :class:`QuantileDelta` per quantile from the point estimates ``qb``/``qa`` and
    each release's bootstrap replicates ``rb``/``ra`` (one row per replicate)."""
    diff = ra - rb
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(rb > 0, ra / rb - 1.0, np.nan)
    alpha = (1.0 - confidence) / 2.0
    out = []
    for i, q in enumerate(qs):
        d = diff[:, i]
        r = rel[:, i]
        lo, hi = _interval(d, alpha)
        rlo, rhi = _interval(r, alpha)
        rel_delta = float(qa[i] / qb[i] - 1.0) if qb[i] > 0 else float("nan")
        out.append(
            QuantileDelta(
                q=float(q),
                before=float(qb[i]),
                after=float(qa[i]),
                delta=float(qa[i] - qb[i]),
                ci_low=lo,
                ci_high=hi,
                rel_delta=rel_delta,
                rel_ci_low=rlo,
                rel_ci_high=rhi,
                before_tail_n=tail_samples(before, float(qb[i])),
                after_tail_n=tail_samples(after, float(qa[i])),
                replicates=d,
                rel_replicates=r,
            )
        )
    return out


def _interval(reps: FloatArray, alpha: float) -> tuple[float, float]:
    finite = reps[np.isfinite(reps)]
    if len(finite) == 0:
        return float("nan"), float("nan")
    lo, hi = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (family-wise error control, any dependence)."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
