"""The autoscaling time line as one Plotly figure: latency against the objective, replicas,
CPU and the recommended signal, window by window, missed windows shaded.

Drawn from :class:`~tracekit.analysis.autoscale.audit.AutoscaleResult` alone: the windows,
their signals and the rule's replayed decisions are the ones ``tracekit autoscale --format
json`` prints.
"""

from __future__ import annotations

import math
from typing import Any

from tracekit.analysis.autoscale import rules as sr
from tracekit.analysis.autoscale.audit import AutoscaleResult
from tracekit.render.html.charts import AFTER_COLOR, BEFORE_COLOR, CRITICAL_COLOR, Figure, _layout
from tracekit.render.html.escape import plot_text

GAP = 0.05
"""Vertical space between the stacked panels (fraction of the plot height)."""


def _value(x: float) -> float | None:
    """NaN (a window without the signal) becomes a gap in the line, not a zero."""
    return x if math.isfinite(x) else None


def _panels(r: AutoscaleResult) -> list[tuple[str, str]]:
    """(signal, axis title) of every panel below latency and replicas."""
    panels: list[tuple[str, str]] = []
    cpu = [w.signals.get(sr.CPU_UTILIZATION, math.nan) for w in r.windows]
    if any(math.isfinite(v) for v in cpu):
        panels.append((sr.CPU_UTILIZATION, "CPU per replica"))
    rec = r.recommendation
    if rec is not None and rec.signal not in (sr.CPU_UTILIZATION, sr.LATENCY):
        panels.append((rec.signal, plot_text(sr.SIGNAL_LABELS.get(rec.signal, rec.signal))))
    return panels


def _rule_target(r: AutoscaleResult, signal: str) -> float | None:
    return next((m.target for m in r.rule.replayable if m.signal == signal), None)


def _domains(k: int) -> list[list[float]]:
    """Top-down vertical domains of ``k`` equal panels."""
    h = (1.0 - GAP * (k - 1)) / k
    return [[1.0 - i * (h + GAP) - h, 1.0 - i * (h + GAP)] for i in range(k)]


def _hline(y: float, axis: int, color: str, dash: str = "dash") -> dict[str, Any]:
    suffix = "" if axis == 1 else str(axis)
    return {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "yref": f"y{suffix}",
        "y0": y,
        "y1": y,
        "line": {"color": color, "dash": dash, "width": 1.5},
    }


def autoscale_timeline(r: AutoscaleResult) -> Figure:
    """Stacked panels sharing the time axis; shaded bands are the missed windows (the
    objective broke and the rule would not have scaled up)."""
    xs = [w.start_s for w in r.windows]
    panels = _panels(r)
    domains = _domains(2 + len(panels))
    slo = r.slo
    slo_label = plot_text(slo.label)
    hover_latency = [
        f"window {w.index} ({w.requests} requests)<br>{slo_label} {w.latency_ms:.1f} ms"
        + (" — missed" if w.missed else " — broke the objective" if w.violating else "")
        + ("" if w.sufficient else " (too few requests to judge)")
        for w in r.windows
    ]
    data: list[dict[str, Any]] = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": f"{slo_label} per window",
            "x": xs,
            "y": [_value(w.latency_ms) for w in r.windows],
            "text": hover_latency,
            "hovertemplate": "%{text}<extra></extra>",
            "line": {"color": AFTER_COLOR},
            "marker": {"size": 5},
            "yaxis": "y",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "name": "replicas seen",
            "x": xs,
            "y": [w.replicas for w in r.windows],
            "line": {"color": BEFORE_COLOR, "shape": "hv"},
            "hovertemplate": "%{y} replicas seen<extra></extra>",
            "yaxis": "y2",
        },
        {
            "type": "scatter",
            "mode": "lines",
            "name": f"replicas {plot_text(r.rule.controller_label)} wants",
            "x": xs,
            "y": [w.desired_replicas for w in r.windows],
            "line": {"color": "#212529", "shape": "hv", "dash": "dot"},
            "hovertemplate": "%{y} replicas wanted<extra></extra>",
            "yaxis": "y2",
        },
    ]
    shapes = [_hline(slo.threshold_ms, 1, CRITICAL_COLOR)]
    layout_axes: dict[str, Any] = {
        "yaxis": {"title": {"text": "ms"}, "domain": domains[0], "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "replicas"}, "domain": domains[1], "rangemode": "tozero"},
    }
    rec = r.recommendation
    for j, (signal, title) in enumerate(panels, start=3):
        percent = signal in sr.UTILIZATION_SIGNALS
        scale = 100.0 if percent else 1.0
        recommended = rec is not None and rec.signal == signal
        values = [w.signals.get(signal, math.nan) for w in r.windows]
        data.append(
            {
                "type": "scatter",
                "mode": "lines",
                "name": title + (" (recommended)" if recommended else ""),
                "x": xs,
                "y": [None if not math.isfinite(v) else v * scale for v in values],
                "line": {"color": "#1c7ed6" if recommended else "#5f3dc4"},
                "hovertemplate": "%{y:.2f}"
                + ("%" if percent else "")
                + "<extra>"
                + title
                + "</extra>",
                "yaxis": f"y{j}",
            }
        )
        target = _rule_target(r, signal)
        if target is not None:
            shapes.append(_hline(target * scale, j, "#495057", "dot"))
        if recommended and rec is not None:
            shapes.append(_hline(rec.target * scale, j, "#1c7ed6"))
        # The range covers the targets too: a 70% CPU target above a 35% line must show.
        levels = [v for v in values if math.isfinite(v)]
        levels += [t for t in (target, rec.target if recommended and rec else None) if t]
        layout_axes[f"yaxis{j}"] = {
            "title": {"text": title + (" %" if percent else "")},
            "domain": domains[j - 1],
            "range": [0, max(levels, default=1.0) * scale * 1.12],
        }
    for w in r.windows:
        if w.missed:
            shapes.append(
                {
                    "type": "rect",
                    "xref": "x",
                    "yref": "paper",
                    "x0": w.start_s,
                    "x1": w.start_s + r.window_s,
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": CRITICAL_COLOR,
                    "opacity": 0.12,
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
    lines = f"dashed red: objective {plot_text(slo.text)}"
    if rec is not None:
        lines += f"; blue: recommended target {rec.target:g}"
    return {
        "data": data,
        "layout": _layout(
            f"Autoscaling time line, {plot_text(r.release)}: shaded = missed windows "
            f"({r.missed_windows} of {r.violating_windows} that broke the objective)",
            220 + 150 * (2 + len(panels)),
            xaxis={
                "title": {"text": f"seconds since the first request ({lines})"},
                "anchor": f"y{2 + len(panels)}",
            },
            shapes=shapes,
            hovermode="x unified",
            **layout_axes,
        ),
    }
