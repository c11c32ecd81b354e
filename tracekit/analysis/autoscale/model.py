"""The autoscale package's shared types: the latency objective and one window of the time line.

At the bottom of the package so that the replay (:mod:`.audit`) and the signal ranking
(:mod:`.signal_ranking`) both import it and not each other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tracekit.errors import ConfigError
from tracekit.units import parse_duration_ms

_SLO = re.compile(r"^\s*p(\d{1,2}(?:\.\d+)?)\s*(<=?)\s*(.+?)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Slo:
    """A latency objective: the ``quantile`` of each window stays below ``threshold_ms``."""

    quantile: float
    threshold_ms: float
    inclusive: bool = False
    """``p95<=200ms``: exactly 200 ms still meets it."""

    @property
    def label(self) -> str:
        return "p" + f"{self.quantile * 100:.1f}".rstrip("0").rstrip(".")

    @property
    def text(self) -> str:
        return f"{self.label}{'<=' if self.inclusive else '<'}{self.threshold_ms:g}ms"

    def broken_by(self, latency_ms: float) -> bool:
        if self.inclusive:
            return latency_ms > self.threshold_ms
        return latency_ms >= self.threshold_ms


def parse_slo(text: str) -> Slo:
    """``"p95<200ms"`` → Slo(0.95, 200.0); ``p99.9<=1s`` works too."""
    m = _SLO.match(text)
    if not m:
        raise ConfigError(f"--slo {text!r}: expected a quantile and a bound, e.g. 'p95<200ms'")
    q = float(m.group(1)) / 100.0
    if not 0.0 < q < 1.0:
        raise ConfigError(f"--slo {text!r}: the quantile must lie between p0 and p100")
    try:
        bound = parse_duration_ms(m.group(3), what="--slo bound")
    except ConfigError:
        raise ConfigError(
            f"--slo {text!r}: the bound must be a duration such as 200ms or 1s"
        ) from None
    if bound <= 0:
        raise ConfigError(f"--slo {text!r}: the bound must be positive")
    return Slo(q, bound, inclusive=m.group(2) == "<=")


def min_requests_for(q: float) -> int:
    """Requests a window needs before its q-quantile means something: one beyond it."""
    return max(10, math.ceil(1.0 / (1.0 - q) - 1e-9))


@dataclass
class Window:
    """One window of the time line, with the rule's decision in it."""

    index: int
    start_s: float
    """Seconds since the first request."""
    start_ns: int
    requests: int
    rate_rps: float
    latency_ms: float
    replicas: int
    signals: dict[str, float]
    """Each candidate signal as a controller sees it (NaN where the traces lack it)."""
    sufficient: bool
    violating: bool = False
    desired_replicas: int = 0
    scale_up: bool = False
    missed: bool = False
