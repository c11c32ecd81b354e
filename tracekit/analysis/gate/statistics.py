"""Statistics only the gate needs: Holm levels and interval bounds, and where its
bootstrap replicates come from.

The replicates are drawn as the diff draws its intervals
(:func:`tracekit.analysis.compare.intervals.release_replicates`): whole one-second
arrival windows are resampled once a release spans ``MIN_CLUSTERS`` of them, so a burst
of slow requests counts as one piece of evidence; with fewer windows it is the
independent windowed bootstrap of :mod:`tracekit.analysis.cohorts.stats`. The gate draws
more replicates than the diff (its Holm-adjusted tails sit at (1 − confidence)/2/m, so
it needs about 1/level replicates to resolve them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tracekit.analysis.cohorts.stats import window_bootstrap_quantiles
from tracekit.analysis.compare.diff import BURSTY_EFFECT
from tracekit.analysis.compare.intervals import CLUSTER_S, MIN_CLUSTERS, release_replicates

__all__ = [
    "BURSTY_EFFECT",
    "CLUSTER_S",
    "MIN_CLUSTERS",
    "holm_bounds",
    "holm_levels",
    "release_replicates",
    "split_counts",
    "window_bootstrap_quantiles",
]

FloatArray = npt.NDArray[np.float64]


def holm_levels(p_values: Sequence[float], alpha: float) -> list[tuple[float, bool]]:
    """Holm step-down: (level each p-value was compared with, rejected) per input.

    Sorted ascending, the r-th p-value is compared with alpha/(m − r) until the first
    one that is not rejected; it and every later one keep that level and are not
    rejected. Rejections agree with ``holm_adjust(p) <= alpha``.
    """
    m = len(p_values)
    out: list[tuple[float, bool]] = [(alpha, False)] * m
    stopped: float | None = None
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        level = alpha / (m - rank) if stopped is None else stopped
        reject = stopped is None and p_values[i] <= level * (1 + 1e-12)
        if not reject and stopped is None:
            stopped = level
        out[i] = (level, reject)
    return out


def split_counts(s: FloatArray, limit: float, strict: bool) -> tuple[int, int]:
    """(replicates within the limit, replicates beyond it) for sorted replicates ``s``.

    Within means ``< limit`` for a strict budget and ``<= limit`` otherwise.
    """
    within = int(np.searchsorted(s, limit, side="left" if strict else "right"))
    return within, len(s) - within


def holm_bounds(s: FloatArray, level_low: float, level_high: float) -> tuple[float, float]:
    """Interval ends of sorted replicates ``s`` at one-sided levels ``level_low/high``.

    These order statistics match the count rule exactly: the low end lies beyond the
    limit precisely when at most floor(level·B) replicates are within it.
    """
    n = len(s)
    k_low = min(math.floor(level_low * n + 1e-9), n - 1)
    k_high = min(math.floor(level_high * n + 1e-9), n - 1)
    return float(s[k_low]), float(s[n - 1 - k_high])
