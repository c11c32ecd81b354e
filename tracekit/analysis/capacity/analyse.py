"""Capacity and cost per release: which binds first, latency under bursts or cost per request.

The time line of each release is cut into windows (:func:`~tracekit.analysis.autoscale.audit.
build_windows`: weighted arrival rate, replicas seen). Latency is that of *accepted* requests
(failed ones are not served work): a window whose objective quantile of accepted requests
breaks the objective *misses*; one with fewer accepted requests than the quantile needs is
not judged. Windows are *peak* above :data:`PEAK_FACTOR` × the median rate of the windows
with requests, or, when that marks none, the top decile by rate (``peak_rule`` says which).
A run of consecutive peak windows is a *spike*. The verdict's words and the ranking of
releases live in :mod:`~tracekit.analysis.capacity.wording`.

Cost is replica-seconds per 1,000 accepted requests (× the release's ``--replica-cost``
per hour when given); GPU busy is, per replica, the union of its model-execution intervals
(device time where measured) ÷ the time it served, averaged over replicas; execution busy
is the same over the executions' wall intervals, the stand-in the verdict uses where no
device time was measured (flag ``busy_from_wall_time``). The verdict:

* ``inconclusive``: fewer than :data:`~.wording.MIN_WINDOWS` judged windows, or no judged
  peak window;
* ``latency_bound``: peak (or normal) windows miss in at least
  :data:`~.wording.MISS_SHARE_BOUND` of them;
* ``cost_bound``: it meets the objective and the GPUs (else the executions) are busy less
  than :data:`~.wording.IDLE_GPU_BUSY`;
* ``balanced`` otherwise (flag ``cost_not_judged`` when there are no model executions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.autoscale.audit import build_windows
from tracekit.analysis.autoscale.model import Slo, Window, min_requests_for
from tracekit.analysis.capacity.batching import Executions, advise, read_executions
from tracekit.analysis.capacity.model import (
    Batching,
    CapacityResult,
    Cost,
    Headroom,
    Overrun,
    Regime,
    ReleaseCapacity,
    Spikes,
    WindowPoint,
)
from tracekit.analysis.capacity.wording import summary, verdict
from tracekit.analysis.cohorts.release import ReleaseData, load_releases
from tracekit.analysis.cohorts.stats import weighted_quantile, weighted_quantiles
from tracekit.analysis.ingest.kineto_timeline import union_ns
from tracekit.analysis.results import Flag
from tracekit.analysis.store import Store
from tracekit.errors import ConfigError

PEAK_FACTOR = 1.5
"""A window is peak above this multiple of the median rate of windows with requests."""
PEAK_TOP_SHARE = 0.1
"""When no window is above :data:`PEAK_FACTOR` × the median, the busiest tenth are peak."""
PEAK_RULE_FACTOR = f"above {PEAK_FACTOR:g}× the median rate"
PEAK_RULE_TOP = "top decile"

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def capacity(
    store: Store,
    versions: list[str],
    slo: Slo,
    *,
    span_store: Store | None = None,
    window_s: float = 10.0,
    replica_cost_per_h: float | Mapping[str, float] | None = None,
    gpus_per_replica: int = 1,
    queue_budget_ms: float | None = None,
    service: str | None = None,
    route: str | None = None,
) -> CapacityResult:
    """Capacity, cost and batching advice for each release in ``versions``.

    ``span_store`` (default ``store``) answers the span-level queries (model executions,
    batching). ``replica_cost_per_h`` is one price for every release or a price per label
    (releases on different hardware); a label it lacks gets no money figure.
    ``gpus_per_replica`` does not change the busy fraction (a replica's model executions
    occupy its GPUs together); it is kept for the GPU counts of the renderers.
    """
    if not versions:
        raise ConfigError("give at least one release to analyse (--version LABEL)")
    if window_s <= 0:
        raise ConfigError(f"--window must be positive, got {window_s:g} s")
    if gpus_per_replica < 1:
        raise ConfigError(f"--gpus-per-replica must be at least 1, got {gpus_per_replica}")
    prices = _prices(replica_cost_per_h, versions)
    spans = span_store if span_store is not None else store
    budget = queue_budget_ms if queue_budget_ms is not None else slo.threshold_ms / 5.0
    datas = load_releases(store, versions, service=service, route=route)
    releases = [
        _release(
            data,
            slo,
            spans,
            window_s=window_s,
            replica_cost_per_h=prices.get(data.label),
            queue_budget_ms=budget,
            service=service,
        )
        for data in datas
    ]
    flags: list[Flag] = []
    unpriced = [r.label for r in releases if r.cost.replica_cost_per_h is None]
    if len(unpriced) == len(releases):
        flags.append(
            Flag("no_replica_cost", "no replica cost given: costs are replica-seconds only")
        )
    elif unpriced:
        flags.append(
            Flag(
                "no_replica_cost",
                f"no replica cost for {', '.join(unpriced)}: its cost is replica-seconds only",
            )
        )
    return CapacityResult(
        releases=releases,
        slo=slo.text,
        window_s=window_s,
        summary=summary(releases, slo),
        flags=flags,
    )


def _prices(cost: float | Mapping[str, float] | None, versions: list[str]) -> dict[str, float]:
    """The price per replica-hour of each release that has one."""
    if cost is None:
        return {}
    given = dict(cost) if isinstance(cost, Mapping) else dict.fromkeys(versions, float(cost))
    unknown = sorted(set(given) - set(versions))
    if unknown:
        raise ConfigError(
            f"--replica-cost names {', '.join(unknown)}, which is not a --version here"
            f" (releases: {', '.join(versions)})"
        )
    for label, price in given.items():
        if not math.isfinite(price) or price < 0:
            raise ConfigError(f"--replica-cost for {label} must be 0 or more, got {price:g}")
    return given


# --- one release ---------------------------------------------------------------------------


@dataclass
class _Timeline:
    """The windows of one release with accepted-request latency in them."""

    windows: list[Window]
    row_window: npt.NDArray[np.int64]
    """Window index of each request."""
    span_s: FloatArray
    latency_ms: FloatArray
    """Objective quantile of accepted requests (NaN where not judged)."""
    judged: BoolArray
    missed: BoolArray
    has_requests: BoolArray
    rate: FloatArray
    replicas: FloatArray


def _timeline(data: ReleaseData, slo: Slo, window_s: float) -> _Timeline:
    min_req = min_requests_for(slo.quantile)
    windows = build_windows(data, slo, window_s, min_req)
    n = len(windows)
    w_ns = int(round(window_s * 1e9))
    t0 = int(data.start_ns.min())
    row_window = ((data.start_ns - t0) // w_ns).astype(np.int64)
    last = int(data.start_ns.max())
    # The spans build_windows divided by: the last window ends at the last arrival.
    span_s = np.full(n, window_s)
    span_s[-1] = min(max((last - windows[-1].start_ns) / 1e9, window_s / 10), window_s)
    accepted = ~data.is_error
    order = np.argsort(row_window, kind="stable")
    bounds = np.searchsorted(row_window[order], np.arange(n + 1))
    latency = np.full(n, np.nan)
    judged = np.zeros(n, dtype=bool)
    for i in range(n):
        rows = order[bounds[i] : bounds[i + 1]]
        rows = rows[accepted[rows]]
        if len(rows) >= min_req:
            judged[i] = True
            latency[i] = weighted_quantile(data.duration_ms[rows], slo.quantile, data.weights[rows])
    missed = judged & np.array(
        [slo.broken_by(v) if judged[i] else False for i, v in enumerate(latency)]
    )
    return _Timeline(
        windows=windows,
        row_window=row_window,
        span_s=span_s,
        latency_ms=latency,
        judged=judged,
        missed=missed,
        has_requests=np.array([w.requests > 0 for w in windows], dtype=bool),
        rate=np.array([w.rate_rps for w in windows], dtype=np.float64),
        replicas=np.array([w.replicas for w in windows], dtype=np.float64),
    )


def _peaks(tl: _Timeline) -> tuple[BoolArray, str, float]:
    """Peak windows, the rule that marked them, and the median rate."""
    rates = tl.rate[tl.has_requests]
    median = float(np.median(rates))
    peak = tl.has_requests & (tl.rate > PEAK_FACTOR * median)
    if peak.any():
        return peak, PEAK_RULE_FACTOR, median
    k = max(1, math.ceil(PEAK_TOP_SHARE * len(rates)))
    # The k busiest windows (ties broken by time, so a flat time line is not all peak).
    candidates = np.flatnonzero(tl.has_requests)
    top = candidates[np.argsort(-tl.rate[candidates], kind="stable")[:k]]
    peak = np.zeros(len(tl.rate), dtype=bool)
    peak[top] = True
    return peak, PEAK_RULE_TOP, median


def _opt(x: float) -> float | None:
    return None if not math.isfinite(x) else float(x)


def _regime(data: ReleaseData, tl: _Timeline, sel: BoolArray) -> Regime:
    rows = sel[tl.row_window]
    ok = rows & ~data.is_error
    qs = weighted_quantiles(data.duration_ms[ok], [0.5, 0.95, 0.99], data.weights[ok])
    weight_all = float(data.weights[rows].sum())
    weight_failed = float(data.weights[rows & data.is_error].sum())
    judged = sel & tl.judged
    missed_rows = (sel & tl.missed)[tl.row_window]
    return Regime(
        p50_ms=_opt(float(qs[0])),
        p95_ms=_opt(float(qs[1])),
        p99_ms=_opt(float(qs[2])),
        windows=int(sel.sum()),
        requests=weight_all,
        miss_share=float((sel & tl.missed).sum() / judged.sum()) if judged.any() else None,
        request_miss_share=(
            float(data.weights[missed_rows].sum()) / weight_all if weight_all > 0 else None
        ),
        error_rate=weight_failed / weight_all if weight_all > 0 else None,
        judged_windows=int(judged.sum()),
        missed_windows=int((sel & tl.missed).sum()),
    )


def _overrun(data: ReleaseData, slo: Slo) -> Overrun:
    """Accepted requests over the objective's threshold and their time past it, weighted."""
    ok = ~data.is_error
    latency, weights = data.duration_ms[ok], data.weights[ok]
    over = latency > slo.threshold_ms
    accepted = float(weights.sum())
    slow = float(weights[over].sum())
    excess_ms = float((weights[over] * (latency[over] - slo.threshold_ms)).sum())
    return Overrun(
        requests=slow,
        share=slow / accepted if accepted > 0 else None,
        excess_s=excess_ms / 1000.0,
    )


def _runs(mask: BoolArray) -> list[tuple[int, int]]:
    """[start, stop) index ranges of consecutive True values."""
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _spikes(
    data: ReleaseData, tl: _Timeline, peak: BoolArray, median: float, normal: BoolArray
) -> Spikes:
    runs = _runs(peak)
    if not runs:
        return Spikes(0, None, None, None, None, _p95(data, tl, normal))
    durations = np.array([float(tl.span_s[a:b].sum()) for a, b in runs])
    ratios = np.array([float(tl.rate[a:b].max()) / median for a, b in runs]) if median > 0 else None
    return Spikes(
        count=len(runs),
        duration_s_p50=weighted_quantile(durations, 0.5),
        duration_s_p90=weighted_quantile(durations, 0.9),
        rate_ratio=float(np.median(ratios)) if ratios is not None else None,
        p95_inside_ms=_p95(data, tl, peak),
        p95_outside_ms=_p95(data, tl, normal),
    )


def _p95(data: ReleaseData, tl: _Timeline, sel: BoolArray) -> float | None:
    ok = sel[tl.row_window] & ~data.is_error
    return _opt(weighted_quantile(data.duration_ms[ok], 0.95, data.weights[ok]))


def _headroom(tl: _Timeline) -> Headroom:
    rpr = tl.rate / tl.replicas
    judged = tl.judged
    peak_rpr = float(rpr[judged].max()) if judged.any() else float(rpr[tl.has_requests].max())
    knee: float | None = None
    if tl.missed.any():
        lowest_miss = float(rpr[tl.missed].min())
        met = judged & ~tl.missed & (rpr < lowest_miss)
        if met.any():
            knee = float(rpr[met].max())
    return Headroom(knee_rps_per_replica=knee, peak_rps_per_replica=peak_rpr)


def _release(
    data: ReleaseData,
    slo: Slo,
    spans: Store,
    *,
    window_s: float,
    replica_cost_per_h: float | None,
    queue_budget_ms: float,
    service: str | None,
) -> ReleaseCapacity:
    flags: list[Flag] = []
    tl = _timeline(data, slo, window_s)
    peak, peak_rule, median = _peaks(tl)
    normal = tl.has_requests & ~peak
    peak_regime = _regime(data, tl, peak)
    normal_regime = _regime(data, tl, normal)
    spikes = _spikes(data, tl, peak, median, normal)
    cost = _cost(data, tl, spans, replica_cost_per_h, service, flags)
    headroom = _headroom(tl)
    overrun = _overrun(data, slo)
    batching = _batching(data, tl, peak, spans, queue_budget_ms, service, flags)
    word, reason = verdict(slo, peak_regime, normal_regime, spikes, cost, overrun, flags)
    points = [
        WindowPoint(
            start_s=w.start_s,
            rate_rps=w.rate_rps,
            rps_per_replica=w.rate_rps / max(w.replicas, 1),
            latency_ms=_opt(float(tl.latency_ms[i])),
            peak=bool(peak[i]),
            missed=bool(tl.missed[i]),
            replicas=w.replicas,
        )
        for i, w in enumerate(tl.windows)
    ]
    return ReleaseCapacity(
        label=data.label,
        verdict=word,
        reason=reason,
        normal=normal_regime,
        peak=peak_regime,
        spikes=spikes,
        cost=cost,
        headroom=headroom,
        overrun=overrun,
        batching=batching,
        peak_rule=peak_rule,
        flags=flags,
        windows=points,
    )


# --- cost ----------------------------------------------------------------------------------


def _cost(
    data: ReleaseData,
    tl: _Timeline,
    spans: Store,
    replica_cost_per_h: float | None,
    service: str | None,
    flags: list[Flag],
) -> Cost:
    replica_s = float((tl.replicas * tl.span_s).sum())
    accepted = float(data.weights[~data.is_error].sum())
    per_1k = replica_s / accepted * 1000.0 if accepted > 0 else None
    if per_1k is None:
        flags.append(Flag("no_accepted_requests", f"{data.label}: every request failed"))
    cost_per_1k = (
        per_1k * replica_cost_per_h / 3600.0
        if per_1k is not None and replica_cost_per_h is not None
        else None
    )
    gpu_busy, wall_busy = _busy(data, spans, service, flags)
    return Cost(
        replica_seconds_per_1k=per_1k,
        gpu_busy_fraction=gpu_busy,
        cost_per_1k=cost_per_1k,
        execution_busy_fraction=wall_busy,
        replica_cost_per_h=replica_cost_per_h,
    )


def _busy(
    data: ReleaseData, spans: Store, service: str | None, flags: list[Flag]
) -> tuple[float | None, float | None]:
    """GPU busy (device time where measured; None without any) and execution busy (wall)."""
    ex = _executions(spans, data.label, service)
    if ex is None or len(ex.start_ns) == 0:
        flags.append(
            Flag(
                "no_model_spans",
                f"{data.label}: no {cv.MODEL_EXECUTE} or {cv.BATCH_SPAN_NAME} spans,"
                " so GPU busy is unknown",
            )
        )
        return None, None
    start = np.asarray(ex.start_ns, dtype=np.int64)
    wall = np.asarray(ex.end_ns, dtype=np.int64) - start
    inst = np.asarray(ex.instance, dtype=object).astype(str)
    wall_busy = _busy_fraction(data, inst, start, start + np.maximum(wall, 0))
    gpu = np.asarray(ex.gpu_ns, dtype=np.float64)
    if not np.isfinite(gpu).any():
        flags.append(
            Flag(
                "no_device_time",
                f"{data.label}: model executions carry no {cv.GPU_TIME_NS}, so GPU busy is"
                " unknown; their wall time (execution busy) stands in for it",
            )
        )
        return None, wall_busy
    # Device time where measured (the GPU is busy for that long from the launch), else wall.
    busy = np.where(np.isfinite(gpu), np.minimum(np.nan_to_num(gpu), wall), wall).astype(np.int64)
    return _busy_fraction(data, inst, start, start + np.maximum(busy, 0)), wall_busy


def _busy_fraction(
    data: ReleaseData,
    inst: npt.NDArray[np.str_],
    start: npt.NDArray[np.int64],
    end: npt.NDArray[np.int64],
) -> float | None:
    """Per replica, the union of [start, end) ÷ the time it served; the mean over replicas."""
    req_inst = data.instance_ids.astype(str)
    req_end = data.start_ns + (data.duration_ms * 1e6).astype(np.int64)
    fractions = []
    for name in sorted(set(req_inst) | set(inst)):
        mine = inst == name
        served = req_inst == name
        los, his = [], []
        if served.any():
            los.append(int(data.start_ns[served].min()))
            his.append(int(req_end[served].max()))
        if mine.any():
            los.append(int(start[mine].min()))
            his.append(int(end[mine].max()))
        lo, hi = min(los), max(his)
        if hi <= lo:
            continue
        fractions.append(min(union_ns(start[mine], end[mine]) / (hi - lo), 1.0))
    return float(np.mean(fractions)) if fractions else None


def _executions(spans: Store, release: str, service: str | None) -> Executions | None:
    return read_executions(spans, release, service=service)


# --- batching ------------------------------------------------------------------------------


def _batching(
    data: ReleaseData,
    tl: _Timeline,
    peak: BoolArray,
    spans: Store,
    queue_budget_ms: float,
    service: str | None,
    flags: list[Flag],
) -> Batching | None:
    intervals = [
        (tl.windows[i].start_ns, tl.windows[i].start_ns + int(round(tl.span_s[i] * 1e9)))
        for i in np.flatnonzero(peak)
    ]
    batching, more = advise(
        spans,
        data.label,
        arrivals_ns=data.start_ns,
        weights=data.weights,
        peak=intervals,
        queue_budget_ms=queue_budget_ms,
        service=service,
    )
    flags.extend(more)
    return batching
