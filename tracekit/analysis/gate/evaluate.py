"""The release gate: is the after release within its latency budgets, with honest statistics?

Each budget becomes one *check* with three outcomes, decided on a bootstrap interval:

* ``fail`` — the whole interval lies beyond the budget;
* ``pass`` — the whole interval lies within it;
* ``inconclusive`` — the interval straddles the budget, or fewer than
  :data:`MIN_TAIL` sampled requests lie at or above the quantile in a release the
  check reads (the quantile cannot be estimated at all). Never a silent pass.

Statistics: quantiles of the raw per-request times (no trimming), weighted by
``tracekit.sample.weight``; a Poisson bootstrap of each release (resampled
independently) gives replicates of the checked statistic — after/before − 1 for
relative budgets, after − before for delta budgets, the after quantile itself for
absolute ones. As in ``tracekit diff``, whole one-second arrival windows are resampled
(:mod:`tracekit.analysis.compare.intervals`), so a burst of slow requests that share a
stalled second is one piece of evidence, not one per request; with fewer windows than
``MIN_CLUSTERS`` single requests are. A ``bursty_tail`` warning says when that widened
a tested quantile's interval. Each check gets two one-sided bootstrap p-values: ``p_fail`` (share of
replicates within the budget; small means "beyond it") and ``p_pass`` (share beyond
it). Each family is Holm-corrected across the tested checks at level
(1 − confidence)/2, so with one check the decision is the ordinary two-sided
percentile interval at ``confidence``, and with several the chance that *any* budget
falsely fails (or falsely passes) stays at most (1 − confidence)/2. The interval
reported with a check has its ends at the Holm-adjusted levels that check was tested
at, so "fail" always reads as "interval beyond the budget".

Minimum effect: a relative or delta budget is never failed by a change smaller than
``min_effect_ms``; the limit is raised to that change (for relative budgets to
``min_effect_ms`` over the baseline quantile). Absolute budgets are a fixed line, which
the minimum effect does not move.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.sampling import (
    UNWEIGHTED_TAIL_SAMPLING,
    estimated_requests,
    unweighted_tail_sampling,
)
from tracekit.analysis.cohorts.stats import (
    MIN_TAIL_SAMPLES,
    holm_adjust,
    tail_samples,
    weighted_quantiles,
)
from tracekit.analysis.cohorts.tokens import E2E, load_metric
from tracekit.analysis.gate import budgets as bg
from tracekit.analysis.gate import wording as gate_report
from tracekit.analysis.gate.model import (
    BEYOND,
    FEW_TAIL,
    STRADDLES,
    WITHIN,
    ZERO_BASELINE,
    GateCheck,
    Samples,
)
from tracekit.analysis.gate.statistics import (
    BURSTY_EFFECT,
    CLUSTER_S,
    holm_bounds,
    holm_levels,
    release_replicates,
    split_counts,
)
from tracekit.analysis.results import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    Flag,
    Outcome,
    ReleaseRef,
    Verdict,
    overall,
)
from tracekit.analysis.store import Store
from tracekit.errors import QueryError, TracekitError

if TYPE_CHECKING:
    from tracekit.analysis.compare.diff import DiffResult

BURSTY_TAIL = "bursty_tail"
"""Warning code when a tested quantile's interval was widened for bursts (as the diff's flag)."""
MIN_TAIL = MIN_TAIL_SAMPLES
"""Fewest sampled requests at or above a quantile for it to be estimated at all."""
DEFAULT_BOOTSTRAP = 2000
"""Replicates per release: resolves the Holm levels of ten budgets at 95% to ~2 replicates."""
DEFAULT_CONFIDENCE = 0.95

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GateResult:
    """The gate's answer; render it with :mod:`tracekit.render.gate`."""

    result: Outcome
    summary: str
    before: ReleaseRef
    after: ReleaseRef
    confidence: float
    correction: str
    min_effect_ms: float
    checks: tuple[GateCheck, ...]
    verdict: Verdict | None
    warnings: tuple[Flag, ...]
    metric: str = "e2e"
    """The latency the budgets are on: ``e2e``, ``ttft`` or ``tpot`` (docs/llm.md)."""


def _values(r: ReleaseData, stage: str | None) -> FloatArray:
    return r.duration_ms if stage is None else r.stage_column(stage)


@dataclass
class _Metric:
    """Point quantiles and bootstrap replicates of one metric in both releases, with each
    quantile's design effect per release (1.0 where requests do not come in bursts)."""

    qs: list[float]
    before: FloatArray
    after: FloatArray
    boot_before: FloatArray
    boot_after: FloatArray
    effects_before: list[float]
    effects_after: list[float]


def _bootstrap(
    before: ReleaseData, after: ReleaseData, chosen: Sequence[bg.Budget], n_boot: int, seed: int
) -> dict[str | None, _Metric]:
    metrics: dict[str | None, _Metric] = {}
    for b in chosen:
        if b.stage is not None and b.stage not in before.stages + after.stages:
            present = ", ".join(dict.fromkeys(before.stages + after.stages)) or "none"
            raise QueryError(
                f"budget {b.name!r}: neither {before.label} nor {after.label} has a stage "
                f"{b.stage!r}; stages present: {present}"
            )
    for index, stage in enumerate(dict.fromkeys(b.stage for b in chosen)):
        qs = sorted({b.quantile for b in chosen if b.stage == stage})
        xb, xa = _values(before, stage), _values(after, stage)
        # One generator per metric, seeded by (seed, metric index): reproducible, and the
        # latency checks' replicates do not depend on which stage budgets follow them.
        rng = np.random.default_rng([seed, index])
        # Whole one-second arrival windows are resampled, as the diff's intervals are: a
        # burst of slow requests is one piece of evidence, not one per request. With
        # fewer than MIN_CLUSTERS windows this is the independent Poisson bootstrap.
        rb, eb, _ = release_replicates(
            xb, before.weights, before.start_ns, qs, n_boot=n_boot, rng=rng
        )
        ra, ea, _ = release_replicates(
            xa, after.weights, after.start_ns, qs, n_boot=n_boot, rng=rng
        )
        metrics[stage] = _Metric(
            qs,
            weighted_quantiles(xb, qs, before.weights),
            weighted_quantiles(xa, qs, after.weights),
            rb,
            ra,
            eb,
            ea,
        )
    return metrics


def bursty_warning(
    before: ReleaseData,
    after: ReleaseData,
    chosen: Sequence[bg.Budget],
    checks: Sequence[GateCheck],
    metrics: dict[str | None, _Metric],
) -> Flag | None:
    """``bursty_tail`` when a tested quantile's requests arrive in bursts (design effect at
    least the diff's :data:`BURSTY_EFFECT` in either release): its interval was widened."""
    parts: dict[str, str] = {}
    for b, c in zip(chosen, checks, strict=True):
        if c.reason in (FEW_TAIL, ZERO_BASELINE):
            continue  # not tested: no interval was drawn for it
        m = metrics[b.stage]
        j = m.qs.index(c.quantile)
        effects = (m.effects_before[j], m.effects_after[j])
        if c.kind == bg.ABSOLUTE:
            effects = (1.0, effects[1])  # an absolute budget reads only the after release
        if max(effects) < BURSTY_EFFECT:
            continue
        widened = [
            f"{rel.label} ×{math.sqrt(e):.1f}"
            for rel, e in zip((before, after), effects, strict=True)
            if e > 1.0
        ]
        key = gate_report.quantile_label(c)
        parts.setdefault(key, f"{key} ({', '.join(widened)})")
    if not parts:
        return None
    return Flag(
        BURSTY_TAIL,
        f"requests at or above {'; '.join(parts.values())} arrive in bursts (within "
        f"{CLUSTER_S:g} s of each other more often than chance): whole one-second windows "
        "were resampled and the interval is wider accordingly; more load over a longer "
        "time narrows it.",
    )


def _statistic(b: bg.Budget, m: _Metric, min_effect_ms: float) -> tuple[float, float, FloatArray]:
    """(observed, limit, replicates) of the statistic ``b`` limits."""
    j = m.qs.index(b.quantile)
    before_ms, after_ms = float(m.before[j]), float(m.after[j])
    rb, ra = m.boot_before[:, j], m.boot_after[:, j]
    if b.kind == bg.RELATIVE:
        observed = after_ms / before_ms - 1.0 if before_ms > 0 else math.nan
        limit = b.value
        if min_effect_ms > 0 and before_ms > 0:
            limit = max(limit, min_effect_ms / before_ms)
        with np.errstate(divide="ignore", invalid="ignore"):
            reps = np.where(rb > 0, ra / rb - 1.0, np.nan)
        return observed, limit, reps
    if b.kind == bg.DELTA:
        return after_ms - before_ms, max(b.value, min_effect_ms), ra - rb
    return after_ms, b.value, ra.copy()


def evaluate_gate(
    before: ReleaseData,
    after: ReleaseData,
    budgets: Sequence[bg.Budget] | None = None,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    min_effect_ms: float = 0.0,
    seed: int = 0,
    n_boot: int = DEFAULT_BOOTSTRAP,
    verdict: Verdict | None = None,
) -> GateResult:
    """Check ``after`` against ``before`` under ``budgets`` (default: p95, p99 ≤ +10%).

    Pure: reads only the two releases. Raises :class:`~tracekit.errors.ConfigError` for
    a bad confidence or minimum effect and :class:`~tracekit.errors.QueryError` for a
    budget on a stage neither release has.
    """
    confidence = bg.check_confidence(confidence)
    min_effect_ms = bg.parse_duration_ms(min_effect_ms, what="min_effect")
    chosen = tuple(budgets) if budgets else bg.DEFAULT_BUDGETS
    metrics = _bootstrap(before, after, chosen, n_boot, seed)

    drafts: list[GateCheck] = []
    tested: list[tuple[int, FloatArray]] = []
    for b in chosen:
        m = metrics[b.stage]
        j = m.qs.index(b.quantile)
        observed, limit, reps = _statistic(b, m, min_effect_ms)
        samples = Samples(
            before.n,
            after.n,
            tail_samples(_values(before, b.stage), float(m.before[j])),
            tail_samples(_values(after, b.stage), float(m.after[j])),
        )
        # An absolute budget reads only the after release; the others read both.
        tails = [samples.after_tail] + ([samples.before_tail] if b.kind != bg.ABSOLUTE else [])
        finite = np.sort(reps[np.isfinite(reps)])
        reason = STRADDLES
        if min(tails) < MIN_TAIL:
            reason = FEW_TAIL
        elif b.kind == bg.RELATIVE and (m.before[j] <= 0 or len(finite) < n_boot // 2):
            reason = ZERO_BASELINE
        else:
            tested.append((len(drafts), finite))
        drafts.append(
            GateCheck(
                name=b.name,
                metric=b.metric,
                quantile=b.quantile,
                kind=b.kind,
                op=b.op,
                result=INCONCLUSIVE,
                reason=reason,
                observed=observed,
                budget=limit,
                budget_text=b.value_text,
                ci_low=math.nan,
                ci_high=math.nan,
                samples=samples,
                needed_samples=None,
                before_ms=float(m.before[j]),
                after_ms=float(m.after[j]),
                p_fail=math.nan,
                p_pass=math.nan,
            )
        )

    alpha = (1.0 - confidence) / 2.0
    p_fail, p_pass = [], []
    for i, reps in tested:
        within, beyond = split_counts(reps, drafts[i].budget, drafts[i].op == "<")
        p_fail.append(within / len(reps))
        p_pass.append(beyond / len(reps))
    fail_levels, pass_levels = holm_levels(p_fail, alpha), holm_levels(p_pass, alpha)
    adj_fail, adj_pass = holm_adjust(p_fail), holm_adjust(p_pass)
    for t, (i, reps) in enumerate(tested):
        (level_f, failed), (level_p, passed) = fail_levels[t], pass_levels[t]
        lo, hi = holm_bounds(reps, level_f, level_p)
        result, reason = (
            (FAIL, BEYOND)
            if failed
            else (PASS, WITHIN)
            if passed
            else (
                INCONCLUSIVE,
                STRADDLES,
            )
        )
        drafts[i] = replace(
            drafts[i],
            result=result,
            reason=reason,
            ci_low=lo,
            ci_high=hi,
            p_fail=adj_fail[t],
            p_pass=adj_pass[t],
        )
    checks = [
        replace(c, needed_samples=gate_report.needed_requests(c, MIN_TAIL))
        if c.result == INCONCLUSIVE
        else c
        for c in drafts
    ]
    warnings = tuple(
        Flag("coordinated_omission", msg) for msg in coordinated_omission(before, after)
    )
    bursty = bursty_warning(before, after, chosen, checks, metrics)
    warnings += (bursty,) if bursty is not None else ()
    warnings += tuple(
        Flag(UNWEIGHTED_TAIL_SAMPLING, msg)
        for rel in (before, after)
        if (msg := unweighted_tail_sampling(rel))
    )
    info_b = ReleaseRef(before.label, before.n, estimated_requests(before))
    info_a = ReleaseRef(after.label, after.n, estimated_requests(after))
    return _finish(info_b, info_a, confidence, min_effect_ms, checks, verdict, warnings)


def _finish(
    before: ReleaseRef,
    after: ReleaseRef,
    confidence: float,
    min_effect_ms: float,
    checks: Sequence[GateCheck],
    verdict: Verdict | None,
    warnings: tuple[Flag, ...],
) -> GateResult:
    worded = tuple(replace(c, message=gate_report.describe(c, verdict, MIN_TAIL)) for c in checks)
    result = overall([c.result for c in worded])
    return GateResult(
        result=result,
        summary=gate_report.summarize(result, before, after, confidence, worded),
        before=before,
        after=after,
        confidence=confidence,
        correction="holm",
        min_effect_ms=min_effect_ms,
        checks=worded,
        verdict=verdict,
        warnings=warnings,
    )


def with_verdict(
    result: GateResult, verdict: Verdict | None, warnings: Sequence[Flag] = ()
) -> GateResult:
    """The same result with the diff's verdict attached, messages reworded to use it."""
    done = _finish(
        result.before,
        result.after,
        result.confidence,
        result.min_effect_ms,
        result.checks,
        verdict,
        result.warnings + tuple(warnings),
    )
    return replace(done, metric=result.metric)


def coordinated_omission(before: ReleaseData, after: ReleaseData) -> list[str]:
    """Warnings for releases whose requests look like a one-connection closed loop.

    With no batch queue in the trace and every request starting only after the previous
    one ended, a slow request held back the requests behind it, whose waiting was never
    recorded: the measured quantiles understate what users at a fixed rate would see.
    """
    out = []
    for r in (before, after):
        if r.n < 20 or cv.BATCH_QUEUE in r.stages:
            continue
        order = np.argsort(r.start_ns, kind="stable")
        start = r.start_ns[order].astype(np.float64)
        if start[-1] == start[0]:
            continue  # no timestamps to judge by
        end = start + r.duration_ms[order] * 1e6
        # 1 µs of slack absorbs the float round trip ns → ms → ns.
        if np.all(start[1:] >= end[:-1] - 1e3):
            out.append(
                f"release {r.label}: every request started only after the previous one "
                "ended and none has a batch_queue stage, as from a closed-loop load "
                "generator with one connection; latency may be understated (coordinated "
                "omission). Gate on an open-loop (fixed arrival rate) load test."
            )
    return out


def _diff_verdict(
    before: ReleaseData, after: ReleaseData, confidence: float, seed: int
) -> tuple[DiffResult | None, list[Flag]]:
    """The diff (for its verdict), or a warning saying why there is none (the gate still
    decides)."""
    try:
        from tracekit.analysis.compare.diff import compute_diff

        return compute_diff(before, after, confidence=confidence, seed=seed), []
    except (ValueError, TracekitError) as exc:
        # The verdict only words the failure message; a missing or failing diff must
        # not hide the gate's decision, so say what happened and carry on without it.
        return None, [Flag("no_verdict", f"no stage attribution from the diff: {exc}")]


def _named_verdict(
    store: Store,
    before: ReleaseData,
    after: ReleaseData,
    diff: DiffResult | None,
    *,
    metric: str,
    service: str | None,
    route: str | None,
) -> Verdict | None:
    """The diff's verdict, naming the operation that holds most of the primary stage's
    growth where one does (request time only: token metrics have no operations)."""
    if diff is None:
        return None
    if metric != E2E or diff.verdict.primary_stage is None:
        return diff.verdict
    from tracekit.analysis.compare.diff import with_operations

    try:
        named = with_operations(
            store, before, after, diff, service=service, route=route, patterns=False
        )
    except TracekitError:
        return diff.verdict  # the message loses the operation, the gate keeps its decision
    return named.verdict


def run_gate(
    store: Store,
    before: str,
    after: str,
    *,
    budgets: Sequence[bg.Budget] | None = None,
    confidence: float = DEFAULT_CONFIDENCE,
    min_effect_ms: float = 0.0,
    seed: int = 0,
    service: str | None = None,
    route: str | None = None,
    n_boot: int = DEFAULT_BOOTSTRAP,
    metric: str = E2E,
) -> GateResult:
    """Gate release ``after`` against ``before`` as stored; see :func:`evaluate_gate`.
    ``metric``: the latency the budgets are on (``e2e``, ``ttft``, ``tpot``).

    When any check does not pass, the diff's verdict (which stage grew the tail, wait or
    compute) is attached and named in the failure messages.
    """
    (b, a), view_flags = load_metric(store, [before, after], metric, service=service, route=route)
    # The diff's verdict is needed whenever a check does not pass; it is computed on a
    # second thread while the checks are (NumPy releases the GIL), so a failing gate at
    # a million requests a release costs the longer of the two, not their sum. Its
    # confidence is the gate's, known before the checks run.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tracekit-verdict") as pool:
        pending = pool.submit(_diff_verdict, b, a, bg.check_confidence(confidence), seed)
        result = evaluate_gate(
            b,
            a,
            budgets,
            confidence=confidence,
            min_effect_ms=min_effect_ms,
            seed=seed,
            n_boot=n_boot,
        )
        result = replace(result, metric=metric, warnings=(*result.warnings, *view_flags))
        if result.result == PASS:
            pending.cancel()
            return result
        diff, warnings = pending.result()
    verdict = _named_verdict(store, b, a, diff, metric=metric, service=service, route=route)
    return with_verdict(result, verdict, warnings)
