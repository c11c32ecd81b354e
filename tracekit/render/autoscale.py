"""Renderers for the autoscaling audit: table (people), JSON (scripts), markdown (PRs).

Each is ``render_x(result) -> str`` over an
:class:`~tracekit.analysis.autoscale.audit.AutoscaleResult`; none of them queries anything.
The JSON shape is documented in ``docs/autoscale.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tracekit.analysis.autoscale import rules as sr
from tracekit.analysis.autoscale.audit import AutoscaleResult, fmt_signal, fmt_target
from tracekit.analysis.autoscale.model import Window
from tracekit.render.common import as_text, markdown_table, rich_to_text, to_json
from tracekit.render.text import printable

MAX_ROWS = 40
"""Windows shown in table and markdown output; JSON always has all of them."""
_TABLE_SIGNALS = (sr.CPU_UTILIZATION, sr.GPU_UTILIZATION, sr.INFLIGHT, sr.QUEUE_DEPTH)


def _num(x: float, digits: int = 3) -> float | None:
    return None if not math.isfinite(x) else round(x, digits)


def _window_json(w: Window) -> dict[str, Any]:
    return {
        "index": w.index,
        "start_s": w.start_s,
        "start_ns": w.start_ns,
        "requests": w.requests,
        "rate_rps": _num(w.rate_rps),
        "latency_ms": _num(w.latency_ms),
        "replicas": w.replicas,
        "desired_replicas": w.desired_replicas,
        "sufficient": w.sufficient,
        "violating": w.violating,
        "scale_up": w.scale_up,
        "missed": w.missed,
        "signals": {k: _num(v, 4) for k, v in w.signals.items()},
    }


def _rule_json(rule: sr.ScalingRule) -> dict[str, Any]:
    def behavior(b: sr.ScalingBehavior) -> dict[str, Any]:
        return {
            "stabilization_s": b.stabilization_s,
            "select": b.select,
            "policies": [
                {"type": p.kind, "value": p.value, "period_s": p.period_s} for p in b.policies
            ],
        }

    return {
        "controller": rule.controller,
        "name": rule.name,
        "source": rule.source,
        "assumed": rule.assumed,
        "min_replicas": rule.min_replicas,
        "max_replicas": rule.max_replicas,
        "tolerance": rule.tolerance,
        "metrics": [
            {"signal": m.signal, "target": m.target, "kind": m.kind, "source": m.source}
            for m in rule.metrics
        ],
        "scale_up": behavior(rule.scale_up),
        "scale_down": behavior(rule.scale_down),
        "notes": list(rule.notes),
    }


def _at(r: AutoscaleResult, index: int | None) -> dict[str, Any] | None:
    if index is None:
        return None
    return {"window": index, "start_s": r.windows[index].start_s}


def as_dict(r: AutoscaleResult) -> dict[str, Any]:
    """The JSON document as a dict (keys in contract order)."""
    return {
        "release": r.release,
        "slo": {"text": r.slo.text, "quantile": r.slo.quantile, "threshold_ms": r.slo.threshold_ms},
        "window_s": r.window_s,
        "min_requests": r.min_requests,
        "rule": _rule_json(r.rule),
        "summary": r.summary,
        "violating_windows": r.violating_windows,
        "missed_windows": r.missed_windows,
        "sparse_windows": r.sparse_windows,
        "rule_adequate": r.rule_adequate,
        "violating": [w.index for w in r.windows if w.violating],
        "missed": [_window_json(w) for w in r.missed],
        "first_violation": _at(r, r.first_violation),
        "first_scale_up": _at(r, r.first_scale_up),
        "lead_lag_windows": r.lead_lag_windows,
        "lead_lag_s": r.lead_lag_s,
        "signals": r.signals,
        "recommendation": r.recommendation,
        "flags": [{"code": c, "message": m} for c, m in r.flags],
        "notes": r.notes,
        "windows": [_window_json(w) for w in r.windows],
    }


def render_json(r: AutoscaleResult) -> str:
    return to_json(as_dict(r))


def _shown(r: AutoscaleResult) -> list[Window]:
    """Every window when few; else from three before the first violation on."""
    if len(r.windows) <= MAX_ROWS:
        return r.windows
    start = max(0, (r.first_violation or 0) - 3)
    return r.windows[start : start + MAX_ROWS]


def _state(w: Window) -> str:
    if not w.sufficient:
        return "sparse"
    if w.missed:
        return "MISSED"
    if w.violating:
        return "violating, scaled"
    return "scale up" if w.scale_up else "ok"


def _rows(r: AutoscaleResult) -> tuple[list[str], list[list[str]]]:
    present = [s for s in _TABLE_SIGNALS if any(math.isfinite(w.signals[s]) for w in r.windows)]
    headers = ["window", "req/s", r.slo.label, "replicas → desired"]
    headers += [sr.SIGNAL_LABELS[s].replace(" per replica", "/replica") for s in present]
    headers.append("state")
    rows = []
    for w in _shown(r):
        row = [f"{w.start_s:g} s", f"{w.rate_rps:.1f}", fmt_signal(sr.LATENCY, w.latency_ms)]
        row.append(f"{w.replicas} → {w.desired_replicas}")
        row += [fmt_signal(s, w.signals[s]) for s in present]
        row.append(_state(w))
        rows.append(row)
    return headers, rows


def _signal_rows(r: AutoscaleResult) -> tuple[list[str], list[list[str]]]:
    headers = ["signal", "rank corr.", "lead (windows)", "separation (AUC)", "score"]
    rows = []
    for s in r.signals:
        if not s.available:
            rows.append([s.label, "not in traces", "–", "–", "–"])
            continue
        corr = "–" if math.isnan(s.correlation) else f"{s.correlation:+.2f}"
        sep = "–" if math.isnan(s.separation) else f"{s.separation:.2f}"
        lead = "itself" if s.name == sr.LATENCY else str(s.lead_windows)
        rows.append([s.label, corr, lead, sep, f"{s.score:.2f}"])
    return headers, rows


def _rule_line(r: AutoscaleResult) -> str:
    rule = r.rule
    metrics = ", ".join(m.source for m in rule.metrics)
    return (
        f"Rule: {rule.controller} {rule.name!r} ({metrics}; replicas {rule.min_replicas}–"
        f"{rule.max_replicas}, tolerance {rule.tolerance:g}) from {rule.source}. "
        f"Objective {r.slo.text} over {r.window_s:g} s windows, release {r.release}."
    )


def _recommendation_lines(r: AutoscaleResult) -> list[str]:
    rec = r.recommendation
    if rec is None:
        return ["No signal had enough windows to recommend one."]
    lines = [
        f"Recommendation: scale on {sr.SIGNAL_LABELS[rec.signal].lower()} with target "
        f"{fmt_target(rec.signal, rec.target)} ({rec.rationale})."
    ]
    if rec.ray_serve:
        lines.append(
            f"Ray Serve equivalent: target_ongoing_requests={rec.ray_serve['target_ongoing_requests']:g}"
        )
    if rec.promql:
        lines.append(f"Per-replica value the audit measured, in PromQL: {rec.promql}")
    return lines


def _snippets(rec: Any) -> list[str]:
    """Adapter rule + HPA, then the KEDA ScaledObject: both name the exported series.

    Escaped line by line: the YAML's own newlines stay, a name's control characters do not.
    """
    return [
        "\n".join(printable(line) for line in s.rstrip().split("\n"))
        for s in (rec.adapter_rule + rec.hpa_snippet, "# or, with KEDA:\n" + rec.keda_snippet)
        if s.strip()
    ]


def render_table(r: AutoscaleResult) -> str:
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [as_text(r.summary, style="bold"), as_text(_rule_line(r))]
    headers, rows = _rows(r)
    table = Table(*map(printable, headers), title="Windows", title_justify="left")
    for row in rows:
        table.add_row(*map(as_text, row), style="red" if row[-1] == "MISSED" else None)
    parts.append(table)
    if len(_shown(r)) < len(r.windows):
        parts.append(Text(f"({len(r.windows) - len(_shown(r))} more windows in --format json)"))
    headers, rows = _signal_rows(r)
    signals = Table(*headers, title="Signals, best first", title_justify="left")
    for row in rows:
        signals.add_row(*map(as_text, row))
    parts.append(signals)
    parts += [as_text(line) for line in _recommendation_lines(r)]
    if r.recommendation is not None:
        parts += [Text(s) for s in _snippets(r.recommendation)]
    parts += [as_text(f"note: {n}", style="dim") for n in r.notes]
    return rich_to_text(*parts)


def render_markdown(r: AutoscaleResult) -> str:
    out = [f"**{printable(r.summary)}**", "", printable(_rule_line(r)), ""]
    out += [markdown_table(*_rows(r)), ""]
    out += ["Signals, best first:", "", markdown_table(*_signal_rows(r)), ""]
    out += [printable(line) for line in _recommendation_lines(r)]
    if r.recommendation is not None:
        for snippet in _snippets(r.recommendation):
            out += ["", "```yaml", snippet, "```"]
    out += [f"> note: {printable(n)}" for n in r.notes]
    return "\n".join(out) + "\n"


RENDERERS: dict[str, Callable[[AutoscaleResult], str]] = {
    "table": render_table,
    "json": render_json,
    "markdown": render_markdown,
}
