"""What ``tracekit attribute`` reports: one line per run, or its JSON."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tracekit.analysis.attribute import AttributeReport
from tracekit.render.common import markdown_table


def _when(ns: int | None) -> str:
    if ns is None or ns <= 0 or ns >= 2**63 - 1:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) + " UTC"


def render_table(r: AttributeReport) -> str:
    """``attribute 0/2: 1,328 requests (12,094 spans, 251k spans/s) …``"""
    parts = [
        f"attribute {r.shard}: {r.requests:,} requests written ({r.spans:,} spans, "
        f"{r.spans_per_s:,.0f} spans/s, {r.slices} slices, {r.seconds:.1f} s)"
    ]
    if r.reattributed:
        parts.append(f"{r.reattributed:,} re-attributed (late spans)")
    if r.already:
        parts.append(f"{r.already:,} already attributed")
    if r.orphans:
        parts.append(f"{r.orphans:,} traces with no request skipped")
    if r.rootless:
        parts.append(f"{r.rootless:,} traces without a request span skipped")
    if r.batches:
        parts.append(f"{r.batches:,} batch traces")
    mark = f"attributed up to {_when(r.watermark)}" if r.watermark else "watermark not moved"
    return "; ".join(parts) + f"; {mark}\n" + "".join(f"note: {n}\n" for n in r.notes)


def as_dict(r: AttributeReport) -> dict[str, Any]:
    return {
        "shard": r.shard,
        "window": {"from_ns": r.window[0], "to_ns": r.window[1]},
        "requests": r.requests,
        "reattributed": r.reattributed,
        "already_attributed": r.already,
        "spans": r.spans,
        "orphan_traces": r.orphans,
        "batch_traces": r.batches,
        "rootless_traces": r.rootless,
        "slices": r.slices,
        "pulled_bytes": r.pulled_bytes,
        "seconds": round(r.seconds, 3),
        "watermark_ns": r.watermark,
        "notes": r.notes,
    }


def render_json(r: AttributeReport) -> str:
    return json.dumps(as_dict(r), indent=2)


def render_markdown(r: AttributeReport) -> str:
    rows = [[k, v] for k, v in as_dict(r).items() if k not in ("window", "notes")]
    return f"### tracekit attribute {r.shard}\n\n" + markdown_table(["", "value"], rows) + "\n"


RENDERERS: dict[str, Callable[[AttributeReport], str]] = {
    "table": render_table,
    "json": render_json,
    "markdown": render_markdown,
}
