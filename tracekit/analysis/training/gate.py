"""``tracekit gate`` on training runs: budgets on samples/s, step time or efficiency.

A budget is ``METRIC OP VALUE``: METRIC one of ``samples_per_s``, ``step_ms.p50``,
``step_ms.p95``, ``step_ms.mean``, ``efficiency``; OP ``<``, ``<=``, ``>``, ``>=``;
VALUE absolute (``1200``, ``45ms``, ``0.8``) or, for samples/s and step time, relative
to the before run (``-10%``, ``+5%``). Relative samples/s is against the before run
scaled to the after run's world size (ideal scaling), so ``samples_per_s>=-10%`` on two
runs of different sizes reads "at least 90% scaling efficiency", and is said so: each
check's :class:`CheckWords` put the observed value, its interval and the budget in one
unit ("scaling efficiency 36.3% of ideal", "≥ 90% of ideal"), beside what was measured
("samples/s 88.4 → 67.7").

Each statistic gets a bootstrap interval over steps (both runs resampled); a budget
passes when the whole interval is within it, fails when the whole interval is beyond,
and is inconclusive otherwise — or when a run has fewer than :data:`MIN_STEPS` steps.
The outcomes are the request gate's (:class:`~tracekit.analysis.results.Outcome`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tracekit.analysis.results import FAIL, INCONCLUSIVE, PASS, Outcome, overall
from tracekit.analysis.store import Store
from tracekit.analysis.training.model import RunSteps
from tracekit.analysis.training.steps import load_run
from tracekit.errors import ConfigError

MIN_STEPS = 5
DEFAULT_BUDGETS = ("samples_per_s>=-10%",)
METRICS = ("samples_per_s", "step_ms.p50", "step_ms.p95", "step_ms.mean", "efficiency")
_BUDGET = re.compile(
    r"^\s*(?P<metric>[a-z_.0-9]+)\s*(?P<op><=|>=|<|>)\s*(?P<value>[+-]?[0-9.]+)\s*(?P<unit>%|ms|s)?\s*$"
)


@dataclass(frozen=True)
class TrainingBudget:
    text: str
    metric: str
    op: str
    value: float
    relative: bool


@dataclass(frozen=True)
class CheckWords:
    """A check as it is read: the observed value, its interval and the budget in one unit."""

    quantity: str
    """What is checked: ``scaling efficiency``, ``samples/s``, ``step p95``, …"""
    observed: str
    """``36.3% of ideal``, ``67.7``, ``+12.0% against 1rank``, ``470.1 ms``."""
    interval: str
    """``37.2% … 39.5%`` (empty when inconclusive for want of steps)."""
    limit: str
    """The budget in the observed value's unit: ``≥ 90% of ideal``, ``≤ 120 ms``."""
    measured: str
    """Each run's statistic as measured: ``samples/s 88.4 → 67.7``, ``step p95 78.0 →
    128.1 ms``."""


@dataclass
class TrainingCheck:
    budget: str
    metric: str
    result: Outcome
    observed: float | None
    """The after run's statistic (relative budgets: the change as a fraction)."""
    ci_low: float | None
    ci_high: float | None
    limit: float
    message: str
    before_value: float | None = None
    """The before run's statistic as measured (samples/s or ms; None for efficiency)."""
    after_value: float | None = None
    """The after run's statistic as measured."""
    words: CheckWords | None = None


@dataclass
class TrainingGateResult:
    before: str
    after: str
    result: Outcome
    exit_code: int | None = None
    """The process exit code of ``tracekit gate``: set by the CLI, which owns exit codes
    (None from the library)."""
    checks: list[TrainingCheck] = field(default_factory=list)
    kind: str = "training"


def parse_budget(text: str) -> TrainingBudget:
    m = _BUDGET.match(text)
    if not m or m["metric"] not in METRICS:
        raise ConfigError(
            f"training budget {text!r}: write METRIC OP VALUE with METRIC one of "
            f"{', '.join(METRICS)}, e.g. 'samples_per_s>=-10%' or 'step_ms.p95<=120ms'"
        )
    value = float(m["value"])
    unit = m["unit"]
    relative = unit == "%"
    if relative and m["metric"] == "efficiency":
        raise ConfigError(f"training budget {text!r}: efficiency is a fraction, e.g. >=0.8")
    if unit == "s":
        value *= 1000.0
    return TrainingBudget(
        text.strip(), m["metric"], m["op"], value / 100 if relative else value, relative
    )


def _stat(metric: str, steps: np.ndarray, samples: np.ndarray) -> float:
    if metric == "samples_per_s" or metric == "efficiency":
        return float(samples.sum() / (steps.sum() / 1000.0))
    q = {"step_ms.p50": 0.5, "step_ms.p95": 0.95}.get(metric)
    return float(np.quantile(steps, q)) if q is not None else float(steps.mean())


def _holds(op: str, x: float, limit: float) -> bool:
    return {"<": x < limit, "<=": x <= limit, ">": x > limit, ">=": x >= limit}[op]


_OP = {"<": "<", "<=": "≤", ">": ">", ">=": "≥"}
_QUANTITY = {
    "samples_per_s": "samples/s",
    "step_ms.p50": "step p50",
    "step_ms.p95": "step p95",
    "step_ms.mean": "mean step",
}


def _short_pct(x: float, sign: bool = False) -> str:
    """``90%``, ``87.5%``, ``+10%``: a budget as its writer would."""
    text = f"{x * 100:{'+' if sign else ''}.1f}".rstrip("0").rstrip(".")
    return text + "%"


def words_for(
    budget: TrainingBudget, before: str, b_value: float | None, a_value: float | None
) -> tuple[str, Callable[[float], str], str, str, str]:
    """(quantity, how a checked value reads, what follows the observed value, the limit,
    what was measured) for ``budget``. A relative samples/s budget is read as the scaling
    efficiency it is (``-10%`` → ``≥ 90% of ideal``)."""
    op = _OP[budget.op]
    quantity = _QUANTITY.get(budget.metric, "scaling efficiency")
    steps = budget.metric.startswith("step_ms")
    measured = ""
    if b_value is not None and a_value is not None:
        measured = f"{b_value:,.1f} → {a_value:,.1f}"
    elif a_value is not None:
        measured = f"{a_value:,.1f}"
    if measured:
        measured = f"{quantity} {measured} ms" if steps else f"samples/s {measured}"
    if not steps and (budget.metric == "efficiency" or budget.relative):
        shift = 1.0 if budget.relative else 0.0
        return (
            "scaling efficiency",
            lambda x: f"{x + shift:.1%}",
            " of ideal",
            f"{op} {_short_pct(budget.value + shift)} of ideal",
            measured,
        )
    if budget.relative:
        limit = f"{op} {_short_pct(budget.value, sign=True)}"
        return quantity, lambda x: f"{x:+.1%}", f" against {before}", limit, measured
    if steps:
        return quantity, lambda x: f"{x:,.1f} ms", "", f"{op} {budget.value:,g} ms", measured
    return quantity, lambda x: f"{x:,.1f}", "", f"{op} {budget.value:,g} samples/s", measured


def check(
    b: RunSteps, a: RunSteps, budget: TrainingBudget, *, confidence: float = 0.95, seed: int = 0
) -> TrainingCheck:
    """One budget against the after run, with a bootstrap interval over steps."""
    ratio = a.world_size / b.world_size
    per_rank = 1.0
    if a.samples_per_rank_step and b.samples_per_rank_step:
        per_rank = a.samples_per_rank_step / b.samples_per_rank_step
    bs, ba = np.asarray(b.step_times_ms), np.asarray(a.step_times_ms)
    ns_b = np.nan_to_num(np.asarray(b.samples_per_step), nan=b.world_size)
    ns_a = np.nan_to_num(np.asarray(a.samples_per_step), nan=a.world_size)
    throughput = budget.metric in ("samples_per_s", "efficiency")

    def value(sb: np.ndarray, nb: np.ndarray, sa: np.ndarray, na: np.ndarray) -> float:
        after = _stat(budget.metric, sa, na)
        if budget.metric == "efficiency":
            return after / (_stat(budget.metric, sb, nb) * ratio)
        if not budget.relative:
            return after
        before = _stat(budget.metric, sb, nb) * (ratio if throughput else per_rank)
        return after / before - 1.0

    b_value = _stat(budget.metric, bs, ns_b) if len(bs) else None
    a_value = _stat(budget.metric, ba, ns_a) if len(ba) else None
    quantity, fmt, unit, limit, measured = words_for(budget, b.label, b_value, a_value)
    if len(bs) < MIN_STEPS or len(ba) < MIN_STEPS:
        message = f"{budget.text}: inconclusive — fewer than {MIN_STEPS} steps in a run"
        return TrainingCheck(
            budget.text, budget.metric, INCONCLUSIVE, None, None, None, budget.value, message,
            b_value, a_value, CheckWords(quantity, "–", "", limit, measured),
        )  # fmt: skip
    observed = value(bs, ns_b, ba, ns_a)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(1000):
        ib, ia = rng.integers(0, len(bs), len(bs)), rng.integers(0, len(ba), len(ba))
        draws.append(value(bs[ib], ns_b[ib], ba[ia], ns_a[ia]))
    alpha = (1 - confidence) / 2
    lo, hi = (float(x) for x in np.quantile(draws, [alpha, 1 - alpha]))
    inside = _holds(budget.op, lo, budget.value) and _holds(budget.op, hi, budget.value)
    beyond = not _holds(budget.op, lo, budget.value) and not _holds(budget.op, hi, budget.value)
    result = PASS if inside else FAIL if beyond else INCONCLUSIVE
    words = CheckWords(quantity, fmt(observed) + unit, f"{fmt(lo)} … {fmt(hi)}", limit, measured)
    message = (
        f"{budget.text}: {result} — {quantity} {words.observed} "
        f"({confidence:.0%} interval {words.interval}; budget {limit})"
        + (f"; {measured} as measured" if measured else "")
    )
    return TrainingCheck(
        budget.text, budget.metric, result, observed, lo, hi, budget.value, message,
        b_value, a_value, words,
    )  # fmt: skip


def gate_runs(
    store: Store,
    before: str,
    after: str,
    budgets: list[str] | None = None,
    *,
    confidence: float = 0.95,
    seed: int = 0,
    warmup: int = 1,
) -> TrainingGateResult:
    """Check the after run against ``budgets`` (default: :data:`DEFAULT_BUDGETS`)."""
    parsed = [parse_budget(t) for t in (budgets or DEFAULT_BUDGETS)]
    b, a = load_run(store, before, warmup=warmup), load_run(store, after, warmup=warmup)
    checks = [check(b, a, p, confidence=confidence, seed=seed) for p in parsed]
    return TrainingGateResult(before, after, overall([c.result for c in checks]), checks=checks)
