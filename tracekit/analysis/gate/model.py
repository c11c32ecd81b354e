"""The gate's own types: why a check came out as it did, and what a check is made of.

Outcomes, verdicts, flags and release references are the shared result vocabulary
(:mod:`tracekit.analysis.results`).

At the bottom of the gate package so that the statistics (:mod:`.evaluate`) and the
wording (:mod:`.wording`) both import it and never each other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.analysis.results import Outcome

# Why a check came out as it did (``GateCheck.reason``).
WITHIN = "within"
BEYOND = "beyond"
STRADDLES = "straddles"
FEW_TAIL = "too_few_tail_samples"
ZERO_BASELINE = "zero_baseline"


@dataclass(frozen=True)
class Samples:
    """Sampled requests in each release, and how many lie at or above the quantile."""

    before: int
    after: int
    before_tail: int
    after_tail: int


@dataclass(frozen=True)
class GateCheck:
    """One budget's outcome. Relative values are fractions (0.1 = +10%), others ms."""

    name: str
    metric: str
    """``latency`` or ``stage.<name>``."""
    quantile: float
    kind: str
    """``relative``, ``delta`` or ``absolute``."""
    op: str
    result: Outcome
    reason: str
    """``within``, ``beyond``, ``straddles``, ``too_few_tail_samples`` or ``zero_baseline``."""
    observed: float
    """The checked statistic: relative change, change in ms, or the after quantile in ms."""
    budget: float
    """The limit the interval was compared with (raised by the minimum effect if needed)."""
    budget_text: str
    """The limit as the user wrote it, canonically (``+10%``, ``40ms``)."""
    ci_low: float
    ci_high: float
    samples: Samples
    needed_samples: int | None
    """Roughly how many requests per release would decide an inconclusive check."""
    before_ms: float
    after_ms: float
    p_fail: float
    """Holm-adjusted p-value of "within budget" (small: the budget is exceeded)."""
    p_pass: float
    """Holm-adjusted p-value of "beyond budget" (small: the budget holds)."""
    message: str = ""
