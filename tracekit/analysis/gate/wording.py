"""The gate's sentences: one message per check, the summary line, requests still needed.

Kept apart from :mod:`tracekit.analysis.gate.evaluate` (the statistics) because the wording is
rebuilt when the diff's verdict arrives, and because a reviewer reads these lines in a
pull request: each names the quantile, the change with its interval, the budget, and
(for a failing request-latency check) the stage and kind of time that grew.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tracekit.analysis.gate import budgets as bg
from tracekit.analysis.gate.model import FEW_TAIL, STRADDLES, ZERO_BASELINE, GateCheck
from tracekit.analysis.results import FAIL, PASS, ReleaseRef, Verdict

_KIND_WORDS = {"wait": "wait", "compute": "compute", "hidden_wait": "hidden wait"}


def _pct(x: float, decimals: int) -> str:
    return f"{x * 100:+.{decimals}f}%"


def _decimals(*xs: float) -> int:
    finite = [abs(x) for x in xs if math.isfinite(x)]
    return 1 if finite and max(finite) < 0.1 else 0


def observed_text(c: GateCheck) -> str:
    """``+38% (CI +31..+45%)``, ``+7.2 ms (CI +5.0..+9.1 ms)`` or ``212.0 ms (CI …)``."""
    has_ci = math.isfinite(c.ci_low) and math.isfinite(c.ci_high)
    if c.kind == bg.RELATIVE:
        d = _decimals(c.observed, c.ci_low, c.ci_high)
        if not math.isfinite(c.observed):
            return "change undefined"
        text = _pct(c.observed, d)
        if has_ci:
            text += f" (CI {c.ci_low * 100:+.{d}f}..{c.ci_high * 100:+.{d}f}%)"
        return text
    sign = "+" if c.kind == bg.DELTA else ""
    # Sub-millisecond values need a second decimal to show their interval at all.
    finite = [abs(x) for x in (c.observed, c.ci_low, c.ci_high) if math.isfinite(x)]
    d = 2 if finite and max(finite) < 1.0 else 1
    text = f"{c.observed:{sign}.{d}f} ms"
    if has_ci:
        text += f" (CI {c.ci_low:{sign}.{d}f}..{c.ci_high:{sign}.{d}f} ms)"
    return text


def quantile_label(c: GateCheck) -> str:
    """``p99`` for the request latency, ``batch_queue p99`` for a stage."""
    q = f"p{c.quantile * 100:g}"
    return q if c.metric == bg.LATENCY else f"{c.metric.removeprefix('stage.')} {q}"


def budget_words(c: GateCheck) -> str:
    """``budget +10%``, ``budget < 40ms``, or the raised limit when the minimum effect bit."""
    shown = c.budget_text if c.kind != bg.ABSOLUTE else f"{c.op} {c.budget_text}"
    if c.kind != bg.ABSOLUTE and bg.format_limit(c.budget, c.kind) != c.budget_text:
        if c.kind == bg.RELATIVE:
            raised = _pct(c.budget, _decimals(c.budget))
        else:
            raised = f"{c.budget:+.1f}ms"
        return f"budget {shown} (raised to {raised} by the minimum effect)"
    return f"budget {shown}"


def blame(c: GateCheck, verdict: Verdict | None) -> str:
    """``: 82% of it batch_queue wait`` when the diff names a stage for a latency check;
    ``: 90% of it downstream wait (160.0 ms of it redis-manual GetDriver)`` when it names
    the operation too."""
    if verdict is None or c.metric != bg.LATENCY or not verdict.primary_stage:
        return ""
    kind = _KIND_WORDS.get(verdict.kind)
    if kind is None:
        return ""
    share = verdict.share
    op = verdict.operation
    # The operation that holds most of the stage's growth, as the diff's verdict names it.
    named = "" if op is None else f" ({op.removed_ms:.1f} ms of it {op.service} {op.operation})"
    if share is not None and math.isfinite(share) and share > 0:
        return f": {share:.0%} of it {verdict.primary_stage} {kind}{named}"
    return f": mostly {verdict.primary_stage} {kind}{named}"


def needed_requests(c: GateCheck, min_tail: int) -> int | None:
    """Roughly how many requests per release would decide an inconclusive check.

    Too few tail samples: enough that ``min_tail`` lie at or above the quantile. An
    interval straddling the budget: its width shrinks as 1/sqrt(n), so n grows by
    (half-width / distance from the estimate to the budget)². ``None`` when the
    estimate sits on the budget (no sample size settles it) or nothing can be said.
    """
    q = c.quantile
    # Rounded first: 1 - 0.999 is not exactly 0.001 in binary.
    for_tail = math.ceil(round(min_tail / (1.0 - q), 6))
    n_ref = c.samples.after if c.kind == bg.ABSOLUTE else max(c.samples.before, c.samples.after)
    if c.reason == FEW_TAIL:
        # Each short release needs enough requests for min_tail at or above the
        # quantile; where ties or weights keep its tail short, scale what it has.
        short = [(c.samples.after, c.samples.after_tail)]
        if c.kind != bg.ABSOLUTE:
            short.append((c.samples.before, c.samples.before_tail))
        need = [
            max(for_tail, math.ceil(n * min_tail / tail) if tail else for_tail)
            for n, tail in short
            if tail < min_tail
        ]
        return _round_up(max(need, default=for_tail))
    if c.reason != STRADDLES or not math.isfinite(c.observed):
        return None
    if c.observed > c.budget:
        width, distance = c.observed - c.ci_low, c.observed - c.budget
    else:
        width, distance = c.ci_high - c.observed, c.budget - c.observed
    if not (math.isfinite(width) and distance > 0):
        return None
    factor = max((width / distance) ** 2, 1.0)
    return _round_up(max(for_tail, math.ceil(n_ref * factor)))


def _round_up(n: int) -> int:
    """Two significant figures, rounded up: 12,345 → 13,000."""
    if n < 100:
        return n
    step = 10 ** (len(str(n)) - 2)
    return int(-(-n // step) * step)


def describe(c: GateCheck, verdict: Verdict | None, min_tail: int) -> str:
    """One sentence for one check."""
    label = quantile_label(c)
    if c.reason == FEW_TAIL:
        counts = f"after has {c.samples.after_tail} of {c.samples.after:,}"
        if c.kind != bg.ABSOLUTE:
            counts = f"before has {c.samples.before_tail} of {c.samples.before:,}, " + counts
        need = (
            f"; about {c.needed_samples:,} requests per release would" if c.needed_samples else ""
        )
        return (
            f"{label} cannot be estimated: {counts} requests at or above it, and at least "
            f"{min_tail} are needed in each release{need} estimate it"
        )
    if c.reason == ZERO_BASELINE:
        return (
            f"{label} is {c.before_ms:.1f} ms in the baseline, so a relative budget is "
            f"undefined; give an absolute one (e.g. '{c.metric}.p{c.quantile * 100:g} < 50ms')"
            if c.metric != bg.LATENCY
            else f"{label} is {c.before_ms:.1f} ms in the baseline, so a relative budget is "
            "undefined; give an absolute one (e.g. 'p99 < 50ms')"
        )
    text = f"{label} {observed_text(c)}"
    if c.result == FAIL:
        return f"{text} over {budget_words(c)}{blame(c, verdict)}"
    if c.result == PASS:
        return f"{text} within {budget_words(c)}"
    if c.needed_samples:
        more = f"; about {c.needed_samples:,} requests per release would likely decide it"
    else:
        more = "; the estimate sits on the budget, so more requests would not soon decide it"
    return f"{text} straddles {budget_words(c)}{more}"


def summarize(
    result: str,
    before: ReleaseRef,
    after: ReleaseRef,
    confidence: float,
    checks: Sequence[GateCheck],
) -> str:
    """The one sentence a CI log or PR comment leads with."""
    n = len(checks)
    basis = (
        f"{before.requests:,} vs {after.requests:,} requests, {confidence * 100:g}% confidence"
        + (", Holm-corrected" if n > 1 else "")
    )
    if result == PASS:
        what = "its budget" if n == 1 else f"all {n} budgets"
        return f"pass: {after.label} keeps {what} against {before.label} ({basis})."
    picked = [c for c in checks if c.result == result]
    first = picked[0].message
    more = f"; and {len(picked) - 1} more" if len(picked) > 1 else ""
    if result == FAIL:
        return (
            f"fail: {after.label} breaks {len(picked)} of {n} budgets against {before.label} "
            f"({basis}): {first}{more}."
        )
    return (
        f"inconclusive: {len(picked)} of {n} budgets undecided for {after.label} against "
        f"{before.label}, none broken ({basis}): {first}{more}."
    )
