"""One self-contained HTML page from a :class:`~tracekit.analysis.report.Report`.

The page carries everything it needs: plotly.js inlined (no CDN, so it opens from a CI
artifact or an e-mail with no network), the figures as JSON, the tables as HTML, and the
analysis results themselves as the JSON documents ``--format json`` prints, in a
``<script type="application/json" id="tracekit-results">`` block a script can read back.
Whatever the traces' names hold, both JSON blocks stay valid JSON and the HTML holds them
as text (:mod:`.escape`); a Jaeger link is drawn for http(s) URLs only.

Sections appear only for the parts the report holds, in reading order: the verdict and
the gate's outcome, latency by quantile, the counterfactual stage shares, per-stage
distributions, the slowest traces as waterfalls, slow vs fast, the autoscaling time line
and training runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tracekit import __version__
from tracekit.analysis.report import Report, Waterfall
from tracekit.errors import ConfigError
from tracekit.render.common import kind_cell, metric_label, ms, pct
from tracekit.render.diff import (
    ATTRIBUTE_HEADERS,
    LATENCY_HEADERS,
    OPERATION_HEADERS,
    STAGE_HEADERS,
    attribute_rows,
    cohort_line,
    latency_rows,
    operation_rows,
    operation_title,
    stage_rows,
)
from tracekit.render.gate import HEADERS as GATE_HEADERS
from tracekit.render.html import charts
from tracekit.render.html.escape import LINK_SCHEMES, e, link_url, script_json
from tracekit.render.html.styles import CSS
from tracekit.render.html.timeline import autoscale_timeline
from tracekit.render.summary import SLOW_OPERATION_HEADERS, slow_operation_rows


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:  # the analysis extra brings it
        raise ConfigError("the HTML report needs plotly: pip install 'tracekit[analysis]'") from exc
    return str(get_plotlyjs())


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


class Page:
    """Collects sections and figures, then writes the whole document."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures: dict[str, dict[str, Any]] = {}

    def chart(self, kind: str, figure: dict[str, Any]) -> str:
        chart_id = f"chart-{len(self.figures) + 1}"
        self.figures[chart_id] = figure
        # The height is the figure's: a printed page must not collapse the box under it.
        height = int(figure.get("layout", {}).get("height", 400))
        return (
            f'<div class="chart" id="{chart_id}" data-chart="{e(kind)}" '
            f'style="height: {height}px"></div>'
        )

    def section(self, section_id: str, heading: str, *body: str) -> None:
        inner = "".join(body)
        self.parts.append(f'<section id="{section_id}"><h2>{e(heading)}</h2>{inner}</section>')

    def document(self, header: str, results: dict[str, Any], footer: str) -> str:
        figures = script_json(self.figures)
        return (
            "<!DOCTYPE html>\n"
            '<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(self.title)}</title><style>{CSS}</style>"
            f"<script>{_plotly_js()}</script></head><body><main>"
            f"{header}{''.join(self.parts)}<footer>{footer}</footer></main>"
            f'<script type="application/json" id="tracekit-figures">{figures}</script>'
            f'<script type="application/json" id="tracekit-results">{script_json(results)}'
            f"</script><script>{_DRAW}</script></body></html>\n"
        )


# Draws every figure; marks the body when done so a reader (or a test) knows the page
# is complete; refits the charts to the paper's width when printed.
_DRAW = """
(function () {
  var figures = JSON.parse(document.getElementById('tracekit-figures').textContent);
  var config = {responsive: true, displaylogo: false,
                modeBarButtonsToRemove: ['select2d', 'lasso2d']};
  var pending = Object.keys(figures).map(function (id) {
    var f = figures[id];
    return Plotly.newPlot(id, f.data, f.layout, config);
  });
  Promise.all(pending).then(function () {
    document.body.setAttribute('data-charts', String(pending.length));
  });
  // Paper is narrower than the screen: refit every chart to the printed width, and back.
  function refit() {
    Object.keys(figures).forEach(function (id) {
      Plotly.Plots.resize(document.getElementById(id));
    });
  }
  window.addEventListener('beforeprint', refit);
  window.addEventListener('afterprint', refit);
})();
"""


def _badge(outcome: str) -> str:
    return f'<span class="badge {e(outcome)}">{e(outcome.upper())}</span>'


def _header(report: Report) -> str:
    lines = [f"<h1>{e(report.title)}</h1>"]
    verdict = None
    if report.diff is not None:
        verdict = report.diff.verdict.summary
    elif report.training is not None:
        verdict = report.training.diff.verdict.summary
    elif report.slow is not None:
        verdict = report.slow.summary
    elif report.autoscale is not None:
        verdict = report.autoscale.summary
    elif report.capacity is not None:
        verdict = report.capacity.summary
    if verdict:
        lines.append(f'<p class="verdict" id="verdict">{e(verdict)}</p>')
    if report.gate is not None:
        g = report.gate
        lines.append(
            f'<p class="gate" id="gate-outcome">Release gate: {_badge(g.result)} {e(g.summary)}</p>'
        )
    return '<header id="top">' + "".join(lines) + "</header>"


def _gate_rows(report: Report) -> list[list[str]]:
    from tracekit.analysis.gate.wording import observed_text

    assert report.gate is not None
    rows = []
    for c in report.gate.checks:
        change = "–" if c.reason in ("too_few_tail_samples", "zero_baseline") else observed_text(c)
        budget = c.budget_text if c.kind != "absolute" else f"{c.op} {c.budget_text}"
        tail = (
            f"{c.samples.after_tail:,}"
            if c.kind == "absolute"
            else f"{c.samples.before_tail:,} / {c.samples.after_tail:,}"
        )
        rows.append([c.name, c.result, ms(c.before_ms), ms(c.after_ms), change, budget, tail])
    return rows


def _gate_section(page: Page, report: Report) -> None:
    g = report.gate
    assert g is not None
    details = "".join(
        f'<p class="{e(c.result)}">{e(c.result)}: {e(c.message)}</p>'
        for c in g.checks
        if c.result != "pass"
    )
    warnings = "".join(f'<p class="note">warning: {e(w.message)}</p>' for w in g.warnings)
    page.section(
        "gate",
        f"Release gate{metric_label(g.metric)}: {g.after.label} against {g.before.label}",
        table(GATE_HEADERS, _gate_rows(report), "gate-checks"),
        details,
        warnings,
    )


def _diff_sections(page: Page, report: Report) -> None:
    d = report.diff
    assert d is not None
    if report.before is not None and report.after is not None:
        page.section(
            "latency",
            "Latency" + metric_label(d.metric),
            page.chart("latency", charts.latency_curves(d, report.before, report.after)),
            table(LATENCY_HEADERS, latency_rows(d), "latency"),
        )
    page.section(
        "stages",
        "Which stage explains the tail growth" + metric_label(d.metric),
        page.chart("shares", charts.counterfactual_shares(d)),
        table(STAGE_HEADERS, stage_rows(d), "stages"),
        f'<p class="note">{e(cohort_line(d))}</p>',
    )
    if title := operation_title(d):
        page.section(
            "operations",
            title,
            table(OPERATION_HEADERS, operation_rows(d), "operations"),
        )
    if report.before is not None and report.after is not None and d.stages:
        page.section(
            "distributions",
            "Per-stage distributions, before and after",
            page.chart("distributions", charts.stage_distributions(d, report.before, report.after)),
        )
    extra = []
    if d.attributes:
        extra.append(table(ATTRIBUTE_HEADERS, attribute_rows(d.attributes), "attributes"))
    if d.flags:
        extra.append(
            "<ul class='flags'>"
            + "".join(f"<li><b>{e(f.code)}</b>: {e(f.message)}</li>" for f in d.flags)
            + "</ul>"
        )
    if extra:
        page.section("evidence", "Over-represented in slow traces, and flags", *extra)


def _refused_links(waterfalls: Sequence[Waterfall]) -> str:
    """Says why the traces have no Jaeger link although a URL was given (the URL itself is
    not repeated: it is whatever the flag or the span held)."""
    if not any(w.url and not link_url(w.url) for w in waterfalls):
        return ""
    schemes = " and ".join(sorted(LINK_SCHEMES))
    return (
        '<p class="note" id="no-links">No Jaeger links: the trace URL is not an http(s) URL '
        f"(only {schemes} are linked; check --jaeger-url).</p>"
    )


def _waterfall_block(page: Page, w: Waterfall) -> str:
    ex = w.explanation
    url = link_url(w.url)
    link = (
        f' <a class="jaeger" href="{e(url)}" target="_blank" rel="noopener">open in Jaeger</a>'
        if url
        else ""
    )
    split = ", ".join(
        f"{s.stage} {s.critical_ms:.1f} ms ({s.time_kind})" for s in ex.stages if s.critical_ms > 0
    )
    return (
        f'<div class="trace" data-trace-id="{e(ex.trace_id)}">'
        f"<h3>{e(ex.trace_id)} — {ex.duration_ms:.1f} ms"
        f"{' (' + e(ex.release) + ')' if ex.release else ''}{link}</h3>"
        f'<p class="note">{e(w.note)} Critical path: {e(split)}.</p>'
        + page.chart("waterfall", charts.waterfall(ex))
        + "</div>"
    )


def _slow_sections(page: Page, report: Report) -> None:
    s = report.slow
    assert s is not None
    rows = [
        [
            g.name,
            kind_cell(g.time_kind, g.hidden_wait),
            ms(g.slow_mean_ms),
            ms(g.fast_mean_ms),
            ms(g.delta_ms),
            pct(g.share),
        ]
        for g in s.stages
    ]
    body = [page.chart("slow", charts.slow_gaps(s))]
    if report.slow_release is not None:
        body.append(page.chart("latency", charts.slow_curve(s, report.slow_release)))
    body.append(table(["stage", "kind", "slow", "fast", "gap", "share"], rows, "slow"))
    if op_rows := slow_operation_rows(s):
        body.append(table(SLOW_OPERATION_HEADERS, op_rows, "operations"))
    if s.flags:
        body.append(
            "<ul class='flags'>"
            + "".join(f"<li><b>{e(f.code)}</b>: {e(f.message)}</li>" for f in s.flags)
            + "</ul>"
        )
    page.section("slow", f"Slow vs fast requests of {s.label}", *body)


def _autoscale_section(page: Page, report: Report) -> None:
    r = report.autoscale
    assert r is not None
    body = [
        f'<p class="verdict-small">{e(r.summary)}</p>',
        page.chart("autoscale", autoscale_timeline(r)),
    ]
    if r.recommendation is not None:
        body.append(f"<pre>{e(r.recommendation.hpa_snippet)}</pre>")
    page.section("autoscale", "Autoscaling", *body)


def _capacity_section(page: Page, report: Report) -> None:
    from tracekit.render.html import capacity

    result = report.capacity
    assert result is not None
    body = [f'<p class="verdict-small">{e(r.label)}: {e(r.reason)}</p>' for r in result.releases]
    body.append(page.chart("capacity", capacity.latency_vs_rate(result)))
    body.append(page.chart("capacity", capacity.cost_per_release(result)))
    for r in result.releases:
        if r.batching is not None and r.batching.triton:
            body.append(f"<p>{e(r.label)}: batching pick</p><pre>{e(r.batching.triton)}</pre>")
    page.section("capacity", "Capacity: latency under bursts and cost per request", *body)


def _training_section(page: Page, report: Report) -> None:
    from tracekit.render.html import training

    part = report.training
    assert part is not None
    v = part.diff.verdict
    body = [
        f'<p class="verdict-small">{e(v.fix)}</p>' if v.fix else "",
        page.chart("training", training.scaling(part.diff)),
        page.chart("training", training.components(part.diff)),
    ]
    body += [page.chart("training", training.rank_stack(run)) for run in part.runs]
    page.section("training", "Training runs: where the step time goes, per rank", *body)


def results_json(report: Report) -> dict[str, Any]:
    """The results exactly as ``--format json`` prints them, one key per part present."""
    from tracekit.render import autoscale, capacity, diff, gate, summary, training

    out: dict[str, Any] = {}
    if report.diff is not None:
        out["diff"] = json.loads(diff.render_json(report.diff))
    if report.gate is not None:
        out["gate"] = json.loads(gate.render_json(report.gate))
    if report.slow is not None:
        out["slow"] = json.loads(summary.SLOW_RENDERERS["json"](report.slow))
    if report.autoscale is not None:
        out["autoscale"] = json.loads(autoscale.render_json(report.autoscale))
    if report.training is not None:
        out["training"] = json.loads(training.diff_json(report.training.diff))
    if report.capacity is not None:
        out["capacity"] = json.loads(capacity.capacity_json(report.capacity))
    return out


def render_report(report: Report) -> str:
    """The whole page for ``report``: every part it holds, nothing it does not."""
    page = Page(report.title)
    if report.gate is not None:
        _gate_section(page, report)
    if report.diff is not None:
        _diff_sections(page, report)
    if report.slow is not None:
        _slow_sections(page, report)
    if report.waterfalls:
        blocks = [_waterfall_block(page, w) for w in report.waterfalls]
        page.section(
            "traces",
            "Slowest traces, critical path in red",
            '<p class="note">Bars are spans coloured by stage; the thin red bars are the '
            "critical path (last-finishing-child walk), the only time the request waited for."
            "</p>",
            _refused_links(report.waterfalls),
            *blocks,
        )
    if report.autoscale is not None:
        _autoscale_section(page, report)
    elif report.autoscale_note:
        page.section("autoscale", "Autoscaling", f'<p class="note">{e(report.autoscale_note)}</p>')
    if report.training is not None:
        _training_section(page, report)
    if report.capacity is not None:
        _capacity_section(page, report)
    if report.notes:
        page.section("notes", "Not shown", *(f'<p class="note">{e(n)}</p>' for n in report.notes))
    footer = (
        f"tracekit {e(__version__)} · from {e(report.source)} · the numbers in this page are "
        "the ones <code>--format json</code> prints; they are embedded below as JSON "
        "(<code>#tracekit-results</code>)."
    )
    return page.document(_header(report), results_json(report), footer)
