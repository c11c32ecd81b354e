"""Renderers of the training analysis: ``steps``, the training ``diff`` and ``gate``.

Each takes a dataclass of :mod:`tracekit.analysis.training.model` (or the gate's
result) and returns text; nothing here queries. The JSON keys are the issue's
(documented in docs/training.md); per-step series used by the diff are left out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tracekit.analysis.training.gate import TrainingGateResult
from tracekit.analysis.training.model import (
    RankRow,
    RunSteps,
    StepsResult,
    TrainingDiff,
    gb_s,
    rank_count,
)
from tracekit.render.common import _jsonable, markdown_table, ms, pct
from tracekit.render.text import printable

_SERIES = ("step_times_ms", "component_steps_ms", "samples_per_step")


def _num(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{v:,.{digits}f}"


def _rank_json(r: RankRow) -> dict[str, Any]:
    out: dict[str, Any] = _jsonable(r)
    return {k: v for k, v in out.items() if v is not None or not k.startswith(("gpu_", "comm_o"))}


def run_json(run: RunSteps) -> dict[str, Any]:
    out: dict[str, Any] = _jsonable(run)
    for k in _SERIES:
        out.pop(k, None)
    out["ranks"] = [_rank_json(r) for r in run.ranks]
    return out


def steps_json(result: StepsResult) -> str:
    doc = {
        "runs": [run_json(r) for r in result.runs],
        "flags": _jsonable([*result.flags, *(f for r in result.runs for f in r.flags)]),
    }
    return json.dumps(doc, indent=2)


def _run_lines(run: RunSteps, md: bool) -> list[str]:
    head = (
        f"run {run.label}: {rank_count(run.world_size)}, {run.steps} steps"
        + (f" (first {run.warmup_steps} skipped as warm-up)" if run.warmup_steps else "")
        + f" — step p50 {ms(run.step_ms.p50)}, p95 {ms(run.step_ms.p95)}, "
        f"{_num(run.samples_per_s)} samples/s, communication overlap {pct(_frac(run.overlap_pct))}"
    )
    if run.clock_offset_ms:
        head += f", clocks aligned by up to {run.clock_offset_ms:.2f} ms"
    comp_rows = [[c.name, ms(c.mean_ms, 2), pct(c.share)] for c in run.components]
    rank_rows = [
        [
            r.rank,
            r.host or "–",
            ms(r.step_ms_p50),
            ms(r.data_wait_ms),
            ms(r.compute_ms),
            ms(r.comm_exposed_ms),
            ms(r.peer_wait_ms),
            r.last_arrivals,
        ]
        for r in run.ranks
    ]
    lines = [("### " if md else "") + head, ""]
    lines += _table(["component", "mean per step", "share"], comp_rows, md)
    lines.append("")
    headers = ["rank", "host", "step p50", "data wait", "compute", "comm exposed", "peer wait"]
    headers.append("last")
    if any(r.gpu_idle_pct is not None for r in run.ranks):
        # profiled runs: each rank's GPU time line (HTA's temporal breakdown, overlap)
        headers += ["GPU idle", "GPU compute", "GPU non-compute", "comm overlap"]
        for row, r in zip(rank_rows, run.ranks, strict=True):
            row += [
                pct(_frac(r.gpu_idle_pct), 1),
                pct(_frac(r.gpu_compute_pct), 1),
                pct(_frac(r.gpu_non_compute_pct), 1),
                pct(_frac(r.comm_overlap_pct), 1),
            ]
    lines += _table(headers, rank_rows, md)
    lines += _comm_lines(run, md)
    if run.stragglers and run.world_size > 1:
        lines.append("")
        lines.append(
            "stragglers (arrived last at a collective): "
            + "; ".join(
                f"rank {s.rank} {s.last_arrivals}× ({s.share:.0%}), {s.mean_lag_ms:.1f} ms late; "
                f"late in {s.late_steps:.0%} of steps, median {s.lateness_ms:+.1f} ms"
                for s in run.stragglers
            )
        )
    return lines


def _size(nbytes: float) -> str:
    """Bytes as nccl-tests-style binary units (``25.0 MiB``)."""
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= k:
            return f"{nbytes / k:.1f} {unit}"
    return f"{nbytes:.0f} B"


def _comm_lines(run: RunSteps, md: bool) -> list[str]:
    """Bandwidth per collective class and communication per process group."""
    lines: list[str] = []
    if run.collectives:
        link = f" of {run.link_gbps:g} Gb/s" if run.link_gbps else ""
        headers = ["op", "group", "ranks", "scope", "size", "count", "transfer", "algbw", "busbw"]
        if run.link_gbps:
            headers.append("of link")
        rows = []
        for c in run.collectives:
            row: list[Any] = [
                c.op,
                c.group if not c.group_desc else f"{c.group} ({c.group_desc})",
                c.group_size,
                c.scope,
                _size(c.bytes),
                c.count,
                ms(c.time_ms, 2),
                gb_s(c.algbw_gb_s),
                gb_s(c.busbw_gb_s) if c.busbw_gb_s is not None and c.group_size > 1 else "–",
            ]
            if run.link_gbps:
                row.append(pct(c.link_fraction) if c.link_fraction is not None else "–")
            rows.append(row)
        lines += [
            "",
            "collectives (transfer time only; algbw and busbw as nccl-tests computes them, "
            f"1 GB/s = 10⁹ bytes/s{link}):",
        ]
        lines += _table(headers, rows, md)
    if run.groups:
        rows = [
            [
                g.group if not g.group_desc else f"{g.group} ({g.group_desc})",
                g.role.replace("_", "-"),
                g.group_size,
                ", ".join(g.ops),
                g.launched_under,
                f"{g.per_step:.1f}",
                ms(g.wall_ms),
                ms(g.exposed_ms),
            ]
            for g in run.groups
        ]
        headers = ["group", "role", "ranks", "ops", "launched under", "per step", "wall"]
        headers.append("exposed")
        lines += ["", "communication by process group (per rank and step):"]
        lines += _table(headers, rows, md)
    return lines


def _frac(v: float | None) -> float | None:
    return None if v is None else v / 100.0


def _table(headers: list[str], rows: list[list[Any]], md: bool) -> list[str]:
    if md:
        return markdown_table(headers, rows).splitlines()
    # escaped before measuring, so a run label or host name cannot skew the columns
    cells = [[printable(str(v)) for v in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), *(fmt.format(*r).rstrip() for r in cells)]


def _join(lines: list[str]) -> str:
    """The lines as text, each escaped: names in them come from the traces."""
    return "\n".join(printable(line) for line in lines)


def steps_text(result: StepsResult, md: bool = False) -> str:
    lines: list[str] = []
    for run in result.runs:
        lines += _run_lines(run, md)
        lines.append("")
    for f in [*result.flags, *(f for r in result.runs for f in r.flags)]:
        lines.append(f"note [{f.code}]: {f.message}")
    return _join(lines).rstrip() + "\n"


STEPS_RENDERERS: dict[str, Callable[[StepsResult], str]] = {
    "table": steps_text,
    "json": steps_json,
    "markdown": lambda r: steps_text(r, md=True),
}


# --- diff -------------------------------------------------------------------------------


def diff_json(d: TrainingDiff) -> str:
    doc: dict[str, Any] = _jsonable(d)
    return json.dumps(doc, indent=2)


def diff_text(d: TrainingDiff, md: bool = False) -> str:
    s = d.scaling
    lines = [
        ("### " if md else "")
        + f"training diff {d.before.label} ({rank_count(d.before.world_size)}) "
        f"→ {d.after.label} ({rank_count(d.after.world_size)})",
        "",
        f"samples/s {_num(d.before.samples_per_s)} → {_num(d.after.samples_per_s)}: "
        f"speed-up {_num(s.speedup, 2)}× of an ideal {_num(s.ideal, 2)}×, "
        f"scaling efficiency {pct(s.efficiency)} of ideal",
        f"mean step {ms(d.ideal_step_ms)} under ideal scaling",
        "",
    ]
    rows = [
        [c.name, ms(c.before_ms, 2), ms(c.after_ms, 2), f"{c.delta_ms:+.2f} ms", pct(c.share)]
        for c in d.components
    ]
    lines += _table(["component", "before", "after", "delta", "share of loss"], rows, md)
    if d.bandwidth is not None:
        lines += ["", f"bandwidth: {d.bandwidth.sentence()}"]
    lines += ["", f"verdict: {d.verdict.bottleneck}", d.verdict.summary]
    for f in d.flags:
        lines.append(f"note [{f.code}]: {f.message}")
    return _join(lines) + "\n"


DIFF_RENDERERS: dict[str, Callable[[TrainingDiff], str]] = {
    "table": diff_text,
    "json": diff_json,
    "markdown": lambda d: diff_text(d, md=True),
}


# --- gate -------------------------------------------------------------------------------


def gate_json(g: TrainingGateResult) -> str:
    doc: dict[str, Any] = _jsonable(g)
    return json.dumps(doc, indent=2)


def gate_text(g: TrainingGateResult, md: bool = False) -> str:
    lines = [
        ("### " if md else "")
        + f"training gate {g.before} → {g.after}: {g.result.upper()}"
        + ("" if g.exit_code is None else f" (exit {g.exit_code})"),
        "",
    ]
    # observed, interval and limit in one unit (a relative samples/s budget reads as the
    # scaling efficiency it is); the raw fractions are in the JSON
    rows = [
        [c.budget, c.result, w.quantity, w.observed, w.interval or "–", w.limit, w.measured or "–"]
        for c in g.checks
        if (w := c.words) is not None
    ]
    headers = ["budget", "result", "checked", "observed", "interval", "limit", "measured"]
    lines += _table(headers, rows, md)
    lines += [""] + [c.message for c in g.checks]
    return _join(lines) + "\n"


GATE_RENDERERS: dict[str, Callable[[TrainingGateResult], str]] = {
    "table": gate_text,
    "json": gate_json,
    "markdown": lambda g: gate_text(g, md=True),
}
