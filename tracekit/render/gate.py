"""Renderers for :class:`~tracekit.analysis.gate.evaluate.GateResult`: table, JSON, markdown, JUnit XML.

The JSON shape is documented in docs/gate.md and kept stable; latencies are
milliseconds, relative values fractions (0.1 = +10%). Markdown is meant for
``$GITHUB_STEP_SUMMARY`` or a pull-request comment; JUnit XML gives CI one test case per
budget (``<failure>`` for fail, ``<skipped>`` for inconclusive).
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from typing import Any

from tracekit.analysis.gate.evaluate import GateResult
from tracekit.analysis.gate.model import GateCheck
from tracekit.analysis.gate.wording import observed_text
from tracekit.analysis.training.gate import TrainingGateResult
from tracekit.render.common import (
    as_text,
    markdown_table,
    metric_label,
    ms,
    requests_text,
    rich_to_text,
    to_json,
)
from tracekit.render.text import printable

ICONS = {"pass": "✅", "fail": "❌", "inconclusive": "⚠️"}
_STYLES = {"pass": "green", "fail": "bold red", "inconclusive": "yellow"}


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def as_dict(result: GateResult) -> dict[str, Any]:
    """The JSON document (before serialisation); field order is part of the contract."""
    checks = []
    for c in result.checks:
        item: dict[str, Any] = {
            "name": c.name,
            "result": c.result,
            "reason": c.reason,
            "metric": c.metric,
            "quantile": c.quantile,
            "kind": c.kind,
            "op": c.op,
            "observed": _num(c.observed),
            "budget": _num(c.budget),
            "budget_text": c.budget_text,
            "ci_low": _num(c.ci_low),
            "ci_high": _num(c.ci_high),
            "before_ms": _num(c.before_ms),
            "after_ms": _num(c.after_ms),
            "samples": {
                "before": c.samples.before,
                "after": c.samples.after,
                "before_tail": c.samples.before_tail,
                "after_tail": c.samples.after_tail,
            },
            "p_fail": _num(c.p_fail),
            "p_pass": _num(c.p_pass),
            "message": c.message,
        }
        if c.needed_samples is not None:
            item["needed_samples"] = c.needed_samples
        checks.append(item)
    v = result.verdict
    return {
        "result": result.result,
        "summary": result.summary,
        "before": {
            "label": result.before.label,
            "requests": result.before.requests,
            "estimated_requests": result.before.estimated_requests,
        },
        "after": {
            "label": result.after.label,
            "requests": result.after.requests,
            "estimated_requests": result.after.estimated_requests,
        },
        "confidence": result.confidence,
        "correction": result.correction,
        "min_effect_ms": result.min_effect_ms,
        "metric": result.metric,
        "checks": checks,
        "verdict": None
        if v is None
        else {
            "primary_stage": v.primary_stage,
            "kind": v.kind,
            "share": v.share,
            "summary": v.summary,
        },
        "warnings": [{"code": w.code, "message": w.message} for w in result.warnings],
    }


def render_json(result: GateResult) -> str:
    return to_json(as_dict(result))


def _budget_cell(c: GateCheck) -> str:
    return c.budget_text if c.kind != "absolute" else f"{c.op} {c.budget_text}"


def _tail_cell(c: GateCheck) -> str:
    if c.kind == "absolute":
        return f"{c.samples.after_tail:,}"
    return f"{c.samples.before_tail:,} / {c.samples.after_tail:,}"


def _change_cell(c: GateCheck) -> str:
    if c.reason in ("too_few_tail_samples", "zero_baseline"):
        return "–"
    return observed_text(c)


def _rows(result: GateResult, icons: bool) -> list[list[str]]:
    return [
        [
            c.name,
            f"{ICONS[c.result]} {c.result}" if icons else c.result,
            ms(c.before_ms),
            ms(c.after_ms),
            _change_cell(c),
            _budget_cell(c),
            _tail_cell(c),
        ]
        for c in result.checks
    ]


HEADERS = ("Check", "Result", "Before", "After", "Change (CI)", "Budget", "Tail samples")


def render_table(result: GateResult) -> str:
    from rich.table import Table

    table = Table(
        title=as_text(
            f"tracekit gate{metric_label(result.metric)}: {result.after.label} against"
            f" {result.before.label}"
        )
    )
    for h in HEADERS:
        table.add_column(h, justify="right" if h in ("Before", "After") else "left")
    for c, row in zip(result.checks, _rows(result, icons=False), strict=True):
        cells = [as_text(cell) for cell in row]
        cells[1].stylize(_STYLES[c.result])
        table.add_row(*cells)
    parts: list[Any] = [table]
    for c in result.checks:
        if c.result != "pass":
            parts.append(as_text(f"{c.result}: {c.message}", style=_STYLES[c.result]))
    if result.verdict is not None:
        parts.append(as_text(f"diff: {result.verdict.summary}"))
    for w in result.warnings:
        parts.append(as_text(f"warning: {w.message}", style="yellow"))
    parts.append(as_text(result.summary, style=_STYLES[result.result]))
    return rich_to_text(*parts)


def render_markdown(result: GateResult) -> str:
    n = len(result.checks)
    lines = [
        f"## {ICONS[result.result]} tracekit gate{metric_label(result.metric)}: {result.result}",
        "",
        f"**{printable(result.after.label)}** against **{printable(result.before.label)}**: "
        f"{requests_text(result.before.requests, result.before.estimated_requests)} vs "
        f"{requests_text(result.after.requests, result.after.estimated_requests)}, "
        f"{result.confidence * 100:g}% confidence"
        + (f", Holm-corrected across {n} budgets." if n > 1 else "."),
        "",
        markdown_table(HEADERS, _rows(result, icons=True)),
        "",
    ]
    details = [c for c in result.checks if c.result != "pass"]
    if details:
        lines.extend(
            f"- {ICONS[c.result]} **{printable(c.name)}**: {printable(c.message)}" for c in details
        )
        lines.append("")
    if result.verdict is not None:
        lines.extend([f"**Where the time went:** {printable(result.verdict.summary)}", ""])
    for w in result.warnings:
        lines.extend([f"> ⚠️ **{printable(w.code)}**: {printable(w.message)}", ""])
    lines.append(printable(result.summary))
    return "\n".join(lines) + "\n"


def render_junit(result: GateResult | TrainingGateResult) -> str:
    """JUnit XML: ``<testsuites>`` holding one ``<testsuite name="tracekit gate">``, one
    test case per budget (a training gate's budgets on samples/s, step time or
    efficiency too).

    Names and messages pass through :func:`printable`: XML 1.0 cannot carry most control
    characters at all, and CI pages show these strings as they are.
    """
    if isinstance(result, TrainingGateResult):
        props = [("before", result.before), ("after", result.after), ("result", result.result)]
        cases = [
            (f"tracekit.gate.training.{c.metric}", c.budget, c.result, c.message)
            for c in result.checks
        ]
        return _junit("tracekit gate (training)", props, cases, [])
    props = [
        ("before", result.before.label),
        ("after", result.after.label),
        ("confidence", f"{result.confidence:g}"),
        ("correction", result.correction),
        ("result", result.result),
    ]
    cases = [(f"tracekit.gate.{c.metric}", c.name, c.result, c.message) for c in result.checks]
    lines = [result.summary] + [f"warning: {w.message}" for w in result.warnings]
    return _junit(f"tracekit gate{metric_label(result.metric)}", props, cases, lines)


def _junit(
    name: str,
    props: Sequence[tuple[str, str]],
    cases: Sequence[tuple[str, str, str, str]],
    out_lines: Sequence[str],
) -> str:
    """The XML of one suite: ``cases`` are (classname, name, outcome, message)."""
    counts = {r: sum(outcome == r for _, _, outcome, _ in cases) for r in ICONS}
    attrs = {
        "tests": str(len(cases)),
        "failures": str(counts["fail"]),
        "errors": "0",
        "skipped": str(counts["inconclusive"]),
        "time": "0",
    }
    root = ET.Element("testsuites", {"name": "tracekit", **attrs})
    suite = ET.SubElement(root, "testsuite", {"name": name, **attrs})
    properties = ET.SubElement(suite, "properties")
    for key, value in props:
        ET.SubElement(properties, "property", {"name": key, "value": printable(str(value))})
    for classname, case_name, outcome, text in cases:
        case = ET.SubElement(
            suite, "testcase", {"classname": classname, "name": printable(case_name), "time": "0"}
        )
        message = printable(text)
        if outcome == "fail":
            failure = ET.SubElement(case, "failure", {"message": message, "type": "BudgetExceeded"})
            failure.text = message
        elif outcome == "inconclusive":
            ET.SubElement(case, "skipped", {"message": f"inconclusive: {message}"})
        else:
            ET.SubElement(case, "system-out").text = message
    if out_lines:
        ET.SubElement(suite, "system-out").text = "\n".join(printable(x) for x in out_lines)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


RENDERERS: dict[str, Callable[[GateResult], str]] = {
    "table": render_table,
    "json": render_json,
    "markdown": render_markdown,
}
