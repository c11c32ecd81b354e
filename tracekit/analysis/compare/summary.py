"""``tracekit summary`` and ``tracekit slow``: one release's tail, split by stage.

* :class:`Summary`: requests, p50/p90/p95/p99, and per stage the mean critical-path
  time, the tail-cohort (≥ p99) mean and the stage's share of the tail — the seed's
  "p99 160 ms: feature retrieval 15, preprocessing 10, batch queue 55, model 20,
  downstream 45".
* :class:`SlowFast`: the ≥ p99 cohort against the ≤ p50 cohort of the same release.
  Critical-path times add up to each request's duration, so the gap between the two
  cohorts' mean durations splits exactly into per-stage gaps; a stage's share is its
  part of that gap. The cohort widens to ≥ p95 when fewer than ten requests are at or
  above p99. Attribute values are ranked slow vs the rest, as in ``diff``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.attribution.patterns import ReleasePatterns
from tracekit.analysis.cohorts import counterfactual as cf
from tracekit.analysis.cohorts.bubbleup import AttributeLift, rank_attributes
from tracekit.analysis.cohorts.release import ReleaseData, load_release
from tracekit.analysis.cohorts.sampling import (
    UNWEIGHTED_TAIL_SAMPLING,
    estimated_requests,
    unweighted_tail_sampling,
)
from tracekit.analysis.cohorts.stats import DEFAULT_QUANTILES, weighted_quantiles
from tracekit.analysis.cohorts.tokens import (
    E2E,
    TokenSummary,
    metric_view,
    read_tokens,
    token_summary,
)
from tracekit.analysis.compare import operations as ops
from tracekit.analysis.compare.diff import EXEMPLARS, Exemplar, with_profile_ids
from tracekit.analysis.compare.wording import (
    few_requests_flag,
    issue_phrase,
    kind_phrase,
    quantile_name,
    split_sentence,
)
from tracekit.analysis.results import Flag
from tracekit.analysis.store import Store
from tracekit.analysis.store.operations import OperationStat
from tracekit.errors import QueryError

SECOND_STAGE_SHARE = 0.2
"""A second stage is named in the sentence when it holds at least this share."""


@dataclass(frozen=True)
class StageSummary:
    name: str
    time_kind: str
    mean_ms: float
    """Mean critical-path ms over every request (weighted)."""
    tail_mean_ms: float
    """Mean critical-path ms over the tail cohort."""
    tail_share: float
    """tail_mean_ms / mean tail duration: the stage's share of a tail request."""


@dataclass(frozen=True)
class Summary:
    label: str
    requests: int
    errors: int
    latency: dict[str, float]
    """``p50``, ``p90``, ``p95``, ``p99`` in ms."""
    cohort: str
    threshold_ms: float
    tail_requests: int
    stages: list[StageSummary]
    summary: str
    flags: list[Flag] = field(default_factory=list)
    estimated_requests: float = 0.0
    """Summed sample weights: the requests ``requests`` kept ones stand for."""
    metric: str = "e2e"
    """The latency summarised: ``e2e``, ``ttft`` or ``tpot`` (docs/llm.md)."""
    tokens: TokenSummary | None = None
    """Time to first token, time per output token and token counts, where the requests
    carry LLM stages or token attributes; None otherwise."""
    operations: list[OperationStat] | None = None
    """Top operations of the tail cohort's critical path (≥ ``threshold_ms``), most path
    time first; None for a token metric (operations split request time)."""


@dataclass(frozen=True)
class StageGap:
    name: str
    time_kind: str
    kind: str
    """``wait``, ``compute`` or ``hidden_wait`` (slow cohort vs fast, same rule as diff)."""
    slow_mean_ms: float
    fast_mean_ms: float
    delta_ms: float
    share: float
    """delta_ms / the cohorts' gap in mean duration (shares sum to 1)."""
    hidden_wait: bool


@dataclass(frozen=True)
class SlowFast:
    label: str
    requests: int
    cohort: str
    slow_threshold_ms: float
    fast_threshold_ms: float
    slow_requests: int
    fast_requests: int
    slow_mean_ms: float
    fast_mean_ms: float
    widened: bool
    reason: str
    stages: list[StageGap]
    primary_stage: str | None
    kind: str
    summary: str
    attributes: list[AttributeLift] = field(default_factory=list)
    exemplars: list[Exemplar] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    estimated_requests: float = 0.0
    """Summed sample weights: the requests ``requests`` kept ones stand for."""
    operations: SlowOperations | None = None
    """Top operations of the slow cohort's critical path, and the fast cohort's."""
    patterns: dict[str, ReleasePatterns | None] | None = None
    """``slow`` and ``fast``: pattern counts over (a sample of) each cohort's traces (a
    value is None where the store holds no spans)."""


@dataclass(frozen=True)
class SlowOperations:
    """Operations of the slow cohort against the fast one (per request of each cohort)."""

    slow: list[OperationStat] = field(default_factory=list)
    """Most path time first."""
    fast: list[OperationStat] = field(default_factory=list)
    """The fast cohort's top operations, most path time first."""
    available: bool = True
    """False when the store has no operation rows (re-ingest to fill them)."""


def _tail_q(rel: ReleaseData) -> tuple[float, str]:
    if cf.cohort_size(rel.duration_ms, rel.weights, 0.99) >= cf.MIN_TAIL_REQUESTS:
        return 0.99, ""
    n = cf.cohort_size(rel.duration_ms, rel.weights, 0.99)
    return 0.95, (
        f"{n} of {rel.n} requests are at or above p99 (fewer than {cf.MIN_TAIL_REQUESTS}): "
        "using the ≥ p95 cohort instead"
    )


def compute_summary(rel: ReleaseData) -> Summary:
    """Summary of one release's requests (pure)."""
    qs = weighted_quantiles(rel.duration_ms, DEFAULT_QUANTILES, rel.weights)
    q, reason = _tail_q(rel)
    threshold = float(weighted_quantiles(rel.duration_ms, [q], rel.weights)[0])
    mask = rel.duration_ms >= threshold
    tail_total = cf.weighted_mean(rel.duration_ms[mask], rel.weights[mask])
    stages = []
    for j, name in enumerate(rel.stages):
        tail_mean = cf.weighted_mean(rel.stage_ms[mask, j], rel.weights[mask])
        stages.append(
            StageSummary(
                name=name,
                time_kind=cf.declared_kind(None, rel, name),
                mean_ms=cf.weighted_mean(rel.stage_ms[:, j], rel.weights),
                tail_mean_ms=tail_mean,
                tail_share=tail_mean / tail_total if tail_total > 0 else float("nan"),
            )
        )
    label = quantile_name(q)
    n_tail = int(mask.sum())
    who = (
        "the 1 request at or above it averages"
        if n_tail == 1
        else (f"the {n_tail} requests at or above it average")
    )
    prefix = f"{label} {threshold:.1f} ms; {who}"
    sentence = split_sentence(prefix, tail_total, [(s.name, s.tail_mean_ms) for s in stages])
    top = sorted(stages, key=lambda s: -s.tail_share)
    named = [top[0]] + [s for s in top[1:2] if s.tail_share >= SECOND_STAGE_SHARE] if top else []
    if named:
        most = " and ".join(
            f"{kind_phrase(s.name, s.time_kind)} ({s.tail_share:.0%})" for s in named
        )
        sentence += f" — most of the tail is {most}"
        if cv.MODEL_EXECUTE in rel.stages and all(s.name != cv.MODEL_EXECUTE for s in named):
            sentence += ", not the model"
    flags = [Flag("tail_widened", reason)] if reason else []
    few = few_requests_flag([rel], label, [int(mask.sum())])
    if few is not None:
        flags.append(few)
    if bias := unweighted_tail_sampling(rel):
        flags.append(Flag(UNWEIGHTED_TAIL_SAMPLING, bias))
    return Summary(
        label=rel.label,
        requests=rel.n,
        errors=int(rel.is_error.sum()),
        latency={quantile_name(p): float(v) for p, v in zip(DEFAULT_QUANTILES, qs, strict=True)},
        cohort=label,
        threshold_ms=threshold,
        tail_requests=int(mask.sum()),
        stages=stages,
        summary=sentence + ".",
        flags=flags,
        estimated_requests=estimated_requests(rel),
    )


def summarize_release(
    store: Store,
    label: str,
    *,
    service: str | None = None,
    route: str | None = None,
    metric: str = E2E,
) -> Summary:
    """Summary of release ``label`` (of ``metric``: ``e2e``, ``ttft``, ``tpot``), with its
    token latencies beside when it has any; :class:`QueryError` naming the releases when
    absent."""
    data = load_release(store, label, service=service, route=route)
    tokens = read_tokens(store, data, service=service, route=route)
    view, flags = metric_view(data, metric, tokens)
    summary = compute_summary(view)
    top = None
    if metric == E2E:
        top = ops.cohort_operations(
            store, label, min_ms=summary.threshold_ms, service=service, route=route
        ).operations
    return dataclasses.replace(
        summary,
        operations=top,
        metric=metric,
        tokens=token_summary(data, tokens),
        flags=[*summary.flags, *flags],
    )


def summarize_all(
    store: Store, *, service: str | None = None, route: str | None = None, metric: str = E2E
) -> list[Summary]:
    """One summary per release in the store, most requests first."""
    labels = [label for label, _ in store.releases()]
    if not labels:
        raise QueryError(f"no requests in {store.path}: run `tracekit ingest FILE` first")
    if metric == E2E:
        return [summarize_release(store, label, service=service, route=route) for label in labels]
    # A token metric: the releases without LLM requests are left out, unless all are.
    out, first_error = [], None
    for label in labels:
        try:
            out.append(summarize_release(store, label, service=service, route=route, metric=metric))
        except QueryError as exc:
            first_error = first_error or exc
    if not out and first_error is not None:
        raise first_error
    return out


def _gap_rows(
    rel: ReleaseData, slow: npt.NDArray[np.bool_], fast: npt.NDArray[np.bool_]
) -> list[StageGap]:
    gap = cf.weighted_mean(rel.duration_ms[slow], rel.weights[slow]) - cf.weighted_mean(
        rel.duration_ms[fast], rel.weights[fast]
    )
    rows = []
    for name in rel.stages:
        declared = cf.declared_kind(None, rel, name)
        ev_fast = cf.stage_evidence(rel, name, fast)
        ev_slow = cf.stage_evidence(rel, name, slow)
        hidden = cf.is_hidden_wait(declared, ev_fast, ev_slow)
        delta = ev_slow.critical_ms - ev_fast.critical_ms
        rows.append(
            StageGap(
                name=name,
                time_kind=declared,
                kind=cv.HIDDEN_WAIT if hidden else declared,
                slow_mean_ms=ev_slow.critical_ms,
                fast_mean_ms=ev_fast.critical_ms,
                delta_ms=delta,
                share=delta / gap if gap > 0 else float("nan"),
                hidden_wait=hidden,
            )
        )
    return rows


def compute_slow_fast(rel: ReleaseData) -> SlowFast:
    """Slow (≥ p99, or ≥ p95 when thin) vs fast (≤ p50) within one release (pure)."""
    q, reason = _tail_q(rel)
    slow_t, fast_t = weighted_quantiles(rel.duration_ms, [q, 0.5], rel.weights)
    slow = rel.duration_ms >= slow_t
    fast = rel.duration_ms <= fast_t
    rows = _gap_rows(rel, slow, fast)
    slow_mean = cf.weighted_mean(rel.duration_ms[slow], rel.weights[slow])
    fast_mean = cf.weighted_mean(rel.duration_ms[fast], rel.weights[fast])
    ranked = sorted((r for r in rows if r.share > 0), key=lambda r: (-r.share, r.name))
    label = quantile_name(q)
    head = (
        f"Slow requests (≥ {label}, {slow_t:.1f} ms, {int(slow.sum())}) average {slow_mean:.1f} ms "
        f"vs {fast_mean:.1f} ms for fast ones (≤ p50)"
    )
    if not ranked or not slow_mean > fast_mean:
        primary, kind = None, "none"
        sentence = head + ": no stage stands out."
    else:
        named = [ranked[0]] + [r for r in ranked[1:3] if r.share >= SECOND_STAGE_SHARE]
        primary, kind = ranked[0].name, ranked[0].kind
        parts = ", ".join(
            f"{kind_phrase(r.name, r.kind)} {r.delta_ms:+.1f} ms ({r.share:.0%})" for r in named
        )
        issue = issue_phrase([(r.name, r.kind) for r in named], rel.stages)
        sentence = f"{head}; the gap is {parts} — {issue}."
    flags = [Flag("tail_widened", reason)] if reason else []
    few = few_requests_flag([rel], label, [int(slow.sum())])
    if few is not None:
        flags.append(few)
    if bias := unweighted_tail_sampling(rel):
        flags.append(Flag(UNWEIGHTED_TAIL_SAMPLING, bias))
    idx = np.flatnonzero(slow)
    primary_ms = rel.stage_column(primary)[idx] if primary else np.zeros(len(idx))
    order = np.lexsort((-rel.duration_ms[idx], -primary_ms))[:EXEMPLARS]
    exemplars = [
        Exemplar(str(rel.trace_ids[idx[i]]), float(rel.duration_ms[idx[i]]), float(primary_ms[i]))
        for i in order
    ]
    return SlowFast(
        label=rel.label,
        requests=rel.n,
        cohort=label,
        slow_threshold_ms=float(slow_t),
        fast_threshold_ms=float(fast_t),
        slow_requests=int(slow.sum()),
        fast_requests=int(fast.sum()),
        slow_mean_ms=slow_mean,
        fast_mean_ms=fast_mean,
        widened=bool(reason),
        reason=reason,
        stages=rows,
        primary_stage=primary,
        kind=kind,
        summary=sentence,
        exemplars=exemplars,
        flags=flags,
        estimated_requests=estimated_requests(rel),
    )


def slow_vs_fast(
    store: Store,
    label: str | None = None,
    *,
    service: str | None = None,
    route: str | None = None,
    jaeger_url: str | None = None,
) -> SlowFast:
    """Slow vs fast requests of ``label`` (the only release when None), with attributes."""
    if label is None:
        known = store.releases()
        if not known:
            raise QueryError(f"no requests in {store.path}: run `tracekit ingest FILE` first")
        if len(known) != 1:
            present = ", ".join(name or "(none)" for name, _ in known) or "none"
            raise QueryError(
                f"several releases in {store.path} ({present}): pick one with --version"
            )
        label = known[0][0]
    rel = load_release(store, label, service=service, route=route)
    result = compute_slow_fast(rel)
    attributes = rank_attributes(
        store, label, result.slow_threshold_ms, service=service, route=route
    )
    base = jaeger_url.rstrip("/") if jaeger_url else None
    exemplars = [
        Exemplar(
            e.trace_id,
            e.duration_ms,
            e.primary_stage_ms,
            f"{base}/trace/{e.trace_id}" if base else None,
        )
        for e in result.exemplars
    ]
    exemplars = with_profile_ids(store, exemplars)
    slow = ops.cohort_operations(
        store, label, min_ms=result.slow_threshold_ms, service=service, route=route
    )
    fast = ops.cohort_operations(
        store,
        label,
        max_ms=result.fast_threshold_ms,
        service=service,
        route=route,
        limit=ops.CANDIDATES,
    )
    slow_ids = [str(t) for t in rel.trace_ids[rel.duration_ms >= result.slow_threshold_ms]]
    fast_ids = [str(t) for t in rel.trace_ids[rel.duration_ms <= result.fast_threshold_ms]]
    patterns = {
        "slow": ops.cohort_patterns(store, label, slow_ids),
        "fast": ops.cohort_patterns(store, label, fast_ids),
    }
    flags = [
        *result.flags,
        *ops.pattern_flags(patterns["slow"], patterns["fast"], "slow traces", "fast"),
    ]
    return dataclasses.replace(
        result,
        attributes=attributes,
        exemplars=exemplars,
        operations=SlowOperations(slow.operations, fast.operations, slow.available),
        patterns=patterns,
        flags=flags,
    )
