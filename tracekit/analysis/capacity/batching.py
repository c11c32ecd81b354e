"""Batching advice: read the traced batch executions, fit their cost, replay the batcher.

The traced batcher (:class:`tracekit.instrumentation.batching.DynamicBatcher`) closes a
batch when it holds ``max_batch`` requests or ``max_wait`` after its first request
arrived, then waits for one of ``workers`` to be free. This module

- reads one row per model execution (:func:`read_executions`): a batch once, from its
  ``model_execute`` child or the batch span itself; per-request ``model_execute`` spans
  only for requests no batch served;
- fits execution time against batch size (:func:`fit_curve`);
- replays the recorded arrival times through that batcher for a grid of
  ``(max_wait_ms, max_batch)`` (:func:`replay`) and picks the option of lowest GPU time
  per request whose p95 queue wait stays within the budget (:func:`advise`).

The replay splits the arrivals round-robin, in arrival order, over the replicas the
executions were traced on (a balancer spreading load evenly): arrivals carry no
instance, and an even split is what a resized batcher would see behind the same
balancer. Each replica runs ``workers`` workers, the most executions traced running at
once on one replica. Sampled arrivals are replayed as kept (a thinner stream than the
real one) and their weights apply to the quantiles; a flag says so.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.attribution.per_request import json_path
from tracekit.analysis.capacity.model import Batching, BatchOption, Curve
from tracekit.analysis.cohorts.stats import weighted_quantile
from tracekit.analysis.results import Flag
from tracekit.analysis.store import DatabaseError, Store
from tracekit.errors import QueryError

NS_PER_MS = 1_000_000
MAX_WAIT_GRID_MS: tuple[float, ...] = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
"""The ``max_wait_ms`` values the replay tries."""
MAX_BATCH_GRID: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
"""The ``max_batch`` values the replay tries."""
QUEUE_QUANTILE = 0.95

NO_BATCH_SPANS = "no_batch_spans"
NO_BATCHING_OPTION = "no_batching_option"
BATCH_CURVE_ONE_SIZE = "batch_curve_one_size"
REPLAY_SAMPLED = "batching_replay_sampled"


@dataclass
class Executions:
    """One row per model execution of a release (a batch counted once)."""

    instance: npt.NDArray[np.object_]
    """``service.instance.id`` ('' when absent)."""
    start_ns: npt.NDArray[np.int64]
    end_ns: npt.NDArray[np.int64]
    size: npt.NDArray[np.int64]
    """Requests served: the batch's size, 1 for an unbatched execution."""
    gpu_ns: npt.NDArray[np.float64]
    """Device time, NaN where not taken."""
    batched: npt.NDArray[np.bool_]
    """Whether the row is a traced batch (rather than one request's own execution)."""

    def __len__(self) -> int:
        return len(self.start_ns)


# Batches: the batch span's model_execute children (min start, max end, summed device
# time), else the batch span itself. Unbatched: model_execute spans outside any batch
# trace, with no batch id, not nested in another model_execute span.
_EXECUTIONS_SQL = """
WITH rel AS (
    SELECT * FROM spans
    WHERE coalesce(service_version, '') = $release
      AND ($service IS NULL OR service_name = $service)
      AND start_ns IS NOT NULL AND end_ns IS NOT NULL
),
batches AS (
    SELECT trace_id, span_id, instance_id, start_ns, end_ns, gpu_time_ns,
           coalesce(TRY_CAST(json_extract(attributes, $count_path) AS BIGINT),
                    TRY_CAST(json_extract(attributes, $size_path) AS BIGINT),
                    CAST(json_array_length(links) AS BIGINT), 1) AS size
    FROM rel WHERE name = $batch_name
),
children AS (
    SELECT s.trace_id, s.parent_span_id, min(s.start_ns) AS start_ns,
           max(s.end_ns) AS end_ns, sum(s.gpu_time_ns) AS gpu_ns
    FROM spans s JOIN batches b ON s.trace_id = b.trace_id AND s.parent_span_id = b.span_id
    WHERE s.stage = $model AND s.start_ns IS NOT NULL AND s.end_ns IS NOT NULL
    GROUP BY s.trace_id, s.parent_span_id
)
SELECT coalesce(b.instance_id, '') AS instance,
       coalesce(c.start_ns, b.start_ns) AS start_ns,
       coalesce(c.end_ns, b.end_ns) AS end_ns,
       greatest(b.size, 1) AS size,
       CAST(CASE WHEN c.trace_id IS NULL THEN b.gpu_time_ns ELSE c.gpu_ns END AS DOUBLE) AS gpu_ns,
       true AS batched
FROM batches b LEFT JOIN children c ON c.trace_id = b.trace_id AND c.parent_span_id = b.span_id
UNION ALL
SELECT coalesce(m.instance_id, ''), m.start_ns, m.end_ns, 1,
       CAST(m.gpu_time_ns AS DOUBLE), false
FROM rel m
WHERE m.stage = $model
  AND m.trace_id NOT IN (SELECT trace_id FROM batches)
  AND json_extract(m.attributes, $id_path) IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM spans p
      WHERE p.trace_id = m.trace_id AND p.span_id = m.parent_span_id AND p.stage = $model)
ORDER BY start_ns
"""

_QUEUE_SQL = """
SELECT TRY_CAST(json_extract(attributes, $fill_path) AS DOUBLE) AS fill_ns,
       TRY_CAST(json_extract(attributes, $worker_path) AS DOUBLE) AS worker_ns,
       sample_weight
FROM spans
WHERE coalesce(service_version, '') = $release
  AND ($service IS NULL OR service_name = $service)
  AND stage = $queue
"""


def _query(store: Store, sql: str, params: dict[str, Any]) -> list[Any]:
    try:
        return store.run(sql, params)
    except DatabaseError as exc:
        raise QueryError(f"cannot read batch executions from {store.path}: {exc}") from exc


def read_executions(store: Store, release: str, *, service: str | None = None) -> Executions | None:
    """The model executions of ``release`` (one row per batch or unbatched request), or
    None when it has none."""
    rows = _query(
        store,
        _EXECUTIONS_SQL,
        {
            "release": release,
            "service": service,
            "batch_name": cv.BATCH_SPAN_NAME,
            "model": cv.MODEL_EXECUTE,
            "count_path": json_path(cv.BATCH_REQUEST_COUNT),
            "size_path": json_path(cv.BATCH_SIZE),
            "id_path": json_path(cv.BATCH_ID),
        },
    )
    if not rows:
        return None
    cols = list(zip(*rows, strict=True))
    return Executions(
        instance=np.array(cols[0], dtype=object),
        start_ns=np.array(cols[1], dtype=np.int64),
        end_ns=np.array(cols[2], dtype=np.int64),
        size=np.array(cols[3], dtype=np.int64),
        gpu_ns=np.array([math.nan if g is None else g for g in cols[4]], dtype=np.float64),
        batched=np.array(cols[5], dtype=bool),
    )


# --- the cost curve -----------------------------------------------------------------


def fit_curve(size: npt.ArrayLike, duration_ms: npt.ArrayLike) -> Curve:
    """Least-squares ``duration = intercept + per_request × size``, ``per_request`` ≥ 0.

    With one batch size only the split is unknowable: all of it is charged per request
    (batching then saves nothing), with ``r2`` None.
    """
    x = np.asarray(size, dtype=np.float64)
    y = np.asarray(duration_ms, dtype=np.float64)
    n = len(x)
    if n == 0:
        return Curve(intercept_ms=0.0, per_request_ms=0.0, batches=0, r2=None)
    if np.ptp(x) == 0:
        return Curve(intercept_ms=0.0, per_request_ms=float(y.mean() / x[0]), batches=n, r2=None)
    slope, intercept = np.polyfit(x, y, 1)
    if slope < 0:
        slope, intercept = 0.0, float(y.mean())
    resid = y - (intercept + slope * x)
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid**2).sum()) / ss_tot if ss_tot > 0 else None
    return Curve(intercept_ms=float(intercept), per_request_ms=float(slope), batches=n, r2=r2)


def _exec_ms(curve: Curve, size: int) -> float:
    return max(curve.intercept_ms + curve.per_request_ms * size, 0.0)


# --- the replay ---------------------------------------------------------------------


@dataclass
class Replay:
    """One replica's batches under one option: queue wait per request, batch by batch."""

    wait_ms: npt.NDArray[np.float64]
    """Per arrival (in the order given): fill + worker wait until its batch started."""
    fill_ms: npt.NDArray[np.float64]
    """Per arrival: until its batch closed (full, or max wait after its first)."""
    sizes: npt.NDArray[np.int64]
    """Per batch, in start order."""
    exec_ms: float
    """Summed execution time of the batches."""


def replay(
    arrivals_ms: Sequence[float] | npt.NDArray[np.float64],
    *,
    max_wait_ms: float,
    max_batch: int,
    workers: int,
    curve: Curve,
) -> Replay:
    """Push sorted arrival times (ms) through one replica's batcher.

    As :class:`~tracekit.instrumentation.batching.DynamicBatcher`: the collector takes
    the oldest waiting request, closes the batch at ``max_batch`` members or
    ``max_wait_ms`` after that request arrived (taking at once whatever queued while it
    waited for a worker), then waits for the earliest free of ``workers`` workers; the
    batch runs ``intercept + per_request × size``.
    """
    a = [float(t) for t in arrivals_ms]
    n = len(a)
    starts: list[float] = []
    closes: list[float] = []
    sizes: list[int] = []
    cost = [_exec_ms(curve, b) for b in range(max_batch + 1)]
    free = [-math.inf] * workers  # a heap of when each worker is next free
    collector = -math.inf  # when the collector last handed a batch to a worker
    total = 0.0
    i = 0
    # One turn per batch, not per request; the members are a bisect.
    while i < n:
        deadline = a[i] + max_wait_ms
        cutoff = collector if collector > deadline else deadline
        j = bisect_right(a, cutoff, i, min(i + max_batch, n))
        nb = j - i
        close = a[j - 1] if nb == max_batch else deadline
        start = free[0]
        if start < close:
            start = close
        if start < collector:
            start = collector
        run = cost[nb]
        heapq.heapreplace(free, start + run)
        total += run
        starts.append(start)
        closes.append(close)
        sizes.append(nb)
        collector = start
        i = j
    size_arr = np.array(sizes, dtype=np.int64)
    arr = np.asarray(a, dtype=np.float64)
    wait = np.repeat(np.array(starts), size_arr) - arr
    fill = np.maximum(np.repeat(np.array(closes), size_arr) - arr, 0.0)
    return Replay(wait_ms=wait, fill_ms=fill, sizes=size_arr, exec_ms=total)


def _peak_mask(arrivals_ns: npt.NDArray[np.int64], peak: Sequence[tuple[int, int]]) -> Any:
    """Which (sorted) arrivals fall in a peak interval ``[start, end)``."""
    mask = np.zeros(len(arrivals_ns), dtype=bool)
    if not peak or not len(arrivals_ns):
        return mask
    bounds = np.asarray(peak, dtype=np.int64).reshape(-1, 2)
    lo = np.searchsorted(arrivals_ns, bounds[:, 0], side="left")
    hi = np.searchsorted(arrivals_ns, bounds[:, 1], side="left")
    delta = np.zeros(len(arrivals_ns) + 1, dtype=np.int64)
    np.add.at(delta, lo, 1)
    np.add.at(delta, hi, -1)
    return np.cumsum(delta[:-1]) > 0


@dataclass
class _Arrivals:
    """The arrivals as the replay uses them: sorted, split over replicas."""

    per_replica_ms: list[npt.NDArray[np.float64]]
    order: list[npt.NDArray[np.int64]]
    """Per replica: the positions of its arrivals in the sorted arrays below."""
    weights: npt.NDArray[np.float64]
    peak: npt.NDArray[np.bool_]


def _split(
    arrivals_ns: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
    peak: Sequence[tuple[int, int]],
    replicas: int,
) -> _Arrivals:
    idx = np.argsort(arrivals_ns, kind="stable")
    t = np.asarray(arrivals_ns, dtype=np.int64)[idx]
    w = np.asarray(weights, dtype=np.float64)[idx]
    origin = t[0] if len(t) else 0
    ms = (t - origin) / NS_PER_MS
    order = [np.arange(r, len(t), replicas, dtype=np.int64) for r in range(replicas)]
    return _Arrivals(
        per_replica_ms=[ms[o] for o in order], order=order, weights=w, peak=_peak_mask(t, peak)
    )


def simulate(
    arrivals: _Arrivals, *, max_wait_ms: float, max_batch: int, workers: int, curve: Curve
) -> BatchOption:
    """One option over every replica: the worse of the normal and peak p95 queue waits,
    and GPU milliseconds per request."""
    wait = np.empty(len(arrivals.weights))
    total = 0.0
    for ms, pos in zip(arrivals.per_replica_ms, arrivals.order, strict=True):
        r = replay(ms, max_wait_ms=max_wait_ms, max_batch=max_batch, workers=workers, curve=curve)
        wait[pos] = r.wait_ms
        total += r.exec_ms
    p95s = [
        weighted_quantile(wait[m], QUEUE_QUANTILE, arrivals.weights[m])
        for m in (~arrivals.peak, arrivals.peak)
        if m.any()
    ]
    n = len(wait)
    return BatchOption(
        max_wait_ms=max_wait_ms,
        max_batch=max_batch,
        p95_queue_ms=max(p95s) if p95s else math.nan,
        gpu_ms_per_request=total / n if n else math.nan,
    )


def pick_option(options: Sequence[BatchOption], budget_ms: float) -> BatchOption | None:
    """Lowest GPU time per request within the queue budget (ties: less queue wait, then
    the shorter wait and smaller batch); None when no option fits."""
    fits = [o for o in options if o.p95_queue_ms <= budget_ms]
    if not fits:
        return None
    return min(
        fits, key=lambda o: (o.gpu_ms_per_request, o.p95_queue_ms, o.max_wait_ms, o.max_batch)
    )


def _table(
    options: Sequence[BatchOption], budget_ms: float, observed: BatchOption | None
) -> list[BatchOption]:
    """Per max_batch its best option (the pick's rule; the least queue wait where none
    fits), plus the observed one, sorted by max_batch then max_wait."""
    out: list[BatchOption] = []
    for b in sorted({o.max_batch for o in options}):
        group = [o for o in options if o.max_batch == b]
        best = pick_option(group, budget_ms) or min(
            group, key=lambda o: (o.p95_queue_ms, o.gpu_ms_per_request, o.max_wait_ms)
        )
        out.append(best)
    if observed is not None and all(
        (o.max_wait_ms, o.max_batch) != (observed.max_wait_ms, observed.max_batch) for o in out
    ):
        out.append(observed)
    return sorted(out, key=lambda o: (o.max_batch, o.max_wait_ms))


# --- observed batcher ---------------------------------------------------------------


def max_concurrency(ex: Executions) -> int:
    """The most executions running at once on one replica (at least 1)."""
    best = 1
    for inst in np.unique(ex.instance):
        rows = ex.instance == inst
        times = np.concatenate([ex.start_ns[rows], ex.end_ns[rows]])
        # an end at the same instant as a start frees its worker first
        kinds = np.concatenate([np.ones(rows.sum()), -np.ones(rows.sum())])
        order = np.lexsort((kinds, times))
        best = max(best, int(np.cumsum(kinds[order]).max()))
    return best


def observed_max_wait(fill_ms_max: float) -> float:
    """The batcher's max wait from the longest fill wait seen: a grid value within 10 %
    (the excess is event-loop lag), else rounded to 0.1 ms."""
    for w in MAX_WAIT_GRID_MS:
        if abs(fill_ms_max - w) <= max(0.1 * w, 0.05):
            return w
    return round(fill_ms_max, 1)


def _fmt(x: float) -> str:
    return f"{x:g}"


def triton_config(option: BatchOption) -> str:
    """Triton's ``dynamic_batching`` block implementing ``option``."""
    return (
        "dynamic_batching {\n"
        f"  max_queue_delay_microseconds: {round(option.max_wait_ms * 1000)}\n"
        f"  preferred_batch_size: [ {option.max_batch} ]\n"
        "}"
    )


def tracekit_batcher(option: BatchOption, workers: int) -> str:
    """The :class:`~tracekit.instrumentation.batching.DynamicBatcher` call for ``option``."""
    return (
        f"DynamicBatcher(max_batch_size={option.max_batch}, "
        f"max_wait_ms={_fmt(option.max_wait_ms)}, workers={workers})"
    )


def advise(
    store: Store,
    release: str,
    *,
    arrivals_ns: npt.NDArray[np.int64],
    weights: npt.NDArray[np.float64],
    peak: list[tuple[int, int]],
    queue_budget_ms: float,
    service: str | None = None,
) -> tuple[Batching | None, list[Flag]]:
    """Batching advice for ``release`` from its traced batches and recorded arrivals.

    ``arrivals_ns``/``weights``: the release's requests (start time, sample weight);
    ``peak``: the peak windows ``[start_ns, end_ns)``. None (flag ``no_batch_spans``)
    without traced batches.
    """
    flags: list[Flag] = []
    ex = read_executions(store, release, service=service)
    if ex is None or not ex.batched.any():
        return None, [
            Flag(
                NO_BATCH_SPANS,
                f"release {release!r} has no {cv.BATCH_SPAN_NAME} spans: no batching advice",
            )
        ]
    batches = Executions(
        instance=ex.instance[ex.batched],
        start_ns=ex.start_ns[ex.batched],
        end_ns=ex.end_ns[ex.batched],
        size=ex.size[ex.batched],
        gpu_ns=ex.gpu_ns[ex.batched],
        batched=ex.batched[ex.batched],
    )
    curve = fit_curve(batches.size, (batches.end_ns - batches.start_ns) / NS_PER_MS)
    if curve.r2 is None and curve.batches:
        flags.append(
            Flag(
                BATCH_CURVE_ONE_SIZE,
                f"every traced batch held {int(batches.size[0])} requests: execution time is "
                "charged per request, so the replay sees no saving from larger batches",
            )
        )
    workers = max_concurrency(batches)
    replicas = len(np.unique(batches.instance))

    queue = _query(
        store,
        _QUEUE_SQL,
        {
            "release": release,
            "service": service,
            "queue": cv.BATCH_QUEUE,
            "fill_path": json_path(cv.QUEUE_FILL_WAIT_NS),
            "worker_path": json_path(cv.QUEUE_WORKER_WAIT_NS),
        },
    )
    fill_ms = np.array([r[0] for r in queue if r[0] is not None], dtype=np.float64) / NS_PER_MS
    fill_w = np.array([r[2] for r in queue if r[0] is not None], dtype=np.float64)
    worker_ms = np.array([r[1] for r in queue if r[1] is not None], dtype=np.float64) / NS_PER_MS
    worker_w = np.array([r[2] for r in queue if r[1] is not None], dtype=np.float64)
    fill_p95 = weighted_quantile(fill_ms, QUEUE_QUANTILE, fill_w) if len(fill_ms) else None
    worker_p95 = weighted_quantile(worker_ms, QUEUE_QUANTILE, worker_w) if len(worker_ms) else None
    batch_p50 = float(np.median(batches.size))

    arrivals_ns = np.asarray(arrivals_ns, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) and np.any(weights != 1.0):
        flags.append(
            Flag(
                REPLAY_SAMPLED,
                "the replay pushes the sampled requests only: the real arrival stream was "
                "denser, so its queue waits are optimistic",
            )
        )
    options: list[BatchOption] = []
    observed: BatchOption | None = None
    if len(arrivals_ns):
        arrivals = _split(arrivals_ns, weights, peak, replicas)
        options = [
            simulate(arrivals, max_wait_ms=w, max_batch=b, workers=workers, curve=curve)
            for b in MAX_BATCH_GRID
            for w in (MAX_WAIT_GRID_MS if b > 1 else MAX_WAIT_GRID_MS[:1])
        ]
        # max_batch 1 closes every batch on arrival: its max wait changes nothing
        options[1:1] = [
            BatchOption(w, 1, options[0].p95_queue_ms, options[0].gpu_ms_per_request)
            for w in MAX_WAIT_GRID_MS[1:]
        ]
        obs_wait = observed_max_wait(float(fill_ms.max())) if len(fill_ms) else 0.0
        observed = simulate(
            arrivals,
            max_wait_ms=obs_wait,
            max_batch=int(batches.size.max()),
            workers=workers,
            curve=curve,
        )
    pick = pick_option(options, queue_budget_ms)
    if pick is None:
        best = min((o.p95_queue_ms for o in options), default=math.nan)
        flags.append(
            Flag(
                NO_BATCHING_OPTION,
                f"no batching option keeps the p95 queue wait within {_fmt(queue_budget_ms)} ms "
                + (f"(the least is {best:.1f} ms)" if options else "(no arrivals to replay)"),
            )
        )
    return (
        Batching(
            curve=curve,
            workers=workers,
            observed=observed,
            options=_table(options, queue_budget_ms, observed),
            pick=pick,
            queue_budget_ms=queue_budget_ms,
            fill_wait_ms_p95=fill_p95,
            worker_wait_ms_p95=worker_p95,
            batch_size_p50=batch_p50,
            triton=triton_config(pick) if pick else None,
            tracekit_batcher=tracekit_batcher(pick, workers) if pick else None,
        ),
        flags,
    )
