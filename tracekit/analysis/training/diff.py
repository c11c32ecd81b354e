"""``tracekit diff`` of two training runs: scaling efficiency and what ate it.

Speed-up is samples/s after ÷ before, ideal speed-up the ratio of world sizes, and
scaling efficiency their ratio (docs/design.md, "Training steps"). Under ideal scaling the
after run's mean step time would be the before run's, with compute scaled to the after
run's per-rank batch (compute is compared per sample); the difference is the **lost**
step time. Each component's share of it follows the diff's counterfactual rule: put the
component's per-step values in the after run back to the before run's distribution
(quantile-matched), recompute the mean step time, and see how much of the loss
disappears. The figures behind the verdict are 10%-trimmed means over steps, so a
few steps stalled by something else on the machine do not decide it.

The verdict names a bottleneck only on evidence that noise does not produce:

- ``straggler``: one rank arrives after the others at the collectives of most steps,
  by a margin (its median lateness over steps, last or not, is at least
  :data:`STRAGGLER_LATENESS` of the step) and beyond chance (4 standard errors of
  that median, estimated from the steps' own spread). Steps, not collectives, are the
  unit: a step's buckets share whatever delayed the rank in that step. Peer wait and compute imbalance without
  such a rank is *jitter* — ranks taking turns being late, which any synchronous job
  on shared or noisy hardware pays — reported, never named.
- ``compute``: only when the per-rank batch shrank (strong scaling): the per-GPU batch
  too small to hide fixed costs. With the same per-rank batch, compute that grew is the
  same work done slower (a busy host, throttled devices): flagged, not a scaling
  bottleneck.
- every named bottleneck must recover at least :data:`MIN_STEP_SHARE` of the after
  run's step time and a majority of the growth that can be named.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.results import Flag, TrainingVerdict
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
    RunSteps,
    RunSummary,
    Scaling,
    Straggler,
    TrainingDiff,
    bottleneck_of,
)
from tracekit.analysis.training.steps import load_run

EFFICIENT = 0.9
"""Scaling efficiency at or above which nothing is named a bottleneck."""
MAJORITY = 0.5
"""A bottleneck must account for at least this share of the growth that can be named."""
MIN_STEP_SHARE = 0.15
"""...and recover at least this share of the after run's step time."""
STRAGGLER_LATENESS = 0.15
"""A straggler's median lateness over steps, as a share of the step time."""
STRAGGLER_STEPS = 2 / 3
"""...and the share of steps in which it arrived after the others."""
STRAGGLER_Z = 4.0
"""...and its median lateness in standard errors (the steps' own spread): beyond chance."""
TRIM = 0.1
"""Share of steps trimmed from each end for the verdict's means."""
JITTER = "jitter"
SLOWER_COMPUTE = "slower_compute"


def trimmed_mean(values: np.ndarray | list[float], trim: float = TRIM) -> float:
    """Mean of ``values`` without the ``trim`` share at each end (plain mean under 5)."""
    v = np.sort(np.asarray(values, dtype=float))
    k = int(len(v) * trim) if len(v) >= 5 else 0
    v = v[k : len(v) - k]
    return float(v.mean()) if len(v) else 0.0


def consistent_straggler(run: RunSteps) -> Straggler | None:
    """The rank that arrives after the others in most steps by a margin, if one does."""
    if run.world_size < 2 or not run.stragglers:
        return None
    lead = max(run.stragglers, key=lambda s: s.lateness_ms)
    margin = STRAGGLER_LATENESS * run.step_ms.p50
    if (
        lead.lateness_ms >= margin
        and lead.late_steps >= STRAGGLER_STEPS
        and lead.lateness_ms >= STRAGGLER_Z * lead.lateness_se_ms
    ):
        return lead
    return None


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
    # the verdict's own figures: trimmed means over steps (a stalled step decides nothing)
    robust_after = trimmed_mean(a.step_times_ms)
    robust_ideal = trimmed_mean(b.step_times_ms) * per_rank
    lost = robust_after - robust_ideal

    names = [c.name for c in a.components]
    names += [c.name for c in b.components if c.name not in names]
    step_after = np.asarray(a.step_times_ms, dtype=float)
    components = []
    recovered_ms: dict[str, float] = {}
    # With the same per-rank batch, the compute stages do the same work in both runs: a
    # change in their time is the machine (load, clocks), not scaling. It is set aside
    # before deciding whether anything was lost (a baseline measured on a busier
    # machine must not hide a real bottleneck, nor a busier after run invent one).
    drift = 0.0
    for name in names:
        scale = per_rank if name in COMPUTE_STAGES or name == IMBALANCE else 1.0
        before_vals = [v * scale for v in b.component_steps_ms.get(name, [])] or [0.0]
        after_vals = a.component_steps_ms.get(name, []) or [0.0] * len(step_after)
        cf = step_after - np.asarray(after_vals) + quantile_matched(after_vals, before_vals)
        recovered = robust_after - trimmed_mean(cf) if len(step_after) else 0.0
        recovered_ms[name] = recovered
        if name in COMPUTE_STAGES and abs(per_rank - 1.0) <= 1e-9:
            drift += trimmed_mean(after_vals) - trimmed_mean(before_vals)
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
    verdict = _verdict(
        b,
        a,
        Scaling(speedup, ideal, efficiency),
        components,
        recovered_ms,
        _Loss(lost, robust_after - drift, robust_ideal, drift, per_rank),
        flags,
    )
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


@dataclass
class _Loss:
    """The verdict's figures (trimmed means over steps, ms)."""

    lost: float
    """After step minus the ideal step."""
    after_same_work: float
    """After step with the compute stages at the before run's time (same per-rank batch)."""
    ideal: float
    drift: float
    """Compute time that changed with the per-rank batch unchanged (the machine)."""
    per_rank: float


def _verdict(
    b: RunSteps,
    a: RunSteps,
    scaling: Scaling,
    components: list[DiffComponent],
    recovered_ms: dict[str, float],
    loss: _Loss,
    flags: list[Flag],
) -> TrainingVerdict:
    speedup, ideal, efficiency = scaling.speedup, scaling.ideal, scaling.efficiency
    lost, per_rank = loss.lost, loss.per_rank
    grown = {k: 0.0 for k in BOTTLENECKS if k != NONE}
    for c in components:
        r = recovered_ms.get(c.name, 0.0)
        if r > 0 and c.name != cv.UNATTRIBUTED:
            grown[c.bottleneck] += r  # ms of the step this component's growth costs
    total = sum(grown.values())
    shares = {k: v / total for k, v in grown.items()} if total > 0 else dict.fromkeys(grown, 0.0)
    head = f"{b.label} ({b.world_size} ranks) → {a.label} ({a.world_size} ranks)"
    if speedup is None or efficiency is None:
        return TrainingVerdict(NONE, f"{head}: no step times to compare", FIXES[NONE], [], shares)
    gain = f"{speedup:.2f}× of an ideal {ideal:.2f}× (scaling efficiency {efficiency:.0%})"
    # efficiency with the compute stages' drift set aside: what scaling itself cost
    same_work = loss.ideal / loss.after_same_work if loss.after_same_work > 0 else 1.0
    slower = "slower" if loss.drift > 0 else "faster"
    drift_note = (
        f" (compute ran {abs(loss.drift):.1f} ms per step {slower} with the same per-rank "
        "batch — the machine, not scaling — and is set aside)"
        if abs(loss.drift) >= MIN_STEP_SHARE * loss.ideal
        else ""
    )
    if loss.drift >= MIN_STEP_SHARE * loss.ideal:
        flags.append(
            Flag(
                SLOWER_COMPUTE,
                f"with the same per-rank batch, compute took {loss.drift:.1f} ms more per step: "
                "the same work done slower (a busy host, throttled or different devices), not "
                "a cost of scaling",
            )
        )
    if same_work >= EFFICIENT or total <= 0:
        return TrainingVerdict(
            NONE,
            f"{head}: {gain}; no bottleneck — scaling is close to ideal{drift_note}",
            FIXES[NONE],
            [],
            shares,
        )
    # What noise produces is reported, never named (module docstring).
    lead = consistent_straggler(a)
    unnamed: dict[str, float] = {}
    candidates = dict(grown)
    if lead is None and candidates.get(STRAGGLER, 0.0) > 0:
        unnamed[JITTER] = candidates.pop(STRAGGLER)
    if per_rank >= 1.0 - 1e-9 and candidates.get(COMPUTE, 0.0) > 0:
        unnamed[SLOWER_COMPUTE] = candidates.pop(COMPUTE)
    nameable = sum(v for v in candidates.values() if v > 0)
    top = max(candidates, key=lambda k: candidates[k]) if candidates else NONE
    top_ms = candidates.get(top, 0.0)
    floor = MIN_STEP_SHARE * loss.after_same_work
    if top == NONE or top_ms < floor or top_ms < MAJORITY * nameable:
        spread = ", ".join(
            f"{k.replace('_', ' ')} {v:.1f} ms"
            for k, v in sorted({**candidates, **unnamed}.items(), key=lambda kv: -kv[1])
            if v > 0
        )
        return TrainingVerdict(
            NONE,
            f"{head}: {gain}; no single bottleneck — the lost {lost:.1f} ms per step is spread "
            f"({spread}); jitter is ranks taking turns being late, which no one rank or "
            f"component explains{drift_note}",
            FIXES[NONE],
            [],
            shares,
        )
    ranks: list[int] = []
    detail = ""
    if top == STRAGGLER and lead is not None:
        ranks = [lead.rank]
        where = f" on {lead.host}" if lead.host else ""
        detail = (
            f"; rank {lead.rank}{where} arrived after the others in {lead.late_steps:.0%} of "
            f"steps (median {lead.lateness_ms:.1f} ms late) and last at {lead.share:.0%} of "
            "collectives"
        )
    summary = (
        f"{head}: {gain}. {top.replace('_', ' ')} accounts for {shares[top]:.0%} of the "
        f"step-time growth ({top_ms:.1f} ms per step){detail}{drift_note} — {FIXES[top]}."
    )
    return TrainingVerdict(top, summary, FIXES[top], ranks, shares)
