"""Critical-path attribution of every trace at once, in numpy: what ``refresh`` runs.

:func:`analyse_all` computes, for all traces of a batch together, exactly what
:func:`tracekit.analysis.attribution.critical_path.analyse_trace` computes for one (that
module stays the reference: ``explain`` draws its waterfall from it, and the tests
compare both on every trace they can find). A Python walk costs ~100 µs a trace; here
the work is a few numpy operations per tree *level* over all traces' spans of that
level, so a batch costs O(spans · log spans) plus a constant per level.

How the walk becomes array operations. In the reference, a span's children are taken
in the order (end descending, start, index); the next child on the path is the first
in that order that is *eligible* at the cursor: it ended by the cursor (within
``BACK_TO_BACK_NS``) and started before it, i.e. ``q = max(end - tolerance, start + 1)``
is at most the cursor; the cursor then moves to its start. A child's successor
therefore depends on its own start only: it is the first sibling, in that order, whose
``q`` is at most that start (no sibling before it can be eligible there, or the walk
would have taken it first). With the children of a tree level sorted by (parent, end
desc, start, index), "the first sibling with ``q`` at most x" is a binary search on the
segmented running minimum of ``q`` — one ``np.searchsorted`` for all children at once.
The chain of each parent (its first child, at the parent's bound, then successor after
successor) is marked by pointer doubling in log2(longest chain) steps. A child on the
path is truncated to the cursor before it; the parent is charged the gaps between its
path children and the stretch from its start to the last cursor.

A CONSUMER under a PRODUCER, and a span tied to its trace only by FOLLOWS_FROM or a
link (``follows``), is never made anyone's child: it and its subtree stay out, as in
the reference.

A background span (a DDP bucket) enters the walk from its parent's last background
launch, as in the reference: ``ws`` holds those walk starts (the clipped start
elsewhere), and the walk reads it wherever the reference's walk reads a start.

Inputs are :class:`SpanArrays` (rows ordered by trace, then span id: the order the
reference receives too, so ties break the same way).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.attribution.critical_path import BACK_TO_BACK_NS, fallback_stage_name

I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]
NamesFor = Callable[[I64], list[tuple[str, str | None]]]
"""Rows -> (span name, http.route) of each: the inputs of a fallback stage name."""


@dataclass
class SpanArrays:
    """One batch of traces' spans as columns; rows grouped by trace (``trace`` ascending).

    Codes: ``stage`` indexes :attr:`stage_names` (-1: no stage); ``time_kind`` indexes
    :data:`tracekit.conventions.TIME_KINDS` (-1: absent or not a valid kind);
    ``service`` is any code equal for equal service names (-1: none).
    """

    trace: I64
    parent: I64
    """Row of the parent span in the same trace; -1 when absent (a root or an orphan)."""
    start: I64
    end: I64
    has_ts: B
    stage: I64
    time_kind: I64
    service: I64
    is_server: B
    is_outcall: B
    """CLIENT or PRODUCER kind."""
    is_batch: B
    is_db: B
    cpu_ns: I64
    """-1 when not measured (as the store's readers always treated negative values)."""
    gpu_ns: I64
    stage_names: list[str]
    background: B | None = None
    """Launched in the background (``tracekit.comm.async``); None: no span is."""
    is_producer: B | None = None
    """PRODUCER kind (None: no span is)."""
    is_consumer: B | None = None
    """CONSUMER kind (None: no span is)."""
    follows: B | None = None
    """Tied to its trace only by FOLLOWS_FROM or a link (see ``TraceInput.follows``)."""
    op: I64 | None = None
    """Operation code of each span (``operations.operation_codes``), naming
    :attr:`op_names`; None: no operation rows are computed."""
    op_names: list[tuple[str, str]] = field(default_factory=list)
    """(service, operation) by operation code."""
    is_error: B | None = None
    """The span failed (``operations.failed_rows``: status ERROR, or UNSET with an HTTP
    error code for its kind); None: no span did."""


def _empty() -> I64:
    return np.zeros(0, dtype=np.int64)


@dataclass
class BulkResult:
    """Per request and per (request, stage) rows, plus the tallies of ``RefreshReport``."""

    stage_names: list[str]
    """Stage names by code: the input's, then fallback stages, ``downstream``, ``unattributed``."""

    req_trace: I64 = field(default_factory=_empty)
    req_root: I64 = field(default_factory=_empty)
    req_start: I64 = field(default_factory=_empty)
    req_duration: I64 = field(default_factory=_empty)
    req_span_count: I64 = field(default_factory=_empty)
    req_skewed: I64 = field(default_factory=_empty)
    st_trace: I64 = field(default_factory=_empty)
    st_root: I64 = field(default_factory=_empty)
    st_stage: I64 = field(default_factory=_empty)
    """Index into :attr:`stage_names` (fallback stages are appended to it)."""
    st_kind: I64 = field(default_factory=_empty)
    """Index into TIME_KINDS."""
    st_critical: I64 = field(default_factory=_empty)
    st_wall: I64 = field(default_factory=_empty)
    st_cpu: I64 = field(default_factory=_empty)
    """-1: never measured."""
    st_gpu: I64 = field(default_factory=_empty)
    op_root: I64 = field(default_factory=_empty)
    """Per (request, stage, operation) row, as ``operations.OperationRow``: the root row."""
    op_stage: I64 = field(default_factory=_empty)
    """Index into :attr:`stage_names`."""
    op_code: I64 = field(default_factory=_empty)
    """Index into ``SpanArrays.op_names``."""
    op_critical: I64 = field(default_factory=_empty)
    op_calls: I64 = field(default_factory=_empty)
    op_on_path: I64 = field(default_factory=_empty)
    op_overlapping: I64 = field(default_factory=_empty)
    op_errors: I64 = field(default_factory=_empty)
    traces: int = 0
    batch_traces: int = 0
    skipped_no_timestamps: int = 0
    skipped_no_root: int = 0
    orphans_attached: int = 0
    orphans_dropped: int = 0
    skewed_spans: int = 0
    fallback_traces: int = 0


def _segment_starts(keys: I64) -> B:
    first = np.ones(len(keys), dtype=bool)
    if len(keys) > 1:
        first[1:] = keys[1:] != keys[:-1]
    return first


def _first_at_most(values: I64, first: B) -> Callable[[I64, I64], I64]:
    """A search: for (segment numbers, limits), the first row of each segment whose
    value is at most the limit; -1 where none is.

    Segments start where ``first`` is set. The running minimum of each segment falls
    monotonically, so with values replaced by their ranks and each segment lifted by its
    number, one sorted key answers every query with one ``np.searchsorted``.
    """
    n = len(values)
    uniq, rank = np.unique(values, return_inverse=True)
    m = len(uniq) + 1
    seg_no = np.cumsum(first) - 1
    last = int(seg_no[-1]) if n else 0
    # earlier segments lifted above later ones: one running minimum restarts at each
    run = np.minimum.accumulate(rank.astype(np.int64) + (last - seg_no) * m)
    key = seg_no * m + (m - 1 - (run - (last - seg_no) * m))
    seg_end = np.append(np.flatnonzero(first)[1:], n)

    def find(seg: I64, limit: I64) -> I64:
        below = np.searchsorted(uniq, limit, side="right")  # values at most the limit
        pos = np.searchsorted(key, seg * m + (m - below), side="left")
        return np.where(pos < seg_end[seg], pos, -1).astype(np.int64)

    return find


def _chains(starts: I64, succ: I64) -> B:
    """Rows reached from ``starts`` by following ``succ`` (-1: the chain ends).

    Pointer doubling: ``jumps[k]`` is the 2**k-th successor; a stretch of 2**(k+1)
    rows from x is the stretch of 2**k from x plus the one from ``jumps[k][x]``.
    """
    jumps = [succ]
    while True:
        j = jumps[-1]
        has = j >= 0
        if not has.any():
            break
        nxt = np.full(len(j), -1, dtype=np.int64)
        nxt[has] = j[j[has]]
        jumps.append(nxt)
    mark = np.zeros(len(succ), dtype=bool)
    mark[starts] = True
    for j in reversed(jumps[:-1]):
        to = j[mark]
        mark[to[to >= 0]] = True
    return mark


def _seg_prefix_max_excl(values: I64, first: B) -> tuple[I64, B]:
    """Per row: the maximum of ``values`` over earlier rows of its segment (see above)."""
    n = len(values)
    if n == 0:
        return values.copy(), np.zeros(0, dtype=bool)
    uniq, rank = np.unique(values, return_inverse=True)
    m = len(uniq) + 1
    seg_no = np.cumsum(first) - 1
    lifted = rank.astype(np.int64) + seg_no * m
    run = np.maximum.accumulate(lifted)
    excl = np.empty(n, dtype=np.int64)
    excl[0] = 0
    excl[1:] = run[:-1]
    out = uniq[np.clip(excl - seg_no * m, 0, len(uniq) - 1)]
    return out.astype(np.int64), ~first


def analyse_all(s: SpanArrays, names_for: NamesFor | None = None) -> BulkResult:
    """Attribution of every trace in ``s`` (see the module docstring).

    ``names_for(rows)`` returns (span name, http.route) of those rows; it is called once,
    for the spans that may need a fallback stage (traces without any ``tracekit.stage``).
    """
    n = len(s.trace)
    names = list(s.stage_names)
    code_of = {name: i for i, name in enumerate(names)}

    def code(name: str) -> int:
        if name not in code_of:
            code_of[name] = len(names)
            names.append(name)
        return code_of[name]

    down = code(cv.DOWNSTREAM)
    unattributed = code(cv.UNATTRIBUTED)
    idx = np.arange(n, dtype=np.int64)
    tr = s.trace
    first_row = _segment_starts(tr) if n else np.zeros(0, dtype=bool)
    t_lo = np.flatnonzero(first_row)
    n_traces = len(t_lo)
    t_size = np.diff(np.append(t_lo, n)).astype(np.int64)
    tno = (np.cumsum(first_row) - 1).astype(np.int64)  # dense trace number per row

    # --- per trace: skip reasons and the root --------------------------------------
    no_ts = np.zeros(n_traces, dtype=bool)
    no_ts[tno[~s.has_ts]] = True
    is_root_cand = s.parent < 0
    cand = np.flatnonzero(is_root_cand & ~no_ts[tno])
    # Same key as the reference's min(): start, longest first, SERVER first, index.
    dur = s.end[cand] - s.start[cand]
    order = np.lexsort((cand, ~s.is_server[cand], -dur, s.start[cand], tno[cand]))
    cand_sorted = cand[order]
    firsts = _segment_starts(tno[cand_sorted])
    root_of = np.full(n_traces, -1, dtype=np.int64)
    root_of[tno[cand_sorted[firsts]]] = cand_sorted[firsts]
    has_root = root_of >= 0
    root_batch = np.zeros(n_traces, dtype=bool)
    root_batch[has_root] = s.is_batch[root_of[has_root]]
    valid = ~no_ts & has_root & ~root_batch
    fallback_tr = np.zeros(n_traces, dtype=bool)
    if n:
        staged = np.zeros(n_traces, dtype=bool)
        staged[tno[s.stage >= 0]] = True
        fallback_tr = valid & ~staged

    res = BulkResult(
        stage_names=names,
        traces=n_traces,
        batch_traces=int(np.count_nonzero(~no_ts & has_root & root_batch)),
        skipped_no_timestamps=int(np.count_nonzero(no_ts)),
        skipped_no_root=int(np.count_nonzero(~no_ts & ~has_root)),
        fallback_traces=int(np.count_nonzero(fallback_tr)),
    )
    if not valid.any():
        return res

    in_valid = valid[tno]
    root_row = root_of[tno]  # per span, its trace's root (-1 for skipped traces)
    rs = np.where(in_valid, s.start[np.maximum(root_row, 0)], 0)
    re_ = np.where(in_valid, np.maximum(s.end[np.maximum(root_row, 0)], rs), 0)

    # --- tree parent: the parent row, or the root for parentless spans inside it ---
    tp = np.full(n, -1, dtype=np.int64)
    attached = np.zeros(n, dtype=bool)
    member = in_valid & ~s.is_batch & (idx != root_row)
    # Not waited for (a CONSUMER under a PRODUCER, FOLLOWS_FROM or a link only): no one's
    # child, so the walk never reaches it or its subtree.
    detached = np.zeros(n, dtype=bool) if s.follows is None else s.follows.copy()
    if s.is_consumer is not None and s.is_producer is not None:
        has_p = np.flatnonzero(s.is_consumer & (s.parent >= 0))
        detached[has_p] |= s.is_producer[s.parent[has_p]]
    member &= ~detached
    with_parent = member & (s.parent >= 0)
    tp[with_parent] = s.parent[with_parent]
    orphan = member & (s.parent < 0)
    inside = orphan & (rs <= s.start) & (s.end <= re_)
    tp[inside] = root_row[inside]
    attached[inside] = True
    res.orphans_attached = int(np.count_nonzero(inside))
    res.orphans_dropped = int(np.count_nonzero(orphan & ~inside))

    # Children grouped by tree parent, in the reference's order: real children by
    # index, then the attached orphans (they were appended after).
    kids = np.flatnonzero(tp >= 0)
    kids = kids[np.lexsort((kids, attached[kids], tp[kids]))]
    kid_parent = tp[kids]
    bounds_lo = np.searchsorted(kid_parent, idx, side="left")
    bounds_hi = np.searchsorted(kid_parent, idx, side="right")

    fb_names: dict[int, int] = {}
    if fallback_tr.any():
        # Only the direct children of a fallback trace's root can be named after their
        # operation; fetch those names once.
        rows = np.flatnonzero(fallback_tr[tno] & (tp >= 0) & (tp == root_row) & ~s.is_outcall)
        if len(rows) and names_for is not None:
            for row, (name, route) in zip(rows.tolist(), names_for(rows), strict=True):
                fb_names[row] = code(fallback_stage_name(name, route))
    fb = fallback_tr[tno]

    cs = np.zeros(n, dtype=np.int64)
    ce = np.zeros(n, dtype=np.int64)
    ws = cs  # walk starts; a separate array only when some span is in the background
    bg_all = s.background if s.background is not None and s.background.any() else None
    if bg_all is not None:
        ws = np.zeros(n, dtype=np.int64)
        last_launch = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    eff = np.full(n, -1, dtype=np.int64)
    src = np.full(n, -1, dtype=np.int64)
    tparent = np.full(n, -1, dtype=np.int64)
    top = np.zeros(n, dtype=bool)
    on_path = np.zeros(n, dtype=bool)
    upper = np.zeros(n, dtype=np.int64)
    crit = np.zeros(n, dtype=np.int64)
    cursor_end = np.zeros(n, dtype=np.int64)
    skew = np.zeros(n_traces, dtype=np.int64)

    roots = root_of[valid]
    ws[roots] = s.start[roots]
    cs[roots] = s.start[roots]
    ce[roots] = np.maximum(s.end[roots], s.start[roots])
    eff[roots] = s.stage[roots]
    src[roots] = np.where(s.stage[roots] >= 0, roots, -1)
    top[roots] = s.stage[roots] >= 0
    on_path[roots] = True
    upper[roots] = ce[roots]
    cursor_end[roots] = ce[roots]
    levels = [roots]
    frontier = roots
    while len(frontier):
        lo_b, hi_b = bounds_lo[frontier], bounds_hi[frontier]
        counts = hi_b - lo_b
        total = int(counts.sum())
        if total == 0:
            break
        # Children of the frontier, parent by parent in frontier order.
        offs = np.repeat(lo_b - np.cumsum(counts) + counts, counts) + np.arange(total)
        c = kids[offs]
        p = kid_parent[offs]
        st = s.start[c]
        en = np.maximum(s.end[c], st)
        lo, hi = cs[p], ce[p]
        ignore = (en < lo) | (st > hi)
        if ignore.any():
            np.add.at(skew, tno[c[ignore]], 1)
            keep = ~ignore
            c, p, st, en, lo, hi = c[keep], p[keep], st[keep], en[keep], lo[keep], hi[keep]
        clipped = (st < lo) | (en > hi)
        if clipped.any():
            np.add.at(skew, tno[c[clipped]], 1)
            st = np.maximum(st, lo)
            en = np.minimum(en, hi)
        cs[c], ce[c] = st, en
        tparent[c] = p
        level = c
        if bg_all is not None:
            # siblings share a level: each parent's last background launch is known here
            bg = bg_all[c]
            np.maximum.at(last_launch, p[bg], st[bg])
            st = np.where(bg, np.minimum(np.maximum(st, last_launch[p]), en), st)
            ws[c] = st

        own = s.stage[c]
        fbc = fb[c]
        if fbc.any():
            f = np.flatnonzero(fbc)
            fc = c[f]
            out = s.is_outcall[fc] | s.is_db[fc] | (s.service[fc] != s.service[root_row[fc]])
            named = np.array([fb_names.get(r, -1) for r in fc.tolist()], dtype=np.int64)
            under_root = p[f] == root_row[fc]
            own = own.copy()
            own[f] = np.where(out, down, np.where(under_root, named, -1))
        eff_p = eff[p]
        inherit = (own < 0) | (own == eff_p) | (eff_p == down)
        eff[c] = np.where(inherit, eff_p, own)
        src[c] = np.where(inherit, src[p], c)
        new = np.flatnonzero(~inherit)
        if len(new):
            # Is the stage already open further up? Walk the chain of stage-opening
            # spans (a few per trace) for all new openings at once.
            stage_new = own[new]
            j = src[p[new]]
            found = np.zeros(len(new), dtype=bool)
            active = j >= 0
            while active.any():
                jj = j[active]
                found[active] |= eff[jj] == stage_new[active]
                pj = tparent[jj]
                nxt = np.where(pj >= 0, src[np.maximum(pj, 0)], -1)
                j[active] = nxt
                active = (j >= 0) & ~found
            top[c[new[~found]]] = True

        # The walk: children by (parent, end desc, start, index); each parent's chain
        # starts at its first child eligible at its bound and goes successor by successor.
        w = np.lexsort((c, st, -en, p))
        c, p, st, en = c[w], p[w], st[w], en[w]
        firsts = _segment_starts(p)
        find = _first_at_most(np.maximum(en - BACK_TO_BACK_NS, st + 1), firsts)
        seg = np.cumsum(firsts) - 1
        succ = find(seg, st)
        heads = p[firsts]
        live = np.flatnonzero(on_path[heads])
        head = find(live, upper[heads[live]])
        live, head = live[head >= 0], head[head >= 0]
        sel = _chains(head, succ)
        # the cursor before each path child: the parent's bound, then its predecessor's start
        cursor = np.zeros(len(c), dtype=np.int64)
        cursor[head] = upper[heads[live]]
        pred = np.flatnonzero(sel & (succ >= 0))
        cursor[succ[pred]] = st[pred]
        on_path[c] = sel
        u = np.where(sel, np.minimum(en, cursor), en)
        upper[c] = u
        cursor_end[c] = u
        if sel.any():
            np.add.at(crit, p[sel], cursor[sel] - u[sel])
            # the last cursor of each parent: its last path child's start
            np.minimum.at(cursor_end, p[sel], st[sel])
        frontier = level
        levels.append(frontier)

    tree = np.concatenate(levels)
    path = tree[on_path[tree]]
    crit[path] += cursor_end[path] - ws[path]
    res.skewed_spans = int(skew.sum())

    _stage_rows(res, s, tree, tno, root_of, eff, top, crit, cs, ce, unattributed)
    if s.op is not None:
        _operation_rows(
            res, s, s.op, levels, tno, root_of, eff, tparent, crit, cs, ce, unattributed
        )
    res.stage_names = names
    vt = np.flatnonzero(valid)
    r = root_of[vt]
    res.req_trace = vt.astype(np.int64)
    res.req_root = r
    res.req_start = cs[r]
    res.req_duration = ce[r] - cs[r]
    res.req_span_count = t_size[vt]
    res.req_skewed = skew[vt]
    return res


def _stage_rows(
    res: BulkResult,
    s: SpanArrays,
    tree: I64,
    tno: I64,
    root_of: I64,
    eff: I64,
    top: B,
    crit: I64,
    cs: I64,
    ce: I64,
    unattributed: int,
) -> None:
    """Per (trace, stage): path time from every span, the rest from top-level spans."""
    n_codes = len(res.stage_names) + 1
    bfs_rank = np.empty(len(eff), dtype=np.int64)
    bfs_rank[tree] = np.arange(len(tree))

    charged = tree[crit[tree] != 0]
    c_key = tno[charged] * n_codes + np.where(eff[charged] >= 0, eff[charged], unattributed)
    tops = tree[top[tree]]
    t_key = tno[tops] * n_codes + eff[tops]
    keys, inv = np.unique(np.concatenate([c_key, t_key]), return_inverse=True)
    k = len(keys)
    crit_sum = np.zeros(k, dtype=np.int64)
    np.add.at(crit_sum, inv[: len(charged)], crit[charged])
    t_inv = inv[len(charged) :]
    has_top = np.zeros(k, dtype=bool)
    has_top[t_inv] = True

    # Wall: union of each (trace, stage)'s top-level intervals.
    o = np.lexsort((ce[tops], cs[tops], t_inv))
    g, a, b = t_inv[o], cs[tops][o], ce[tops][o]
    first = _segment_starts(g)
    prev_max, has_prev = _seg_prefix_max_excl(b, first)
    start_eff = np.where(has_prev, np.maximum(a, prev_max), a)
    piece = np.maximum(b - start_eff, 0)
    wall = np.zeros(k, dtype=np.int64)
    np.add.at(wall, g, piece)

    def measured(v: I64) -> tuple[I64, B]:
        ok = v[tops] >= 0
        total = np.zeros(k, dtype=np.int64)
        np.add.at(total, t_inv[ok], v[tops][ok])
        any_ = np.zeros(k, dtype=bool)
        any_[t_inv[ok]] = True
        return total, any_

    cpu, cpu_any = measured(s.cpu_ns)
    gpu, gpu_any = measured(s.gpu_ns)

    # The declared kind: the first top-level span (in walk order) that declares one.
    kind = np.full(k, -1, dtype=np.int64)
    dk = s.time_kind[tops] >= 0
    if dk.any():
        cand = np.flatnonzero(dk)
        o2 = np.lexsort((bfs_rank[tops][cand], t_inv[cand]))
        cand = cand[o2]
        f2 = _segment_starts(t_inv[cand])
        kind[t_inv[cand[f2]]] = s.time_kind[tops][cand[f2]]

    stage_code = keys % n_codes
    default = np.array(
        [cv.TIME_KINDS.index(cv.default_time_kind(nm)) for nm in res.stage_names],
        dtype=np.int64,
    )
    kind = np.where(kind >= 0, kind, default[stage_code])
    trace_no = keys // n_codes
    res.st_trace = trace_no
    res.st_root = root_of[trace_no]
    res.st_stage = stage_code
    res.st_kind = kind
    res.st_critical = crit_sum
    res.st_wall = np.where(has_top, wall, crit_sum)
    res.st_cpu = np.where(has_top & cpu_any, cpu, -1)
    res.st_gpu = np.where(has_top & gpu_any, gpu, -1)


def _operation_rows(
    res: BulkResult,
    s: SpanArrays,
    op: I64,
    levels: list[I64],
    tno: I64,
    root_of: I64,
    eff: I64,
    tparent: I64,
    crit: I64,
    cs: I64,
    ce: I64,
    unattributed: int,
) -> None:
    """Per (trace, stage, operation): ``operations.request_operations`` for every request.

    A call is a span whose tree parent is of another operation; its spans are found
    level by level (top-down), its subtree's path time bottom-up.
    """
    n = len(op)
    call = np.arange(n, dtype=np.int64)  # the call each span belongs to
    for level in levels[1:]:
        p = tparent[level]
        same = op[p] == op[level]
        call[level] = np.where(same, call[p], level)
    sub = crit.copy()
    for level in reversed(levels[1:]):
        np.add.at(sub, tparent[level], sub[level])
    tree = np.concatenate(levels)
    calls = tree[call[tree] == tree]
    err = np.zeros(n, dtype=bool)
    if s.is_error is not None:
        bad = tree[s.is_error[tree]]
        err[call[bad]] = True
    # Overlap: calls of one operation under one parent, by (start, end, row).
    kids = calls[tparent[calls] >= 0]
    o = np.lexsort((kids, ce[kids], cs[kids], op[kids], tparent[kids]))
    kids = kids[o]
    grp = _segment_starts(tparent[kids] * (len(s.op_names) + 1) + op[kids])
    reach, has_prev = _seg_prefix_max_excl(ce[kids], grp)
    over = np.zeros(n, dtype=bool)
    over[kids] = has_prev & (reach - BACK_TO_BACK_NS > cs[kids])

    n_codes = len(res.stage_names) + 1
    n_ops = len(s.op_names) + 1
    stage = np.where(eff[tree] >= 0, eff[tree], unattributed)
    keys, inv = np.unique((tno[tree] * n_codes + stage) * n_ops + op[tree], return_inverse=True)
    k = len(keys)

    def total(values: I64 | B, where: B) -> I64:
        out = np.zeros(k, dtype=np.int64)
        np.add.at(out, inv[where], values[where])
        return out

    is_call = call[tree] == tree
    res.op_critical = total(crit[tree], np.ones(len(tree), dtype=bool))
    res.op_calls = total(np.ones(len(tree), dtype=np.int64), is_call)
    res.op_on_path = total((sub[tree] > 0).astype(np.int64), is_call)
    res.op_overlapping = total(over[tree].astype(np.int64), is_call)
    res.op_errors = total(err[tree].astype(np.int64), is_call)
    res.op_code = keys % n_ops
    res.op_stage = (keys // n_ops) % n_codes
    res.op_root = root_of[keys // n_ops // n_codes]
