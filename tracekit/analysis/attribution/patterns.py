"""Patterns in one trace, each named with its evidence; and how often they occur in a release.

:func:`trace_patterns` takes one analysed trace (its :class:`~.critical_path.TraceInput`,
the :class:`~.critical_path.TraceAnalysis` of :func:`~.critical_path.analyse_trace` and
each span's attributes) and returns its :class:`Pattern` findings. It builds on
:mod:`.operations`' calls (:func:`~.operations.trace_calls`): the same operation names,
the same calls (a CLIENT span and its callee's SERVER span are one), the same groups of
calls under one parent and the same failed spans (:func:`~.operations.span_failed`) as
the operation rows that ``explain`` shows and the store holds.

- ``n_plus_one``: a parent makes at least :data:`N_PLUS_ONE_MIN` serial calls to one
  operation. Only calls that overlap no other call of the group count: a fan-out or a
  worker pool (calls that overlap) is concurrency, not an N+1.
- ``retry``: a parent calls an operation again, after the previous call of it ended,
  when that call failed (or timed out); a call with ``http.request.resend_count`` is a
  retry whatever came before it.
- ``timeout``: a failed span ended at a limit: its duration lies just above a round
  figure (:data:`ROUND_LIMITS`, within :data:`LIMIT_TOLERANCE`) that something else in
  the trace also hit (a failed call of the same operation under the same parent, a
  failed ancestor of the same duration) or while a child was still running; or the span
  says so (``error.type`` naming a timeout, HTTP 408/504, gRPC DEADLINE_EXCEEDED).
- ``error_origin``: where a failure began when failing spans above it mask it: from
  each topmost failing span, follow the failing children (of failing siblings, the one
  that failed first: earliest end) down until no child failed; a span that failed by
  timeout (a child still running when it ended, or at its limit with a child that ran as
  long) passes the blame to the child that used up the time, even one whose status is
  OK. Named only when it lies below where the failure showed.

Every threshold is taken from the trace alone: no configuration, no other traces.
:func:`release_patterns` runs the same detection over up to :data:`RELEASE_SAMPLE` traces
of a release (or of a cohort of it, such as the tail) and counts what it found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from tracekit import conventions as cv
from tracekit.analysis.attribution import critical_path as cp
from tracekit.analysis.attribution import per_request as attribution
from tracekit.analysis.attribution.operations import Calls, trace_calls
from tracekit.analysis.store import Store
from tracekit.analysis.store.span_attributes import span_attributes

N_PLUS_ONE: Final = "n_plus_one"
RETRY: Final = "retry"
TIMEOUT: Final = "timeout"
ERROR_ORIGIN: Final = "error_origin"
KINDS: Final = (N_PLUS_ONE, RETRY, TIMEOUT, ERROR_ORIGIN)
"""Pattern kinds, in the order they are reported."""

N_PLUS_ONE_MIN: Final = 5
"""Serial calls of one operation under one parent that make an N+1. Sentry's N+1
detector's default count, and low enough that a loop over a short page of ids shows;
HotROD's serial dispatch makes 13 and 10."""
ROUND_LIMITS: Final = (1.0, 2.0, 2.5, 3.0, 5.0)
"""Mantissas of the round figures a limit is set to (10 ms, 250 ms, 3 s, 30 s, ...)."""
MIN_LIMIT_NS: Final = 10_000_000
"""10 ms: shorter durations lie near some round figure by chance."""
LIMIT_TOLERANCE: Final = 0.05
"""A span hit limit L when it lasted L to L·1.05: a timer fires late (scheduling, the
work to end the span), never early."""
RELEASE_SAMPLE: Final = 200
"""Traces :func:`release_patterns` examines at most per release (or cohort)."""
_SHOWN_DURATIONS = 4

_DECLARED_TIMEOUT_WORDS = ("timeout", "timed out", "deadline")
_TIMEOUT_HTTP = frozenset({408, 504})
_GRPC_DEADLINE_EXCEEDED = 4
_CALL_KINDS = frozenset({"CLIENT", "PRODUCER"})
_KEYS = (
    cv.HTTP_RESPONSE_STATUS_CODE,
    cv.HTTP_REQUEST_RESEND_COUNT,
    cv.ERROR_TYPE,
    cv.RPC_GRPC_STATUS_CODE,
)
NS_PER_MS = 1_000_000.0


@dataclass(frozen=True)
class Pattern:
    """One pattern found in a trace, with the figures that show it."""

    kind: str
    """One of :data:`KINDS`."""
    span_id: str
    """``n_plus_one``: the calling parent; ``retry``/``timeout``: the first failed call;
    ``error_origin``: the span where the failure began."""
    service: str
    operation: str
    """The operation repeated, retried, timed out, or where the failure began."""
    count: int
    """Serial calls, retries, calls that timed out; for ``error_origin`` the failing
    spans above it that masked it."""
    evidence: str


def wanted_attributes(text: str | None) -> dict[str, Any]:
    """The attributes the detection reads, from a span's attributes JSON."""
    if not text:
        return {}
    try:
        attrs = json.loads(text)
    except ValueError:
        return {}
    return {k: attrs[k] for k in _KEYS if k in attrs} if isinstance(attrs, dict) else {}


def trace_patterns(
    t: cp.TraceInput,
    a: cp.TraceAnalysis,
    attributes: Sequence[Mapping[str, Any]],
    calls: Calls | None = None,
) -> list[Pattern]:
    """The patterns of one analysed trace, in :data:`KINDS` order, then as found (parents
    before children). ``attributes`` per span, aligned with ``t``, need only
    :func:`wanted_attributes`' keys; ``calls``: :func:`~.operations.trace_calls` of the
    trace, when made already."""
    tr = _Trace(t, a, attributes, trace_calls(t, a) if calls is None else calls)
    return tr.n_plus_one() + tr.retries() + tr.timeouts() + tr.error_origins()


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _ms(ns: float) -> str:
    return f"{ns / NS_PER_MS:.1f} ms"


def round_limit(duration_ns: int) -> int | None:
    """The round figure (:data:`ROUND_LIMITS`) that ``duration_ns`` lies just above,
    within :data:`LIMIT_TOLERANCE`; None when it lies near none."""
    if duration_ns < MIN_LIMIT_NS:
        return None
    scale = 1_000_000  # 1 ms
    while scale * 10 <= duration_ns:
        scale *= 10
    for m in reversed(ROUND_LIMITS):
        limit = int(m * scale)
        if limit <= duration_ns <= limit * (1 + LIMIT_TOLERANCE):
            return limit
    return None


class _Trace:
    """One trace's walked tree with its calls (:class:`~.operations.Calls`)."""

    def __init__(
        self,
        t: cp.TraceInput,
        a: cp.TraceAnalysis,
        attributes: Sequence[Mapping[str, Any]],
        calls: Calls,
    ) -> None:
        self.t, self.a, self.attrs = t, a, attributes
        tp = a.tree_parent
        # Parents first, siblings by start: the order ties are broken in below.
        self.tree = sorted(calls.tree, key=lambda i: (a.depth[i], a.clipped_start[i], i))
        self.kids: dict[int, list[int]] = {}
        for i in self.tree:
            p = tp[i]
            if p is not None:
                self.kids.setdefault(p, []).append(i)
        self.failing = list(t.error or [False] * len(tp))
        self.op = calls.ops
        self.sub = calls.path_ns
        self.call_of = calls.call_of
        self.call_failed = calls.failed
        self.groups = calls.groups
        self.limit = {i: self._limit(i) for i in self.tree if self.failing[i]}

    # --- facts per span --------------------------------------------------------
    def _dur(self, i: int) -> int:
        s, e = self.t.start[i], self.t.end[i]
        return 0 if s is None or e is None else max(0, e - s)

    def _end(self, i: int) -> int:
        return self.t.end[i] or 0

    def declared_timeout(self, i: int) -> str | None:
        """How span ``i`` says it timed out, or None."""
        at = self.attrs[i]
        err = str(at.get(cv.ERROR_TYPE) or "").lower()
        if any(w in err for w in _DECLARED_TIMEOUT_WORDS):
            return f"error.type {at[cv.ERROR_TYPE]}"
        code = _int(at.get(cv.HTTP_RESPONSE_STATUS_CODE))
        if code in _TIMEOUT_HTTP:
            return f"HTTP {code}"
        if _int(at.get(cv.RPC_GRPC_STATUS_CODE)) == _GRPC_DEADLINE_EXCEEDED:
            return "gRPC DEADLINE_EXCEEDED"
        return None

    def _limit(self, i: int) -> int | None:
        return round_limit(self._dur(i))

    def still_running(self, i: int) -> list[int]:
        """Children of ``i`` that ended after it (beyond the back-to-back tolerance)."""
        end = self._end(i)
        return [k for k in self.kids.get(i, []) if self._end(k) > end + cp.BACK_TO_BACK_NS]

    def timeout_evidence(self, i: int) -> str | None:
        """Why failed span ``i`` timed out (see the module docstring), or None."""
        declared = self.declared_timeout(i)
        if declared:
            return f"says so ({declared})"
        limit = self.limit.get(i)
        if limit is None:
            return None
        lo, hi = limit, limit * (1 + LIMIT_TOLERANCE)
        running = self.still_running(i)
        if running:
            return f"ended at a {_ms(limit)} limit while {len(running)} child span(s) still ran"
        p = self.a.tree_parent[i]
        peers = [
            k
            for k in (self.kids.get(p, []) if p is not None else [])
            if k != i and self.op[k] == self.op[i] and self.failing[k]
        ]
        if any(lo <= self._dur(k) <= hi for k in peers):
            return f"ended at a {_ms(limit)} limit that a failed call beside it also hit"
        while p is not None:
            if self.failing[p] and lo <= self._dur(p) <= hi:
                return f"ended at a {_ms(limit)} limit that its caller also hit"
            p = self.a.tree_parent[p]
        return None

    def failed_by_timeout(self, i: int) -> int | None:
        """The child that used up failed span ``i``'s time when ``i`` failed by timeout
        (a child still running when it ended, or, ``i`` at a limit, a child that ran as
        long); None otherwise."""
        if not self.failing[i]:
            return None
        running = self.still_running(i)
        if running:
            return max(running, key=lambda k: (self._end(k), -(self.t.start[k] or 0)))
        if self.limit.get(i) is None and self.declared_timeout(i) is None:
            return None
        kids = self.kids.get(i, [])
        if not kids:
            return None
        last = max(kids, key=lambda k: (self._end(k), -(self.t.start[k] or 0)))
        slack = max(MIN_LIMIT_NS // 10, int(self._dur(i) * LIMIT_TOLERANCE))
        return last if self._end(last) >= self._end(i) - slack else None

    def _who(self, i: int) -> str:
        return " ".join(self.op[i])

    # --- groups of calls -------------------------------------------------------
    def _overlapping(self, calls: list[int]) -> list[bool]:
        """Per call of a group (in its start order): it overlaps another call of the group,
        on the times the group was ordered by (clipped to the parent)."""
        cs, ce = self.a.clipped_start, self.a.clipped_end
        n = len(calls)
        out = [False] * n
        latest = None
        for k, c in enumerate(calls):
            start, end = cs[c] or 0, ce[c] or 0
            if latest is not None and start < latest - cp.BACK_TO_BACK_NS:
                out[k] = True
            if k + 1 < n and (cs[calls[k + 1]] or 0) < end - cp.BACK_TO_BACK_NS:
                out[k] = True
            latest = end if latest is None else max(latest, end)
        return out

    def _is_call_out(self, i: int) -> bool:
        p = self.a.tree_parent[i]
        return (
            self.t.kind[i] in _CALL_KINDS
            or self.t.is_db[i]
            or (p is not None and self.t.service[i] != self.t.service[p])
        )

    # --- the patterns ----------------------------------------------------------
    def n_plus_one(self) -> list[Pattern]:
        out = []
        for (p, op), calls in self.groups.items():
            if len(calls) < N_PLUS_ONE_MIN or not self._is_call_out(calls[0]):
                continue
            serial = [c for c, o in zip(calls, self._overlapping(calls), strict=True) if not o]
            if len(serial) < N_PLUS_ONE_MIN:
                continue
            path = sum(self.sub[c] for c in serial)
            wall = sum(self._dur(c) for c in serial)
            overlapped = len(calls) - len(serial)
            more = f" ({overlapped} more overlapped)" if overlapped else ""
            out.append(
                Pattern(
                    N_PLUS_ONE,
                    self.t.span_id[p],
                    *op,
                    len(serial),
                    f"{len(serial)} serial calls of {' '.join(op)} under {self._who(p)}{more}, "
                    f"{_ms(path)} on the path ({_ms(wall)} in all)",
                )
            )
        return out

    def retries(self) -> list[Pattern]:
        out = []
        for (p, op), calls in self.groups.items():
            retried: list[int] = []
            failed_before = 0
            resent = 0
            for prev, c in zip(calls, calls[1:], strict=False):
                serial = (self.t.start[c] or 0) >= self._end(prev) - cp.BACK_TO_BACK_NS
                after_failure = serial and self.call_failed.get(prev, False)
                declared = (_int(self.attrs[c].get(cv.HTTP_REQUEST_RESEND_COUNT)) or 0) > 0
                if after_failure or declared:
                    retried.append(prev)
                    failed_before += after_failure
                    resent += declared and not after_failure
            if not retried:
                continue
            lost = sum(self._dur(c) for c in retried if self.call_failed.get(c, False))
            why = []
            if failed_before:
                why.append(
                    f"{failed_before} after a failed call ({_ms(lost)} spent in failed calls)"
                )
            if resent:
                why.append(f"{resent} marked {cv.HTTP_REQUEST_RESEND_COUNT}")
            out.append(
                Pattern(
                    RETRY,
                    self.t.span_id[retried[0]],
                    *op,
                    len(retried),
                    f"{len(retried)} repeated calls of {' '.join(op)} under {self._who(p)}: "
                    + "; ".join(why),
                )
            )
        return out

    def timeouts(self) -> list[Pattern]:
        found: dict[tuple[int | None, tuple[str, str]], list[tuple[int, str]]] = {}
        for i in self.tree:
            if not self.failing[i]:
                continue
            why = self.timeout_evidence(i)
            if why is None:
                continue
            # A caller that timed out because its callee did is the callee's timeout.
            limit = self.limit.get(i)
            if limit is not None and any(
                self.failing[k] and self.limit.get(k) == limit and self.timeout_evidence(k)
                for k in self.kids.get(i, [])
            ):
                continue
            found.setdefault((self.a.tree_parent[i], self.op[i]), []).append((i, why))
        out = []
        for (_, op), hits in found.items():
            first, why = hits[0]
            durations = ", ".join(_ms(self._dur(i)) for i, _ in hits[:_SHOWN_DURATIONS])
            more = ", …" if len(hits) > _SHOWN_DURATIONS else ""
            n = len(hits)
            out.append(
                Pattern(
                    TIMEOUT,
                    self.t.span_id[first],
                    *op,
                    n,
                    f"{n} failed call{'s' if n > 1 else ''} of {' '.join(op)} {why} "
                    f"({durations}{more})",
                )
            )
        return out

    def error_origins(self) -> list[Pattern]:
        tp = self.a.tree_parent
        out = []
        for start in self.tree:
            p = tp[start]
            if not self.failing[start] or (p is not None and self.failing[p]):
                continue
            x, chain, blamed = start, [start], []
            while True:
                y = self.failed_by_timeout(x)
                if y is not None:
                    blamed.append((x, y))
                else:
                    failing = [k for k in self.kids.get(x, []) if self.failing[k]]
                    if not failing:
                        break
                    y = min(failing, key=lambda k: (self._end(k), self.t.start[k] or 0, k))
                chain.append(y)
                x = y
            if x == start:
                continue
            above = [i for i in chain[:-1] if self.failing[i]]
            began = (
                f"failed at {_ms(self._end(x) - self.a.start_ns)}"
                if self.failing[x]
                else f"status OK, ran {_ms(self._dur(x))}"
            )
            why = "; ".join(
                f"{self._who(c)} timed out after {_ms(self._dur(c))} waiting on it"
                for c, k in blamed
                if k == x
            )
            masked = ", ".join(self._who(i) for i in above[:3]) + (", …" if len(above) > 3 else "")
            out.append(
                Pattern(
                    ERROR_ORIGIN,
                    self.t.span_id[x],
                    *self.op[x],
                    len(above),
                    f"the failure began at {self._who(x)} ({began}{'; ' + why if why else ''}), "
                    f"masked by {len(above)} failing span(s) above it: {masked}",
                )
            )
        return out


# --- in a release ------------------------------------------------------------------


@dataclass(frozen=True)
class PatternCount:
    """How often one pattern occurred in the traces examined."""

    kind: str
    service: str | None
    """None in the per-kind counts."""
    operation: str | None
    traces: int
    """Traces with at least one finding."""
    share: float
    """``traces`` over the traces examined."""
    occurrences: int
    """Findings, summed over the traces (a trace may hold several)."""


@dataclass
class ReleasePatterns:
    """The patterns of (a sample of) one release's requests."""

    release: str
    examined: int
    """Traces the detection ran on (at most :data:`RELEASE_SAMPLE`)."""
    available: int
    """Requests of the release (or of the cohort given) it sampled from."""
    kinds: list[PatternCount] = field(default_factory=list)
    """Per kind, in :data:`KINDS` order (kinds never found left out)."""
    operations: list[PatternCount] = field(default_factory=list)
    """Per (kind, service, operation), most traces first."""


_RELEASE_IDS_SQL = "SELECT trace_id FROM requests WHERE release = $release ORDER BY trace_id"


def _evenly(ids: list[str], n: int) -> list[str]:
    """At most ``n`` of the sorted ``ids``, evenly spaced (trace ids are random already,
    so a stride is as good a sample as another, and the same store gives the same one)."""
    if len(ids) <= n:
        return ids
    step = (len(ids) - 1) / (n - 1) if n > 1 else 0
    return [ids[round(k * step)] for k in range(n)]


def release_patterns(
    store: Store,
    release: str,
    trace_ids: Sequence[str] | None = None,
    *,
    limit: int = RELEASE_SAMPLE,
) -> ReleasePatterns:
    """Pattern counts of one release: ``release_patterns(store, "v2", tail_ids, limit=200)``.

    ``trace_ids``: a cohort of the release's requests (e.g. the tail's) to sample from;
    None: all its requests. At most ``limit`` of them are examined, evenly spaced in
    trace-id order (deterministic). Returns per kind and per (kind, service, operation)
    the traces with a finding, their share of those examined, and the findings summed.
    Traces the walk skips (batches, spans without timestamps) count as examined with
    nothing found.
    """
    if trace_ids is None:
        pool = [str(r[0]) for r in store.run(_RELEASE_IDS_SQL, {"release": release})]
    else:
        pool = sorted(set(trace_ids))
    ids = _evenly(pool, max(limit, 0))
    result = ReleasePatterns(release, examined=len(ids), available=len(pool))
    if not ids:
        return result
    kinds: dict[str, list[int]] = {}
    ops: dict[tuple[str, str, str], list[int]] = {}
    for found in _findings(store, ids):
        for p in found:
            kinds.setdefault(p.kind, [0, 0])[1] += 1
            ops.setdefault((p.kind, p.service, p.operation), [0, 0])[1] += 1
        for kind in {p.kind for p in found}:
            kinds[kind][0] += 1
        for key in {(p.kind, p.service, p.operation) for p in found}:
            ops[key][0] += 1
    n = len(ids)
    result.kinds = [
        PatternCount(k, None, None, kinds[k][0], kinds[k][0] / n, kinds[k][1])
        for k in KINDS
        if k in kinds
    ]
    result.operations = sorted(
        (PatternCount(k, s, o, c[0], c[0] / n, c[1]) for (k, s, o), c in ops.items()),
        key=lambda pc: (-pc.traces, KINDS.index(pc.kind), pc.service or "", pc.operation or ""),
    )
    return result


def _findings(store: Store, ids: list[str]) -> list[list[Pattern]]:
    """The patterns of each trace of ``ids`` that the walk analyses."""
    c = attribution.fetch_spans(store, ids)
    attrs = {key: wanted_attributes(text) for key, text in span_attributes(store, ids).items()}
    out = []
    tids = c["trace_id"]
    lo = 0
    while lo < len(tids):
        hi = lo
        while hi < len(tids) and tids[hi] == tids[lo]:
            hi += 1
        t = attribution.trace_input(c, lo, hi)
        a = cp.analyse_trace(t)
        if not isinstance(a, str):
            span_attrs = [attrs.get((tids[lo], sid), {}) for sid in t.span_id]
            out.append(trace_patterns(t, a, span_attrs))
        lo = hi
    return out
