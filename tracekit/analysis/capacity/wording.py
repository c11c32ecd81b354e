"""The capacity verdict of one release and the summary of several, in words.

Every text here is made of full sentences, each ending with a full stop, so that a
reason reads alone (JSON, HTML) and inside the summary alike. Window counts are given
as "missed of judged" — the same two numbers the table prints — never as a share of
another denominator. Latency-bound releases are ranked by how far their requests ran
past the objective in all (:class:`~tracekit.analysis.capacity.model.Overrun`), not by
the share of windows they miss: a release that misses in a few windows by seconds binds
before one that misses in many by milliseconds.
"""

from __future__ import annotations

from tracekit.analysis.autoscale.model import Slo, min_requests_for
from tracekit.analysis.capacity.model import (
    BALANCED,
    COST_BOUND,
    INCONCLUSIVE,
    LATENCY_BOUND,
    Cost,
    Overrun,
    Regime,
    ReleaseCapacity,
    Spikes,
)
from tracekit.analysis.results import Flag

MIN_WINDOWS = 6
"""Judged windows (enough accepted requests) a verdict needs."""
MISS_SHARE_BOUND = 0.1
"""Share of judged peak (or normal) windows missing the objective that makes it latency-bound."""
IDLE_GPU_BUSY = 0.4
"""GPU busy fraction below which a release that meets the objective is cost-bound."""


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _ms(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f} ms"


def _money(x: float) -> str:
    return f"${x:.2f}" if x >= 0.01 else f"${x:.4f}"


def _secs(v: float) -> str:
    """A spike's duration as people read it: ``1.4``, ``12``."""
    return f"{round(v, 1):g}" if v < 10 else f"{v:.0f}"


def _duration(seconds: float) -> str:
    """Time past the objective: ``850 ms``, ``70.2 s``, ``1,204 s``."""
    if seconds < 1.0:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:,.1f} s" if seconds < 100 else f"{seconds:,.0f} s"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def cost_text(cost: Cost) -> str:
    if cost.cost_per_1k is not None:
        return f"{_money(cost.cost_per_1k)} per 1,000 requests"
    if cost.replica_seconds_per_1k is not None:
        return f"{cost.replica_seconds_per_1k:.1f} replica-seconds per 1,000 requests"
    return "an unknown cost"


def busy_text(cost: Cost) -> str:
    """``its GPUs 4% busy``, ``its model executions 6% busy (wall time)``."""
    if cost.gpu_busy_fraction is not None:
        return f"its GPUs {_pct(cost.gpu_busy_fraction)} busy"
    if cost.execution_busy_fraction is not None:
        return f"its model executions {_pct(cost.execution_busy_fraction)} busy (wall time)"
    return "its GPU busy unknown"


def judged_busy(cost: Cost) -> float | None:
    """GPU busy, else execution busy (its stand-in where no device time was measured)."""
    if cost.gpu_busy_fraction is not None:
        return cost.gpu_busy_fraction
    return cost.execution_busy_fraction


def _objective_q(regime: Regime, slo: Slo) -> float | None:
    if slo.quantile >= 0.99:
        return regime.p99_ms
    return regime.p95_ms if slo.quantile >= 0.95 else regime.p50_ms


def _overrun_text(overrun: Overrun, slo: Slo) -> str:
    """``160 of its requests (24%) took longer than 500 ms, 70.2 s past it in all``."""
    n = round(overrun.requests)
    share = f" ({_pct(overrun.share)})" if overrun.share is not None else ""
    if n == 0:
        return f"none of its requests took longer than {slo.threshold_ms:g} ms"
    return (
        f"{n:,} of its requests{share} took longer than {slo.threshold_ms:g} ms, "
        f"{_duration(overrun.excess_s)} past it in all"
    )


def verdict(
    slo: Slo,
    peak: Regime,
    normal: Regime,
    spikes: Spikes,
    cost: Cost,
    overrun: Overrun,
    flags: list[Flag],
) -> tuple[str, str]:
    """The verdict of one release and its reason (full sentences); adds the flags that
    say what the cost judgement stood on."""
    judged = peak.judged_windows + normal.judged_windows
    missed = peak.missed_windows + normal.missed_windows
    min_req = min_requests_for(slo.quantile)
    if judged < MIN_WINDOWS:
        return INCONCLUSIVE, (
            f"only {_plural(judged, 'window')} had the {min_req} accepted requests "
            f"{slo.label} needs, and a verdict needs at least {MIN_WINDOWS}."
        )
    if peak.windows == 0 or peak.miss_share is None:
        return INCONCLUSIVE, (
            f"no peak window had the {min_req} accepted requests {slo.label} needs."
        )
    counts = (
        f"{peak.missed_windows} of {peak.judged_windows} peak, "
        f"{normal.missed_windows} of {normal.judged_windows} normal"
    )
    worst = max(peak.miss_share, normal.miss_share or 0.0)
    if worst >= MISS_SHARE_BOUND:
        spike_text = ""
        if spikes.count and spikes.duration_s_p50 is not None:
            lo, hi = spikes.duration_s_p50, spikes.duration_s_p90 or spikes.duration_s_p50
            a, b = _secs(lo), _secs(hi)
            span = f"{a} s" if a == b else f"{a}–{b} s"
            ratio = f" at {spikes.rate_ratio:.1f}× the median rate" if spikes.rate_ratio else ""
            spike_text = (
                f"; {_plural(spikes.count, 'spike')} of {span}{ratio}"
                f" push{'es' if spikes.count == 1 else ''} its p95 to"
                f" {_ms(spikes.p95_inside_ms)} against {_ms(spikes.p95_outside_ms)} outside"
            )
        return LATENCY_BOUND, (
            f"it misses {slo.text} in {missed} of {judged} judged windows ({counts})"
            f"{spike_text}; {_overrun_text(overrun, slo)}."
        )
    meets = (
        f"it meets {slo.text} in {judged - missed} of {judged} judged windows "
        f"({counts} missed; {slo.label} {_ms(_objective_q(peak, slo))} in peaks)"
    )
    busy = judged_busy(cost)
    if busy is None:
        flags.append(
            Flag(
                "cost_not_judged",
                "no model executions were traced, so whether it is cost-bound is not judged",
            )
        )
        return BALANCED, (
            f"{meets} at {cost_text(cost)}; no model executions were traced, so whether it"
            " is cost-bound is not judged."
        )
    if cost.gpu_busy_fraction is None:
        flags.append(
            Flag(
                "busy_from_wall_time",
                "cost judged on the model executions' wall time (no device time measured): an"
                " upper bound of GPU busy where executions wait for the device",
            )
        )
    if busy < IDLE_GPU_BUSY:
        return COST_BOUND, (
            f"{meets}, with {busy_text(cost)}, under {_pct(IDLE_GPU_BUSY)}, at {cost_text(cost)}."
        )
    return BALANCED, f"{meets}, with {busy_text(cost)} at {cost_text(cost)}."


_ORDER = {LATENCY_BOUND: 0, COST_BOUND: 1, BALANCED: 2, INCONCLUSIVE: 3}
_WORDS = {
    LATENCY_BOUND: "latency-bound",
    COST_BOUND: "cost-bound",
    BALANCED: "balanced",
    INCONCLUSIVE: "inconclusive",
}


def rank_key(r: ReleaseCapacity) -> tuple[int, float, float]:
    """Latency-bound first, the most time past the objective first (then the most peak
    windows missed); then cost-bound, the least busy first; then the rest."""
    if r.verdict == LATENCY_BOUND:
        return 0, -r.overrun.excess_s, -(r.peak.miss_share or 0.0)
    if r.verdict == COST_BOUND:
        busy = judged_busy(r.cost)
        return 1, busy if busy is not None else 1.0, 0.0
    return _ORDER[r.verdict], 0.0, 0.0


def _why_first(first: ReleaseCapacity, others: list[ReleaseCapacity], slo: Slo) -> str:
    """Why the first of several latency-bound releases binds first: its time past the
    objective against each other's."""
    against = ", ".join(
        f"{round(o.overrun.requests):,} of {o.label}'s, {_duration(o.overrun.excess_s)} past it"
        for o in others
    )
    return (
        f"{_overrun_text(first.overrun, slo)}, against {against}. "
        f"{first.label} is latency-bound: {first.reason}"
    )


def summary(releases: list[ReleaseCapacity], slo: Slo) -> str:
    """Which release binds the business first (latency-bound before cost-bound) and why."""
    if len(releases) == 1:
        r = releases[0]
        return f"{r.label} is {_WORDS[r.verdict]}: {r.reason}"
    ranked = sorted(releases, key=rank_key)
    first = ranked[0]
    if first.verdict in (BALANCED, INCONCLUSIVE):
        head = "nothing binds." if first.verdict == BALANCED else "no release gives a verdict."
        return " ".join([head, *(f"{r.label} is {_WORDS[r.verdict]}: {r.reason}" for r in ranked)])
    late = [r for r in ranked[1:] if r.verdict == LATENCY_BOUND]
    why = _why_first(first, late, slo) if late else first.reason
    parts = [f"fix {first.label} first: {why}"]
    for r in ranked[1:]:
        if r.verdict in (LATENCY_BOUND, INCONCLUSIVE):
            too = " too" if r.verdict == LATENCY_BOUND else ""
            parts.append(f"{r.label} is {_WORDS[r.verdict]}{too}: {r.reason}")
        else:
            parts.append(
                f"{r.label} meets {slo.text} with {busy_text(r.cost)} at {cost_text(r.cost)},"
                f" against {first.label}'s {cost_text(first.cost)}."
            )
    if all(r.cost.cost_per_1k is None for r in releases):
        parts.append("Costs are unknown: no replica cost was given.")
    elif any(r.cost.cost_per_1k is None for r in releases):
        parts.append("Money is unknown where no replica cost was given.")
    return " ".join(parts)
