"""Render ``tracekit summary`` (a list of :class:`Summary`) and ``tracekit slow``
(:class:`SlowFast`) as table, json or markdown; each leads with its sentence."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from tracekit.analysis.compare.operations import SERIAL_SHARE
from tracekit.analysis.compare.summary import SlowFast, Summary
from tracekit.analysis.results import release_name
from tracekit.analysis.store.operations import OperationStat
from tracekit.render.common import (
    as_text,
    hidden_wait_note,
    kind_cell,
    markdown_table,
    ms,
    pct,
    requests_text,
    rich_to_text,
    signed_ms,
    to_json,
)
from tracekit.render.diff import (
    ATTRIBUTE_HEADERS,
    attribute_rows,
    exemplar_headers,
    exemplar_rows,
    flag_items,
    flag_lines,
)
from tracekit.render.text import printable

SUMMARY_HEADERS = ["stage", "kind", "mean ms", "tail mean ms", "share of tail"]
OPERATION_HEADERS = ["stage", "operation", "ms per request", "share", "calls", "serial", "errors"]
SLOW_OPERATION_HEADERS = [
    "stage",
    "operation",
    "fast ms",
    "slow ms",
    "delta ms",
    "calls fast → slow",
]


def _serial(value: float | None) -> str:
    if value is None:
        return "–"
    return "serial" if value >= SERIAL_SHARE else "overlapping"


def operation_rows(stats: Sequence[OperationStat]) -> list[list[str]]:
    """Top operations of a cohort: path ms and calls per request of the cohort."""
    return [
        [
            o.stage,
            f"{o.service} {o.operation}",
            _num(o.path_ms_per_request),
            pct(o.share),
            f"{o.calls_per_request:.1f}",
            _serial(o.serial_share),
            f"{o.errors_per_request:.1f}",
        ]
        for o in stats
    ]


def slow_operation_rows(r: SlowFast) -> list[list[str]]:
    """The slow cohort's top operations against the same operations in the fast cohort."""
    if r.operations is None:
        return []
    fast = {(o.stage, o.service, o.operation): o for o in r.operations.fast}
    rows = []
    for o in r.operations.slow:
        f = fast.get((o.stage, o.service, o.operation))
        f_ms = f.path_ms_per_request if f else 0.0
        f_calls = f.calls_per_request if f else 0.0
        rows.append(
            [
                o.stage,
                f"{o.service} {o.operation}",
                _num(f_ms),
                _num(o.path_ms_per_request),
                signed_ms(o.path_ms_per_request - f_ms).removesuffix(" ms"),
                f"{f_calls:.1f} → {o.calls_per_request:.1f}",
            ]
        )
    return rows


def _operations_title(cohort: str, what: str) -> str:
    return f"Operations on the critical path of {what} (≥ {cohort}; per request)"


SLOW_HEADERS = ["stage", "kind", "fast mean ms", "slow mean ms", "delta ms", "share of gap"]


def _num(value: float) -> str:
    return ms(value).removesuffix(" ms")


def latency_line(s: Summary) -> str:
    qs = ", ".join(f"{k} {_num(v)}" for k, v in s.latency.items())
    count = requests_text(s.requests, s.estimated_requests)
    what = "" if s.metric == "e2e" else f" {s.metric.upper()}"
    return f"{release_name(s.label)}: {count} ({s.errors} errors);{what} {qs} ms"


def tokens_line(s: Summary) -> str | None:
    """``tokens: TTFT p50 … ms, TPOT p50 … ms; prompt p50 … tokens, output p50 …``."""
    t = s.tokens
    if t is None:
        return None
    parts = []
    for name, qs in (("TTFT", t.ttft_ms), ("TPOT", t.tpot_ms)):
        if qs is not None:
            parts.append(f"{name} " + ", ".join(f"{k} {_num(v)}" for k, v in qs.items()) + " ms")
    counts = [
        f"{label} {value:,.0f}"
        for label, value in (
            ("prompt p50", t.prompt_tokens_p50),
            ("prompt p95", t.prompt_tokens_p95),
            ("output p50", t.output_tokens_p50),
        )
        if value is not None
    ]
    if counts:
        parts.append(", ".join(counts) + " tokens")
    return "tokens: " + "; ".join(parts) if parts else None


def summary_rows(s: Summary) -> list[list[str]]:
    return [
        [st.name, st.time_kind, _num(st.mean_ms), _num(st.tail_mean_ms), pct(st.tail_share)]
        for st in s.stages
    ]


def slow_rows(r: SlowFast) -> list[list[str]]:
    return [
        [
            g.name,
            kind_cell(g.time_kind, g.hidden_wait),
            _num(g.fast_mean_ms),
            _num(g.slow_mean_ms),
            signed_ms(g.delta_ms).removesuffix(" ms"),
            pct(g.share),
        ]
        for g in r.stages
    ]


def _table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=as_text(title), title_justify="left", header_style="bold")
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*(as_text(cell) for cell in row))
    return table


def render_summaries_table(summaries: Sequence[Summary]) -> str:
    parts: list[Any] = []
    for s in summaries:
        parts += [
            as_text(s.summary, style="bold"),
            as_text(latency_line(s)),
            *([as_text(line)] if (line := tokens_line(s)) else []),
            _table(
                f"Stages of {release_name(s.label)} (tail = ≥ {s.cohort}, {s.tail_requests} requests)",
                SUMMARY_HEADERS,
                summary_rows(s),
            ),
        ]
        if s.operations:
            title = _operations_title(s.cohort, f"{release_name(s.label)}'s tail")
            parts.append(_table(title, OPERATION_HEADERS, operation_rows(s.operations)))
        parts += [as_text(line, style="yellow") for line in flag_lines(s.flags)]
        parts.append("")
    return rich_to_text(*parts)


def render_summaries_markdown(summaries: Sequence[Summary]) -> str:
    out = []
    for s in summaries:
        out += [
            f"### tracekit summary: {printable(release_name(s.label))}",
            "",
            f"**{printable(s.summary)}**",
            "",
            printable(latency_line(s)),
            "",
            *([printable(line), ""] if (line := tokens_line(s)) else []),
            markdown_table(SUMMARY_HEADERS, summary_rows(s)),
            "",
        ]
        if s.operations:
            title = _operations_title(s.cohort, f"{release_name(s.label)}'s tail")
            out += [
                f"{printable(title)}:",
                "",
                markdown_table(OPERATION_HEADERS, operation_rows(s.operations)),
                "",
            ]
        out += flag_items(s.flags)
    return "\n".join(out).rstrip() + "\n"


def render_summaries_json(summaries: Sequence[Summary]) -> str:
    return to_json({"releases": list(summaries)})


def _count(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


def _cohort_line(r: SlowFast) -> str:
    return (
        f"slow = ≥ {r.cohort} ({r.slow_threshold_ms:.1f} ms, {_count(r.slow_requests)}); "
        f"fast = ≤ p50 ({r.fast_threshold_ms:.1f} ms, {_count(r.fast_requests)}); "
        f"of {requests_text(r.requests, r.estimated_requests)} in {release_name(r.label)}"
    )


def render_slow_table(r: SlowFast) -> str:
    parts: list[Any] = [
        as_text(r.summary, style="bold"),
        "",
        _table("Stages, slow vs fast (critical-path ms, cohort means)", SLOW_HEADERS, slow_rows(r)),
        *[as_text(line, style="dim") for line in hidden_wait_note(r.stages)],
        as_text(_cohort_line(r), style="dim"),
    ]
    if rows := slow_operation_rows(r):
        title = _operations_title(r.cohort, "slow requests") + ", fast = ≤ p50"
        parts += ["", _table(title, SLOW_OPERATION_HEADERS, rows)]
    if r.attributes:
        parts += [
            "",
            _table(
                "Over-represented in slow traces", ATTRIBUTE_HEADERS, attribute_rows(r.attributes)
            ),
        ]
    if r.exemplars:
        parts += [
            "",
            _table(
                "Exemplar slow traces", exemplar_headers(r.exemplars), exemplar_rows(r.exemplars)
            ),
        ]
    if r.flags:
        parts += ["", as_text("Flags", style="bold")]
        parts += [as_text(line) for line in flag_lines(r.flags)]
    return rich_to_text(*parts)


def render_slow_markdown(r: SlowFast) -> str:
    out = [
        f"### tracekit slow: {printable(release_name(r.label))}",
        "",
        f"**{printable(r.summary)}**",
        "",
        markdown_table(SLOW_HEADERS, slow_rows(r)),
        "",
        *[f"_{line}_\n" for line in hidden_wait_note(r.stages)],
        f"_{printable(_cohort_line(r))}_",
    ]
    if rows := slow_operation_rows(r):
        title = _operations_title(r.cohort, "slow requests") + ", fast = ≤ p50"
        out += ["", f"{printable(title)}:", "", markdown_table(SLOW_OPERATION_HEADERS, rows)]
    if r.attributes:
        out += ["", markdown_table(ATTRIBUTE_HEADERS, attribute_rows(r.attributes))]
    if r.exemplars:
        out += ["", markdown_table(exemplar_headers(r.exemplars), exemplar_rows(r.exemplars))]
    if r.flags:
        out += ["", *flag_items(r.flags)]
    return "\n".join(out) + "\n"


SUMMARY_RENDERERS: dict[str, Callable[[Any], str]] = {
    "table": render_summaries_table,
    "json": render_summaries_json,
    "markdown": render_summaries_markdown,
}

SLOW_RENDERERS: dict[str, Callable[[Any], str]] = {
    "table": render_slow_table,
    "json": to_json,
    "markdown": render_slow_markdown,
}
