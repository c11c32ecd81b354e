"""Which stage explains a latency change between two groups of requests.

Two questions, answered for ``diff`` (before vs after release) and ``slow`` (slow vs fast
cohort of one release):

* **Counterfactual removal** (the attribution). For each stage, the after-group's
  critical-path time of that stage is put back to the before-group's distribution by
  weighted quantile matching — the request at weighted rank r of the stage's after
  distribution gets the before distribution's value at rank r — the other stages of
  each request stay as they are, and the tail quantile is recomputed. What the tail
  loses is the stage's *removal*. Quantile matching keeps each request's position in
  the stage's distribution, so the correlation between stages (a cache miss that also
  makes the downstream call slow) survives; comparing tail-cohort means would not,
  because conditioning on slow requests drags in every stage with a heavy tail.

* **Measured evidence** per stage: tail-cohort means of critical-path, wall, CPU and
  GPU milliseconds, and the *hidden wait* rule that refines a declared ``compute``
  stage by its measurements (see :func:`is_hidden_wait`).

Shares: removals can overlap (two stages that each remove most of the growth when the
growth needs both) or fall short of the growth (interaction). A stage's share is its
positive removal divided by ``max(growth, sum of positive removals)``: shares never
sum past 1, and they sum to exactly 1 when the removals overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.stats import MIN_TAIL_SAMPLES, tail_samples, weighted_quantile

FloatArray = npt.NDArray[np.float64]

MIN_TAIL_REQUESTS = MIN_TAIL_SAMPLES
"""Fewer requests than this at or above p99 in either group widens the cohort to p95."""

HIDDEN_WAIT_MIN_GROWTH_MS = 1.0
HIDDEN_WAIT_MIN_REL_GROWTH = 0.2
HIDDEN_WAIT_MAX_MEASURED_SHARE = 0.1
MEASURED_MIN_FRACTION = 0.5
"""A stage counts as measured when at least this fraction of its occurrences carry CPU
or GPU time (instrumentation that times a stage times it every time)."""


def quantile_match(
    after: FloatArray, after_w: FloatArray, before: FloatArray, before_w: FloatArray
) -> FloatArray:
    """Each ``after`` value replaced by the ``before`` value at the same weighted rank.

    Ranks are weighted mid-ranks in (0, 1); ties are split in row order (stable sort),
    so the result has exactly the before distribution whatever the ties.
    """
    if len(after) == 0:
        return np.zeros(0)
    if len(before) == 0 or before_w.sum() <= 0:
        return np.zeros_like(after)
    order = stable_argsort(after)
    if _unit(after_w):
        # Unsampled: the cumulative weights are 1..n, so the mid-ranks need no gather and
        # no cumsum (the same floating-point operations as the general case below).
        cum = np.arange(1, len(after) + 1, dtype=np.float64)
        ranks = (cum - 0.5) / cum[-1]
    else:
        w = after_w[order]
        cum = np.cumsum(w)
        ranks = (cum - w / 2.0) / cum[-1]
    if _unit(before_w):
        b_sorted = np.sort(before)  # the values of a stable argsort, without the gather
        b_cum = np.arange(1, len(before) + 1, dtype=np.float64)
    else:
        b_order = np.argsort(before, kind="stable")
        b_sorted = before[b_order]
        b_cum = np.cumsum(before_w[b_order])
    b_cum /= b_cum[-1]
    idx = np.clip(np.searchsorted(b_cum, ranks, side="left"), 0, len(b_sorted) - 1)
    out = np.empty_like(after, dtype=np.float64)
    out[order] = b_sorted[idx]
    return out


def _unit(w: FloatArray) -> bool:
    return bool(w[0] == 1.0 and np.all(w == 1.0))


def stable_argsort(x: FloatArray) -> npt.NDArray[np.int64]:
    """``np.argsort(x, kind="stable")``, computed about twice as fast for a million values.

    NumPy's stable sort of floats is a merge sort; its default sort is a vectorised
    quicksort that leaves equal values in no particular order. So: sort with that, then
    put each run of equal values (NaNs count as equal, as the stable sort keeps them in
    row order too) back in row order by sorting (run number, row) keys as integers.
    """
    n = len(x)
    order = np.argsort(x)
    if n < 2:
        return order
    v = x[order]
    tie = v[1:] == v[:-1]
    tie |= np.isnan(v[1:]) & np.isnan(v[:-1])
    if not tie.any():
        return order
    run = np.empty(n, dtype=np.int64)
    run[0] = 0
    np.cumsum(~tie, out=run[1:])
    keys = np.sort(run * n + order)
    return keys % n


@dataclass(frozen=True)
class Removal:
    """How much of the tail quantile's growth disappears when one stage is put back."""

    stage: str
    removed_ms: float
    """after tail quantile − counterfactual tail quantile (negative: putting it back hurts)."""
    share: float
    """Attribution share of the growth (0..1); NaN when the tail did not grow."""


def counterfactual_removals(
    before: ReleaseData, after: ReleaseData, q: float, stages: tuple[str, ...] | None = None
) -> tuple[float, list[Removal]]:
    """(growth of the q-quantile in ms, one :class:`Removal` per stage).

    ``stages`` defaults to every stage either group has, in request order.
    """
    stages = stages or cv.order_stages(set(before.stages) | set(after.stages))
    after_q = weighted_quantile(after.duration_ms, q, after.weights)
    before_q = weighted_quantile(before.duration_ms, q, before.weights)
    growth = after_q - before_q
    removed: list[float] = []
    for stage in stages:
        a_col = after.stage_column(stage)
        b_col = before.stage_column(stage)
        matched = quantile_match(a_col, after.weights, b_col, before.weights)
        totals = after.duration_ms - a_col + matched
        removed.append(after_q - weighted_quantile(totals, q, after.weights))
    return growth, [
        Removal(stage, r, s)
        for stage, r, s in zip(stages, removed, shares(growth, removed), strict=True)
    ]


def shares(growth: float, removed: list[float]) -> list[float]:
    """Shares of the growth: positive removal / max(growth, Σ positive removals)."""
    if not growth > 0:
        return [float("nan")] * len(removed)
    positive = [max(r, 0.0) for r in removed]
    denominator = max(growth, sum(positive))
    return [p / denominator for p in positive]


def choose_tail(
    before_ms: FloatArray, before_w: FloatArray, after_ms: FloatArray, after_w: FloatArray
) -> tuple[float, str]:
    """The tail quantile to compare (0.99, or 0.95 when p99 rests on too few requests)
    and the reason when widened (empty otherwise)."""
    thin = []
    for name, x, w in (("before", before_ms, before_w), ("after", after_ms, after_w)):
        n_tail = cohort_size(x, w, 0.99)
        if n_tail < MIN_TAIL_REQUESTS:
            thin.append(f"{n_tail} of {len(x)} {name} requests are at or above p99")
    if not thin:
        return 0.99, ""
    return 0.95, (
        "; ".join(thin) + f" (fewer than {MIN_TAIL_REQUESTS}): comparing the ≥ p95 cohort instead"
    )


def cohort_size(x: FloatArray, w: FloatArray, q: float) -> int:
    """Requests (not weighted) at or above the weighted q-quantile."""
    if len(x) == 0:
        return 0
    return tail_samples(x, weighted_quantile(x, q, w))


def weighted_mean(x: FloatArray, w: FloatArray) -> float:
    """Weighted mean ignoring NaN values; NaN when nothing is left."""
    if len(x) and _unit(w):
        # A contiguous copy (a stage column is a strided view) sums in the same order as
        # the masked copy below does.
        total = float(np.ascontiguousarray(x).sum())
        if not np.isnan(total):
            # No NaN and every weight 1: the same sum over the same values, without the
            # masks and gathers (a million requests, a dozen means per diff).
            return total / len(x)
    ok = ~np.isnan(x)
    total = float(w[ok].sum())
    return float((x[ok] * w[ok]).sum() / total) if total > 0 else float("nan")


@dataclass(frozen=True)
class StageEvidence:
    """Cohort means of one stage in one group (milliseconds; NaN when not measured)."""

    critical_ms: float
    wall_ms: float
    cpu_ms: float
    gpu_ms: float
    measured_ms: float
    """Mean of CPU + GPU time per request (the measured work), NaN when unmeasured."""


def stage_evidence(rel: ReleaseData, stage: str, mask: npt.NDArray[np.bool_]) -> StageEvidence:
    """Means of ``stage`` over the requests in ``mask`` (e.g. the tail cohort)."""
    w = rel.weights[mask]
    if stage not in rel.stages or not mask.any():
        zero = 0.0 if mask.any() else float("nan")
        return StageEvidence(zero, zero, float("nan"), float("nan"), float("nan"))
    j = rel.stage_index(stage)
    crit = rel.stage_ms[mask, j]
    wall = rel.stage_wall_ms[mask, j]
    cpu = rel.stage_cpu_ms[mask, j]
    gpu = rel.stage_gpu_ms[mask, j]
    present = (wall > 0) | (crit > 0)
    both = np.where(np.isnan(cpu) & np.isnan(gpu), np.nan, np.nan_to_num(cpu) + np.nan_to_num(gpu))
    measured = ~np.isnan(both) & present
    is_measured = present.any() and measured.sum() >= MEASURED_MIN_FRACTION * present.sum()

    def mean_if_measured(x: FloatArray) -> float:
        return weighted_mean(np.where(present, x, np.nan), w) if is_measured else float("nan")

    return StageEvidence(
        critical_ms=weighted_mean(crit, w),
        wall_ms=weighted_mean(wall, w),
        cpu_ms=mean_if_measured(cpu),
        gpu_ms=mean_if_measured(gpu),
        measured_ms=mean_if_measured(both),
    )


def is_hidden_wait(time_kind: str, before: StageEvidence, after: StageEvidence) -> bool:
    """A declared compute stage whose time grew while its measured CPU/GPU time did not.

    The rule, on tail-cohort means: critical-path time grew by more than 1 ms and more
    than 20%, CPU/GPU time was measured in both groups, and the measured time grew by
    less than 10% of the critical-path growth. Unmeasured stages are never hidden wait:
    without a measurement there is no evidence either way.
    """
    if time_kind != cv.COMPUTE:
        return False
    growth = after.critical_ms - before.critical_ms
    if not (
        growth > HIDDEN_WAIT_MIN_GROWTH_MS
        and growth > HIDDEN_WAIT_MIN_REL_GROWTH * before.critical_ms
    ):
        return False
    if np.isnan(before.measured_ms) or np.isnan(after.measured_ms):
        return False
    return bool(after.measured_ms - before.measured_ms < HIDDEN_WAIT_MAX_MEASURED_SHARE * growth)


def declared_kind(before: ReleaseData | None, after: ReleaseData, stage: str) -> str:
    """The stage's declared time kind (the after group's, else the before's, else the
    default of :func:`tracekit.conventions.default_time_kind`, which is what
    refresh stores: ``unattributed`` is ``wait``)."""
    if stage in after.time_kinds:
        return after.time_kinds[stage]
    if before is not None and stage in before.time_kinds:
        return before.time_kinds[stage]
    return cv.default_time_kind(stage)
