"""Renderers of :class:`tracekit.analysis.attribution.explain.Explanation`: a terminal waterfall,
JSON and markdown. Renderers never query; they only format what the analysis returned.

In the waterfall, ``█`` marks a span's own pieces of the critical path and ``░`` the
rest of its interval; ``★`` flags spans with time on the path. A stage derived from an
engine's latency attributes reads ``queue (from attributes)``, in both tables. Each
profile captured on trigger that the request triggered or ran under follows, as its
heading (:func:`profile_heading`), its top ops and kernels by self time and its GPU line.
The headline names the operations inside its stages (:func:`operation_phrase`); the
operations table follows the stage split, then the patterns with their evidence.
Operation names come from the trace: escaped like stage names everywhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from tracekit import conventions as cv
from tracekit.analysis.attribution.explain import (
    ExplainProfile,
    ExplainSpan,
    ExplainStage,
    Explanation,
    Operation,
    ProfileOp,
)
from tracekit.analysis.attribution.operations import operation_name
from tracekit.analysis.attribution.patterns import Pattern
from tracekit.render.common import (
    as_text,
    markdown_cell,
    markdown_table,
    ms,
    pct,
    rich_to_text,
    to_json,
)
from tracekit.render.text import printable

BAR_WIDTH = 40
PATH_GLYPH = "█"
OFF_PATH_GLYPH = "░"
STAR = "★"
_NAME_WIDTH = 34
DERIVED_MARK = {cv.DERIVED_FROM_ATTRIBUTES: "from attributes"}
"""What a derived stage's label adds, by where it was derived from."""
HEADLINE_OPERATIONS = 3
"""Operations the headline names per stage (the rest: "…")."""
TABLE_OPERATIONS = 20
"""Rows of the operations table (the rest counted below it)."""


def operation_phrase(o: Operation) -> str:
    """``redis-manual GetDriver ×13 serial 204.1 ms``: calls shown when more than one."""
    calls = ""
    if o.calls > 1:
        calls = f" ×{o.calls} {'serial' if o.serial else 'overlapping'}"
    return f"{o.service} {o.operation}{calls} {ms(o.path_ms)}"


def _stage_operations(e: Explanation, st: ExplainStage) -> list[Operation]:
    """The stage's operations on the path that say more than the stage's own name (the
    request span's own time is its gaps between stages: not an operation it called)."""
    request = (e.service or "(unknown)", operation_name(e.name))
    return [
        o
        for o in e.operations
        if o.stage == st.stage
        and o.path_ms > 0
        and o.operation != st.stage
        and (o.service, o.operation) != request
    ]


def headline(e: Explanation) -> str:
    """The sentence a person reads first: where this request's time went, naming the
    operations inside each stage it names."""
    top = sorted(e.stages, key=lambda s: s.critical_ms, reverse=True)[:2]
    parts = []
    for s in top:
        if s.critical_ms <= 0:
            continue
        part = f"{s.stage} {ms(s.critical_ms)} ({pct(s.share)}, {s.time_kind})"
        ops = _stage_operations(e, s)
        if ops:
            named = ", ".join(operation_phrase(o) for o in ops[:HEADLINE_OPERATIONS])
            part += f": {named}{', …' if len(ops) > HEADLINE_OPERATIONS else ''}"
        parts.append(part)
    if not parts:
        return f"This request took {ms(e.duration_ms)}."
    joint = "; and " if ":" in parts[0] and len(parts) > 1 else " and "
    return f"Most of this request's {ms(e.duration_ms)} went to " + joint.join(parts) + "."


_OPERATION_HEADERS = [
    "stage",
    "service",
    "operation",
    "on path",
    "calls",
    "calls on path",
    "serial",
    "errors",
]


def _operation_rows(e: Explanation) -> list[list[str]]:
    return [
        [
            o.stage,
            o.service,
            o.operation,
            ms(o.path_ms),
            str(o.calls),
            str(o.calls_on_path),
            "yes" if o.serial else "no",
            str(o.errors) if o.errors else "",
        ]
        for o in e.operations[:TABLE_OPERATIONS]
    ]


def _more_operations(e: Explanation) -> str | None:
    more = len(e.operations) - TABLE_OPERATIONS
    return f"… {more} more operation(s), in --format json" if more > 0 else None


def pattern_line(p: Pattern) -> str:
    """``n_plus_one  redis-manual GetDriver ×13: <evidence>``."""
    return f"{p.kind}  {p.service} {p.operation} ×{p.count}: {p.evidence}"


def _title(e: Explanation) -> str:
    who = " ".join(x for x in (e.service, e.release) if x)
    bits = [f"trace {e.trace_id}", e.name, who, ms(e.duration_ms), f"{e.span_count} spans"]
    return "  ·  ".join(b for b in bits if b)


def _notes(e: Explanation) -> list[str]:
    notes = []
    if e.fallback:
        notes.append(
            "No tracekit.stage on this trace: stages come from span kinds and names "
            "(calls out and other services are downstream)."
        )
    derived = [s.stage for s in e.stages if s.derived]
    if derived:
        notes.append(
            f"{', '.join(derived)} derived at ingest from the engine's latency attributes "
            "(gen_ai.latency.*), not measured as spans."
        )
    if e.skewed_spans:
        notes.append(
            f"{e.skewed_spans} span(s) overflowed their parent and were clipped to it (clock "
            "skew between hosts, or a server span outliving its client call)."
        )
    if e.hidden_spans:
        notes.append(
            f"{e.hidden_spans} span(s) lie outside the request or are not connected to it."
        )
    return notes


def bar(span: ExplainSpan, total_ms: float, width: int = BAR_WIDTH) -> list[tuple[str, bool]]:
    """The span's cells in a ``width``-cell waterfall: (glyph, on the critical path)."""
    scale = width / total_ms if total_ms > 0 else 0.0
    first = min(int(span.start_ms * scale), width - 1)
    last = max(first, min(width - 1, int(span.end_ms * scale - 1e-9)))
    cells: list[tuple[str, bool]] = [(" ", False)] * width
    for k in range(first, last + 1):
        lo, hi = k / scale if scale else 0.0, (k + 1) / scale if scale else 0.0
        on = any(s < hi and e > lo for s, e in span.path)
        cells[k] = (PATH_GLYPH if on else OFF_PATH_GLYPH, on)
    return cells


def _bar_text(span: ExplainSpan, total_ms: float) -> Text:
    text = Text()
    for glyph, on in bar(span, total_ms):
        text.append(glyph, style="bold red" if on else "dim")
    return text


def _plain_bar(span: ExplainSpan, total_ms: float) -> str:
    return "".join(glyph for glyph, _ in bar(span, total_ms)).rstrip()


def _derived(label: str, derived: str | None) -> str:
    return f"{label} ({DERIVED_MARK.get(derived, f'from {derived}')})" if derived else label


def _stage_label(span: ExplainSpan) -> str:
    """``downstream (model_execute)`` for a called service's own stage span: the time
    counts as downstream, the bracket says what the dependency called it;
    ``queue (from attributes)`` for a stage span derived at ingest."""
    stage = span.stage or cv.UNATTRIBUTED
    label = f"{stage} ({span.own_stage})" if span.own_stage else stage
    return _derived(label, span.derived)


def _label(span: ExplainSpan) -> str:
    # escaped before it is cut, so the cut never splits a character from its escape
    label = "  " * span.depth + printable(span.name)
    return label if len(label) <= _NAME_WIDTH else label[: _NAME_WIDTH - 1] + "…"


def profile_heading(p: ExplainProfile) -> str:
    """``profile 3f2a… (rule, captured 3 executions, triggered by TRACE model_execute 212.5 ms)``."""
    if not p.ingested:
        return f"profile {p.profile_id} (named by this trace's spans; its file is not ingested)"
    runs = "execution" if p.captured == 1 else "executions"
    bits = [p.reason or "", f"captured {p.captured} {runs}"]
    if p.trigger_trace_id:
        cause = " ".join(x for x in (p.trigger_trace_id, p.stage) if x)
        took = f" {ms(p.trigger_ms)}" if p.trigger_ms is not None else ""
        bits.append(f"triggered by {cause}{took}")
    return f"profile {p.profile_id} ({', '.join(b for b in bits if b)})"


def profile_role(p: ExplainProfile) -> str:
    """What this request has to do with the profile, in a sentence."""
    if not p.ingested:
        return (
            f"Ingest its file ({cv.PROFILE_FILE_PREFIX}…-{p.profile_id}.pt.trace.json) to see "
            "its top ops."
        )
    if p.role == "triggered":
        return f"This request's {p.stage or 'stage'} took {ms(p.trigger_ms)} and fired the capture."
    took = f" ({ms(p.captured_ms)})" if p.captured_ms is not None else ""
    if p.role == "captured":
        return f"This request's {p.stage or 'stage'}{took} ran under the profiler."
    if p.role == "overlapping":
        return (
            f"This request's {p.stage or 'stage'}{took} ran only partly under the profiler "
            "(already running when it started, or begun after the captured executions)."
        )
    return "This request's spans name the profile."


def profile_totals(p: ExplainProfile) -> str | None:
    """What the capture holds in all: its wall time, CPU and device time, its file."""
    if not p.ingested:
        return None
    device = f", device ops {ms(p.kernel_ms, 3)}" if p.top_kernels else ""
    return f"{ms(p.wall_ms, 3)} profiled: CPU ops {ms(p.cpu_ms, 3)} self time{device} ({p.source})"


def profile_gpu_line(p: ExplainProfile) -> str | None:
    """HTA's GPU figures of the capture, in a line; None without a GPU."""
    g = p.gpu
    if g is None:
        return None
    overlap = "" if g.comm_overlap_pct is None else f", comm overlap {g.comm_overlap_pct:.1f}%"
    return (
        f"GPU: {g.kernels} device ops over {ms(g.window_ms, 2)}: idle {g.idle_pct:.1f}%, "
        f"compute {g.compute_pct:.1f}%, non-compute {g.non_compute_pct:.1f}%{overlap}; "
        f"idle waiting on host launches {ms(g.host_wait_ms, 2)}"
    )


_OP_HEADERS = ["calls", "self", "share"]


def _op_rows(ops: list[ProfileOp]) -> list[list[str]]:
    return [[o.name, str(o.calls), ms(o.self_ms, 3), pct(o.share)] for o in ops]


def _op_tables(p: ExplainProfile) -> list[tuple[str, list[list[str]]]]:
    """(first column's title, rows): CPU ops, then kernels where there were any."""
    out = [("CPU op (by self time)", _op_rows(p.top_ops))] if p.top_ops else []
    if p.top_kernels:
        out.append(("GPU kernel (by time)", _op_rows(p.top_kernels)))
    return out


def _profile_parts(e: Explanation) -> list[Any]:
    parts: list[Any] = []
    for p in e.profiles:
        parts += ["", as_text(profile_heading(p), style="bold"), as_text(profile_role(p))]
        if (totals := profile_totals(p)) is not None:
            parts.append(as_text(totals, style="dim"))
        for title, rows in _op_tables(p):
            table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
            table.add_column(title, no_wrap=True)
            for header in _OP_HEADERS:
                table.add_column(header, justify="right", no_wrap=True)
            for row in rows:
                table.add_row(*(as_text(cell) for cell in row))
            parts.append(table)
        if (line := profile_gpu_line(p)) is not None:
            parts.append(as_text(line))
    return parts


def render_table(e: Explanation) -> str:
    """The waterfall and the stage split, for a terminal."""
    spans = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    spans.add_column(STAR, width=1)
    spans.add_column("span", no_wrap=True, max_width=_NAME_WIDTH)
    spans.add_column("service", no_wrap=True)
    spans.add_column("stage", no_wrap=True)
    spans.add_column("kind", no_wrap=True)
    spans.add_column("start", justify="right", no_wrap=True)
    spans.add_column("dur", justify="right", no_wrap=True)
    spans.add_column("on path", justify="right", no_wrap=True)
    spans.add_column(f"0 … {ms(e.duration_ms)}", no_wrap=True, width=BAR_WIDTH)
    for s in e.spans:
        spans.add_row(
            Text(STAR, style="bold red") if s.on_critical_path else "",
            as_text(_label(s)),
            as_text(s.service or ""),
            as_text(_stage_label(s)),
            as_text(s.time_kind or ""),
            f"{s.start_ms:.1f}",
            f"{s.duration_ms:.1f}",
            f"{s.critical_ms:.1f}" if s.on_critical_path else "",
            _bar_text(s, e.duration_ms),
        )

    stages = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, show_footer=True)
    stages.add_column("stage", footer="total")
    stages.add_column("kind")
    stages.add_column("on path", justify="right", footer=ms(e.duration_ms))
    stages.add_column("share", justify="right", footer=pct(1.0))
    stages.add_column("wall", justify="right")
    stages.add_column("cpu", justify="right")
    stages.add_column("gpu", justify="right")
    for st in e.stages:
        stages.add_row(
            as_text(_derived(st.stage, st.derived)),
            as_text(st.time_kind),
            ms(st.critical_ms),
            pct(st.share),
            ms(st.wall_ms),
            ms(st.cpu_ms),
            ms(st.gpu_ms),
        )
    legend = f"{STAR} on the critical path   {PATH_GLYPH} the span's own path time   {OFF_PATH_GLYPH} off the path"
    parts: list[Any] = [as_text(_title(e), style="bold"), as_text(headline(e)), *_notes(e), ""]
    parts += [spans, Text(legend, style="dim"), "", Text("Per stage", style="bold"), stages]
    if e.operations:
        ops = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for k, header in enumerate(_OPERATION_HEADERS):
            ops.add_column(header, justify="right" if k > 2 else "left", no_wrap=k < 3)
        for row in _operation_rows(e):
            ops.add_row(*(as_text(cell) for cell in row))
        parts += ["", Text("Per operation", style="bold"), ops]
        if (more := _more_operations(e)) is not None:
            parts.append(as_text(more, style="dim"))
    if e.patterns:
        parts += ["", Text("Patterns", style="bold")]
        parts += [as_text(pattern_line(p)) for p in e.patterns]
    parts += _profile_parts(e)
    return rich_to_text(*parts, width=150)


def _as_dict(e: Explanation) -> dict[str, Any]:
    out = dataclasses.asdict(e)
    for span, d in zip(e.spans, out["spans"], strict=True):
        d["duration_ms"] = span.duration_ms
        d["on_critical_path"] = span.on_critical_path
        d["path"] = [{"start_ms": s, "end_ms": t} for s, t in span.path]
    out["summary"] = headline(e)
    for key in ("operations", "patterns", "profiles"):
        out[key] = out.pop(key)  # after the summary: the request first
    return out


def render_json(e: Explanation) -> str:
    """Stable JSON: the Explanation's fields, plus per span ``duration_ms`` and
    ``on_critical_path``, plus ``summary`` (the headline sentence), then ``operations``,
    ``patterns`` and ``profiles``. Times in ms."""
    return to_json(_as_dict(e))


def render_markdown(e: Explanation) -> str:
    """A markdown report: headline, stage split, then the waterfall in a table."""
    lines = [f"### {printable(_title(e))}", "", printable(headline(e)), ""]
    lines += [f"> {n}" for n in _notes(e)]
    stage_rows = [
        [
            _derived(s.stage, s.derived),
            s.time_kind,
            ms(s.critical_ms),
            pct(s.share),
            ms(s.wall_ms),
            ms(s.cpu_ms),
            ms(s.gpu_ms),
        ]
        for s in e.stages
    ]
    stage_rows.append(["**total**", "", ms(e.duration_ms), pct(1.0), "", "", ""])
    lines += [
        markdown_table(["stage", "kind", "on path", "share", "wall", "cpu", "gpu"], stage_rows),
        "",
    ]
    span_rows = [
        [
            STAR if s.on_critical_path else "",
            "&nbsp;" * (2 * s.depth) + s.name,
            s.service or "",
            _stage_label(s),
            f"{s.start_ms:.1f}",
            f"{s.duration_ms:.1f}",
            f"{s.critical_ms:.1f}" if s.on_critical_path else "",
            f"`{_plain_bar(s, e.duration_ms)}`",
        ]
        for s in e.spans
    ]
    lines.append(
        markdown_table(
            ["★", "span", "service", "stage", "start ms", "dur ms", "on path ms", "waterfall"],
            span_rows,
        )
    )
    if e.operations:
        lines += ["", markdown_table(_OPERATION_HEADERS, _operation_rows(e))]
        if (more := _more_operations(e)) is not None:
            lines += ["", more]
    if e.patterns:
        lines += ["", "**Patterns**", ""]
        lines += [
            f"- `{p.kind}` {markdown_cell(pattern_line(p)[len(p.kind) + 2 :])}" for p in e.patterns
        ]
    for p in e.profiles:
        lines += ["", f"#### {printable(profile_heading(p))}", "", printable(profile_role(p))]
        if (totals := profile_totals(p)) is not None:
            lines += ["", f"_{printable(totals)}_"]
        for title, rows in _op_tables(p):
            lines += ["", markdown_table([title, *_OP_HEADERS], rows)]
        if (gpu := profile_gpu_line(p)) is not None:
            lines += ["", gpu]
    return "\n".join(lines) + "\n"


RENDERERS: dict[str, Callable[[Any], str]] = {
    "table": render_table,
    "json": render_json,
    "markdown": render_markdown,
}
"""Renderer per ``--format`` value."""
