"""What an HTML report is drawn from, gathered from the store once (``Analysis.report``).

:class:`Report` bundles the results the other commands already return (the diff, the
gate, the autoscaling audit, slow vs fast) with the per-request arrays the charts need
(:class:`~tracekit.analysis.cohorts.release.ReleaseData`) and the waterfalls of the
exemplar traces (:class:`~tracekit.analysis.attribution.explain.Explanation`). Every
part is optional, so ``tracekit slow --html`` and ``tracekit autoscale --html`` draw
their part alone with the same page code; :mod:`tracekit.render.html` only reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tracekit.analysis.attribution.explain import Explanation, explain_trace
from tracekit.analysis.autoscale.audit import AutoscaleResult, audit_autoscaling
from tracekit.analysis.autoscale.model import Slo
from tracekit.analysis.capacity.model import CapacityResult
from tracekit.analysis.cohorts.release import ReleaseData, load_release
from tracekit.analysis.cohorts.tokens import E2E, load_metric
from tracekit.analysis.compare.diff import DiffResult, Exemplar, diff_releases
from tracekit.analysis.compare.summary import SlowFast
from tracekit.analysis.gate.evaluate import GateResult
from tracekit.analysis.store import Store
from tracekit.analysis.training.diff import compare_runs
from tracekit.analysis.training.model import RunSteps, TrainingDiff
from tracekit.analysis.training.steps import load_run
from tracekit.errors import QueryError

MIN_WINDOWS = 3
"""Fewer windows than this make no time line worth drawing."""


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
    capacity: CapacityResult | None = None
    """Why the autoscaling time line is absent (no ``--slo``, no replicas in the traces)."""
    waterfalls: list[Waterfall] = field(default_factory=list)
    training: TrainingPart | None = None
    notes: list[str] = field(default_factory=list)
    """Parts that could not be drawn, and why (shown, never silently dropped)."""

    @property
    def verdict(self) -> str:
        """The page's headline sentence (the diff's verdict), or ``""``."""
        if self.diff is not None:
            return self.diff.verdict.summary
        if self.training is not None:
            return self.training.diff.verdict.summary
        if self.capacity is not None:
            return self.capacity.summary
        return ""


Explain = Callable[[str], Explanation]
"""A trace id → its explanation (the store's spans, or, on an attributed ClickHouse
store, that one trace's spans pulled)."""


def waterfalls(
    explain: Explain, exemplars: Sequence[Exemplar], note: str
) -> tuple[list[Waterfall], list[str]]:
    """Explain each exemplar trace; a trace that cannot be drawn becomes a note."""
    drawn, notes = [], []
    for ex in exemplars:
        try:
            drawn.append(Waterfall(explain(ex.trace_id), ex.url, note))
        except QueryError as exc:
            notes.append(f"trace {ex.trace_id}: {exc}")
    return drawn, notes


def _explainer(store: Store) -> Explain:
    return lambda trace_id: explain_trace(store, trace_id)


def release_report(
    store: Store,
    before: str,
    after: str,
    gate: GateResult,
    *,
    explain: Explain | None = None,
    slo: Slo | None = None,
    window_s: float = 30.0,
    jaeger_url: str | None = None,
    service: str | None = None,
    route: str | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    metric: str = E2E,
) -> Report:
    """Two releases: diff, ``gate``, exemplar waterfalls and, given ``slo``, the
    autoscaling audit of both releases as one time line; ``metric``: the latency the diff
    and the charts compare (``e2e``, ``ttft``, ``tpot``)."""
    (before_data, after_data), _ = load_metric(
        store, [before, after], metric, service=service, route=route
    )
    diff = diff_releases(
        store,
        before,
        after,
        service=service,
        route=route,
        confidence=confidence,
        seed=seed,
        jaeger_url=jaeger_url,
        metric=metric,
    )
    primary = diff.verdict.primary_stage
    note = f"From the {after} tail (≥ {diff.tail.cohort})" + (
        f", most {primary} time first." if primary else ", slowest first."
    )
    drawn, notes = waterfalls(explain or _explainer(store), diff.exemplars, note)
    report = Report(
        title=f"tracekit report: {before} → {after}",
        source=str(store.path),
        diff=diff,
        gate=gate,
        before=before_data,
        after=after_data,
        waterfalls=drawn,
        notes=notes,
    )
    if slo is None:
        report.autoscale_note = (
            'No autoscaling time line: give the latency objective with --slo "p95<200ms".'
        )
        return report
    try:
        audit = audit_autoscaling(
            store, release=[before, after], slo=slo, window_s=window_s, service=service
        )
    except QueryError as exc:
        report.autoscale_note = f"No autoscaling time line: {exc}"
        return report
    if len(audit.windows) < MIN_WINDOWS:
        report.autoscale_note = (
            f"No autoscaling time line: the traces span {len(audit.windows)} window(s) of "
            f"{window_s:g} s; give a shorter --window."
        )
    else:
        report.autoscale = audit
    return report


def training_report(store: Store, before: str, after: str) -> Report:
    """Two training runs: the scaling diff and each run's steps per rank."""
    b, a = load_run(store, before), load_run(store, after)
    return Report(
        title=f"tracekit report: training {before} → {after}",
        source=str(store.path),
        training=TrainingPart(compare_runs(b, a), [b, a]),
    )


def slow_report(
    store: Store,
    result: SlowFast,
    *,
    service: str | None,
    route: str | None,
    explain: Explain | None = None,
) -> Report:
    """``tracekit slow``'s part alone: the gap per stage, the curve, the exemplars."""
    drawn, notes = waterfalls(
        explain or _explainer(store),
        result.exemplars,
        f"From the {result.label} slow cohort (≥ {result.cohort}).",
    )
    return Report(
        title=f"tracekit slow: {result.label}",
        source=str(store.path),
        slow=result,
        slow_release=load_release(store, result.label, service=service, route=route),
        waterfalls=drawn,
        notes=notes,
    )


def capacity_report(store: Store, result: CapacityResult) -> Report:
    """``tracekit capacity --html``: latency against arrival rate, and cost, per release."""
    names = ", ".join(r.label for r in result.releases)
    return Report(title=f"tracekit capacity: {names}", source=str(store.path), capacity=result)


def autoscale_report(store: Store, result: AutoscaleResult) -> Report:
    """``tracekit autoscale``'s part alone: the time line and the recommendation."""
    return Report(
        title=f"tracekit autoscale: {result.release}", source=str(store.path), autoscale=result
    )
