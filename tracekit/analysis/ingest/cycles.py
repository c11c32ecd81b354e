"""Parent cycles in the stage: found, reported, and broken so the trace has a root.

A span that is its own parent, or spans whose parents lead round in a circle, leave
their trace without a root: attribution would never make it a request and the report
would say nothing. Before the stage goes into ``spans``, :func:`break_cycles` walks
down from every root (a span without a parent, or whose parent is not in the input)
and looks at what that walk never reached: each cycle there is one ``cycle`` problem,
located at the span that closes it, which is stored as a root (its parent link
dropped) so the trace is attributed from it. A ``strict`` ingest fails on it.
"""

from __future__ import annotations

from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.store import Store

# Spans the walk down from the roots never reaches: cycle members and what hangs below.
_UNREACHED = """
WITH RECURSIVE reach(trace_id, span_id) AS (
    SELECT s.trace_id, s.span_id FROM _tk_stage s
    WHERE s.parent_span_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM _tk_stage p
        WHERE p.trace_id = s.trace_id AND p.span_id = s.parent_span_id)
    UNION
    SELECT c.trace_id, c.span_id
    FROM _tk_stage c JOIN reach r ON c.trace_id = r.trace_id AND c.parent_span_id = r.span_id
)
SELECT s.trace_id, s.span_id, s.parent_span_id, s.start_ns, s.source
FROM _tk_stage s
WHERE NOT EXISTS (
    SELECT 1 FROM reach r WHERE r.trace_id = s.trace_id AND r.span_id = s.span_id)
ORDER BY s.trace_id, s.start_ns NULLS LAST, s.span_id
"""

_DETACH = """
UPDATE _tk_stage SET parent_span_id = NULL WHERE trace_id = $trace_id AND span_id = $span_id
"""


def break_cycles(store: Store, log: ProblemLog) -> int:
    """Report and break every parent cycle in ``_tk_stage``; returns how many there were.

    Of each cycle, the span that starts first (then the lowest id) becomes the root:
    in a real request that is the span the others ran inside, so the trace is
    attributed from where it began. Spans below a cycle are reached through it.
    """
    rows = store.run(_UNREACHED)
    if not rows:
        return 0
    parent: dict[tuple[str, str], str | None] = {}
    info: dict[tuple[str, str], tuple[int | None, str]] = {}
    for trace_id, span_id, parent_id, start, source in rows:
        parent[(trace_id, span_id)] = parent_id
        info[(trace_id, span_id)] = (start, source)
    found = 0
    done: set[tuple[str, str]] = set()
    for key in parent:  # in trace, start order: the first member met opens its cycle
        path: list[tuple[str, str]] = []
        on_path: set[tuple[str, str]] = set()
        node: tuple[str, str] | None = key
        while node is not None and node not in done and node not in on_path:
            path.append(node)
            on_path.add(node)
            up = parent.get(node)
            node = (node[0], up) if up is not None and (node[0], up) in parent else None
        if node is not None and node in on_path:
            cycle = path[path.index(node) :]
            _break(store, log, cycle, info)
            found += 1
        done.update(path)
    return found


def _break(
    store: Store,
    log: ProblemLog,
    cycle: list[tuple[str, str]],
    info: dict[tuple[str, str], tuple[int | None, str]],
) -> None:
    def order(k: tuple[str, str]) -> tuple[bool, int, str]:
        start = info[k][0]
        return (start is None, start or 0, k[1])

    trace_id, span_id = min(cycle, key=order)
    source = info[(trace_id, span_id)][1]
    if len(cycle) == 1:
        what = f"span {span_id} of trace {trace_id} is its own parent"
    else:
        chain = " -> ".join(s for _, s in cycle)
        what = f"spans {chain} of trace {trace_id} are each other's parents (a cycle)"
    log.add(source, f"{what}; stored {span_id} as the root", pk.CYCLE)
    store.run(_DETACH, {"trace_id": trace_id, "span_id": span_id})
