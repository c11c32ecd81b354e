"""One release's requests as numpy arrays: the input of diff, slow, gate and autoscale.

Reads the derived tables ``requests`` and ``request_stages`` (filled by
:func:`tracekit.analysis.attribution.per_request.refresh`) and pivots the per-stage critical-path
times into a (requests × stages) matrix, so every statistic downstream is vectorised.
Times are milliseconds (float64), as in every output tracekit writes. The releases a
command compares load together (:func:`load_releases`): one scan, one join.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.store import Store
from tracekit.errors import QueryError

NS_PER_MS = 1_000_000.0


@dataclass
class ReleaseData:
    """Per-request arrays for one release; row i of every array is the same request."""

    label: str
    trace_ids: npt.NDArray[np.object_]
    start_ns: npt.NDArray[np.int64]
    duration_ms: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    is_error: npt.NDArray[np.bool_]
    stages: tuple[str, ...]
    """Column names of the stage matrices: built-in stages in request order, then user
    stages alphabetically, then ``unattributed`` (only stages that occur)."""
    stage_ms: npt.NDArray[np.float64]
    """(n, k) critical-path milliseconds per stage; rows sum to ``duration_ms``."""
    stage_wall_ms: npt.NDArray[np.float64]
    """(n, k) wall milliseconds of the stage's own spans (may exceed the path share)."""
    stage_cpu_ms: npt.NDArray[np.float64]
    """(n, k) measured CPU milliseconds; NaN where the stage was not measured."""
    stage_gpu_ms: npt.NDArray[np.float64]
    """(n, k) measured device milliseconds; NaN where not measured."""
    time_kinds: dict[str, str]
    """Declared time kind per stage (``wait`` or ``compute``)."""
    instance_ids: npt.NDArray[np.object_]
    inflight: npt.NDArray[np.float64]
    queue_depth: npt.NDArray[np.float64]
    cpu_utilization: npt.NDArray[np.float64]
    gpu_utilization: npt.NDArray[np.float64]
    """Request-span attributes; NaN where the span did not carry them."""
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(len(self.duration_ms))

    def stage_index(self, stage: str) -> int:
        return self.stages.index(stage)

    def stage_column(self, stage: str) -> npt.NDArray[np.float64]:
        """Critical-path ms of ``stage`` per request (zeros when the stage never occurs)."""
        if stage not in self.stages:
            return np.zeros(self.n)
        return self.stage_ms[:, self.stages.index(stage)]


_FILTER = """
    list_contains($labels, coalesce(r.release, '')) AND ($service IS NULL OR r.service_name = $service)
      AND ($route IS NULL OR r.route = $route OR r.name = $route)
"""

# The replicas of the selection, once each: requests carry an index into this list
# instead of their own copy of the text (a Python string per request costs ~0.1 µs of
# CPU, a tenth of the whole request scan).
_INSTANCES_SQL = f"""
SELECT list(DISTINCT coalesce(r.instance_id, '') ORDER BY coalesce(r.instance_id, ''))
FROM requests r
WHERE {_FILTER}
"""

# One scan of ``requests`` for every release asked (ordered in numpy); the row id lets the
# stage rows find their request's row below without a second window over the releases or a
# join on the sorted selection, and ``part`` says which release a row belongs to.
_REQUEST_SQL = f"""
SELECT r.rowid AS rid, (list_position($labels, coalesce(r.release, '')) - 1)::INTEGER AS part,
       r.trace_id, r.start_ns, r.duration_ns, r.sample_weight, r.is_error,
       i.instance_code,
       coalesce(r.inflight, 'NaN'::DOUBLE) AS inflight,
       coalesce(r.queue_depth, 'NaN'::DOUBLE) AS queue_depth,
       coalesce(r.cpu_utilization, 'NaN'::DOUBLE) AS cpu_utilization,
       coalesce(r.gpu_utilization, 'NaN'::DOUBLE) AS gpu_utilization
FROM requests r
JOIN (SELECT unnest($instances) AS instance_id,
             (generate_subscripts($instances, 1) - 1)::INTEGER AS instance_code) i
  ON i.instance_id = coalesce(r.instance_id, '')
WHERE {_FILTER}
"""

# Stage and time kind come back as small integer codes (their names are fetched once):
# millions of Python strings, and a dict lookup for each, cost more than the join. The
# counts say whether any CPU/GPU time was measured at all (a scan of two columns).
_NAMES_SQL = """
SELECT list(DISTINCT stage ORDER BY stage), list(DISTINCT time_kind ORDER BY time_kind),
       count(cpu_time_ns), count(gpu_time_ns)
FROM request_stages
"""

# Every release's stage rows in one join: the 32-character trace id of each of the table's
# rows is read and probed once per diff, not once per release. Codes and row ids travel as
# the narrowest integers that hold them, and unmeasured CPU/GPU columns not at all: the
# rows are millions, and fetching them costs about as much as the join.
_STAGE_SQL = """
SELECT r.rowid::{rid_type} AS rid,
       ((list_position($stages, s.stage) - 1) * $nk
        + list_position($kinds, s.time_kind) - 1)::{code_type} AS code,
       s.critical_ns, s.wall_ns{measured}
FROM request_stages s JOIN requests r USING (trace_id)
WHERE {where}
"""
_MEASURED = """,
       coalesce(s.cpu_time_ns::DOUBLE, 'NaN'::DOUBLE) AS cpu_time_ns,
       coalesce(s.gpu_time_ns::DOUBLE, 'NaN'::DOUBLE) AS gpu_time_ns"""

_REQUEST_COLUMNS = (
    "trace_id",
    "start_ns",
    "duration_ns",
    "sample_weight",
    "is_error",
    "instance_code",
    "inflight",
    "queue_depth",
    "cpu_utilization",
    "gpu_utilization",
)


def load_release(
    store: Store, label: str, *, service: str | None = None, route: str | None = None
) -> ReleaseData:
    """Every request of release ``label`` (optionally one entry service / route).

    Raises :class:`QueryError` naming the releases present when there is none. See
    :func:`load_releases`, which loads several in the same two scans.
    """
    return load_releases(store, [label], service=service, route=route)[0]


def load_releases(
    store: Store, labels: Sequence[str], *, service: str | None = None, route: str | None = None
) -> list[ReleaseData]:
    """Every request of each release in ``labels`` (optionally one entry service / route),
    one :class:`ReleaseData` per label, in order.

    Raises :class:`QueryError` for the first label without requests (naming the releases
    present when it is unknown). The pivot to stage matrices is vectorised, and the
    releases share one scan of ``requests`` and one join of ``request_stages``: two
    releases of a million requests each load in about 3 s of CPU, 2 s on two cores.
    """
    unique = list(dict.fromkeys(labels))
    if not unique:
        return []
    params = {"labels": unique, "service": service, "route": route}
    con = store.con
    # Row ids are positions in the table: nothing writes between these reads (this
    # connection runs them back to back, and DuckDB lets no other process write the file
    # while it is open here).
    got_instances = con.execute(_INSTANCES_SQL, params).fetchall()
    instances = list(got_instances[0][0] or []) if got_instances else []
    req = con.execute(_REQUEST_SQL, {**params, "instances": instances}).fetchnumpy()
    instance_names = np.asarray(instances, dtype=object)
    part = np.asarray(req["part"], dtype=np.int64)
    counts = np.bincount(part, minlength=len(unique))
    for label, count in zip(unique, counts, strict=True):
        if count == 0:
            store.require_release(label)
            raise QueryError(
                f"release {label!r} has no requests for service={service!r} route={route!r}"
            )
    selections = _in_start_order(part, req, len(unique))
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    total = int(offsets[-1])
    # Names of every stage and kind in the store (a scan, no join); codes index them.
    got = con.execute(_NAMES_SQL).fetchall()
    names: list[str] = list(got[0][0] or []) if got else []
    kind_names: list[str] = list(got[0][1] or []) if got else []
    measured = bool(got and (got[0][2] or got[0][3]))
    nk = max(len(kind_names), 1)
    ncodes = len(names) * nk
    rid = np.asarray(req["rid"], dtype=np.int64)
    sql = _STAGE_SQL.format(
        rid_type="INTEGER" if int(rid.max()) < 2**31 else "BIGINT",
        code_type="SMALLINT" if ncodes < 2**15 else "INTEGER",
        measured=_MEASURED if measured else "",
        where=_FILTER,
    )
    rows = con.execute(sql, {**params, "stages": names, "kinds": kind_names, "nk": nk}).fetchnumpy()
    # Every array below has one entry per stage row (millions): 32-bit indexes where they
    # fit and in-place arithmetic, as allocating such arrays costs as much as filling them.
    itype = np.int32 if total * max(len(names), 1) < 2**31 else np.int64
    # Each request's row in the releases laid end to end, each in start order.
    position = np.empty(int(rid.max()) + 1, dtype=itype)
    for p, sel in enumerate(selections):
        position[rid[sel]] = np.arange(offsets[p], offsets[p + 1], dtype=itype)
    row_g = position[rows["rid"]]
    codes = np.asarray(rows["code"])
    # Rows per (release, stage, time kind): a stage is given its most common time kind in
    # the release, and a release's columns are the stages it has.
    if len(unique) == 1:
        keyed = codes
    else:
        keyed = np.repeat(np.arange(len(unique), dtype=itype), counts)[row_g]
        keyed *= ncodes
        keyed += codes
    pairs = np.bincount(keyed, minlength=len(unique) * ncodes).reshape(len(unique), -1, nk)
    seen = [
        {
            st: {kn: int(pp[a, b]) for b, kn in enumerate(kind_names) if pp[a, b]}
            for a, st in enumerate(names)
            if pp[a].any()  # stages of other releases only
        }
        for pp in pairs
    ]
    union = cv.order_stages({st for kinds_seen in seen for st in kinds_seen})
    k = len(union)
    column = np.asarray([union.index(st) if st in union else -1 for st in names], itype)
    # One flat index for the scatters (2-D fancy indexing recomputes it each time).
    flat = column[codes // nk]
    row_g *= k
    flat += row_g
    # The scatters are independent and NumPy releases the GIL while it does them: two
    # threads fill the matrices in about half the wall time when a second core is free.
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="tracekit-load") as pool:
        crit_f = pool.submit(_matrix, total, k, 0.0, flat, rows["critical_ns"])
        wall_f = pool.submit(_matrix, total, k, 0.0, flat, rows["wall_ns"])
        cpu = _matrix(total, k, np.nan, flat, rows["cpu_time_ns"] if measured else None)
        gpu = _matrix(total, k, np.nan, flat, rows["gpu_time_ns"] if measured else None)
        crit, wall = crit_f.result(), wall_f.result()
    out: dict[str, ReleaseData] = {}
    for p, (label, sel) in enumerate(zip(unique, selections, strict=True)):
        col = {name: np.asarray(req[name])[sel] for name in _REQUEST_COLUMNS}
        stages = cv.order_stages(list(seen[p]))
        rows_p = slice(int(offsets[p]), int(offsets[p + 1]))
        keep = [union.index(st) for st in stages]
        pick = functools.partial(_rows_and_columns, rows=rows_p, columns=keep)
        out[label] = ReleaseData(
            label=label,
            trace_ids=np.asarray(col["trace_id"], dtype=object),
            start_ns=np.asarray(col["start_ns"], dtype=np.int64),
            duration_ms=np.asarray(col["duration_ns"], dtype=np.float64) / NS_PER_MS,
            weights=np.asarray(col["sample_weight"], dtype=np.float64),
            is_error=np.asarray(col["is_error"], dtype=bool),
            stages=stages,
            stage_ms=pick(crit),
            stage_wall_ms=pick(wall),
            stage_cpu_ms=pick(cpu),
            stage_gpu_ms=pick(gpu),
            time_kinds={st: max(c.items(), key=lambda kv: kv[1])[0] for st, c in seen[p].items()},
            instance_ids=instance_names[np.asarray(col["instance_code"], dtype=np.int64)],
            inflight=np.asarray(col["inflight"], dtype=np.float64),
            queue_depth=np.asarray(col["queue_depth"], dtype=np.float64),
            cpu_utilization=np.asarray(col["cpu_utilization"], dtype=np.float64),
            gpu_utilization=np.asarray(col["gpu_utilization"], dtype=np.float64),
        )
    # A label asked twice gets arrays of its own each time, as two loads would give.
    given: set[str] = set()
    result = []
    for label in labels:
        result.append(copy.deepcopy(out[label]) if label in given else out[label])
        given.add(label)
    return result


def _in_start_order(
    part: npt.NDArray[np.int64], req: dict[str, Any], parts: int
) -> list[slice | npt.NDArray[np.int64]]:
    """Per release, the positions of its request rows ordered by (start, trace id): sorted
    here rather than by an ORDER BY, whose sort carries every column and compares the ids
    as text. A release whose rows already lie together in start order (as bulk writes
    leave them) gets a slice, so its columns are views, not copies."""
    start = np.asarray(req["start_ns"], dtype=np.int64)
    out: list[slice | npt.NDArray[np.int64]] = []
    for p in range(parts):
        idx = np.flatnonzero(part == p) if parts > 1 else np.arange(len(part))
        s = start[idx]
        if len(s) < 2 or bool(np.all(s[1:] > s[:-1])):
            order = None  # already in order, no two at the same nanosecond
        else:
            order = np.argsort(s, kind="stable")
            ordered = s[order]
            if bool(np.any(ordered[1:] == ordered[:-1])):
                # Requests that started in the same nanosecond: the trace id breaks the tie
                # (hex text, so code-point order is DuckDB's byte order).
                ids = np.asarray(req["trace_id"], dtype=object)[idx]
                order = np.lexsort((ids.astype(str), s))
        sel = idx if order is None else idx[order]
        if order is None and len(idx) and int(idx[-1]) - int(idx[0]) == len(idx) - 1:
            out.append(slice(int(idx[0]), int(idx[-1]) + 1))
        else:
            out.append(sel)
    return out


def _rows_and_columns(
    m: npt.NDArray[np.float64], rows: slice, columns: list[int]
) -> npt.NDArray[np.float64]:
    """One release's block of a matrix shared by several: a view when it has every column."""
    block = m[rows]
    return block if columns == list(range(m.shape[1])) else block[:, columns]


def _matrix(
    n: int, k: int, fill: float, flat: npt.NDArray[np.int64], ns: npt.ArrayLike | None
) -> npt.NDArray[np.float64]:
    """An (n, k) matrix of ``fill`` with the stage rows' nanoseconds put in as ms."""
    out = np.zeros(n * k) if fill == 0.0 else np.full(n * k, fill)
    if ns is None:
        return out.reshape(n, k)
    values = np.asarray(ns)
    if not (np.isnan(fill) and np.isnan(values).all()):  # unmeasured: nothing to put in
        # Put in as nanoseconds (the cast to float happens in the scatter), then one
        # division in place: the same quotient per value as dividing them first, without
        # two temporaries of every stage row.
        out[flat] = values
        out /= NS_PER_MS
    return out.reshape(n, k)


def concat_releases(parts: list[ReleaseData]) -> ReleaseData:
    """Several releases as one time line (e.g. before and after a rollout), by start time.

    Stage columns are the union of the parts' stages; a stage a part never had reads 0
    (critical, wall) or NaN (cpu, gpu) for its requests. The label joins the parts'.
    """
    if len(parts) == 1:
        return parts[0]
    stages = cv.order_stages({s for p in parts for s in p.stages})

    def widen(p: ReleaseData, m: npt.NDArray[np.float64], fill: float) -> npt.NDArray[np.float64]:
        out = np.full((p.n, len(stages)), fill)
        for j, s in enumerate(p.stages):
            out[:, stages.index(s)] = m[:, j]
        return out

    start = np.concatenate([p.start_ns for p in parts])
    order = np.argsort(start, kind="stable")

    def cat(name: str) -> npt.NDArray[Any]:
        return np.concatenate([getattr(p, name) for p in parts])[order]

    def cat_stage(name: str, fill: float) -> npt.NDArray[np.float64]:
        return np.concatenate([widen(p, getattr(p, name), fill) for p in parts])[order]

    kinds: dict[str, str] = {}
    for p in parts:
        for s, k in p.time_kinds.items():
            kinds.setdefault(s, k)
    return ReleaseData(
        label="+".join(p.label for p in parts),
        trace_ids=cat("trace_ids"),
        start_ns=start[order],
        duration_ms=cat("duration_ms"),
        weights=cat("weights"),
        is_error=cat("is_error"),
        stages=stages,
        stage_ms=cat_stage("stage_ms", 0.0),
        stage_wall_ms=cat_stage("stage_wall_ms", 0.0),
        stage_cpu_ms=cat_stage("stage_cpu_ms", np.nan),
        stage_gpu_ms=cat_stage("stage_gpu_ms", np.nan),
        time_kinds=kinds,
        instance_ids=cat("instance_ids"),
        inflight=cat("inflight"),
        queue_depth=cat("queue_depth"),
        cpu_utilization=cat("cpu_utilization"),
        gpu_utilization=cat("gpu_utilization"),
    )
