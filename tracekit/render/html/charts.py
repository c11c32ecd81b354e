"""Plotly figures (plain ``{"data", "layout"}`` dicts) for the diff, slow vs fast and a trace.

Each function turns one analysis result into one figure; the page (:mod:`.page`) hands
the dicts to plotly.js in the browser. The figures draw the numbers the JSON renderers
print — the quantile markers, intervals and shares are the result's own fields — and add
only what a picture needs beside them: the quantile curve of every request, sampled at a
few hundred levels with the weighted quantile the diff itself uses. Every name from the
traces (stages, spans, services, releases) goes through
:func:`~tracekit.render.html.escape.plot_text`, so plotly.js draws it as the text it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.attribution.explain import Explanation
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.stats import weighted_quantiles
from tracekit.analysis.compare.diff import DiffResult, LatencyRow
from tracekit.analysis.compare.summary import SlowFast
from tracekit.render.html.escape import plot_text

Figure = dict[str, Any]

BEFORE_COLOR = "#6b7f99"
AFTER_COLOR = "#d9480f"
KIND_COLORS: dict[str, str] = {cv.WAIT: "#1c7ed6", cv.COMPUTE: "#2f9e44", cv.HIDDEN_WAIT: "#e8590c"}
KIND_LABELS: dict[str, str] = {
    cv.WAIT: "wait",
    cv.COMPUTE: "compute",
    cv.HIDDEN_WAIT: "hidden wait",
}
CRITICAL_COLOR = "#c92a2a"
STAGE_COLORS: dict[str, str] = {
    cv.FEATURE_RETRIEVAL: "#74c0fc",
    cv.PREPROCESS: "#b2f2bb",
    cv.BATCH_QUEUE: "#ffd43b",
    cv.MODEL_EXECUTE: "#63e6be",
    cv.POSTPROCESS: "#d0bfff",
    cv.DOWNSTREAM: "#ffa8a8",
    cv.UNATTRIBUTED: "#dee2e6",
}
_OTHER_COLORS = ("#ffc078", "#a5d8ff", "#eebefa", "#c0eb75", "#99e9f2", "#fcc2d7")
MARKED = ("p50", "p95", "p99")
"""Quantiles marked on the latency curves (the issue's p50/p95/p99)."""
CURVE_POINTS = 320
MAX_STAGES_SHOWN = 5
FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


def stage_color(stage: str | None) -> str:
    if stage is None:
        return STAGE_COLORS[cv.UNATTRIBUTED]
    if stage in STAGE_COLORS:
        return STAGE_COLORS[stage]
    return _OTHER_COLORS[sum(map(ord, stage)) % len(_OTHER_COLORS)]


def _layout(title: str, height: int, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 14}},
        "height": height,
        "margin": {"l": 70, "r": 20, "t": 48, "b": 48},
        "font": FONT,
        "hovermode": "closest",
        "plot_bgcolor": "#ffffff",
        "paper_bgcolor": "#ffffff",
        "legend": {"orientation": "h", "y": -0.18, "x": 0},
    }
    layout.update(extra)
    return layout


def _nines(q: float) -> float:
    """Position of quantile ``q`` on the "nines" axis: p90 → 1, p99 → 2, p99.9 → 3."""
    return -math.log10(1.0 - q)


def _quantile_of(name: str) -> float:
    return float(name.removeprefix("p")) / 100.0


def _levels(n: int) -> np.ndarray:
    """Quantile levels evenly spaced on the nines axis, up to the last one n requests
    can estimate (one request beyond it)."""
    top = _nines(max(0.5, 1.0 - 1.0 / max(n, 2)))
    return 1.0 - 10.0 ** -np.linspace(_nines(0.01), top, CURVE_POINTS)


def _nines_axis(top: float) -> dict[str, Any]:
    ticks = [q for q in (0.1, 0.5, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9999) if _nines(q) <= top]
    return {
        "title": {"text": "quantile (tail to the right)"},
        "tickvals": [_nines(q) for q in ticks],
        "ticktext": [f"p{q * 100:g}" for q in ticks],
        "range": [0, top * 1.02],
        "gridcolor": "#eceff1",
        "zeroline": False,
    }


def quantile_curve(rel: ReleaseData, color: str, name: str | None = None) -> dict[str, Any]:
    """One release's latency quantile curve as a line trace (weighted, as in the diff)."""
    levels = _levels(rel.n)
    values = weighted_quantiles(rel.duration_ms, levels.tolist(), rel.weights)
    return {
        "type": "scatter",
        "mode": "lines",
        "name": name or f"{plot_text(rel.label)} ({rel.n:,} requests)",
        "x": [_nines(q) for q in levels],
        "y": [float(v) for v in values],
        "customdata": [q * 100 for q in levels],
        "line": {"color": color, "width": 2},
        "hovertemplate": "p%{customdata:.2f}: %{y:.1f} ms<extra>"
        + plot_text(rel.label)
        + "</extra>",
    }


def _marker_trace(rows: Sequence[LatencyRow], which: str, label: str, color: str, ci: float) -> Any:
    label = plot_text(label)
    xs = [_nines(_quantile_of(r.quantile)) for r in rows]
    ys = [getattr(r, which) for r in rows]
    trace: dict[str, Any] = {
        "type": "scatter",
        "mode": "markers+text",
        "name": f"{label} p50/p95/p99",
        "x": xs,
        "y": ys,
        "text": [r.quantile for r in rows],
        "textposition": "top left" if which == "before" else "bottom right",
        "marker": {"color": color, "size": 9, "symbol": "circle" if which == "after" else "square"},
        "showlegend": False,
    }
    if which == "after":
        # The delta's interval drawn around the after value: before + [ci_low, ci_high].
        trace["error_y"] = {
            "type": "data",
            "symmetric": False,
            "array": [max(0.0, r.before + r.ci_high - r.after) for r in rows],
            "arrayminus": [max(0.0, r.after - (r.before + r.ci_low)) for r in rows],
            "color": color,
            "thickness": 2,
            "width": 6,
        }
        trace["customdata"] = [[r.delta, r.ci_low, r.ci_high, r.before] for r in rows]
        trace["hovertemplate"] = (
            "%{text} " + label + ": %{y:.1f} ms<br>Δ %{customdata[0]:+.1f} ms "
            f"({ci:.0%} CI " + "%{customdata[1]:+.1f} .. %{customdata[2]:+.1f})"
            "<br>before %{customdata[3]:.1f} ms<extra></extra>"
        )
    else:
        trace["hovertemplate"] = "%{text} " + label + ": %{y:.1f} ms<extra></extra>"
    return trace


def latency_curves(diff: DiffResult, before: ReleaseData, after: ReleaseData) -> Figure:
    """Both releases' quantile curves on one chart, p50/p95/p99 marked, the after markers
    carrying the delta's bootstrap interval."""
    rows = [r for r in diff.latency if r.quantile in MARKED]
    top = _nines(1.0 - 1.0 / max(min(before.n, after.n), 2))
    top = max(top, _nines(0.99) + 0.2)
    return {
        "data": [
            quantile_curve(before, BEFORE_COLOR),
            quantile_curve(after, AFTER_COLOR),
            _marker_trace(rows, "before", before.label, BEFORE_COLOR, diff.confidence),
            _marker_trace(rows, "after", after.label, AFTER_COLOR, diff.confidence),
        ],
        "layout": _layout(
            f"Latency by quantile: {plot_text(before.label)} vs {plot_text(after.label)} "
            f"(bars: {diff.confidence:.0%} bootstrap interval of the change)",
            420,
            xaxis=_nines_axis(top),
            yaxis={
                "title": {"text": "latency (ms)"},
                "rangemode": "tozero",
                "gridcolor": "#eceff1",
            },
        ),
    }


def _kind_bars(
    names: Sequence[str],
    values: Sequence[float],
    kinds: Sequence[str],
    texts: Sequence[str],
    hover: Sequence[str],
) -> list[dict[str, Any]]:
    """One horizontal bar trace per time kind, so the legend reads wait/compute/hidden wait."""
    traces = []
    for kind in (cv.WAIT, cv.COMPUTE, cv.HIDDEN_WAIT):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if not idx:
            continue
        marker: dict[str, Any] = {"color": KIND_COLORS[kind]}
        if kind == cv.HIDDEN_WAIT:
            # Hatched as well as coloured: the distinction survives a black-and-white print.
            marker["pattern"] = {"shape": "/", "fgcolor": "#ffffff", "solidity": 0.3}
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": KIND_LABELS[kind],
                "y": [names[i] for i in idx],
                "x": [values[i] for i in idx],
                "text": [texts[i] for i in idx],
                "textposition": "outside",
                "cliponaxis": False,
                "customdata": [hover[i] for i in idx],
                "hovertemplate": "%{customdata}<extra></extra>",
                "marker": marker,
            }
        )
    return traces


def counterfactual_shares(diff: DiffResult) -> Figure:
    """Per stage: how much of the tail growth disappears when the stage is put back."""
    stages = list(diff.stages)
    names = [s.name for s in stages]
    hover = [
        f"<b>{plot_text(s.name)}</b> ({plot_text(KIND_LABELS.get(s.kind, s.kind))})<br>"
        f"removes {s.counterfactual_p99_removed_ms:+.1f} ms of the {diff.tail.cohort} growth"
        + (f" ({s.share:.0%})" if math.isfinite(s.share) else "")
        + f"<br>tail mean {s.tail_before_ms:.1f} → {s.tail_after_ms:.1f} ms"
        for s in stages
    ]
    texts = [f"{s.share:.0%}" if math.isfinite(s.share) else "" for s in stages]
    names = [plot_text(n) for n in names]
    return {
        "data": _kind_bars(
            names,
            [s.counterfactual_p99_removed_ms for s in stages],
            [s.kind for s in stages],
            texts,
            hover,
        ),
        "layout": _layout(
            f"What the {plot_text(diff.tail.cohort)} growth loses if each stage is put back "
            f"to {plot_text(diff.before.label)} (counterfactual)",
            max(220, 60 + 34 * len(stages)),
            barmode="overlay",
            xaxis={"title": {"text": "ms of tail growth removed"}, "zerolinecolor": "#868e96"},
            yaxis={"categoryorder": "array", "categoryarray": names[::-1], "automargin": True},
        ),
    }


def stages_that_matter(diff: DiffResult) -> list[str]:
    """The primary stage, then those holding a share ≥ 10% or a tail change ≥ 10% of the
    tail quantile's change; the largest tail stages when nothing grew."""
    growth = next((r.delta for r in diff.latency if r.quantile == diff.tail.cohort), 0.0)
    picked = [diff.verdict.primary_stage] if diff.verdict.primary_stage else []
    for s in sorted(diff.stages, key=lambda s: -abs(s.tail_delta_ms)):
        big_share = math.isfinite(s.share) and s.share >= 0.1
        big_change = growth > 0 and abs(s.tail_delta_ms) >= 0.1 * growth
        if (big_share or big_change) and s.name not in picked:
            picked.append(s.name)
    if not picked:
        picked = [s.name for s in sorted(diff.stages, key=lambda s: -s.tail_after_ms)]
    return picked[:MAX_STAGES_SHOWN]


def _box(rel: ReleaseData, stages: Sequence[str], color: str) -> dict[str, Any]:
    """Box per stage from weighted quantiles (p1, p25, p50, p75, p99), precomputed so the
    page carries five numbers per stage instead of every request."""
    stats = [
        weighted_quantiles(rel.stage_column(s), [0.01, 0.25, 0.5, 0.75, 0.99], rel.weights)
        for s in stages
    ]
    return {
        "type": "box",
        "name": plot_text(rel.label),
        "x": [plot_text(s) for s in stages],
        "lowerfence": [float(v[0]) for v in stats],
        "q1": [float(v[1]) for v in stats],
        "median": [float(v[2]) for v in stats],
        "q3": [float(v[3]) for v in stats],
        "upperfence": [float(v[4]) for v in stats],
        "marker": {"color": color},
        "line": {"color": color},
        "fillcolor": color + "55",
        "boxpoints": False,
    }


def stage_distributions(diff: DiffResult, before: ReleaseData, after: ReleaseData) -> Figure:
    stages = stages_that_matter(diff)
    return {
        "data": [_box(before, stages, BEFORE_COLOR), _box(after, stages, AFTER_COLOR)],
        "layout": _layout(
            "Critical-path time per request, stages that matter "
            "(box p25–p75, line p50, whiskers p1–p99)",
            380,
            boxmode="group",
            yaxis={"title": {"text": "ms"}, "rangemode": "tozero", "gridcolor": "#eceff1"},
        ),
    }


def slow_gaps(slow: SlowFast) -> Figure:
    """Per stage: slow-cohort mean minus fast-cohort mean, coloured by kind."""
    stages = list(slow.stages)
    hover = [
        f"<b>{plot_text(s.name)}</b> ({plot_text(KIND_LABELS.get(s.kind, s.kind))})<br>"
        f"slow {s.slow_mean_ms:.1f} ms vs fast {s.fast_mean_ms:.1f} ms"
        + (f"<br>{s.share:.0%} of the gap" if math.isfinite(s.share) else "")
        for s in stages
    ]
    names = [plot_text(s.name) for s in stages]
    return {
        "data": _kind_bars(
            names,
            [s.delta_ms for s in stages],
            [s.kind for s in stages],
            [f"{s.share:.0%}" if math.isfinite(s.share) else "" for s in stages],
            hover,
        ),
        "layout": _layout(
            f"{plot_text(slow.label)}: where slow requests (≥ {plot_text(slow.cohort)}) spend the time fast ones "
            "(≤ p50) do not",
            max(220, 60 + 34 * len(stages)),
            barmode="overlay",
            xaxis={"title": {"text": "ms more than a fast request"}, "zerolinecolor": "#868e96"},
            yaxis={"categoryorder": "array", "categoryarray": names[::-1], "automargin": True},
        ),
    }


def slow_curve(slow: SlowFast, rel: ReleaseData) -> Figure:
    """One release's quantile curve with the fast and slow cohort thresholds marked."""
    marks = [
        (0.5, slow.fast_threshold_ms, "fast ≤ p50"),
        (_quantile_of(slow.cohort), slow.slow_threshold_ms, f"slow ≥ {plot_text(slow.cohort)}"),
    ]
    top = max(_nines(1.0 - 1.0 / max(rel.n, 2)), _nines(0.99) + 0.2)
    return {
        "data": [
            quantile_curve(rel, AFTER_COLOR),
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": "cohort thresholds",
                "x": [_nines(q) for q, _, _ in marks],
                "y": [v for _, v, _ in marks],
                "text": [label for _, _, label in marks],
                "textposition": "top left",
                "marker": {"color": "#212529", "size": 9},
                "hovertemplate": "%{text}: %{y:.1f} ms<extra></extra>",
                "showlegend": False,
            },
        ],
        "layout": _layout(
            f"Latency by quantile: {plot_text(rel.label)}",
            360,
            xaxis=_nines_axis(top),
            yaxis={
                "title": {"text": "latency (ms)"},
                "rangemode": "tozero",
                "gridcolor": "#eceff1",
            },
        ),
    }


def _span_label(name: str, service: str | None, root_service: str | None) -> str:
    """The span's name, shortened, with its service when another one ran it."""
    label = name if len(name) <= 36 else name[:35] + "…"
    return plot_text(f"{label} [{service}]" if service and service != root_service else label)


def waterfall(ex: Explanation) -> Figure:
    """The trace's spans as bars by stage, the critical path drawn over them in red."""
    n = len(ex.spans)
    labels = [_span_label(s.name, s.service, ex.service) for s in ex.spans]
    traces: list[dict[str, Any]] = []
    by_stage: dict[str, list[int]] = {}
    for i, s in enumerate(ex.spans):
        by_stage.setdefault(s.stage or cv.UNATTRIBUTED, []).append(i)
    for stage in cv.order_stages(list(by_stage)):
        idx = by_stage[stage]
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": plot_text(stage),
                "y": idx,
                "base": [ex.spans[i].start_ms for i in idx],
                "x": [max(ex.spans[i].duration_ms, 1e-3) for i in idx],
                "width": 0.7,
                "marker": {"color": stage_color(stage), "line": {"color": "#495057", "width": 0.5}},
                "customdata": [
                    [
                        plot_text(ex.spans[i].name),
                        plot_text(ex.spans[i].service or ""),
                        plot_text(ex.spans[i].kind),
                        ex.spans[i].start_ms,
                        ex.spans[i].duration_ms,
                        ex.spans[i].critical_ms,
                    ]
                    for i in idx
                ],
                "hovertemplate": "<b>%{customdata[0]}</b> (%{customdata[1]}, %{customdata[2]})"
                "<br>stage " + plot_text(stage) + "<br>start %{customdata[3]:.2f} ms, "
                "%{customdata[4]:.2f} ms long<br>on the critical path: %{customdata[5]:.2f} ms"
                "<extra></extra>",
            }
        )
    ys, bases, lengths = [], [], []
    for i, s in enumerate(ex.spans):
        for start, end in s.path:
            ys.append(i)
            bases.append(start)
            lengths.append(max(end - start, 1e-3))
    traces.append(
        {
            "type": "bar",
            "orientation": "h",
            "name": "critical path",
            "y": ys,
            "base": bases,
            "x": lengths,
            "width": 0.28,
            "marker": {"color": CRITICAL_COLOR},
            "hovertemplate": "critical path %{base:.2f} → %{x:.2f} ms long<extra></extra>",
        }
    )
    return {
        "data": traces,
        "layout": _layout(
            f"{plot_text(ex.name)} — {ex.duration_ms:.1f} ms, trace {plot_text(ex.trace_id)}",
            max(240, 130 + 24 * n),
            barmode="overlay",
            xaxis={
                "ticksuffix": " ms",
                "range": [0, ex.duration_ms * 1.01],
                "gridcolor": "#eceff1",
            },
            yaxis={
                "tickvals": list(range(n)),
                "ticktext": labels,
                "autorange": "reversed",
                "automargin": True,
            },
            legend={"orientation": "h", "y": -0.08, "yanchor": "top", "x": 0},
        ),
    }
