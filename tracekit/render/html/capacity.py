"""``tracekit capacity --html``: latency against arrival rate per release, with the
objective and the peak windows marked, and the cost per 1,000 requests side by side.

Drawn from :class:`~tracekit.analysis.capacity.model.CapacityResult` (its per-window
points); the numbers are the ones ``--format json`` prints.
"""

from __future__ import annotations

from typing import Any

from tracekit.analysis.capacity.model import CapacityResult
from tracekit.render.html.charts import AFTER_COLOR, BEFORE_COLOR, Figure, _layout
from tracekit.render.html.escape import plot_text

_COLORS = (BEFORE_COLOR, AFTER_COLOR, "#2f9e44", "#7048e8", "#1098ad", "#e67700")


def latency_vs_rate(result: CapacityResult) -> Figure:
    """Each window: arrival rate per replica against the objective's quantile; peak
    windows as filled markers, the objective as a horizontal line."""
    data = []
    for i, r in enumerate(result.releases):
        color = _COLORS[i % len(_COLORS)]
        for peak in (False, True):
            pts = [w for w in r.windows if w.peak == peak and w.latency_ms is not None]
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": plot_text(f"{r.label} {'peak' if peak else 'normal'}"),
                    "x": [w.rps_per_replica for w in pts],
                    "y": [w.latency_ms for w in pts],
                    "marker": {
                        "color": color,
                        "size": 9 if peak else 6,
                        "symbol": "circle" if peak else "circle-open",
                    },
                    "hovertemplate": "%{x:.1f} req/s per replica<br>%{y:.1f} ms<extra></extra>",
                }
            )
    threshold = _threshold_ms(result.slo)
    shapes = []
    if threshold is not None:
        shapes.append(
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": threshold,
                "y1": threshold,
                "line": {"color": "#c92a2a", "dash": "dash", "width": 1.5},
            }
        )
    layout = _layout(
        plot_text(f"Latency against arrival rate ({result.slo}, dashed)"),
        380,
        xaxis={"title": {"text": "arrival rate per replica (req/s)"}, "rangemode": "tozero"},
        yaxis={"title": {"text": "window quantile (ms)"}, "rangemode": "tozero"},
        shapes=shapes,
    )
    return {"data": data, "layout": layout}


def cost_per_release(result: CapacityResult) -> Figure:
    """Cost per 1,000 accepted requests (money when a price was given, else
    replica-seconds) and GPU busy fraction, one bar per release."""
    money = all(r.cost.cost_per_1k is not None for r in result.releases)
    labels = [plot_text(r.label) for r in result.releases]
    values = [
        (r.cost.cost_per_1k if money else r.cost.replica_seconds_per_1k) for r in result.releases
    ]
    data = [
        {
            "type": "bar",
            "name": "cost per 1,000 requests" if money else "replica-seconds per 1,000 requests",
            "x": labels,
            "y": values,
            "marker": {"color": BEFORE_COLOR},
        }
    ]
    gpu = [r.cost.gpu_busy_fraction for r in result.releases]
    wall = [r.cost.execution_busy_fraction for r in result.releases]
    for name, busy, dash in (("GPU busy (%)", gpu, None), ("execution busy, wall (%)", wall, "/")):
        if all(b is None for b in busy) or (dash and busy == gpu):
            continue
        marker: dict[str, Any] = {"color": AFTER_COLOR}
        if dash:
            marker["pattern"] = {"shape": dash}
        data.append(
            {
                "type": "bar",
                "name": name,
                "x": labels,
                "y": [None if b is None else b * 100 for b in busy],
                "marker": marker,
                "yaxis": "y2",
            }
        )
    layout = _layout(
        "Cost per 1,000 accepted requests, and GPU busy",
        320,
        barmode="group",
        yaxis={"title": {"text": "per 1,000 requests" if money else "replica-s per 1,000"}},
        yaxis2={"overlaying": "y", "side": "right", "range": [0, 100], "title": {"text": "%"}},
    )
    return {"data": data, "layout": layout}


def _threshold_ms(slo: str) -> float | None:
    from tracekit.analysis.facade import parse_slo
    from tracekit.errors import ConfigError

    try:
        return float(parse_slo(slo).threshold_ms)
    except ConfigError:  # the result's own objective text; a chart without the line is fine
        return None
