"""``tracekit diff`` of two training runs: scaling efficiency and what ate it.

Speed-up is samples/s after ÷ before, ideal speed-up the ratio of world sizes, and
scaling efficiency their ratio (DESIGN.md, "Training steps"). Under ideal scaling the
after run's mean step time would be the before run's, with compute scaled to the after
run's per-rank batch (compute is compared per sample); the difference is the **lost**
step time. Each component's share of it follows the diff's counterfactual rule: put the
component's per-step values in the after run back to the before run's distribution
(quantile-matched), recompute the mean step time, and see how much of the loss
disappears. The bottleneck whose components remove the most is the verdict.
"""

from __future__ import annotations

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.store import Store
from tracekit.analysis.training.model import (
    BOTTLENECKS,
    COMMUNICATION,
    COMPUTE,
    COMPUTE_STAGES,
    DATA_LOADING,
    IMBALANCE,
    NONE,
    STRAGGLER,
    DiffComponent,
    Flag,
    RunSteps,
    RunSummary,
    Scaling,
    TrainingDiff,
    TrainingVerdict,
    bottleneck_of,
)
from tracekit.analysis.training.steps import load_run

EFFICIENT = 0.9
"""Scaling efficiency at or above which nothing is named a bottleneck."""
MAJORITY = 0.5
"""A bottleneck must account for at least this share of the step-time growth."""


def _significant(last: int, matched: int, world: int) -> bool:
    """Whether ``last`` last arrivals of ``matched`` is more than chance (1/world) allows."""
    if matched == 0 or world < 2:
        return False
    p = 1.0 / world
    return bool(last > matched * p + 3.0 * (matched * p * (1 - p)) ** 0.5)


FIXES: dict[str, str] = {
    DATA_LOADING: "feed the GPUs: more DataLoader workers (num_workers), pin_memory and "
    "prefetch_factor, or cheaper decoding",
    COMMUNICATION: "hide or shrink the all-reduce: smaller DDP buckets (bucket_cap_mb) so it "
    "overlaps the backward pass, fewer bytes (bf16/fp16 compression hooks), or gradient "
    "accumulation with no_sync() to all-reduce less often",
    STRAGGLER: "look at the slow rank's GPU and host (clocks, thermal throttling, a noisy "
    "neighbour) and at uneven shards or sequence lengths",
    COMPUTE: "the per-GPU batch is too small to hide fixed costs: raise it (scale the "
    "learning rate) or fuse small kernels",
    NONE: "nothing to fix",
}
"""The fix the seeds name for each bottleneck."""


def summary_of(run: RunSteps) -> RunSummary:
    return RunSummary(run.label, run.world_size, run.steps, run.step_ms.p50, run.samples_per_s)


def quantile_matched(after: list[float], before: list[float]) -> np.ndarray:
    """``after``'s values replaced by ``before``'s at the same rank."""
    a = np.asarray(after, dtype=float)
    b = np.asarray(before, dtype=float) if len(before) else np.zeros(1)
    if len(a) == 0:
        return a
    ranks = np.argsort(np.argsort(a, kind="stable"), kind="stable")
    q = ranks / max(len(a) - 1, 1)
    out: np.ndarray = np.quantile(b, q)
    return out


def diff_runs(store: Store, before: str, after: str, *, warmup: int = 1) -> TrainingDiff:
    """Compare two training runs of the store."""
    return compare_runs(
        load_run(store, before, warmup=warmup), load_run(store, after, warmup=warmup)
    )


def compare_runs(b: RunSteps, a: RunSteps) -> TrainingDiff:
    """The diff of two already-read runs."""
    flags = [*b.flags, *a.flags]
    per_rank = 1.0
    if b.samples_per_rank_step and a.samples_per_rank_step:
        per_rank = a.samples_per_rank_step / b.samples_per_rank_step
        if abs(per_rank - 1.0) > 1e-9:
            flags.append(
                Flag(
                    "batch_changed",
                    f"the per-rank batch changed ×{per_rank:.2f}; compute is compared per sample",
                )
            )
    ideal = a.world_size / b.world_size if b.world_size else float("nan")
    if b.samples_per_s and a.samples_per_s:
        speedup: float | None = a.samples_per_s / b.samples_per_s
    elif b.step_ms_mean and a.step_ms_mean:
        speedup = (a.world_size / a.step_ms_mean) / (b.world_size / b.step_ms_mean) * per_rank
    else:
        speedup = None
    efficiency = speedup / ideal if speedup is not None and ideal else None
    ideal_step = b.step_ms_mean * per_rank
    lost = a.step_ms_mean - ideal_step

    names = [c.name for c in a.components]
    names += [c.name for c in b.components if c.name not in names]
    step_after = np.asarray(a.step_times_ms, dtype=float)
    components = []
    for name in names:
        scale = per_rank if name in COMPUTE_STAGES or name == IMBALANCE else 1.0
        before_vals = [v * scale for v in b.component_steps_ms.get(name, [])] or [0.0]
        after_vals = a.component_steps_ms.get(name, []) or [0.0] * len(step_after)
        cf = step_after - np.asarray(after_vals) + quantile_matched(after_vals, before_vals)
        recovered = float(step_after.mean() - cf.mean()) if len(step_after) else 0.0
        before_ms, after_ms = float(np.mean(before_vals)), float(np.mean(after_vals))
        components.append(
            DiffComponent(
                name=name,
                before_ms=before_ms,
                after_ms=after_ms,
                delta_ms=after_ms - before_ms,
                share=recovered / lost if lost > 0 else None,
                bottleneck=bottleneck_of(name),
            )
        )
    verdict = _verdict(b, a, efficiency, speedup, ideal, components)
    if a.steps < 5 or b.steps < 5:
        flags.append(Flag("few_steps", "fewer than 5 steps in a run: the verdict is fragile"))
    return TrainingDiff(
        before=summary_of(b),
        after=summary_of(a),
        scaling=Scaling(speedup, ideal, efficiency),
        components=components,
        verdict=verdict,
        flags=flags,
        ideal_step_ms=ideal_step,
    )


def _verdict(
    b: RunSteps,
    a: RunSteps,
    efficiency: float | None,
    speedup: float | None,
    ideal: float,
    components: list[DiffComponent],
) -> TrainingVerdict:
    shares = {k: 0.0 for k in BOTTLENECKS if k != NONE}
    for c in components:
        if c.share is not None and c.share > 0 and c.name != cv.UNATTRIBUTED:
            shares[c.bottleneck] += c.share
    head = f"{b.label} ({b.world_size} ranks) → {a.label} ({a.world_size} ranks)"
    if speedup is None or efficiency is None:
        return TrainingVerdict(NONE, f"{head}: no step times to compare", FIXES[NONE], [], shares)
    gain = f"{speedup:.2f}× of an ideal {ideal:.2f}× (scaling efficiency {efficiency:.0%})"
    if efficiency >= EFFICIENT or not any(v > 0 for v in shares.values()):
        return TrainingVerdict(
            NONE,
            f"{head}: {gain}; no bottleneck — scaling is close to ideal",
            FIXES[NONE],
            [],
            shares,
        )
    # the components' own shares can pass 100% when others shrank: state the verdict as
    # a share of the growth, the positive part
    grown = sum(v for v in shares.values() if v > 0)
    shares = {k: v / grown for k, v in shares.items()}
    # A straggler is named only when one rank arrives last more often than chance
    # (binomial, 3 sigma); ranks taking turns is jitter, spread over everyone.
    candidates = dict(shares)
    if not (
        a.stragglers and _significant(a.stragglers[0].last_arrivals, a.collectives, a.world_size)
    ):
        candidates.pop(STRAGGLER, None)
    top = max(candidates, key=lambda k: candidates[k])
    if candidates[top] < MAJORITY:
        return TrainingVerdict(
            NONE,
            f"{head}: {gain}; no single bottleneck — the lost time is spread over ranks and "
            f"components (largest: {top.replace('_', ' ')}, {candidates[top]:.0%} of the growth)",
            FIXES[NONE],
            [],
            shares,
        )
    ranks: list[int] = []
    detail = ""
    if top == STRAGGLER and a.stragglers:
        lead = a.stragglers[0]
        ranks = [s.rank for s in a.stragglers if s.last_arrivals >= 0.5 * lead.last_arrivals]
        where = f" on {lead.host}" if lead.host else ""
        detail = (
            f"; rank {lead.rank}{where} arrived last at {lead.share:.0%} of collectives, "
            f"{lead.mean_lag_ms:.1f} ms after the others"
        )
    summary = (
        f"{head}: {gain}. {top.replace('_', ' ')} accounts for {shares[top]:.0%} of the step-time growth"
        f"{detail} — {FIXES[top]}."
    )
    return TrainingVerdict(top, summary, FIXES[top], ranks, shares)
