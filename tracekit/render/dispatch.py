"""Which renderers draw which result: one ``functools.singledispatch`` over result types.

Each result class the front door (:class:`tracekit.Analysis`) returns is registered
here with the ``{format: renderer}`` table of its module; the table's module is imported
only when a result of that type is rendered. A list of summaries (``Analysis.summary``)
is dispatched on ``list``. tests/render/test_dispatch.py checks that every public
result type has a table, JSON and markdown rendering.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import singledispatch
from typing import Any

from tracekit.analysis.attribute import AttributeReport
from tracekit.analysis.attribution.explain import Explanation
from tracekit.analysis.autoscale.audit import AutoscaleResult
from tracekit.analysis.capacity.model import CapacityResult
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


def _lazy(where: str) -> Callable[[Any], Table]:
    """The dispatch target for a ``module:TABLE`` renderer table, imported when first used."""
    module, _, name = where.partition(":")

    def table(result: Any) -> Table:
        found: Table = getattr(importlib.import_module(module), name)
        return found

    return table


TABLES: dict[type, str] = {
    AttributeReport: "tracekit.render.attribute:RENDERERS",
    DiffResult: "tracekit.render.diff:RENDERERS",
    Explanation: "tracekit.render.explain:RENDERERS",
    GateResult: "tracekit.render.gate:RENDERERS",
    AutoscaleResult: "tracekit.render.autoscale:RENDERERS",
    CapacityResult: "tracekit.render.capacity:RENDERERS",
    SlowFast: "tracekit.render.summary:SLOW_RENDERERS",
    IngestOutcome: "tracekit.render.ingest:RENDERERS",
    StepsResult: "tracekit.render.training:STEPS_RENDERERS",
    TrainingDiff: "tracekit.render.training:DIFF_RENDERERS",
    TrainingGateResult: "tracekit.render.training:GATE_RENDERERS",
}
"""Result class → ``module:TABLE`` of its ``{format: renderer}`` table."""

for _cls, _where in TABLES.items():
    renderers_for.register(_cls, _lazy(_where))


@renderers_for.register
def _summaries(result: list) -> Table:  # type: ignore[type-arg]
    """``Analysis.summary``: a list of :class:`~tracekit.analysis.compare.summary.Summary`."""
    from tracekit.analysis.compare.summary import Summary
    from tracekit.render.summary import SUMMARY_RENDERERS

    if not all(isinstance(item, Summary) for item in result):
        raise TypeError("no renderer for a list other than Analysis.summary()'s summaries")
    return SUMMARY_RENDERERS
