"""Renderers of ``tracekit capacity``: table (people), JSON (scripts), markdown (PRs).

Over a :class:`~tracekit.analysis.capacity.model.CapacityResult`; nothing here queries.
The JSON keys are docs/capacity.md's; the per-window points (for the HTML chart) are
left out of it. A figure the traces could not give is ``null`` / ``–``, never 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tracekit.analysis.capacity.model import (
    Batching,
    BatchOption,
    CapacityResult,
    Overrun,
    Regime,
    ReleaseCapacity,
)
from tracekit.render.common import _jsonable, markdown_table, ms, pct
from tracekit.render.text import printable


def _release_json(r: ReleaseCapacity) -> dict[str, Any]:
    out: dict[str, Any] = _jsonable(r)
    out.pop("windows", None)
    return out


def capacity_json(result: CapacityResult) -> str:
    doc = {
        "slo": result.slo,
        "window_s": result.window_s,
        "releases": [_release_json(r) for r in result.releases],
        "summary": result.summary,
        "flags": _jsonable([*result.flags, *(f for r in result.releases for f in r.flags)]),
    }
    return json.dumps(doc, indent=2)


def _num(v: float | None, fmt: str = "{:,.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def _table(headers: list[str], rows: list[list[Any]], md: bool) -> list[str]:
    if md:
        return markdown_table(headers, rows).splitlines()
    cells = [[printable(str(v)) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), *(fmt.format(*r).rstrip() for r in cells)]


def _regime_row(name: str, g: Regime) -> list[Any]:
    return [
        name,
        g.windows,
        f"{g.requests:,.0f}",
        ms(g.p50_ms),
        ms(g.p95_ms),
        ms(g.p99_ms),
        # Missed of judged: the counts the verdict's sentence gives, never a share of
        # another denominator (windows with too few requests are not judged).
        f"{g.missed_windows} of {g.judged_windows}",
        pct(g.error_rate, 1),
    ]


def _option_row(o: BatchOption, mark: str) -> list[Any]:
    return [
        mark,
        ms(o.max_wait_ms),
        o.max_batch,
        ms(o.p95_queue_ms),
        ms(o.gpu_ms_per_request, 2),
    ]


def _batching_lines(b: Batching, md: bool) -> list[str]:
    c = b.curve
    lines = [
        "",
        f"batching: execution ≈ {c.intercept_ms:.2f} ms + {c.per_request_ms:.2f} ms × batch size "
        f"(fitted over {c.batches:,} batches; {b.workers} worker(s)); traced: batch p50 "
        f"{_num(b.batch_size_p50, '{:.0f}')}, fill wait p95 {ms(b.fill_wait_ms_p95)}, worker "
        f"wait p95 {ms(b.worker_wait_ms_p95)}; queue budget {ms(b.queue_budget_ms)}",
    ]
    rows = []
    if b.observed is not None:
        rows.append(_option_row(b.observed, "as traced"))
    for o in b.options:
        rows.append(_option_row(o, "pick" if o == b.pick else ""))
    lines += _table(["", "max wait", "max batch", "p95 queue", "GPU per request"], rows, md)
    if b.pick is None:
        lines.append("no option keeps the batch queue's p95 within the budget")
    else:
        if b.triton:
            lines += ["", "Triton:" if not md else "Triton:", *_code(b.triton, md)]
        if b.tracekit_batcher:
            lines += ["tracekit:", *_code(b.tracekit_batcher, md)]
    return lines


def _code(text: str, md: bool) -> list[str]:
    body = text.splitlines()
    return ["```", *body, "```"] if md else ["  " + line for line in body]


def _overrun_line(o: Overrun) -> str:
    return (
        f"over the objective: {o.requests:,.0f} accepted requests ({pct(o.share)}), "
        f"{o.excess_s:,.1f} s past it in all"
    )


def _release_lines(r: ReleaseCapacity, md: bool) -> list[str]:
    head = f"{r.label}: {r.verdict} — {r.reason}"
    lines = [("### " if md else "") + head, ""]
    lines += _table(
        ["windows", "count", "requests", "p50", "p95", "p99", "missed/judged", "errors"],
        [_regime_row("normal", r.normal), _regime_row("peak", r.peak)],
        md,
    )
    s, c, h = r.spikes, r.cost, r.headroom
    lines += [
        "",
        f"peak windows: {r.peak_rule}",
        f"spikes: {s.count}, lasting {_num(s.duration_s_p50, '{:.1f}')} s (p50) / "
        f"{_num(s.duration_s_p90, '{:.1f}')} s (p90), {_num(s.rate_ratio, '{:.1f}')}× the median "
        f"rate; p95 inside {ms(s.p95_inside_ms)}, outside {ms(s.p95_outside_ms)}",
        f"cost: {_num(c.replica_seconds_per_1k)} replica-seconds per 1,000 accepted requests"
        + (f", {_num(c.cost_per_1k, '{:,.3f}')} per 1,000" if c.cost_per_1k is not None else "")
        + (f" at {c.replica_cost_per_h:,.2f}/h" if c.replica_cost_per_h is not None else "")
        + f"; GPU busy {pct(c.gpu_busy_fraction)}"
        + f", execution busy (wall) {pct(c.execution_busy_fraction)}",
        (
            f"headroom: the objective breaks above {h.knee_rps_per_replica:,.1f} req/s per "
            f"replica; peak seen {h.peak_rps_per_replica:,.1f} req/s per replica"
            if h.knee_rps_per_replica is not None
            else "headroom: no knee seen (the objective never broke, or never held) up to "
            f"{h.peak_rps_per_replica:,.1f} req/s per replica, the peak seen"
        ),
        _overrun_line(r.overrun),
    ]
    if r.batching is not None:
        lines += _batching_lines(r.batching, md)
    return lines


def capacity_text(result: CapacityResult, md: bool = False) -> str:
    lines: list[str] = [
        ("## " if md else "") + f"capacity against {result.slo} ({result.window_s:g} s windows)",
        "",
    ]
    for r in result.releases:
        lines += _release_lines(r, md)
        lines.append("")
    lines.append(("**" if md else "") + result.summary + ("**" if md else ""))
    for f in [*result.flags, *(f for r in result.releases for f in r.flags)]:
        lines.append(f"note [{f.code}]: {f.message}")
    return "\n".join(printable(line) for line in lines).rstrip() + "\n"


RENDERERS: dict[str, Callable[[CapacityResult], str]] = {
    "table": capacity_text,
    "json": capacity_json,
    "markdown": lambda r: capacity_text(r, md=True),
}
