"""The gate's shared types: outcomes, reasons and the dataclasses a check is made of.

At the bottom of the gate package so that the statistics (:mod:`.evaluate`) and the
wording (:mod:`.wording`) both import it and never each other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    """A check's or the whole gate's result."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


PASS = Outcome.PASS
FAIL = Outcome.FAIL
INCONCLUSIVE = Outcome.INCONCLUSIVE

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
    result: str
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


@dataclass(frozen=True)
class GateVerdict:
    """The diff's answer to "which stage grew the tail, and what kind of time"."""

    primary_stage: str | None
    kind: str
    summary: str
    share: float | None = None
    """Fraction of the p99 growth the primary stage explains."""


@dataclass(frozen=True)
class GateWarning:
    code: str
    message: str


@dataclass(frozen=True)
class ReleaseInfo:
    label: str
    requests: int
    estimated_requests: float = 0.0
    """Summed sample weights of the kept ``requests``."""
