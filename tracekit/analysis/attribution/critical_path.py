"""One trace's critical path, split by stage: the pure core of attribution.

:func:`analyse_trace` takes one trace's spans as aligned lists (:class:`TraceInput`)
and returns a :class:`TraceAnalysis`, or a skip reason. It never touches the store;
:mod:`tracekit.analysis.attribution.per_request` feeds it in bulk and :mod:`tracekit.analysis.attribution.explain`
uses its per-span results to draw a waterfall.

The walk is Jaeger UI's (``TracePage/CriticalPath``): from the request's end, take the
child that *ended* last before the cursor, walk into it, move the cursor to its start,
repeat; the gaps between children on the path are the parent's. A child still running
at the cursor overlapped a sibling already on the path and is off it. Where tracekit
differs, on purpose:

- a child ending up to :data:`BACK_TO_BACK_NS` after the cursor still counts as ended
  (Jaeger wants strictly before): back-to-back children whose clocks touch or overlap
  by that much stay on the path, truncated to the cursor;
- of children ending together the one that started first (the longer) is taken, where
  Jaeger takes whichever comes first in the trace.

Off the path with their subtrees, as Jaeger leaves them: a CONSUMER under a PRODUCER
(the message was handled later, elsewhere; the request did not wait for it) and a span
tied to its trace only by a FOLLOWS_FROM reference or a link (:attr:`TraceInput.follows`).
They are not part of the request: no stage time, not skew, not orphans.

Children overflowing their parent (clock skew between hosts) are clipped to it first;
children entirely outside are ignored with their subtrees. The path partitions the
root's interval exactly, so stage times add up to the request's duration in integer ns.

A background span (``tracekit.comm.async``: a collective launched while its stage went
on computing, as DDP buckets during ``backward``) enters the walk from its parent's last
background launch on (its own start if later): until then the parent was computing, so
only the rest of it — the *exposed* communication — can be on the path. Wall time
keeps the span's real interval.

Stages: a span without ``tracekit.stage`` inherits its nearest staged ancestor's. Once
a span is ``downstream`` its whole subtree is too, the called service's own stage spans
included (they are the dependency's model_execute, not this request's); a span of
another service that is not under a downstream span (behind a gateway, say) keeps its
own stage. A stage's wall, CPU and GPU time come from its top-level spans only (those
with no ancestor of the same stage). Path time in no stage is ``unattributed`` and
reads ``wait`` (:func:`tracekit.conventions.default_time_kind`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from tracekit import conventions as cv

SKIP_NO_TIMESTAMPS = "no_timestamps"
"""Skip reason: a span of the trace has no start or end time."""
SKIP_BATCH = "batch"
"""Skip reason: the trace's root is a batch span, not a request."""
SKIP_NO_ROOT = "no_root"
"""Skip reason: every span has a parent inside the trace (a cycle)."""

_DOWNSTREAM_KINDS = frozenset({"CLIENT", "PRODUCER"})

BACK_TO_BACK_NS = 1_000
"""1 µs: how far a child may end after the cursor and still count as ended before it.

Back-to-back children read one clock, so the later one starts at or after the earlier
one's end; an overlap up to this much is rounding, not concurrency (Jaeger keeps
microseconds, so a span rounded to the nearest one can end 1 µs into the next; an SDK
converting a float clock to ns can overlap by a few ns). Siblings in a worker pool or a
fan-out overlap by far more and stay off the path, as in Jaeger UI."""
_FALLBACK_NAME_MAX = 48
# Path/name segments that look like ids (numbers, hex with a digit, UUIDs) become {id},
# so "GET /users/123" and "GET /users/456" are one stage.
_ID_SEGMENT = re.compile(
    r"(?<![0-9a-z])(?:[0-9a-f]{8}-[0-9a-f-]{27}|(?=[0-9a-f]*[0-9])[0-9a-f]{8,}|[0-9]+)(?![0-9a-z])"
)
_SPACES = re.compile(r"\s+")


@dataclass
class TraceInput:
    """One trace's spans as aligned lists (index i is the same span in every list)."""

    span_id: list[str]
    parent: list[str | None]
    name: list[str]
    kind: list[str]
    start: list[int | None]
    end: list[int | None]
    service: list[str | None]
    stage: list[str | None]
    """``tracekit.stage`` as written on the span (not inherited)."""
    time_kind: list[str | None]
    cpu_ns: list[int | None]
    gpu_ns: list[int | None]
    is_batch: list[bool]
    """Batch span (name ``tracekit.batch`` or carries ``tracekit.batch.request_count``)."""
    is_db: list[bool]
    """Carries a database-client attribute; used only by the fallback stages."""
    route: list[str | None]
    """``http.route`` when present; used only by the fallback stages."""
    background: list[bool] | None = None
    """Launched in the background (``tracekit.comm.async``: a DDP bucket); None: none is."""
    follows: list[bool] | None = None
    """Tied to the trace only by a FOLLOWS_FROM reference (a link to its parent whose
    ``opentracing.ref_type`` is ``follows_from``) or, parentless, by a link into its own
    trace: caused by the request, not waited for. None: no span is."""
    error: list[bool] | None = None
    """The span failed (``operations.span_failed``: status ERROR, or UNSET with an HTTP
    error code for its kind); used only by the operations and the patterns."""
    client: (
        list[tuple[str | None, str | None, str | None, str | None, str | None] | None] | None
    ) = None
    """A CLIENT span's ``operations.ClientAttrs`` (None for other spans): what it names
    when its callee left no SERVER span; used only by the operations."""


@dataclass(slots=True)
class StageTotal:
    """One stage of one request."""

    stage: str
    time_kind: str
    critical_ns: int
    wall_ns: int
    cpu_time_ns: int | None
    gpu_time_ns: int | None


@dataclass
class TraceAnalysis:
    """The critical path of one request trace and its split by stage."""

    root: int
    start_ns: int
    duration_ns: int
    stages: list[StageTotal]
    effective_stage: list[str | None]
    """Per span: its own stage, else its nearest staged ancestor's (None: no stage);
    under a ``downstream`` span always ``downstream``, whatever the span's own stage."""
    clipped_start: list[int | None]
    """Per span: start clipped into its parent; None for spans outside the walked tree."""
    clipped_end: list[int | None]
    depth: list[int]
    tree_parent: list[int | None]
    """Per span: index of the parent it was walked under (orphans: the root); None for
    the root and for spans outside the walked tree."""
    critical_ns: list[int]
    """Per span: time on the critical path charged to this span itself (not its children)."""
    segments: list[tuple[int, int, int]] = field(default_factory=list)
    """(span index, start ns, end ns) pieces of the path, latest first."""
    clipped: int = 0
    ignored: int = 0
    orphans_attached: int = 0
    orphans_dropped: int = 0
    detached: int = 0
    """Spans left off the path with their subtrees (a CONSUMER under a PRODUCER, a span
    reached only by FOLLOWS_FROM or a link): the subtrees' tops."""
    fallback: bool = False
    """True when stages were derived from span names/kinds (no ``tracekit.stage`` at all)."""

    @property
    def skewed_spans(self) -> int:
        return self.clipped + self.ignored


def mask_ids(text: str) -> str:
    """``text`` with runs of white space made one and id-like segments (numbers, hex with a
    digit, UUIDs) made ``{id}``: ``GET /users/123`` and ``GET /users/456`` are one name."""
    return _ID_SEGMENT.sub("{id}", _SPACES.sub(" ", text.strip()))


def fallback_stage_name(name: str, route: str | None) -> str:
    """A user stage named after an operation: route or span name, lower-cased, ids masked."""
    return mask_ids((route or name).lower())[:_FALLBACK_NAME_MAX] or cv.UNATTRIBUTED


def _fallback_stage(
    t: TraceInput, i: int, under_root: bool, root_service: str | None
) -> str | None:
    """Stage of span ``i`` in a trace without tracekit attributes (None: inherit).

    Calls leaving the process (CLIENT/PRODUCER spans, database spans) and spans of
    another service are ``downstream``; the entry service's direct children are user
    stages named after their operation; everything deeper inherits.
    """
    if t.kind[i] in _DOWNSTREAM_KINDS or t.is_db[i] or t.service[i] != root_service:
        return cv.DOWNSTREAM
    if under_root:
        return fallback_stage_name(t.name[i], t.route[i])
    return None


def _pick_root(t: TraceInput, index: dict[str, int]) -> tuple[int | None, list[int]]:
    roots = [i for i, p in enumerate(t.parent) if p is None or p not in index]
    if not roots:
        return None, roots

    def key(i: int) -> tuple[int, int, bool]:
        s, e = t.start[i], t.end[i]
        assert s is not None and e is not None
        return (s, -(e - s), t.kind[i] != "SERVER")

    return min(roots, key=key), roots


def analyse_trace(t: TraceInput) -> TraceAnalysis | str:
    """Critical path and stage split of one trace, or a ``SKIP_*`` reason.

    Written as one tight pass per step: refresh runs it on every trace in the store.
    """
    n = len(t.span_id)
    if None in t.start or None in t.end:
        return SKIP_NO_TIMESTAMPS
    index = {sid: i for i, sid in enumerate(t.span_id)}
    root, roots = _pick_root(t, index)
    if root is None:
        return SKIP_NO_ROOT
    is_batch = t.is_batch
    if is_batch[root]:
        return SKIP_BATCH
    start: list[int] = t.start  # type: ignore[assignment]  # no None: checked above
    end: list[int] = t.end  # type: ignore[assignment]
    rs, re_ = start[root], end[root]
    if re_ < rs:
        re_ = rs

    children: dict[int, list[int]] = {}
    parent, kind = t.parent, t.kind
    follows = t.follows or [False] * n
    detached = 0
    for i in range(n):
        pid = parent[i]
        if pid is not None and i != root and not is_batch[i]:
            j = index.get(pid)
            if j is None:
                continue
            if follows[i] or (kind[i] == "CONSUMER" and kind[j] == "PRODUCER"):
                # Not waited for: off the path, its subtree with it (never reached below).
                detached += 1
            else:
                children.setdefault(j, []).append(i)
    attached = dropped = 0
    for i in roots:
        if i == root or is_batch[i]:
            continue
        if follows[i]:
            detached += 1
        elif rs <= start[i] and end[i] <= re_:
            children.setdefault(root, []).append(i)
            attached += 1
        else:
            dropped += 1

    own = t.stage
    fallback = own.count(None) == n
    if fallback:
        own = list(own)
    eff: list[str | None] = [None] * n
    # top[i]: span i opens a top-level interval of its stage (no ancestor has the same
    # effective stage); only these count toward the stage's wall, CPU and GPU time.
    # src[i]: the top-level span span i's effective stage comes from.
    top = [False] * n
    src: list[int | None] = [None] * n
    cs: list[int | None] = [None] * n
    ce: list[int | None] = [None] * n
    depth = [0] * n
    tree_parent: list[int | None] = [None] * n
    eff[root] = own[root]
    cs[root], ce[root] = rs, re_
    clipped = ignored = 0
    root_service = t.service[root]
    # Top-down: clip each child into its (already clipped) parent, settle its stage,
    # and note the stage's own top-level intervals (for wall time) on the way.
    intervals: dict[str, list[tuple[int, int]]] = {}
    if own[root] is not None:
        intervals[own[root]] = [(rs, re_)]  # type: ignore[index]
        top[root] = True
        src[root] = root
    order = [root]
    sorted_kids: dict[int, list[int]] = {}
    for p in order:
        ks = children.get(p)
        if not ks:
            continue
        lo, hi = cs[p], ce[p]
        assert lo is not None and hi is not None
        eff_p = eff[p]
        kept = []
        for c in ks:
            s, e = start[c], end[c]
            if e < s:
                e = s
            if e < lo or s > hi:
                ignored += 1
                continue
            if s < lo or e > hi:
                clipped += 1
                s, e = max(s, lo), min(e, hi)
            cs[c], ce[c] = s, e
            depth[c] = depth[p] + 1
            tree_parent[c] = p
            if fallback:
                own[c] = _fallback_stage(t, c, p == root, root_service)
            stage = own[c]
            if stage is None or stage == eff_p or eff_p == cv.DOWNSTREAM:
                # Inside a downstream call everything is the dependency's time, its own
                # stages included (a tracekit-instrumented dependency has its own
                # model_execute): it is not this request's model_execute.
                eff[c] = eff_p
                src[c] = src[p]
            else:
                eff[c] = stage
                src[c] = c
                if not _has_staged_ancestor(stage, src[p], eff, tree_parent, src):
                    top[c] = True
                    intervals.setdefault(stage, []).append((s, e))
            order.append(c)
            kept.append((-e, s, c))
        if kept:
            kept.sort()
            sorted_kids[p] = [c for _, _, c in kept]

    crit = [0] * n
    ws = cs
    if t.background is not None and any(t.background):
        ws = _walk_starts(t.background, order, tree_parent, cs, ce)
        for ks in sorted_kids.values():
            ks.sort(key=lambda c: (-ce[c], ws[c], c))  # type: ignore[operator]
    segments = _walk(root, sorted_kids, ws, ce, crit)
    stages = _stage_totals(t, order, top, eff, crit, intervals)
    return TraceAnalysis(
        root=root,
        start_ns=rs,
        duration_ns=re_ - rs,
        stages=stages,
        effective_stage=eff,
        clipped_start=cs,
        clipped_end=ce,
        depth=depth,
        tree_parent=tree_parent,
        critical_ns=crit,
        segments=segments,
        clipped=clipped,
        ignored=ignored,
        orphans_attached=attached,
        orphans_dropped=dropped,
        detached=detached,
        fallback=fallback,
    )


def _has_staged_ancestor(
    stage: str,
    j: int | None,
    eff: list[str | None],
    tree_parent: list[int | None],
    src: list[int | None],
) -> bool:
    """Whether the top-level span ``j`` or one it sits under has effective ``stage``.

    Walks only the chain of stage-opening spans (a few per trace), so preprocess inside
    model_execute inside preprocess is still the outer preprocess's time.
    """
    while j is not None:
        if eff[j] == stage:
            return True
        p = tree_parent[j]
        j = None if p is None else src[p]
    return False


def _walk_starts(
    background: list[bool],
    order: list[int],
    tree_parent: list[int | None],
    cs: list[int | None],
    ce: list[int | None],
) -> list[int | None]:
    """Starts for the walk: a background span from its parent's last background launch."""
    last: dict[int, int] = {}
    for c in order:
        p = tree_parent[c]
        s = cs[c]
        if background[c] and p is not None and s is not None:
            last[p] = max(last.get(p, s), s)
    ws = list(cs)
    for c in order:
        p = tree_parent[c]
        s, e = cs[c], ce[c]
        if background[c] and p is not None and s is not None and e is not None:
            ws[c] = min(max(s, last[p]), e)
    return ws


def _walk(
    root: int,
    sorted_kids: dict[int, list[int]],
    cs: list[int | None],
    ce: list[int | None],
    crit: list[int],
) -> list[tuple[int, int, int]]:
    """The last-finishing-child walk, iterative so deep traces cannot hit the recursion limit.

    Each frame is [span, lo, cursor, children by end descending, next child]. The next
    child on the path is the first in that order that ended by the cursor (give or take
    :data:`BACK_TO_BACK_NS`) and started before it; its end is truncated to the cursor.
    A child passed over once stays off the path, since the cursor only moves earlier: it
    was still running when a sibling already on the path started (or lies wholly after
    the cursor, within the tolerance), so that sibling, not it, held the parent up.
    """
    segments: list[tuple[int, int, int]] = []
    empty: list[int] = []
    frames: list[list[Any]] = [[root, cs[root], ce[root], sorted_kids.get(root, empty), 0]]
    while frames:
        frame = frames[-1]
        span, lo, cursor, ks, k = frame
        pushed = False
        nk = len(ks)
        while k < nk:
            c = ks[k]
            k += 1
            c_start = cs[c]
            if c_start < cursor and ce[c] - BACK_TO_BACK_NS <= cursor:
                c_end = min(ce[c], cursor)
                if c_end < cursor:
                    segments.append((span, c_end, cursor))
                    crit[span] += cursor - c_end
                frame[2] = c_start
                frame[4] = k
                frames.append([c, c_start, c_end, sorted_kids.get(c, empty), 0])
                pushed = True
                break
        if pushed:
            continue
        if cursor > lo:
            segments.append((span, lo, cursor))
            crit[span] += cursor - lo
        frames.pop()
    return segments


def _stage_totals(
    t: TraceInput,
    order: list[int],
    top: list[bool],
    eff: list[str | None],
    crit: list[int],
    intervals: dict[str, list[tuple[int, int]]],
) -> list[StageTotal]:
    """Per stage: path time from every span, the rest from its top-level spans only.

    Wall time is the union of the top-level intervals, so CPU/GPU time is summed over
    the same spans: a nested span of the same stage ran inside its parent, whose thread
    CPU time already contains it.
    """
    critical: dict[str, int] = {}
    kinds: dict[str, str] = {}
    cpu: dict[str, int] = {}
    gpu: dict[str, int] = {}
    time_kind, cpu_ns, gpu_ns = t.time_kind, t.cpu_ns, t.gpu_ns
    for i in order:
        c = crit[i]
        if c:
            stage = eff[i] or cv.UNATTRIBUTED
            critical[stage] = critical.get(stage, 0) + c
        if not top[i]:
            continue
        mine = eff[i]
        assert mine is not None
        tk = time_kind[i]
        if tk is not None and mine not in kinds and tk in cv.TIME_KINDS:
            kinds[mine] = tk
        v = cpu_ns[i]
        if v is not None:
            cpu[mine] = cpu.get(mine, 0) + v
        v = gpu_ns[i]
        if v is not None:
            gpu[mine] = gpu.get(mine, 0) + v

    out = []
    for stage, spans in intervals.items():
        out.append(
            StageTotal(
                stage,
                kinds.get(stage) or cv.default_time_kind(stage),
                critical.pop(stage, 0),
                _union_length(spans),
                cpu.get(stage),
                gpu.get(stage),
            )
        )
    # Left: stages on the path without top-level spans of their own (unattributed).
    for stage, c in critical.items():
        out.append(StageTotal(stage, cv.default_time_kind(stage), c, c, None, None))
    return out


def _union_length(intervals: list[tuple[int, int]]) -> int:
    """Total length covered by possibly overlapping intervals."""
    if len(intervals) == 1:
        s, e = intervals[0]
        return e - s
    total = 0
    intervals.sort()
    cur_s, cur_e = intervals[0]
    for s, e in intervals[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + cur_e - cur_s
