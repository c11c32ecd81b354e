"""The live status line of ``tracekit collect`` (spans/s, requests, releases, rejected)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracekit.render.text import printable

if TYPE_CHECKING:
    from tracekit.collect import CollectStatus


def status_line(status: CollectStatus, *, final: bool = False) -> str:
    """One line: ``collect 127.0.0.1:4318: 1,204 spans/s · 3,100 requests · v1, v2 · …``.

    ``final`` gives the totals printed on exit instead of the rate.
    """
    # Release labels come from the spans: anyone who can write chooses them.
    releases = (
        ", ".join(printable(r) for r in status.releases) if status.releases else "no release yet"
    )
    parts = [
        f"{status.spans_accepted:,} spans accepted"
        if final
        else f"{status.spans_per_s:,.0f} spans/s",
        f"{status.requests_stored:,} requests stored",
        f"releases: {releases}",
        f"{status.spans_rejected:,} spans rejected",
        f"{status.requests_refused:,} retries asked",
    ]
    if not final:
        parts.append(f"{status.pending_spans:,} pending")
    s = status.sampler
    if s is not None:
        kept = s.kept_slow + s.kept_rest + s.kept_unranked
        parts.append(
            f"sampler kept {kept:,} of {s.traces_decided:,} traces "
            f"({s.kept_slow:,} slow, {s.kept_rest:,} weighted)"
        )
    head = "collected" if final else f"collect {status.address}"
    return f"{head}: " + " · ".join(parts)
