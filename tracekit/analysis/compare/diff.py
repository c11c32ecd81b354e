"""``tracekit diff``: what a release changed in the tail, which stage explains it, and why.

The result (:class:`DiffResult`) is the JSON contract in docs/design.md: quantile deltas with
bootstrap intervals, the tail cohort compared stage by stage, the counterfactual
attribution of the tail growth (:mod:`tracekit.analysis.cohorts.counterfactual`), a verdict
sentence, over-represented attribute values (:mod:`tracekit.analysis.cohorts.bubbleup`),
exemplar traces and flags. :func:`compute_diff` is pure (two :class:`ReleaseData`);
:func:`diff_releases` loads them from the store and adds the attribute ranking.
"""

from __future__ import annotations

import dataclasses
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.attribution.explain import profile_ids
from tracekit.analysis.attribution.patterns import ReleasePatterns
from tracekit.analysis.cohorts import counterfactual as cf
from tracekit.analysis.cohorts.bubbleup import AttributeLift, rank_attributes
from tracekit.analysis.cohorts.release import ReleaseData, load_releases
from tracekit.analysis.cohorts.sampling import (
    UNWEIGHTED_TAIL_SAMPLING,
    estimated_requests,
    unweighted_tail_sampling,
)
from tracekit.analysis.cohorts.stats import DEFAULT_QUANTILES, QuantileDelta
from tracekit.analysis.cohorts.tokens import (
    E2E,
    TokenSummary,
    read_tokens,
    token_summary,
    views_of,
)
from tracekit.analysis.compare import operations as ops
from tracekit.analysis.compare.intervals import CLUSTER_S, clustered_quantile_deltas
from tracekit.analysis.compare.wording import (
    cpu_flag,
    few_requests_flag,
    quantile_name,
    verdict_sentence,
)
from tracekit.analysis.results import Flag, NamedOperation, ReleaseRef, Verdict, release_name
from tracekit.analysis.store import Store

EXEMPLARS = 3


@dataclass(frozen=True)
class LatencyRow:
    """One quantile before and after (ms), the delta and its bootstrap interval."""

    quantile: str
    before: float
    after: float
    delta: float
    ci_low: float
    ci_high: float
    rel_delta: float
    rel_ci_low: float
    rel_ci_high: float


@dataclass(frozen=True)
class TailCohort:
    """The requests compared stage by stage: at or above each release's tail quantile."""

    cohort: str
    """``p99``, or ``p95`` when p99 rests on too few requests."""
    threshold_before_ms: float
    threshold_after_ms: float
    requests_before: int
    requests_after: int
    widened: bool
    reason: str


@dataclass(frozen=True)
class StageDelta:
    """One stage: attribution share (counterfactual) and tail-cohort evidence (ms)."""

    name: str
    time_kind: str
    """Declared kind: ``wait`` or ``compute``."""
    kind: str
    """Effective kind: the declared one, or ``hidden_wait``."""
    share: float
    """Share of the tail growth this stage explains (counterfactual; 0..1, null if none)."""
    counterfactual_p99_removed_ms: float
    """Tail-quantile growth that disappears when this stage is put back (may be < 0)."""
    mean_before_ms: float
    mean_after_ms: float
    tail_before_ms: float
    tail_after_ms: float
    tail_delta_ms: float
    wall_tail_before_ms: float
    wall_tail_after_ms: float
    cpu_tail_before_ms: float
    cpu_tail_after_ms: float
    gpu_tail_before_ms: float
    gpu_tail_after_ms: float
    hidden_wait: bool


@dataclass(frozen=True)
class Exemplar:
    trace_id: str
    duration_ms: float
    primary_stage_ms: float
    url: str | None = None
    profile_ids: list[str] = field(default_factory=list)
    """Profiles captured on trigger that this trace triggered or ran under (docs/kineto.md)."""


def with_profile_ids(store: Store, exemplars: list[Exemplar]) -> list[Exemplar]:
    """``exemplars`` with the ids of the profiles each triggered or ran under."""
    ids = profile_ids(store, [e.trace_id for e in exemplars])
    return [dataclasses.replace(e, profile_ids=ids[e.trace_id]) for e in exemplars]


@dataclass(frozen=True)
class DiffResult:
    before: ReleaseRef
    after: ReleaseRef
    confidence: float
    latency: list[LatencyRow]
    tail: TailCohort
    stages: list[StageDelta]
    verdict: Verdict
    attributes: list[AttributeLift] = field(default_factory=list)
    exemplars: list[Exemplar] = field(default_factory=list)
    flags: list[Flag] = field(default_factory=list)
    metric: str = "e2e"
    """The latency compared: ``e2e``, ``ttft`` or ``tpot`` (docs/llm.md)."""
    tokens: dict[str, TokenSummary] | None = None
    """``before`` and ``after`` token latencies (TTFT, TPOT, token counts) shown beside the
    compared metric, where both releases have LLM requests; None otherwise."""
    operations: ops.DiffOperations | None = None
    """The primary stage split by operation (counterfactual) and each tail's top
    operations; None for a token metric or from :func:`compute_diff` alone."""
    patterns: dict[str, ReleasePatterns | None] | None = None
    """``before`` and ``after``: pattern counts over (a sample of) each tail cohort's
    traces (a value is None where the store holds no spans); None as ``operations``."""


def _latency_row(d: QuantileDelta) -> LatencyRow:
    return LatencyRow(
        quantile=quantile_name(d.q),
        before=d.before,
        after=d.after,
        delta=d.delta,
        ci_low=d.ci_low,
        ci_high=d.ci_high,
        rel_delta=d.rel_delta,
        rel_ci_low=d.rel_ci_low,
        rel_ci_high=d.rel_ci_high,
    )


def compute_diff(
    before: ReleaseData,
    after: ReleaseData,
    *,
    confidence: float = 0.95,
    seed: int = 0,
    jaeger_url: str | None = None,
) -> DiffResult:
    """Compare two releases' requests; pure (no attribute ranking, which needs spans)."""
    # Intervals widened where slow requests come in bursts (see compare.intervals): the
    # verdict rests on them, and a burst counted as independent requests invents a
    # regression in an unchanged release. They are drawn on a second thread while this
    # one does the work that does not need them (the tail quantile, the counterfactual,
    # the sampling check): both are NumPy work that releases the GIL (sorts, Poisson
    # draws), so at a million requests a second core takes a third off the wall time, and
    # the generator is used by that thread alone, so the draws are the same.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracekit-intervals") as pool:
        intervals = pool.submit(
            clustered_quantile_deltas,
            before,
            after,
            DEFAULT_QUANTILES,
            confidence=confidence,
            seed=seed,
        )
        q, reason = cf.choose_tail(
            before.duration_ms, before.weights, after.duration_ms, after.weights
        )
        # Queued behind the intervals, so each thread has about half of the work.
        after_sampled = pool.submit(unweighted_tail_sampling, after)
        stages = cv.order_stages(set(before.stages) | set(after.stages))
        _, removals = cf.counterfactual_removals(before, after, q, stages)
        sampled = [unweighted_tail_sampling(before)]
        deltas, effects = intervals.result()
        sampled.append(after_sampled.result())
    tail_delta = next(d for d in deltas if d.q == q)
    b_mask = before.duration_ms >= tail_delta.before
    a_mask = after.duration_ms >= tail_delta.after
    tail = TailCohort(
        cohort=quantile_name(q),
        threshold_before_ms=tail_delta.before,
        threshold_after_ms=tail_delta.after,
        requests_before=int(b_mask.sum()),
        requests_after=int(a_mask.sum()),
        widened=q != 0.99,
        reason=reason,
    )

    every_b = np.ones(len(before.duration_ms), dtype=bool)
    every_a = np.ones(len(after.duration_ms), dtype=bool)
    rows = []
    for removal in removals:
        name = removal.stage
        declared = cf.declared_kind(before, after, name)
        eb = cf.stage_evidence(before, name, b_mask)
        ea = cf.stage_evidence(after, name, a_mask)
        # Hidden wait must show in the tail and over every request. A heavier computation
        # on a busy machine stretches the tail's wall time far beyond its CPU time (the
        # slowest requests are the ones that waited most for a core or the GIL), but over
        # all requests its CPU time grows with it; contention leaves CPU flat in both.
        hidden = cf.is_hidden_wait(declared, eb, ea) and cf.is_hidden_wait(
            declared,
            cf.stage_evidence(before, name, every_b),
            cf.stage_evidence(after, name, every_a),
        )
        rows.append(
            StageDelta(
                name=name,
                time_kind=declared,
                kind=cv.HIDDEN_WAIT if hidden else declared,
                share=removal.share,
                counterfactual_p99_removed_ms=removal.removed_ms,
                mean_before_ms=cf.weighted_mean(before.stage_column(name), before.weights),
                mean_after_ms=cf.weighted_mean(after.stage_column(name), after.weights),
                tail_before_ms=eb.critical_ms,
                tail_after_ms=ea.critical_ms,
                tail_delta_ms=ea.critical_ms - eb.critical_ms,
                wall_tail_before_ms=eb.wall_ms,
                wall_tail_after_ms=ea.wall_ms,
                cpu_tail_before_ms=eb.cpu_ms,
                cpu_tail_after_ms=ea.cpu_ms,
                gpu_tail_before_ms=eb.gpu_ms,
                gpu_tail_after_ms=ea.gpu_ms,
                hidden_wait=hidden,
            )
        )

    verdict = _verdict(tail_delta, rows, confidence)
    flags = _flags(before, after, tail, tail_delta, verdict, sampled)
    bursty = _bursty_flag(before, after, tail.cohort, effects[DEFAULT_QUANTILES.index(q)])
    if bursty is not None:
        flags.append(bursty)
    result = DiffResult(
        before=ReleaseRef(before.label, before.n, estimated_requests(before)),
        after=ReleaseRef(after.label, after.n, estimated_requests(after)),
        confidence=confidence,
        latency=[_latency_row(d) for d in deltas],
        tail=tail,
        stages=rows,
        verdict=verdict,
        exemplars=_exemplars(after, a_mask, verdict.primary_stage, jaeger_url),
        flags=flags,
    )
    return result


def _verdict(
    tail_delta: QuantileDelta,
    rows: list[StageDelta],
    confidence: float,
    operation: NamedOperation | None = None,
) -> Verdict:
    grew = tail_delta.delta > 0 and tail_delta.ci_low > 0
    ranked = sorted(
        (r for r in rows if r.share > 0), key=lambda r: (-r.counterfactual_p99_removed_ms, r.name)
    )
    if not grew or not ranked:
        sentence = verdict_sentence(tail_delta, [], confidence)
        return Verdict(primary_stage=None, kind="none", share=float("nan"), summary=sentence)
    primary = ranked[0]
    named = [primary] + [r for r in ranked[1:3] if r.share >= 0.2]
    sentence = verdict_sentence(
        tail_delta,
        [(r.name, r.kind, r.share) for r in named],
        confidence,
        all_stages=[r.name for r in rows],
        detail=ops.operation_phrase(operation) if operation is not None else None,
    )
    return Verdict(
        primary_stage=primary.name,
        kind=primary.kind,
        share=primary.share,
        summary=sentence,
        operation=operation,
    )


def _flags(
    before: ReleaseData,
    after: ReleaseData,
    tail: TailCohort,
    tail_delta: QuantileDelta,
    verdict: Verdict,
    sampled: list[str | None],
) -> list[Flag]:
    """``sampled``: :func:`unweighted_tail_sampling` of before and after."""
    flags = []
    if tail.widened:
        flags.append(Flag("tail_widened", tail.reason))
    few = few_requests_flag(
        [before, after], tail.cohort, [tail.requests_before, tail.requests_after]
    )
    if few is not None:
        flags.append(few)
    for bias in sampled:
        if bias:
            flags.append(Flag(UNWEIGHTED_TAIL_SAMPLING, bias))
    if verdict.kind == cv.HIDDEN_WAIT:
        flags.append(
            Flag(
                "hidden_wait",
                f"{verdict.primary_stage} is declared compute, but its time grew while its "
                "measured CPU/GPU time did not: contention, GIL, throttling or sync stalls.",
            )
        )
    if verdict.kind != "none":
        flag = cpu_flag(before.cpu_utilization, after.cpu_utilization, tail_delta)
        if flag is not None:
            flags.append(flag)
    return flags


BURSTY_EFFECT = 1.5
"""Design effect from which the diff says that the tail came in bursts."""


def _bursty_flag(
    before: ReleaseData, after: ReleaseData, cohort: str, effects: tuple[float, float]
) -> Flag | None:
    if max(effects) < BURSTY_EFFECT:
        return None
    parts = [
        f"{rel.label} ×{math.sqrt(effect):.1f}"
        for rel, effect in zip((before, after), effects, strict=True)
        if effect > 1.0
    ]
    return Flag(
        "bursty_tail",
        f"requests at or above {cohort} arrive in bursts (within {CLUSTER_S:g} s of each other "
        f"more often than chance): its interval is widened accordingly ({', '.join(parts)}); "
        "more load over a longer time narrows it.",
    )


def _exemplars(
    rel: ReleaseData, mask: np.ndarray, primary: str | None, jaeger_url: str | None
) -> list[Exemplar]:
    """Tail-cohort requests that show the verdict best: most primary-stage time first
    (slowest first without a primary stage), so the waterfall opened shows the cause."""
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return []
    stage_ms = rel.stage_column(primary)[idx] if primary else np.zeros(len(idx))
    order = np.lexsort((rel.trace_ids[idx].astype(str), -rel.duration_ms[idx], -stage_ms))
    base = jaeger_url.rstrip("/") if jaeger_url else None
    out = []
    for i in order[:EXEMPLARS]:
        trace_id = str(rel.trace_ids[idx[i]])
        out.append(
            Exemplar(
                trace_id=trace_id,
                duration_ms=float(rel.duration_ms[idx[i]]),
                primary_stage_ms=float(stage_ms[i]),
                url=f"{base}/trace/{trace_id}" if base else None,
            )
        )
    return out


def diff_releases(
    store: Store,
    before: str,
    after: str,
    *,
    service: str | None = None,
    route: str | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    jaeger_url: str | None = None,
    metric: str = E2E,
) -> DiffResult:
    """Diff two releases in the store, with the attribute ranking of the after release;
    ``metric``: the latency compared (``e2e``, ``ttft``, ``tpot``; docs/llm.md).

    Raises :class:`~tracekit.errors.QueryError` naming the releases present when either
    label is unknown.
    """
    # Both releases in one pass over request_stages: its join on the trace id is the
    # largest part of a load at a million requests.
    b0, a0 = load_releases(store, [before, after], service=service, route=route)
    tokens = [read_tokens(store, d, service=service, route=route) for d in (b0, a0)]
    (b, a), view_flags = views_of([b0, a0], tokens, metric)
    beside = [token_summary(d, t) for d, t in zip((b0, a0), tokens, strict=True)]
    result = compute_diff(b, a, confidence=confidence, seed=seed, jaeger_url=jaeger_url)
    slow_ids = kept_ids = None
    if metric != E2E:  # the tail of this metric, by trace, not of the request's duration
        tail = a.duration_ms >= result.tail.threshold_after_ms
        slow_ids = [str(t) for t in a.trace_ids[tail]]
        kept_ids = [str(t) for t in a.trace_ids]
    # The patterns walk a few hundred traces' spans (two scans of the spans table and
    # Python per span) while the attribute ranking, on this thread, is DuckDB's work:
    # on a cursor of its own, the walk runs beside it instead of after it.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracekit-patterns") as pool:
        pending = (
            pool.submit(tail_patterns, ops.beside(store), b, a, result) if metric == E2E else None
        )
        attributes = rank_attributes(
            store,
            after,
            result.tail.threshold_after_ms,
            service=service,
            route=route,
            slow_ids=slow_ids,
            kept_ids=kept_ids,
        )
        if metric == E2E:
            result = with_operations(
                store, b, a, result, service=service, route=route, patterns=False
            )
        found = pending.result() if pending is not None else None
    if found is not None:
        result = dataclasses.replace(
            result, patterns=found, flags=[*result.flags, *pattern_flags(result, found)]
        )
    return dataclasses.replace(
        result,
        attributes=attributes,
        exemplars=with_profile_ids(store, result.exemplars),
        metric=metric,
        flags=[*result.flags, *view_flags],
        tokens=None
        if beside[0] is None or beside[1] is None
        else {"before": beside[0], "after": beside[1]},
    )


def _tail_delta(result: DiffResult) -> QuantileDelta:
    """The tail quantile's delta as :func:`compute_diff` had it (for rewording)."""
    row = next(r for r in result.latency if r.quantile == result.tail.cohort)
    q = 0.99 if result.tail.cohort == "p99" else 0.95
    return QuantileDelta(
        q=q,
        before=row.before,
        after=row.after,
        delta=row.delta,
        ci_low=row.ci_low,
        ci_high=row.ci_high,
        rel_delta=row.rel_delta,
        rel_ci_low=row.rel_ci_low,
        rel_ci_high=row.rel_ci_high,
        before_tail_n=result.tail.requests_before,
        after_tail_n=result.tail.requests_after,
        replicates=np.zeros(0),
        rel_replicates=np.zeros(0),
    )


def with_operations(
    store: Store,
    before: ReleaseData,
    after: ReleaseData,
    result: DiffResult,
    *,
    service: str | None = None,
    route: str | None = None,
    patterns: bool = True,
) -> DiffResult:
    """``result`` with the operations beneath its stages: each tail cohort's top
    operations, the primary stage's split by operation (counterfactual), the verdict
    naming the operation that holds most of the stage's growth, and (``patterns``) each
    tail's pattern counts, flagged (docs/diff.md, "Operations")."""
    t = result.tail
    top_b = ops.cohort_operations(
        store,
        before.label,
        min_ms=t.threshold_before_ms,
        service=service,
        route=route,
        limit=ops.CANDIDATES,
    )
    top_a = ops.cohort_operations(
        store,
        after.label,
        min_ms=t.threshold_after_ms,
        service=service,
        route=route,
        limit=ops.CANDIDATES,
    )
    stage = result.verdict.primary_stage
    shares: list[ops.OperationShare] = []
    verdict = result.verdict
    if stage is not None and top_a.operations:
        q = _tail_delta(result).q
        shares = ops.operation_shares(
            store,
            before,
            after,
            stage,
            q,
            top_a.operations,
            top_b.operations,
            service=service,
            route=route,
        )
        row = next((r for r in result.stages if r.name == stage), None)
        named = ops.named_operation(row.counterfactual_p99_removed_ms if row else 0.0, shares)
        if named is not None:
            verdict = _verdict(_tail_delta(result), result.stages, result.confidence, named)
    found = tail_patterns(store, before, after, result) if patterns else None
    flags = [*result.flags, *pattern_flags(result, found)]
    return dataclasses.replace(
        result,
        verdict=verdict,
        operations=ops.DiffOperations(
            stage=stage,
            shares=shares,
            before=top_b.operations[: ops.TOP_OPERATIONS],
            after=top_a.operations[: ops.TOP_OPERATIONS],
            available=top_a.available,
        ),
        patterns=found,
        flags=flags,
    )


def tail_patterns(
    store: Store, before: ReleaseData, after: ReleaseData, result: DiffResult
) -> dict[str, ReleasePatterns | None]:
    """Pattern counts over (a sample of) each release's tail cohort."""
    t = result.tail
    b_ids = [str(x) for x in before.trace_ids[before.duration_ms >= t.threshold_before_ms]]
    a_ids = [str(x) for x in after.trace_ids[after.duration_ms >= t.threshold_after_ms]]
    return {
        "before": ops.cohort_patterns(store, before.label, b_ids),
        "after": ops.cohort_patterns(store, after.label, a_ids),
    }


def pattern_flags(
    result: DiffResult, found: dict[str, ReleasePatterns | None] | None
) -> list[Flag]:
    if found is None:
        return []
    return ops.pattern_flags(
        found["after"], found["before"], "slow traces", release_name(result.before.label)
    )
