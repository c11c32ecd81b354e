"""One release's requests as numpy arrays: the input of diff, slow, gate and autoscale.

Reads the derived tables ``requests`` and ``request_stages`` (filled by
:func:`tracekit.analysis.attribution.per_request.refresh`) and pivots the per-stage critical-path
times into a (requests × stages) matrix, so every statistic downstream is vectorised.
Times are milliseconds (float64), as in every output tracekit writes.
"""

from __future__ import annotations

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
    r.release = $release AND ($service IS NULL OR r.service_name = $service)
      AND ($route IS NULL OR r.route = $route OR r.name = $route)
"""

# One scan of ``requests`` (ordered in numpy); the row id lets the stage rows find their request's row
# below without a second window over the release or a join on the sorted selection.
_REQUEST_SQL = f"""
SELECT r.rowid AS rid, r.trace_id, r.start_ns, r.duration_ns, r.sample_weight, r.is_error,
       coalesce(r.instance_id, '') AS instance_id,
       coalesce(r.inflight, 'NaN'::DOUBLE) AS inflight,
       coalesce(r.queue_depth, 'NaN'::DOUBLE) AS queue_depth,
       coalesce(r.cpu_utilization, 'NaN'::DOUBLE) AS cpu_utilization,
       coalesce(r.gpu_utilization, 'NaN'::DOUBLE) AS gpu_utilization
FROM requests r
WHERE {_FILTER}
"""

# Stage and time kind come back as small integer codes (their names are fetched once):
# millions of Python strings, and a dict lookup for each, cost more than the join.
_NAMES_SQL = """
SELECT list(DISTINCT stage ORDER BY stage), list(DISTINCT time_kind ORDER BY time_kind)
FROM request_stages
"""

_STAGE_SQL = f"""
SELECT r.rowid AS rid,
       (list_position($stages, s.stage) - 1)::INTEGER AS stage_code,
       (list_position($kinds, s.time_kind) - 1)::INTEGER AS kind_code,
       s.critical_ns, s.wall_ns,
       coalesce(s.cpu_time_ns::DOUBLE, 'NaN'::DOUBLE) AS cpu_time_ns,
       coalesce(s.gpu_time_ns::DOUBLE, 'NaN'::DOUBLE) AS gpu_time_ns
FROM request_stages s JOIN requests r USING (trace_id)
WHERE {_FILTER}
"""


def load_release(
    store: Store, label: str, *, service: str | None = None, route: str | None = None
) -> ReleaseData:
    """Every request of release ``label`` (optionally one entry service / route).

    Raises :class:`QueryError` naming the releases present when there is none. The
    pivot to a stage matrix is vectorised: a million requests load in about a second
    of CPU (two scans, one join, no Python work per row).
    """
    params = {"release": label, "service": service, "route": route}
    con = store.con
    # Row ids are positions in the table: nothing writes between these reads (this
    # connection runs them back to back, and DuckDB lets no other process write the file
    # while it is open here).
    req = _in_start_order(con.execute(_REQUEST_SQL, params).fetchnumpy())
    n = len(req["trace_id"])
    if n == 0:
        store.require_release(label)
        raise QueryError(
            f"release {label!r} has no requests for service={service!r} route={route!r}"
        )
    # Names of every stage and kind in the store (a scan, no join); codes index them.
    got = con.execute(_NAMES_SQL).fetchone()
    names: list[str] = list(got[0] or []) if got else []
    kind_names: list[str] = list(got[1] or []) if got else []
    rows = con.execute(_STAGE_SQL, {**params, "stages": names, "kinds": kind_names}).fetchnumpy()
    rid = np.asarray(req["rid"], dtype=np.int64)
    position = np.empty(int(rid.max()) + 1, dtype=np.int64)
    position[rid] = np.arange(n, dtype=np.int64)
    row_i = position[np.asarray(rows["rid"], dtype=np.int64)]
    codes = np.asarray(rows["stage_code"], dtype=np.int64)
    kind_codes = np.asarray(rows["kind_code"], dtype=np.int64)
    # Rows per (stage, time kind): a stage is given its most common time kind.
    nk = max(len(kind_names), 1)
    pairs = np.bincount(codes * nk + kind_codes, minlength=len(names) * nk).reshape(-1, nk)
    kinds_seen: dict[str, dict[str, int]] = {
        st: {kn: int(pairs[a, b]) for b, kn in enumerate(kind_names) if pairs[a, b]}
        for a, st in enumerate(names)
        if pairs[a].any()  # stages of other releases only
    }
    stages = cv.order_stages(list(kinds_seen))
    k = len(stages)
    column = np.asarray([stages.index(st) if st in kinds_seen else -1 for st in names], np.int64)
    row_j = column[codes] if len(codes) else codes
    # One flat index for the four scatters (2-D fancy indexing recomputes it each time).
    flat = row_i * k + row_j
    crit = _matrix(n, k, 0.0, flat, rows["critical_ns"])
    wall = _matrix(n, k, 0.0, flat, rows["wall_ns"])
    cpu = _matrix(n, k, np.nan, flat, rows["cpu_time_ns"])
    gpu = _matrix(n, k, np.nan, flat, rows["gpu_time_ns"])
    time_kinds = {st: max(c.items(), key=lambda kv: kv[1])[0] for st, c in kinds_seen.items()}
    return ReleaseData(
        label=label,
        trace_ids=np.asarray(req["trace_id"], dtype=object),
        start_ns=np.asarray(req["start_ns"], dtype=np.int64),
        duration_ms=np.asarray(req["duration_ns"], dtype=np.float64) / NS_PER_MS,
        weights=np.asarray(req["sample_weight"], dtype=np.float64),
        is_error=np.asarray(req["is_error"], dtype=bool),
        stages=stages,
        stage_ms=crit,
        stage_wall_ms=wall,
        stage_cpu_ms=cpu,
        stage_gpu_ms=gpu,
        time_kinds=time_kinds,
        instance_ids=np.asarray(req["instance_id"], dtype=object),
        inflight=np.asarray(req["inflight"], dtype=np.float64),
        queue_depth=np.asarray(req["queue_depth"], dtype=np.float64),
        cpu_utilization=np.asarray(req["cpu_utilization"], dtype=np.float64),
        gpu_utilization=np.asarray(req["gpu_utilization"], dtype=np.float64),
    )


def _in_start_order(req: dict[str, Any]) -> dict[str, npt.NDArray[Any]]:
    """Request columns ordered by (start, trace id): sorted here rather than by an
    ORDER BY, whose sort carries every column and compares the ids as text."""
    start = np.asarray(req["start_ns"], dtype=np.int64)
    order = np.argsort(start, kind="stable")
    ordered = start[order]
    if len(ordered) > 1 and bool(np.any(ordered[1:] == ordered[:-1])):
        # Requests that started in the same nanosecond: the trace id breaks the tie (hex
        # text, so code-point order is DuckDB's byte order).
        order = np.lexsort((np.asarray(req["trace_id"], dtype=str), start))
    return {name: np.asarray(values)[order] for name, values in req.items()}


def _matrix(
    n: int, k: int, fill: float, flat: npt.NDArray[np.int64], ns: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """An (n, k) matrix of ``fill`` with the stage rows' nanoseconds put in as ms."""
    out = np.full(n * k, fill)
    values = np.asarray(ns, dtype=np.float64)
    if not (np.isnan(fill) and np.isnan(values).all()):  # unmeasured: nothing to put in
        out[flat] = values / NS_PER_MS
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
