"""When a child outside its parent's span is clock skew, and how ingest reports it.

Every reader (OTLP files, Jaeger files and pulls, ``tracekit collect`` payloads, and the
files written on into ClickHouse) stages its spans and reaches :func:`check` from
:func:`tracekit.analysis.ingest.staging.finalize`, so this is the one definition.

**Which host a span ran on.** Two spans ran on the same host when they carry the same
resource ``host.name``; when either lacks it, the same ``service.instance.id``; when
either lacks that too, the same ``service.name``. Each comparison uses the most precise
attribute both spans carry, so a span with ``host.name`` under one without still
compares by instance. Two processes that name no host are told apart by their instance
ids, which is conservative: their overlap is counted as skew, as it may be.

**Tolerance.** On one host parent and child read the same clock, so an overlap there is
never skew. One up to :data:`TOLERANCE_NS` is the expected order of a server span
ending after its client call (the client stops at the response's headers, the server
once the body has been handed on), the clock's resolution and a wake-up's delay; it is
not a problem. Beyond it, the server (or whatever the child is) went on for a
measurable time after its caller had its answer, or waited for a CPU first: reported as
:data:`~.problems.OVERRUN`, not as skew. Across hosts any overlap is
:data:`~.problems.SKEW`. docs/ingest.md gives the measurements behind the figure.

Both kinds are one problem each, located at the largest overlap, with its size, ids,
services and hosts, and counting every span; the stored spans are kept as they came
(attribution clips a child to its parent).
"""

from __future__ import annotations

from typing import Any

from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.store import Store

TOLERANCE_NS = 1_000_000
"""1 ms: how far a child may start before or end after its parent on the same host
without being reported (Linux ``time.time_ns`` reads to 1 ns, Jaeger to 1 µs; the
single-host demo's overlaps cluster at 0.26–0.6 ms, docs/ingest.md)."""


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def _describe(example: dict[str, Any], *, cross_host: bool) -> str:
    """``span S (svc on host) of trace T ends X ms after its parent P (svc on host)``."""
    what = []
    if example["early"] > 0:
        what.append(f"starts {_ms(example['early'])} before")
    if example["late"] > 0:
        what.append(f"ends {_ms(example['late'])} after")
    child = example["service"] or "no service"
    parent = example["parent_service"] or "no service"
    if cross_host:
        child += f" on {example['host']}"
        parent += f" on {example['parent_host']}"
    text = (
        f"span {example['span_id']} ({child}) of trace {example['trace_id']} "
        f"{' and '.join(what)} its parent {example['parent_id']} ({parent})"
    )
    if not cross_host:
        text += f", both on {example['host']}"
    return text


def _reason(n: int, example: dict[str, Any], *, cross_host: bool) -> str:
    spans = "span" if n == 1 else "spans"
    largest = _describe(example, cross_host=cross_host)
    if cross_host:
        return (
            f"{n:,} {spans} outside their parent on another host (clock skew between "
            f"hosts); largest: {largest}; clipped"
        )
    return (
        f"{n:,} {spans} outside their parent by over {TOLERANCE_NS / 1e6:g} ms on one host "
        "(one clock, so not skew): a server span outliving its client call, by work after "
        f"the response or a wait for a CPU; largest: {largest}; clipped"
    )


def check(store: Store, statement: str, log: ProblemLog, per_file: dict[int, int]) -> None:
    """Run ``statement`` (``ingest_finalize.sql``'s ``skew``) and log what it finds.

    Adds each kind's count to ``per_file`` (by input number) for ``ingest_log``.
    """
    total: dict[bool, int] = {}
    worst: dict[bool, tuple[int, int, dict[str, Any]]] = {}
    for cross_host, file_no, n, example in store.run(statement, {"tolerance_ns": TOLERANCE_NS}):
        per_file[file_no] = per_file.get(file_no, 0) + n
        total[cross_host] = total.get(cross_host, 0) + n
        # The largest overlap; on a tie, the first in input order.
        key = (-max(example["early"], example["late"]), file_no)
        if cross_host not in worst or key < worst[cross_host][:2]:
            worst[cross_host] = (*key, example)
    for cross_host in sorted(total, reverse=True):
        example = worst[cross_host][2]
        log.add(
            example["source"],
            _reason(total[cross_host], example, cross_host=cross_host),
            pk.SKEW if cross_host else pk.OVERRUN,
            n=total[cross_host],
        )
