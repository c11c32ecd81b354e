"""``tracekit diff`` of two training runs: scaling efficiency and what ate it.

Speed-up is samples/s after ÷ before, ideal speed-up the ratio of world sizes, and
scaling efficiency their ratio (docs/design.md, "Training steps"). Under ideal scaling the
after run's mean step time would be the before run's, with compute scaled to the after
run's per-rank work (compute is compared per sample, or per token where the steps say);
the difference is the **lost** step time. Each component's share of it follows the
diff's counterfactual rule: put the component's per-step values in the after run back
to the before run's distribution (quantile-matched), recompute the mean step time, and
see how much of the loss disappears. The figures behind the verdict are 10%-trimmed
means over steps, so a few steps stalled by something else on the machine do not
decide it.

The verdict (docs/training.md, "Verdict"):

- ``none`` only when scaling is close to ideal: efficiency at least :data:`EFFICIENT`,
  also once a compute speed-up of the after run is taken out (a baseline measured on a
  busier machine must not hide a slow loader). A run whose efficiency is lower always
  gets a bottleneck.
- otherwise the bottleneck whose growth recovers the largest share of the lost time:
  ``data_loading``, ``communication`` (with the bus bandwidth before and after),
  ``straggler`` (one rank arriving after the others in most steps by a margin beyond
  chance; without such a rank the peer wait is *jitter*, ranks taking turns being
  late, said so in the sentence), or ``compute``, split into "per-rank work changed"
  (samples or tokens per rank per step) and "the same work ran slower" (naming the
  stages and their factors: recomputation, resharding, another kernel or GPU).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.results import Flag, TrainingVerdict
from tracekit.analysis.store import Store
from tracekit.analysis.training.bandwidth import INTRA
from tracekit.analysis.training.model import (
    BOTTLENECKS,
    COMMUNICATION,
    COMPUTE,
    COMPUTE_STAGES,
    DATA_LOADING,
    IMBALANCE,
    NONE,
    STRAGGLER,
    BandwidthChange,
    CollectiveBandwidth,
    DiffComponent,
    RunSteps,
    RunSummary,
    Scaling,
    Straggler,
    TrainingDiff,
    bottleneck_of,
    rank_count,
)
from tracekit.analysis.training.steps import load_run

EFFICIENT = 0.9
"""Scaling efficiency at or above which scaling is close to ideal (verdict ``none``)."""
MAJORITY = 0.5
"""Below this share of the growth the named bottleneck's sentence also gives the spread."""
MIN_STEP_SHARE = 0.15
"""A compute drift (same per-rank work) of this share of the ideal step is said."""
STRAGGLER_LATENESS = 0.15
"""A straggler's median lateness over steps, as a share of the step time."""
STRAGGLER_STEPS = 2 / 3
"""...and the share of steps in which it arrived after the others."""
STRAGGLER_Z = 4.0
"""...and its median lateness in standard errors (the steps' own spread): beyond chance."""
TRIM = 0.1
"""Share of steps trimmed from each end for the verdict's means."""
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
BOTTLENECK_PROSE: dict[str, str] = {
    DATA_LOADING: "Data loading",
    COMMUNICATION: "Communication",
    STRAGGLER: "Waiting for a late rank (straggler)",
    COMPUTE: "Compute",
}
"""How the verdict's sentence names the bottleneck it opens with."""
SAME_WORK_FIX = (
    "look at what changed in those stages — activation "
    "recomputation (checkpointing), FSDP resharding, another kernel or library version, "
    "another GPU SKU, clocks and thermal throttling (nvidia-smi -q -d CLOCK,PERFORMANCE)"
)
JITTER_FIX = (
    "no one rank is late in most steps: ranks take turns being late — look for what delays "
    "any rank at random (shared or oversubscribed hosts, OS noise, uneven batches or "
    "sequence lengths) and for host syncs that make every step wait for the slowest"
)
NETWORK_FIX = "the network is the limit: " + FIXES[COMMUNICATION]
INTRA_FIX = (
    "the collectives inside the node are the limit (NVLink/PCIe; loopback for gloo): "
    + FIXES[COMMUNICATION]
)
UNDER_LINK = 0.5
"""Bus bandwidth under this share of the link's rate is not the link's rate at work."""
UNDER_LINK_FIX = (
    "the network is the limit, though well under the link's rate: small messages "
    "(latency-bound: fewer, larger buckets) or a fabric running below it (NCCL_DEBUG=INFO "
    "says whether NCCL uses InfiniBand/RoCE or fell back to sockets; check "
    "NCCL_SOCKET_IFNAME, NCCL_IB_HCA and GPUDirect RDMA)"
)


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


def diff_runs(
    store: Store, before: str, after: str, *, warmup: int = 1, link_gbps: float | None = None
) -> TrainingDiff:
    """Compare two training runs of the store (``link_gbps``: the link's peak, Gb/s)."""
    return compare_runs(
        load_run(store, before, warmup=warmup, link_gbps=link_gbps),
        load_run(store, after, warmup=warmup, link_gbps=link_gbps),
    )


def _work_ratio(b: RunSteps, a: RunSteps) -> tuple[float, str]:
    """After ÷ before per-rank work per step, and its unit (tokens where both runs say)."""
    if b.tokens_per_rank_step and a.tokens_per_rank_step:
        return a.tokens_per_rank_step / b.tokens_per_rank_step, "tokens"
    if b.samples_per_rank_step and a.samples_per_rank_step:
        return a.samples_per_rank_step / b.samples_per_rank_step, "samples"
    return 1.0, "samples"


def compare_runs(b: RunSteps, a: RunSteps) -> TrainingDiff:
    """The diff of two already-read runs."""
    flags = [*b.flags, *a.flags]
    per_rank, unit = _work_ratio(b, a)
    same_work = abs(per_rank - 1.0) <= 1e-9
    if not same_work:
        what = "batch" if unit == "samples" else "tokens"
        flags.append(
            Flag(
                "batch_changed",
                f"the per-rank {what} changed ×{per_rank:.2f}; compute is compared per {unit[:-1]}",
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

    names = [c.name for c in a.components]
    names += [c.name for c in b.components if c.name not in names]
    step_after = np.asarray(a.step_times_ms, dtype=float)
    series: dict[str, tuple[list[float], list[float]]] = {}
    for name in names:
        scale = per_rank if name in COMPUTE_STAGES or name == IMBALANCE else 1.0
        before_vals = [v * scale for v in b.component_steps_ms.get(name, [])] or [0.0]
        after_vals = a.component_steps_ms.get(name, []) or [0.0] * len(step_after)
        series[name] = (before_vals, after_vals)

    def recovered(trim: float) -> dict[str, float]:
        out = {}
        after_mean = trimmed_mean(step_after, trim)
        for name, (before_vals, after_vals) in series.items():
            cf = step_after - np.asarray(after_vals) + quantile_matched(after_vals, before_vals)
            out[name] = after_mean - trimmed_mean(cf, trim) if len(step_after) else 0.0
        return out

    # the verdict's own figures: trimmed means over steps (a stalled step decides nothing)
    robust_after = trimmed_mean(a.step_times_ms)
    robust_ideal = trimmed_mean(b.step_times_ms) * per_rank
    lost = robust_after - robust_ideal
    recovered_ms = recovered(TRIM)
    stages = {
        n: (trimmed_mean(series[n][0]), trimmed_mean(series[n][1]))
        for n in COMPUTE_STAGES
        if n in series
    }
    # With the same per-rank work, a compute change is the same work done faster or
    # slower. Slower is named (recomputation, another kernel, a throttled GPU); faster
    # must not hide a bottleneck that scaling added, so it is taken out of the test
    # for "close to ideal".
    drift = sum(after - before for before, after in stages.values()) if same_work else 0.0
    components = []
    for name in names:
        before_vals, after_vals = series[name]
        before_ms, after_ms = float(np.mean(before_vals)), float(np.mean(after_vals))
        components.append(
            DiffComponent(
                name=name,
                before_ms=before_ms,
                after_ms=after_ms,
                delta_ms=after_ms - before_ms,
                share=recovered_ms[name] / lost if lost > 0 else None,
                bottleneck=bottleneck_of(name),
            )
        )
    scaling = Scaling(speedup, ideal, efficiency)
    bandwidth = bandwidth_change(b, a)
    stalls = False
    if efficiency is not None and efficiency < EFFICIENT and not _grown(recovered_ms):
        # the trimmed means see no loss: it is in a few slow steps; the plain means do
        recovered_ms, stalls = recovered(0.0), True
    verdict = _verdict(
        b,
        a,
        scaling,
        components,
        recovered_ms,
        _Loss(lost, robust_after - min(drift, 0.0), robust_ideal, drift, per_rank, unit),
        _Evidence(stages, bandwidth, stalls),
        flags,
    )
    if a.steps < 5 or b.steps < 5:
        flags.append(Flag("few_steps", "fewer than 5 steps in a run: the verdict is fragile"))
    return TrainingDiff(
        before=summary_of(b),
        after=summary_of(a),
        scaling=scaling,
        components=components,
        verdict=verdict,
        flags=flags,
        ideal_step_ms=ideal_step,
        bandwidth=bandwidth,
    )


@dataclass
class _Loss:
    """The verdict's figures (trimmed means over steps, ms)."""

    lost: float
    """After step minus the ideal step."""
    after_same_work: float
    """After step with a compute speed-up of the same per-rank work taken out."""
    ideal: float
    drift: float
    """Compute time that changed with the per-rank work unchanged (0 when it changed)."""
    per_rank: float
    unit: str
    """What ``per_rank`` counts: ``samples`` or ``tokens``."""


@dataclass
class _Evidence:
    """What the sentence names beside the shares."""

    stages: dict[str, tuple[float, float]]
    """Compute stage -> (before, after) trimmed mean ms (before scaled to the after work)."""
    bandwidth: BandwidthChange | None
    stalls: bool
    """The loss is only in the plain means: a few slow steps."""


def _grown(recovered_ms: dict[str, float]) -> dict[str, float]:
    """Ms of the after step each bottleneck's growth costs (positive parts only).

    ``unattributed`` (step time outside every stage: host work between them, a stage not
    instrumented) counts as compute, and the compute sentence says how much of it it is."""
    grown: dict[str, float] = {}
    for name, r in recovered_ms.items():
        if r > 0:
            key = bottleneck_of(name)
            grown[key] = grown.get(key, 0.0) + r
    return grown


def _busiest(rows: list[CollectiveBandwidth]) -> dict[tuple[str, str], tuple[float, float]]:
    """(op, scope) -> (transfer ms in all, time-weighted mean bus bandwidth).

    Groups of one rank are left out: nothing crosses a bus (nccl-tests' busbw is 0)."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.group_size < 2 or r.busbw_gb_s is None:
            continue
        t = r.count * r.time_ms
        a = acc.setdefault((r.op, r.scope), [0.0, 0.0])
        a[0] += t
        a[1] += r.busbw_gb_s * t
    return {k: (t, w / t) for k, (t, w) in acc.items() if t > 0}


def bandwidth_change(b: RunSteps, a: RunSteps) -> BandwidthChange | None:
    """The after run's busiest (op, scope) by transfer time, with the same op before."""
    after = _busiest(a.collectives)
    if not after:
        return None
    (op, scope), (_t, busbw) = max(after.items(), key=lambda kv: kv[1][0])
    before = _busiest(b.collectives)
    key = (op, scope) if (op, scope) in before else None
    if key is None:
        ops = [k for k in before if k[0] == op]
        key = max(ops, key=lambda k: before[k][0]) if ops else None
    link = a.link_gbps
    fraction = busbw / (link / 8.0) if link and scope != INTRA else None
    return BandwidthChange(
        op,
        scope,
        before[key][1] if key else None,
        busbw,
        link,
        fraction,
        before_scope=key[1] if key else None,
    )


def _verdict(
    b: RunSteps,
    a: RunSteps,
    scaling: Scaling,
    components: list[DiffComponent],
    recovered_ms: dict[str, float],
    loss: _Loss,
    evidence: _Evidence,
    flags: list[Flag],
) -> TrainingVerdict:
    speedup, ideal, efficiency = scaling.speedup, scaling.ideal, scaling.efficiency
    grown = {k: 0.0 for k in BOTTLENECKS if k != NONE} | _grown(recovered_ms)
    total = sum(grown.values())
    shares = {k: v / total for k, v in grown.items()} if total > 0 else dict.fromkeys(grown, 0.0)
    head = f"{b.label} ({rank_count(b.world_size)}) → {a.label} ({rank_count(a.world_size)})"
    if speedup is None or efficiency is None:
        return TrainingVerdict(NONE, f"{head}: no step times to compare.", FIXES[NONE], [], shares)
    gain = f"{speedup:.2f}× of an ideal {ideal:.2f}× (scaling efficiency {efficiency:.0%} of ideal)"
    same_work = loss.ideal / loss.after_same_work if loss.after_same_work > 0 else 1.0
    faster = (
        f" (compute ran {-loss.drift:.1f} ms per step faster with the same per-rank work; "
        f"without that gain the efficiency would be {same_work:.0%})"
        if loss.drift <= -MIN_STEP_SHARE * loss.ideal
        else ""
    )
    if loss.drift >= MIN_STEP_SHARE * loss.ideal:
        flags.append(
            Flag(
                SLOWER_COMPUTE,
                f"with the same per-rank work, compute took {loss.drift:.1f} ms more per step: "
                "the same work done slower",
            )
        )
    if efficiency >= EFFICIENT and same_work >= EFFICIENT:
        return TrainingVerdict(
            NONE,
            f"{head}: {gain}; no bottleneck — scaling is close to ideal (efficiency at least "
            f"{EFFICIENT:.0%}){faster}.",
            FIXES[NONE],
            [],
            shares,
        )
    if total <= 0:
        # Low efficiency, yet no part of the step grew against ideal scaling: the step
        # time scaled and the throughput per step did not (fewer samples per step).
        return TrainingVerdict(
            COMPUTE,
            f"{head}: {gain}. No part of the step grew against ideal scaling: the step time "
            "scaled, the samples per step did not — check the samples each rank reports "
            "(tracekit.step.samples) and the per-rank batch.",
            FIXES[COMPUTE],
            [],
            shares,
        )
    top = max(grown, key=lambda k: grown[k])
    lost = max(loss.lost, total)
    fix, detail, ranks = FIXES[top], "", []
    if top == STRAGGLER:
        lead = consistent_straggler(a)
        if lead is not None:
            ranks = [lead.rank]
            where = f" on {lead.host}" if lead.host else ""
            detail = (
                f"; rank {lead.rank}{where} arrived after the others in {lead.late_steps:.0%} "
                f"of steps (median {lead.lateness_ms:.1f} ms late) and last at {lead.share:.0%} "
                "of collectives"
            )
        else:
            detail = "; no one rank: ranks take turns being late (jitter)"
            fix = JITTER_FIX
    elif top == COMPUTE:
        detail, fix = _compute_detail(b, a, loss, evidence.stages)
        outside = recovered_ms.get(cv.UNATTRIBUTED, 0.0)
        if outside > 0.1 * grown[top]:
            detail += (
                f"; {outside:.1f} ms of it is outside every recorded stage (unattributed: host "
                "work between the stages, or a stage not instrumented)"
            )
    elif top == COMMUNICATION and evidence.bandwidth is not None:
        detail = "; " + evidence.bandwidth.sentence()
        fraction = evidence.bandwidth.link_fraction
        if evidence.bandwidth.scope == INTRA:
            fix = INTRA_FIX
        else:
            fix = NETWORK_FIX if fraction is None or fraction >= UNDER_LINK else UNDER_LINK_FIX
    if grown[top] < MAJORITY * lost:
        rest = ", ".join(
            f"{k.replace('_', ' ')} {v:.1f} ms"
            for k, v in sorted(grown.items(), key=lambda kv: -kv[1])
            if v > 0 and k != top
        )
        detail += f"; the rest is spread ({rest})"
    if evidence.stalls:
        detail += "; the loss is in a few slow steps (trimmed means show none)"
    summary = (
        f"{head}: {gain}. {BOTTLENECK_PROSE[top]} accounts for {grown[top] / lost:.0%} of the "
        f"lost step time ({grown[top]:.1f} of {lost:.1f} ms per step){detail}{faster} — {fix}."
    )
    return TrainingVerdict(top, summary, fix, ranks, shares)


def _compute_detail(
    b: RunSteps, a: RunSteps, loss: _Loss, stages: dict[str, tuple[float, float]]
) -> tuple[str, str]:
    """The compute sentence: whether the per-rank work changed or the same work ran slower."""
    slower = sorted(
        ((n, bv, av) for n, (bv, av) in stages.items() if av > bv),
        key=lambda t: -(t[2] - t[1]),
    )
    if abs(loss.per_rank - 1.0) > 1e-9:
        unit = loss.unit
        before = b.tokens_per_rank_step if unit == "tokens" else b.samples_per_rank_step
        after = a.tokens_per_rank_step if unit == "tokens" else a.samples_per_rank_step
        per = ", ".join(f"{n} per {unit[:-1]} ×{av / bv:.2f}" for n, bv, av in slower if bv > 0)
        text = (
            f"; per-rank work changed: {before or 0:g} → {after or 0:g} {unit} per rank per "
            f"step (×{loss.per_rank:.2f})" + (f", {per}" if per else "")
        )
        return text, FIXES[COMPUTE] if loss.per_rank < 1.0 else SAME_WORK_FIX
    parts = ", ".join(
        f"{n} {bv:.1f} → {av:.1f} ms" + (f" (×{av / bv:.2f})" if bv > 0 else "")
        for n, bv, av in slower
    )
    return f"; the same work ran slower: {parts}" if parts else "", SAME_WORK_FIX
