"""What a span *does*, as one name: the operation, the unit "downstream grew" is split by.

A stage says which part of a request a span belongs to (``downstream``); the operation
says what was called there: ``(service, operation)`` with ids masked, so the 13 calls of
``redis-manual GetDriver`` in one HotROD request are one operation called 13 times, and
``GET /users/123`` and ``GET /users/456`` are one.

A CLIENT span names what it calls, not itself: ``HTTP GET`` from HotROD's frontend to
the customer service and to the route service are two operations. When the called
service traced its side, the client span takes its child SERVER span's service and name
(``customer`` / ``GET /customer``); otherwise the server's address and the URL template
(``url.template``, :data:`tracekit.conventions.URL_TEMPLATE`, else the path of ``url.full`` with ids masked) stand in for them.

A call failed when one of its spans did (:func:`span_failed`): status ERROR, or status
UNSET on an HTTP span whose response code the HTTP semantic conventions call an error
(a CLIENT span's 4xx and 5xx, a SERVER span's 5xx). The conventions tell the
instrumentation to set ERROR there; some leave the status unset (hand-made spans, older
or partial instrumentations), and the request's own error flag already counts its 5xx,
so tracekit infers what the conventions would have set. A status OK stands: someone
decided that response was fine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.attribution.critical_path import (
    BACK_TO_BACK_NS,
    TraceAnalysis,
    TraceInput,
    mask_ids,
)

OPERATION_MAX: Final = 96
"""Longest operation name kept (masked names rarely come near it; ids are masked first)."""


HTTP_ERROR_FROM: Final = {"CLIENT": 400, "SERVER": 500}
"""Per span kind, the lowest ``http.response.status_code`` that fails a span whose status
is UNSET: the HTTP semantic conventions' rule for when instrumentation sets ERROR."""


def span_failed(kind: str, status: str, http_status: float | None) -> bool:
    """Whether one span failed: status ERROR, or status UNSET with an HTTP error code
    for its kind (:data:`HTTP_ERROR_FROM`; ``http_status`` None: no code)."""
    if status == "ERROR":
        return True
    if status != "UNSET" or http_status is None:
        return False
    limit = HTTP_ERROR_FROM.get(kind)
    return limit is not None and http_status >= limit


def failed_rows(
    status_error: npt.NDArray[np.bool_],
    http_status: npt.NDArray[np.float64],
    is_client: npt.NDArray[np.bool_],
    is_server: npt.NDArray[np.bool_],
) -> npt.NDArray[np.bool_]:
    """:func:`span_failed` for many rows: ``http_status`` holds the code of spans whose
    status is UNSET and NaN for every other row (no code, or a status set)."""
    with np.errstate(invalid="ignore"):
        client = is_client & (http_status >= HTTP_ERROR_FROM["CLIENT"])
        server = is_server & (http_status >= HTTP_ERROR_FROM["SERVER"])
    return np.asarray(status_error | client | server, dtype=bool)


def operation_name(name: str) -> str:
    """A span name as an operation: white space made one, ids masked, length bounded."""
    return mask_ids(name)[:OPERATION_MAX] or "(unnamed)"


def client_target(
    method: str | None,
    address: str | None,
    port: str | int | None,
    url_template: str | None,
    url_full: str | None,
) -> tuple[str, str] | None:
    """``(service, operation)`` of a CLIENT span whose callee left no SERVER span: the
    server's address (``host:port``) and the method with the URL template or the masked
    path. None when the span names no server at all."""
    path = url_template
    if not path and url_full:
        try:
            parts = urlsplit(url_full)
        except ValueError:
            parts = None
        if parts is not None:
            path = parts.path or "/"
            address = address or parts.hostname
            port = port or parts.port
    if not address:
        return None
    target = f"{address}:{port}" if port not in (None, "") else address
    what = " ".join(x for x in (method, path) if x) or ""
    return target[:OPERATION_MAX], operation_name(what) if what else "(call)"


def span_operation(
    service: str | None,
    name: str,
    kind: str,
    callee: tuple[str | None, str] | None = None,
    target: tuple[str, str] | None = None,
) -> tuple[str, str]:
    """``(service, operation)`` of one span.

    ``callee``: the (service, name) of the CLIENT span's child SERVER span, when the
    called service traced its side; ``target``: :func:`client_target` of the span. A
    CLIENT span takes the callee's names, else the target's, else its own; every other
    span is its service and its own name.
    """
    if kind == "CLIENT":
        if callee is not None:
            return (callee[0] or service or "(unknown)"), operation_name(callee[1])
        if target is not None:
            return target
    return (service or "(unknown)"), operation_name(name)


ClientAttrs = tuple[str | None, str | None, str | None, str | None, str | None]
"""A CLIENT span's ``http.request.method``, ``server.address``, ``server.port``,
``url.template`` and ``url.full`` (None where absent): the inputs of :func:`client_target`."""


@dataclass(frozen=True, slots=True)
class OperationRow:
    """One operation of one request, beneath one stage (a row of ``request_operations``).

    A *call* is a span of the operation whose parent in the walked tree is not of the
    same operation: a CLIENT span and its callee's SERVER span (which name the same
    operation) are one call, and so is a span nested in a span of its own name.
    """

    stage: str
    """The stage of the operation's spans here: their effective stage, else ``unattributed``."""
    service: str
    operation: str
    critical_ns: int
    """Time on the request's critical path charged to the operation's spans themselves
    (their own time, not their children's): a CLIENT span's own time and its callee SERVER
    span's own time both count, so ``customer GET /customer`` carries the whole call."""
    calls: int
    calls_on_path: int
    """Calls with time on the critical path in their subtree (the walk went through them)."""
    overlapping: int
    """Calls that started while an earlier call of the operation under the same parent
    still ran (by more than :data:`BACK_TO_BACK_NS`); 0: the calls were serial."""
    errors: int
    """Calls in which a span of the call (the CLIENT span or its SERVER span) failed
    (:func:`span_failed`)."""

    @property
    def serial(self) -> bool:
        return self.overlapping == 0


def span_operations(t: TraceInput) -> list[tuple[str, str]]:
    """``(service, operation)`` of every span of one trace (see :func:`span_operation`).

    A CLIENT span's callee is its child SERVER span in the trace (the earliest, ties by
    position, when there are several), found whatever the walk does with it.
    """
    n = len(t.span_id)
    index = {sid: i for i, sid in enumerate(t.span_id)}
    callee: dict[int, int] = {}
    for i in range(n):
        if t.kind[i] != "SERVER":
            continue
        pid = t.parent[i]
        j = index.get(pid) if pid is not None else None
        if j is None or t.kind[j] != "CLIENT":
            continue
        k = callee.get(j)
        if k is None or (t.start[i] or 0, i) < (t.start[k] or 0, k):
            callee[j] = i
    client = t.client
    out = []
    for i in range(n):
        kind = t.kind[i]
        if kind != "CLIENT":
            out.append(span_operation(t.service[i], t.name[i], kind))
            continue
        k = callee.get(i)
        target = None
        if k is None and client is not None and client[i] is not None:
            target = client_target(*client[i])  # type: ignore[misc]
        out.append(
            span_operation(
                t.service[i],
                t.name[i],
                kind,
                callee=None if k is None else (t.service[k], t.name[k]),
                target=target,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Calls:
    """One analysed request's spans grouped into calls: what :func:`request_operations`
    counts and what the patterns (:mod:`.patterns`) read, defined here once."""

    ops: list[tuple[str, str]]
    """``(service, operation)`` of every span (:func:`span_operations`)."""
    tree: list[int]
    """The walked spans (the request's tree), parents before children."""
    call_of: dict[int, int]
    """The call each walked span belongs to, named by the call's first span."""
    failed: dict[int, bool]
    """Calls in which a span failed (:func:`span_failed`), by first span."""
    path_ns: list[int]
    """Critical-path time in each span's subtree (the span's own included)."""
    groups: dict[tuple[int, tuple[str, str]], list[int]]
    """Calls by (calling parent, operation), ordered by (start, end, position), the
    times clipped to the parent as the walk clips them."""
    overlapping: set[int]
    """Calls that started while an earlier call of their group still ran (by more than
    :data:`BACK_TO_BACK_NS`)."""


def trace_calls(t: TraceInput, a: TraceAnalysis) -> Calls:
    """The calls of one analysed request (see :class:`OperationRow` for what a call is)."""
    ops = span_operations(t)
    tp = a.tree_parent
    tree = [i for i in range(len(tp)) if tp[i] is not None or i == a.root]
    tree.sort(key=lambda i: a.depth[i])
    sub = list(a.critical_ns)  # critical time in each span's subtree, bottom-up
    for i in reversed(tree):
        p = tp[i]
        if p is not None:
            sub[p] += sub[i]
    err = t.error or [False] * len(tp)
    call_of: dict[int, int] = {}
    failed: dict[int, bool] = {}
    for i in tree:  # top-down: a span of its parent's operation belongs to its call
        p = tp[i]
        c = call_of[p] if p is not None and ops[p] == ops[i] else i
        call_of[i] = c
        failed[c] = failed.get(c, False) or err[i]
    cs, ce = a.clipped_start, a.clipped_end
    groups: dict[tuple[int, tuple[str, str]], list[int]] = {}
    for i in tree:
        p = tp[i]
        if p is not None and call_of[i] == i:
            groups.setdefault((p, ops[i]), []).append(i)
    overlapping: set[int] = set()
    for calls in groups.values():
        calls.sort(key=lambda i: (cs[i], ce[i], i))
        reach: int | None = None
        for i in calls:
            s, e = cs[i], ce[i]
            assert s is not None and e is not None
            if reach is not None and reach - BACK_TO_BACK_NS > s:
                overlapping.add(i)
            reach = e if reach is None else max(reach, e)
    return Calls(ops, tree, call_of, failed, sub, groups, overlapping)


def request_operations(
    t: TraceInput, a: TraceAnalysis, calls: Calls | None = None
) -> list[OperationRow]:
    """The operations of one analysed request: the reference for the bulk walk's rows,
    and what ``explain`` shows (``calls``: :func:`trace_calls` of it, when made already).

    Every span of the walked tree counts (spans off the request — detached, wholly
    outside their parent, dropped orphans — do not); each span's path time goes to the
    row of its own effective stage, so per stage the rows add up to the stage's path
    time; a call is counted in the row of its first span. Rows are sorted by
    (stage, service, operation).
    """
    c = trace_calls(t, a) if calls is None else calls
    crit = a.critical_ns
    rows: dict[tuple[str, str, str], list[int]] = {}
    for i in c.tree:
        stage = a.effective_stage[i] or cv.UNATTRIBUTED
        key = (stage, *c.ops[i])
        row = rows.get(key)
        if row is None:
            row = rows[key] = [0, 0, 0, 0, 0]
        row[0] += crit[i]
        if c.call_of[i] == i:
            row[1] += 1
            row[2] += c.path_ns[i] > 0
            row[3] += i in c.overlapping
            row[4] += c.failed[i]
    return [OperationRow(*key, *vals) for key, vals in sorted(rows.items())]


def operation_codes(
    parent: npt.NDArray[np.int64],
    is_client: npt.NDArray[np.bool_],
    is_server: npt.NDArray[np.bool_],
    start: npt.NDArray[np.int64],
    pair: npt.NDArray[np.int64],
    pair_names: Sequence[tuple[str | None, str]],
    clients_for: Callable[[npt.NDArray[np.int64]], list[ClientAttrs]],
) -> tuple[npt.NDArray[np.int64], list[tuple[str, str]]]:
    """:func:`span_operations` for many traces' rows at once: what the bulk walk reads.

    ``parent`` is each row's parent row in its trace (-1: none); ``pair`` codes the row's
    (service, span name), spelled out by ``pair_names``; ``clients_for(rows)`` gives the
    :data:`ClientAttrs` of CLIENT rows whose callee left no SERVER span (asked once).
    Returns each row's operation code and the ``(service, operation)`` of each code.
    Names are computed once per distinct value, never per span.
    """
    names: list[tuple[str, str]] = []
    code_of: dict[tuple[str, str], int] = {}

    def code(op: tuple[str, str]) -> int:
        c = code_of.get(op)
        if c is None:
            c = code_of[op] = len(names)
            names.append(op)
        return c

    of_pair = np.array(
        [code(span_operation(svc, name, "INTERNAL")) for svc, name in pair_names] or [0],
        dtype=np.int64,
    )
    op = of_pair[pair] if len(pair) else np.zeros(0, dtype=np.int64)
    clients = np.flatnonzero(is_client)
    if not len(clients):
        return op, names
    # The callee: a CLIENT row's earliest SERVER child (ties by row), as span_operations.
    srv = np.flatnonzero(is_server & (parent >= 0))
    srv = srv[is_client[parent[srv]]]
    srv = srv[np.lexsort((srv, start[srv], parent[srv]))]
    first = np.ones(len(srv), dtype=bool)
    first[1:] = parent[srv][1:] != parent[srv][:-1]
    callee = np.full(len(parent), -1, dtype=np.int64)
    callee[parent[srv[first]]] = srv[first]
    k = callee[clients]
    named = k >= 0
    # With a callee of a known service the operation is the callee's own (vectorised);
    # a callee without a service takes the client's service (rare: one at a time).
    rows, callees = clients[named], k[named]
    unnamed = np.array([not pair_names[p][0] for p in pair[callees].tolist()], dtype=bool)
    op[rows[~unnamed]] = op[callees[~unnamed]]
    for r, c in zip(rows[unnamed].tolist(), callees[unnamed].tolist(), strict=True):
        svc, name = pair_names[pair[r]]
        op[r] = code(span_operation(svc, name, "CLIENT", callee=pair_names[pair[c]]))
    alone = clients[~named]
    if len(alone):
        targets: dict[ClientAttrs, int] = {}
        for r, attrs in zip(alone.tolist(), clients_for(alone), strict=True):
            c = targets.get(attrs)
            if c is None:
                target = client_target(*attrs)
                c = targets[attrs] = -1 if target is None else code(target)
            if c >= 0:
                op[r] = c
    return op, names
