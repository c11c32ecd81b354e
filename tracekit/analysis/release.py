"""One release's requests as numpy arrays: the input of diff, slow, gate and autoscale.

Reads the derived tables ``requests`` and ``request_stages`` (filled by
:func:`tracekit.analysis.attribution.refresh`) and pivots the per-stage critical-path
times into a (requests × stages) matrix, so every statistic downstream is vectorised.
Times are milliseconds (float64), as in every output tracekit writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def order_stages(names: set[str] | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Built-in stages in request order, then others alphabetically, then unattributed."""
    names = set(names)
    builtin = [s for s in cv.STAGES if s in names]
    others = sorted(s for s in names if s not in cv.STAGES and s != cv.UNATTRIBUTED)
    tail = [cv.UNATTRIBUTED] if cv.UNATTRIBUTED in names else []
    return tuple(builtin + others + tail)


_REQUEST_SQL = """
SELECT trace_id, start_ns, duration_ns, sample_weight, is_error, coalesce(instance_id, ''),
       coalesce(inflight, 'NaN'::DOUBLE), coalesce(queue_depth, 'NaN'::DOUBLE),
       coalesce(cpu_utilization, 'NaN'::DOUBLE), coalesce(gpu_utilization, 'NaN'::DOUBLE)
FROM requests
WHERE release = $release AND ($service IS NULL OR service_name = $service)
  AND ($route IS NULL OR route = $route OR name = $route)
ORDER BY start_ns, trace_id
"""

_STAGE_SQL = """
SELECT s.trace_id, s.stage, s.time_kind, s.critical_ns, s.wall_ns, s.cpu_time_ns, s.gpu_time_ns
FROM request_stages s JOIN requests r USING (trace_id)
WHERE r.release = $release AND ($service IS NULL OR r.service_name = $service)
  AND ($route IS NULL OR r.route = $route OR r.name = $route)
"""


def load_release(
    store: Store, label: str, *, service: str | None = None, route: str | None = None
) -> ReleaseData:
    """Every request of release ``label`` (optionally one entry service / route).

    Raises :class:`QueryError` naming the releases present when there is none.
    """
    params = {"release": label, "service": service, "route": route}
    req = store.con.execute(_REQUEST_SQL, params).fetchall()
    if not req:
        store.require_release(label)
        raise QueryError(
            f"release {label!r} has no requests for service={service!r} route={route!r}"
        )
    cols = list(zip(*req, strict=True))
    trace_ids = np.array(cols[0], dtype=object)
    index = {t: i for i, t in enumerate(trace_ids)}
    n = len(trace_ids)

    rows = store.con.execute(_STAGE_SQL, params).fetchall()
    kinds_seen: dict[str, dict[str, int]] = {}
    for _, stage, kind, *_rest in rows:
        kinds_seen.setdefault(stage, {}).setdefault(kind, 0)
        kinds_seen[stage][kind] += 1
    stages = order_stages(list(kinds_seen))
    col = {s: j for j, s in enumerate(stages)}
    k = len(stages)
    crit = np.zeros((n, k))
    wall = np.zeros((n, k))
    cpu = np.full((n, k), np.nan)
    gpu = np.full((n, k), np.nan)
    for trace_id, stage, _kind, critical_ns, wall_ns, cpu_ns, gpu_ns in rows:
        i = index[trace_id]
        j = col[stage]
        crit[i, j] = critical_ns / NS_PER_MS
        wall[i, j] = wall_ns / NS_PER_MS
        if cpu_ns is not None:
            cpu[i, j] = cpu_ns / NS_PER_MS
        if gpu_ns is not None:
            gpu[i, j] = gpu_ns / NS_PER_MS
    time_kinds = {s: max(c.items(), key=lambda kv: kv[1])[0] for s, c in kinds_seen.items()}
    return ReleaseData(
        label=label,
        trace_ids=trace_ids,
        start_ns=np.array(cols[1], dtype=np.int64),
        duration_ms=np.array(cols[2], dtype=np.float64) / NS_PER_MS,
        weights=np.array(cols[3], dtype=np.float64),
        is_error=np.array(cols[4], dtype=bool),
        stages=stages,
        stage_ms=crit,
        stage_wall_ms=wall,
        stage_cpu_ms=cpu,
        stage_gpu_ms=gpu,
        time_kinds=time_kinds,
        instance_ids=np.array(cols[5], dtype=object),
        inflight=np.array(cols[6], dtype=np.float64),
        queue_depth=np.array(cols[7], dtype=np.float64),
        cpu_utilization=np.array(cols[8], dtype=np.float64),
        gpu_utilization=np.array(cols[9], dtype=np.float64),
    )
