"""Which renderers draw which result: one ``functools.singledispatch`` over result types.

Each result class the front door (:class:`tracekit.Analysis`) returns is registered
here with the ``{format: renderer}`` table of its module; the table's module is imported
only when a result of that type is rendered. A list of summaries (``Analysis.summary``)
is dispatched on ``list``. tests/render/test_dispatch.py checks that every public
result type has a table, JSON and markdown rendering.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import singledispatch
from typing import Any

from tracekit.analysis.attribution.explain import Explanation
from tracekit.analysis.autoscale.audit import AutoscaleResult
from tracekit.analysis.compare.diff import DiffResult
from tracekit.analysis.compare.summary import SlowFast
from tracekit.analysis.gate.evaluate import GateResult
from tracekit.analysis.loading import IngestOutcome
from tracekit.analysis.training.gate import TrainingGateResult
from tracekit.analysis.training.model import StepsResult, TrainingDiff

Table = Mapping[str, Any]


@singledispatch
def renderers_for(result: object) -> Table:
    """The ``{format: renderer}`` table for ``result``'s type."""
    raise TypeError(
        f"no renderer for a {type(result).__name__}; register it in tracekit.render.dispatch"
    )


@renderers_for.register
def _diff(result: DiffResult) -> Table:
    from tracekit.render.diff import RENDERERS

    return RENDERERS


@renderers_for.register
def _explain(result: Explanation) -> Table:
    from tracekit.render.explain import RENDERERS

    return RENDERERS


@renderers_for.register
def _gate(result: GateResult) -> Table:
    from tracekit.render.gate import RENDERERS

    return RENDERERS


@renderers_for.register
def _autoscale(result: AutoscaleResult) -> Table:
    from tracekit.render.autoscale import RENDERERS

    return RENDERERS


@renderers_for.register
def _slow(result: SlowFast) -> Table:
    from tracekit.render.summary import SLOW_RENDERERS

    return SLOW_RENDERERS


@renderers_for.register
def _summaries(result: list) -> Table:  # type: ignore[type-arg]
    """``Analysis.summary``: a list of :class:`~tracekit.analysis.compare.summary.Summary`."""
    from tracekit.analysis.compare.summary import Summary
    from tracekit.render.summary import SUMMARY_RENDERERS

    if not all(isinstance(item, Summary) for item in result):
        raise TypeError("no renderer for a list other than Analysis.summary()'s summaries")
    return SUMMARY_RENDERERS


@renderers_for.register
def _ingest(result: IngestOutcome) -> Table:
    from tracekit.render.ingest import RENDERERS

    return RENDERERS


@renderers_for.register
def _steps(result: StepsResult) -> Table:
    from tracekit.render.training import STEPS_RENDERERS

    return STEPS_RENDERERS


@renderers_for.register
def _training_diff(result: TrainingDiff) -> Table:
    from tracekit.render.training import DIFF_RENDERERS

    return DIFF_RENDERERS


@renderers_for.register
def _training_gate(result: TrainingGateResult) -> Table:
    from tracekit.render.training import GATE_RENDERERS

    return GATE_RENDERERS
