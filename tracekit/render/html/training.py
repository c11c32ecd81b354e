"""Training runs in the report: step time stacked by component per rank, the components'
growth between two runs, and scaling efficiency.

Drawn from :class:`~tracekit.analysis.training.model.TrainingDiff` and the two runs'
:class:`~tracekit.analysis.training.model.RunSteps` — the results ``tracekit diff`` and
``tracekit steps`` print as JSON.
"""

from __future__ import annotations

from typing import Any

from tracekit import conventions as cv
from tracekit.analysis.training.model import RunSteps, TrainingDiff
from tracekit.render.html.charts import AFTER_COLOR, BEFORE_COLOR, Figure, _layout
from tracekit.render.html.escape import plot_text

# Per-rank parts of a step, each a field (or difference of fields) of RankRow.
RANK_PARTS: tuple[tuple[str, str], ...] = (
    (cv.DATA_WAIT, "#ffd43b"),
    ("compute", "#2f9e44"),
    ("peer wait", "#e8590c"),
    ("transfer", "#1c7ed6"),
)
BOTTLENECK_COLORS = {
    "data_loading": "#ffd43b",
    "communication": "#1c7ed6",
    "straggler": "#e8590c",
    "compute": "#2f9e44",
    "none": "#adb5bd",
}


def rank_stack(run: RunSteps) -> Figure:
    """Mean step time per rank split into data wait, compute, peer wait and transfer
    (exposed communication minus the wait for the last rank)."""
    ranks = [f"rank {r.rank}" for r in run.ranks]
    values = {
        cv.DATA_WAIT: [r.data_wait_ms for r in run.ranks],
        "compute": [r.compute_ms for r in run.ranks],
        "peer wait": [r.peer_wait_ms for r in run.ranks],
        "transfer": [max(0.0, r.comm_exposed_ms - r.peer_wait_ms) for r in run.ranks],
    }
    data: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": name,
            "x": ranks,
            "y": values[name],
            "marker": {"color": color},
            "hovertemplate": "%{x}: " + name + " %{y:.1f} ms<extra></extra>",
        }
        for name, color in RANK_PARTS
    ]
    data.append(
        {
            "type": "scatter",
            "mode": "markers",
            "name": "step p50",
            "x": ranks,
            "y": [r.step_ms_p50 for r in run.ranks],
            "marker": {"color": "#212529", "symbol": "line-ew-open", "size": 18},
            "hovertemplate": "%{x}: step p50 %{y:.1f} ms<extra></extra>",
        }
    )
    return {
        "data": data,
        "layout": _layout(
            f"{plot_text(run.label)}: step time per rank ({run.world_size} ranks, mean ms per step)",
            340,
            barmode="stack",
            yaxis={"title": {"text": "ms per step"}, "gridcolor": "#eceff1"},
        ),
    }


def components(diff: TrainingDiff) -> Figure:
    """Each component's change in mean step time, coloured by the bottleneck it points at."""
    names = [plot_text(c.name) for c in diff.components]
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "name": "change per step",
                "y": names,
                "x": [c.delta_ms for c in diff.components],
                "text": [f"{c.share:.0%}" if c.share is not None else "" for c in diff.components],
                "textposition": "outside",
                "cliponaxis": False,
                "customdata": [
                    [c.before_ms, c.after_ms, plot_text(c.bottleneck)] for c in diff.components
                ],
                "hovertemplate": "<b>%{y}</b> (%{customdata[2]})<br>%{customdata[0]:.1f} → "
                "%{customdata[1]:.1f} ms per step<extra></extra>",
                "marker": {
                    "color": [
                        BOTTLENECK_COLORS.get(c.bottleneck, "#adb5bd") for c in diff.components
                    ]
                },  # fmt: skip
                "showlegend": False,
            }
        ],
        "layout": _layout(
            f"Step time by component: {plot_text(diff.before.label)} → "
            f"{plot_text(diff.after.label)} "
            "(labels: share of the time lost against ideal scaling)",
            max(220, 60 + 34 * len(names)),
            xaxis={"title": {"text": "ms per step, change"}, "zerolinecolor": "#868e96"},
            yaxis={"categoryorder": "array", "categoryarray": names[::-1], "automargin": True},
        ),
    }


def scaling(diff: TrainingDiff) -> Figure:
    """Throughput of both runs against the ideal (before × world-size ratio)."""
    b, a, s = diff.before, diff.after, diff.scaling
    labels = [
        f"{plot_text(b.label)} ({b.world_size} ranks)",
        f"{plot_text(a.label)} ({a.world_size} ranks)",
    ]
    values = [b.samples_per_s, a.samples_per_s]
    colors = [BEFORE_COLOR, AFTER_COLOR]
    if b.samples_per_s is not None:
        labels.append(f"ideal at {a.world_size} ranks")
        values.append(b.samples_per_s * s.ideal)
        colors.append("#ced4da")
    eff = f"{s.efficiency:.0%}" if s.efficiency is not None else "unknown"
    return {
        "data": [
            {
                "type": "bar",
                "x": labels,
                "y": values,
                "marker": {"color": colors},
                "hovertemplate": "%{x}: %{y:,.0f} samples/s<extra></extra>",
                "showlegend": False,
            }
        ],
        "layout": _layout(
            f"Throughput: scaling efficiency {eff} of ideal",
            320,
            yaxis={"title": {"text": "samples/s"}, "rangemode": "tozero", "gridcolor": "#eceff1"},
        ),
    }
