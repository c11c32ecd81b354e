"""Render a :class:`~tracekit.analysis.compare.diff.DiffResult`: table, json or markdown.

Every format leads with the verdict sentence, then the evidence: latency quantiles
with their intervals, the stage split, over-represented attribute values, exemplar
traces and flags. JSON is the result itself (the contract documented in docs/diff.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from tracekit.analysis.cohorts.bubbleup import AttributeLift
from tracekit.analysis.compare.diff import DiffResult, Exemplar
from tracekit.analysis.results import Flag
from tracekit.render.common import (
    _jsonable,
    as_text,
    hidden_wait_note,
    kind_cell,
    markdown_table,
    metric_label,
    ms,
    pct,
    requests_text,
    rich_to_text,
    signed_ms,
    to_json,
)
from tracekit.render.text import printable


def _num(value: float, signed: bool = False) -> str:
    text = signed_ms(value) if signed else ms(value)
    return text.removesuffix(" ms")


def _ci(lo: float, hi: float) -> str:
    if lo != lo or hi != hi:  # NaN
        return "–"
    return f"{lo:+.1f} .. {hi:+.1f}"


def latency_rows(result: DiffResult) -> list[list[str]]:
    return [
        [
            row.quantile,
            _num(row.before),
            _num(row.after),
            _num(row.delta, signed=True),
            _ci(row.ci_low, row.ci_high),
            pct(row.rel_delta, signed=True),
        ]
        for row in result.latency
    ]


LATENCY_HEADERS = ["quantile", "before ms", "after ms", "delta ms", "CI ms", "relative"]
STAGE_HEADERS = [
    "stage",
    "kind",
    "share",
    "removes",
    "tail before",
    "tail after",
    "tail Δ",
    "cpu+gpu tail",
]


def _measured(before: float, after: float) -> str:
    if before != before or after != after:
        return "–"
    return f"{before:.1f} → {after:.1f}"


def stage_rows(result: DiffResult) -> list[list[str]]:
    rows = []
    for s in result.stages:
        cpu_b = _sum(s.cpu_tail_before_ms, s.gpu_tail_before_ms)
        cpu_a = _sum(s.cpu_tail_after_ms, s.gpu_tail_after_ms)
        rows.append(
            [
                s.name,
                kind_cell(s.time_kind, s.hidden_wait),
                pct(s.share) if s.share == s.share else "–",
                _num(s.counterfactual_p99_removed_ms, signed=True),
                _num(s.tail_before_ms),
                _num(s.tail_after_ms),
                _num(s.tail_delta_ms, signed=True),
                _measured(cpu_b, cpu_a),
            ]
        )
    return rows


def _sum(a: float, b: float) -> float:
    if a != a and b != b:
        return float("nan")
    return (0.0 if a != a else a) + (0.0 if b != b else b)


OPERATION_HEADERS = [
    "operation",
    "share",
    "removes",
    "tail before",
    "tail after",
    "calls per request",
    "serial",
]


def _serial(value: bool | None) -> str:
    return "–" if value is None else ("serial" if value else "overlapping")


def operation_title(result: DiffResult) -> str | None:
    """``Operations in downstream (ms per tail request)`` when the diff split a stage."""
    o = result.operations
    if o is None or not o.shares:
        return None
    return f"Operations in {o.stage} (ms per tail request)"


def operation_rows(result: DiffResult) -> list[list[str]]:
    """The primary stage's operations: share of the tail growth (counterfactual), the
    growth each removes, path ms per tail request before and after, calls per request."""
    o = result.operations
    if o is None:
        return []
    return [
        [
            f"{s.service} {s.operation}",
            pct(s.share) if s.share == s.share else "–",
            _num(s.removed_ms, signed=True),
            _num(s.path_before_ms),
            _num(s.path_after_ms),
            f"{s.calls_before:.1f} → {s.calls_after:.1f}",
            _serial(s.serial),
        ]
        for s in o.shares
    ]


ATTRIBUTE_HEADERS = ["attribute = value", "slow", "rest", "lift", "slow traces"]


def attribute_rows(attributes: Sequence[AttributeLift]) -> list[list[str]]:
    return [
        [
            f"{a.attribute}={a.value}",
            pct(a.slow_share),
            pct(a.rest_share),
            f"{a.lift:.1f}×" if a.lift != float("inf") else "only slow",
            str(a.slow_count),
        ]
        for a in attributes
    ]


EXEMPLAR_HEADERS = ["trace", "duration ms", "primary stage ms", "profile", "link"]


def profile_marker(e: Exemplar) -> str:
    """``profile 3f2a0000deadbeef`` (``+N`` more) for a trace with a profile captured on
    trigger (``tracekit explain`` shows it); empty without."""
    if not e.profile_ids:
        return ""
    more = f" +{len(e.profile_ids) - 1}" if len(e.profile_ids) > 1 else ""
    return f"profile {e.profile_ids[0]}{more}"


def exemplar_rows(exemplars: Sequence[Exemplar]) -> list[list[str]]:
    """Trace, duration, primary-stage ms; the profile column only when a trace has a
    profile, the link column only when there are links (as :func:`exemplar_headers`)."""
    profiles = any(e.profile_ids for e in exemplars)
    with_links = any(e.url for e in exemplars)
    return [
        [e.trace_id, _num(e.duration_ms), _num(e.primary_stage_ms)]
        + ([profile_marker(e)] if profiles else [])
        + ([e.url or ""] if with_links else [])
        for e in exemplars
    ]


def exemplar_headers(exemplars: Sequence[Exemplar]) -> list[str]:
    return [
        h
        for h in EXEMPLAR_HEADERS
        if (h != "profile" or any(e.profile_ids for e in exemplars))
        and (h != "link" or any(e.url for e in exemplars))
    ]


def cohort_line(result: DiffResult) -> str:
    t = result.tail
    line = (
        f"Tail cohort ≥ {t.cohort}: {result.before.label} ≥ {t.threshold_before_ms:.1f} ms "
        f"({t.requests_before} of "
        f"{requests_text(result.before.requests, result.before.estimated_requests)}), "
        f"{result.after.label} ≥ {t.threshold_after_ms:.1f} ms ({t.requests_after} of "
        f"{requests_text(result.after.requests, result.after.estimated_requests)}). "
        "share = part of the tail growth that disappears when the stage is put back "
        "to its before distribution (counterfactual); tail columns are cohort means."
    )
    return line


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=as_text(title), title_justify="left", header_style="bold")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(as_text(cell) for cell in row))
    return table


def flag_lines(flags: Sequence[Flag]) -> list[str]:
    return [f"[{f.code}] {f.message}" for f in flags]


def flag_items(flags: Sequence[Flag]) -> list[str]:
    """Flags as markdown list items (``- **code**: message``)."""
    return [f"- **{printable(f.code)}**: {printable(f.message)}" for f in flags]


def tokens_beside(result: DiffResult) -> str | None:
    """``TTFT p95 51.5 → 506.8 ms, TPOT p95 15.3 → 9.7 ms`` where both releases have them,
    beside whichever metric the diff compares."""
    t = result.tokens
    if t is None:
        return None
    parts = []
    for name, key in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms")):
        b, a = getattr(t["before"], key), getattr(t["after"], key)
        if b is not None and a is not None and name.lower() != result.metric:
            parts.append(f"{name} p95 {b['p95']:.1f} → {a['p95']:.1f} ms")
    return ("beside: " + ", ".join(parts)) if parts else None


def render_table(result: DiffResult) -> str:
    beside = tokens_beside(result)
    parts: list[Any] = [
        as_text(result.verdict.summary, style="bold"),
        *([as_text(beside)] if beside else []),
        "",
        _table(
            f"Latency{metric_label(result.metric)} {result.before.label} → {result.after.label}"
            f" ({result.confidence:.0%} bootstrap CI)",
            LATENCY_HEADERS,
            latency_rows(result),
        ),
        _table("Stages (ms)", STAGE_HEADERS, stage_rows(result)),
        *[as_text(line, style="dim") for line in hidden_wait_note(result.stages)],
        as_text(cohort_line(result), style="dim"),
    ]
    if title := operation_title(result):
        parts += ["", _table(title, OPERATION_HEADERS, operation_rows(result))]
    if result.attributes:
        parts += [
            "",
            _table(
                "Over-represented in slow traces",
                ATTRIBUTE_HEADERS,
                attribute_rows(result.attributes),
            ),
        ]
    if result.exemplars:
        parts += [
            "",
            _table(
                "Exemplar slow traces",
                exemplar_headers(result.exemplars),
                exemplar_rows(result.exemplars),
            ),
        ]
    if result.flags:
        parts += ["", as_text("Flags", style="bold")] + [
            as_text(line) for line in flag_lines(result.flags)
        ]
    return rich_to_text(*parts)


def render_markdown(result: DiffResult) -> str:
    out = [
        f"### tracekit diff{metric_label(result.metric)}: {printable(result.before.label)}"
        f" → {printable(result.after.label)}",
        "",
        f"**{printable(result.verdict.summary)}**",
        "",
        *([printable(beside), ""] if (beside := tokens_beside(result)) else []),
        markdown_table(LATENCY_HEADERS, latency_rows(result)),
        "",
        markdown_table(STAGE_HEADERS, stage_rows(result)),
        "",
        *[f"_{line}_\n" for line in hidden_wait_note(result.stages)],
        f"_{printable(cohort_line(result))}_",
    ]
    if title := operation_title(result):
        out += [
            "",
            f"{printable(title)}:",
            "",
            markdown_table(OPERATION_HEADERS, operation_rows(result)),
        ]
    if result.attributes:
        out += [
            "",
            "Over-represented in slow traces:",
            "",
            markdown_table(ATTRIBUTE_HEADERS, attribute_rows(result.attributes)),
        ]
    if result.exemplars:
        headers = [h for h in exemplar_headers(result.exemplars) if h != "link"]
        rows = [
            [f"[{e.trace_id}]({e.url})" if e.url else f"`{e.trace_id}`", *r[1 : len(headers)]]
            for e, r in zip(result.exemplars, exemplar_rows(result.exemplars), strict=True)
        ]
        out += ["", "Exemplar slow traces:", "", markdown_table(headers, rows)]
    if result.flags:
        out += [""] + flag_items(result.flags)
    return "\n".join(out) + "\n"


def render_json(result: DiffResult) -> str:
    doc = _jsonable(result)
    return to_json({"metric": doc.pop("metric"), **doc})  # the latency compared, first


RENDERERS: dict[str, Callable[[Any], str]] = {
    "table": render_table,
    "json": render_json,
    "markdown": render_markdown,
}
