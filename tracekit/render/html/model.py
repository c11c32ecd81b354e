"""What an HTML page is drawn from: analysis results gathered by a command, never a query.

:class:`Report` bundles the results the JSON renderers already print (the diff, the
gate, the autoscaling audit, slow vs fast) with the per-request arrays the charts need
(:class:`~tracekit.analysis.cohorts.release.ReleaseData`) and the waterfalls of the
exemplar traces (:class:`~tracekit.analysis.attribution.explain.Explanation`). A command
fills it (``tracekit/commands/report.py``); the renderers in this package only read it.
Every part is optional, so ``tracekit slow --html`` and ``tracekit autoscale --html`` draw
their part alone with the same code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.analysis.attribution.explain import Explanation
from tracekit.analysis.autoscale.audit import AutoscaleResult
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.compare.diff import DiffResult
from tracekit.analysis.compare.summary import SlowFast
from tracekit.analysis.gate.evaluate import GateResult
from tracekit.analysis.training.model import RunSteps, TrainingDiff


@dataclass(frozen=True)
class Waterfall:
    """One exemplar trace drawn as a waterfall, with its Jaeger link when one was given."""

    explanation: Explanation
    url: str | None = None
    note: str = ""
    """Why this trace was picked (``slowest of v2 with most batch_queue time``)."""


@dataclass(frozen=True)
class TrainingPart:
    """Two training runs compared: the scaling diff and each run's per-rank steps."""

    diff: TrainingDiff
    runs: list[RunSteps]


@dataclass
class Report:
    """Everything one HTML page shows; absent parts are left out of the page."""

    title: str
    source: str
    """Where the numbers came from (the store's path), printed in the page's footer."""
    diff: DiffResult | None = None
    gate: GateResult | None = None
    before: ReleaseData | None = None
    after: ReleaseData | None = None
    slow: SlowFast | None = None
    slow_release: ReleaseData | None = None
    autoscale: AutoscaleResult | None = None
    autoscale_note: str = ""
    """Why the autoscaling time line is absent (no ``--slo``, no replicas in the traces)."""
    waterfalls: list[Waterfall] = field(default_factory=list)
    training: TrainingPart | None = None
    notes: list[str] = field(default_factory=list)
    """Parts that could not be drawn, and why (shown, never silently dropped)."""
