"""``tracekit steps``: one training run's step time, split by component, per rank.

Reads the ``train_step`` traces of a run (a ``service.version``) and attributes each
rank's step with the critical-path walk of
:func:`tracekit.analysis.attribution.critical_path.analyse_trace` — the walk that fills
``request_stages`` at ingest, so a step's numbers here are that table's. A collective
launched in the background (``tracekit.comm.async``, a DDP bucket) enters the walk at
its stage's last launch (until then the stage was computing), so only *exposed*
communication is charged; the rest is overlap.

Exposed communication is split by matching collectives across ranks on (group, seq):
waiting until the last rank arrived is **peer wait**, the rest **transfer**. Hosts'
clocks are first aligned on collective ends (every rank leaves a collective at about
the same time); ranks on one host share a clock and are never shifted.

Per step, a component is the mean over ranks of its critical-path time, except that
the compute stages keep the fastest rank's time and the excess of the others (their
mean minus the minimum) is ``compute_imbalance``: a straggler's extra compute and the
peer wait it causes are one problem. Components add up to the step time, which is the
mean over ranks of the step span's duration (no clock alignment needed).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.attribution import critical_path as cp
from tracekit.analysis.attribution.per_request import fetch_spans, json_path, trace_input
from tracekit.analysis.results import Flag
from tracekit.analysis.store import DatabaseError, Store
from tracekit.analysis.training import bandwidth as bw
from tracekit.analysis.training.gpu import rank_gpu_breakdown
from tracekit.analysis.training.model import (
    COMPONENT_ORDER,
    COMPUTE_STAGES,
    IMBALANCE,
    PEER_WAIT,
    TRANSFER,
    Component,
    RankRow,
    RunSteps,
    StepQuantiles,
    StepsResult,
    Straggler,
)
from tracekit.errors import QueryError

NS = 1_000_000.0
CLOCK_FLAG_MS = 0.1
"""Alignment that moves a host by more than this is reported (``clock_aligned``)."""
MAX_STRAGGLERS = 3

_RUNS_SQL = """
SELECT service_version, count(*) FROM spans
WHERE parent_span_id IS NULL AND name = $step AND service_version IS NOT NULL
GROUP BY 1 ORDER BY 1
"""

_STEPS_SQL = """
SELECT trace_id, span_id, start_ns, end_ns, host_name, instance_id,
       coalesce(TRY_CAST(json_extract_string(resource_attributes, $rank) AS INTEGER),
                TRY_CAST(json_extract_string(attributes, $rank) AS INTEGER)) AS rank,
       coalesce(TRY_CAST(json_extract_string(resource_attributes, $world) AS INTEGER),
                TRY_CAST(json_extract_string(attributes, $world) AS INTEGER)) AS world,
       TRY_CAST(json_extract_string(attributes, $step_idx) AS BIGINT) AS step,
       TRY_CAST(json_extract_string(attributes, $samples) AS DOUBLE) AS samples,
       TRY_CAST(json_extract_string(resource_attributes, $link) AS DOUBLE) AS link_gbps,
       TRY_CAST(json_extract_string(attributes, $tokens) AS DOUBLE) AS tokens
FROM spans
WHERE parent_span_id IS NULL AND name = $step AND service_version = $label
  AND start_ns IS NOT NULL AND end_ns IS NOT NULL
ORDER BY trace_id
"""

_COMM_SQL = """
SELECT trace_id, span_id,
       coalesce(json_extract_string(attributes, $group), 'default') AS grp,
       TRY_CAST(json_extract_string(attributes, $seq) AS BIGINT) AS seq,
       coalesce(json_extract_string(attributes, $op),
                nullif(split_part(name, ' ', 2), ''), 'unknown') AS op,
       TRY_CAST(json_extract_string(attributes, $bytes) AS BIGINT) AS nbytes,
       TRY_CAST(json_extract_string(attributes, $size) AS INTEGER) AS group_size,
       json_extract_string(attributes, $desc) AS group_desc,
       json_extract_string(attributes, $backend) AS backend
FROM spans
WHERE stage = $comm AND trace_id IN (SELECT unnest($ids::VARCHAR[]))
"""


@dataclass
class _RankStep:
    """One rank's one step after the walk."""

    trace_id: str
    rank: int
    step: int
    host: str | None
    duration_ns: int
    samples: float | None
    stages: dict[str, int]
    tokens: float | None = None
    """Critical-path ns per stage; communication already split into peer wait/transfer."""
    comm_total_ns: int = 0
    comm_exposed_ns: int = 0
    comm_spans: list[tuple[int, int, int, str, int]] = field(default_factory=list)
    """(span index, launch ns, end ns, group, seq) of each matched collective."""
    comm_meta: list[bw.CommAttrs] = field(default_factory=list)
    """Aligned with ``comm_spans``: what the span says of its collective."""
    comm_stage: list[str] = field(default_factory=list)
    """Aligned with ``comm_spans``: the stage it was launched under."""
    segments: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    """Critical segments of each communication span."""


def training_runs(store: Store) -> dict[str, int]:
    """Run label -> number of ``train_step`` spans in the store."""
    try:
        rows = store.con.execute(_RUNS_SQL, {"step": cv.STEP_SPAN_NAME}).fetchall()
    except DatabaseError as exc:
        raise QueryError(f"cannot read {store.path}: {exc}") from exc
    return {str(label): int(n) for label, n in rows}


def is_training_run(store: Store, label: str) -> bool:
    """Whether ``label`` names a run of ``train_step`` traces."""
    return label in training_runs(store)


def steps_report(
    store: Store,
    version: str | None = None,
    *,
    warmup: int = 1,
    link_gbps: float | None = None,
    progress: Callable[[str], None] | None = None,
) -> StepsResult:
    """:class:`StepsResult` for one run (``version``) or every training run in the store."""
    runs = training_runs(store)
    if version is not None:
        if version not in runs:
            known = ", ".join(runs) or "none"
            raise QueryError(
                f"no training run {version!r} in {store.path} (training runs: {known}); "
                "a run is the service.version of processes that used tracekit.train_steps"
            )
        labels = [version]
    else:
        labels = list(runs)
    out = []
    for label in labels:
        if progress:
            progress(f"reading run {label}")
        out.append(load_run(store, label, warmup=warmup, link_gbps=link_gbps))
    return StepsResult(runs=out, db=store.path)


def load_run(
    store: Store, label: str, *, warmup: int = 1, link_gbps: float | None = None
) -> RunSteps:
    """Read and attribute every step of run ``label``.

    ``link_gbps``: the network link's peak in Gb/s for the bandwidth table (default: the
    run's ``tracekit.link.gbps`` resource attribute, if any).
    """
    params = {
        "step": cv.STEP_SPAN_NAME,
        "label": label,
        "rank": json_path(cv.RANK),
        "world": json_path(cv.WORLD_SIZE),
        "step_idx": json_path(cv.STEP),
        "samples": json_path(cv.STEP_SAMPLES),
        "link": json_path(cv.LINK_GBPS),
        "tokens": json_path(cv.STEP_TOKENS),
    }
    try:
        roots = store.con.execute(_STEPS_SQL, params).fetchall()
    except DatabaseError as exc:
        raise QueryError(f"cannot read steps from {store.path}: {exc}") from exc
    if not roots:
        raise QueryError(f"run {label!r} has no timed train_step spans in {store.path}")
    ids = [r[0] for r in roots]
    ranks = _ranks(roots)
    comm = _comm_attributes(store, ids)
    cols = fetch_spans(store, ids)
    bounds = _bounds(cols["trace_id"])
    rank_steps: list[_RankStep] = []
    for trace_id, _sid, start, end, host, _inst, _r, _w, step, samples, _link, tokens in roots:
        lo, hi = bounds[trace_id]
        rs = _walk_step(cols, lo, hi, comm)
        if rs is None:
            continue
        rs.trace_id, rs.rank, rs.host = trace_id, ranks[trace_id], host
        rs.step = int(step) if step is not None else -1
        rs.duration_ns = int(end - start)
        rs.samples = samples
        rs.tokens = tokens
        rank_steps.append(rs)
    world = max([r[7] or 0 for r in roots] + [len(set(ranks.values()))])
    if link_gbps is None:
        # the resource attribute as the option would be checked: finite, above 0
        rates = [float(r[10]) for r in roots if r[10] is not None]
        link_gbps = max((v for v in rates if math.isfinite(v) and v > 0), default=None)
    run = _summarise(label, world, rank_steps, warmup, link_gbps)
    # Profiled runs (Kineto files) also have each rank's GPU time line.
    gpu = rank_gpu_breakdown(store, label)
    run.ranks = [
        replace(
            r,
            gpu_idle_pct=gpu[r.rank].gpu_idle_pct,
            gpu_compute_pct=gpu[r.rank].gpu_compute_pct,
            gpu_non_compute_pct=gpu[r.rank].gpu_non_compute_pct,
            comm_overlap_pct=gpu[r.rank].comm_overlap_pct,
        )
        if r.rank in gpu
        else r
        for r in run.ranks
    ]
    return run


def _ranks(roots: list[tuple[Any, ...]]) -> dict[str, int]:
    """Rank per step trace: as written, else numbered by process (service.instance.id)."""
    instances = sorted({str(r[5]) for r in roots if r[6] is None})
    dense = {inst: i for i, inst in enumerate(instances)}
    return {r[0]: int(r[6]) if r[6] is not None else dense[str(r[5])] for r in roots}


def _comm_attributes(store: Store, ids: list[str]) -> dict[tuple[str, str], bw.CommAttrs]:
    params = {
        "ids": ids,
        "comm": cv.COMMUNICATION,
        "group": json_path(cv.COMM_GROUP),
        "seq": json_path(cv.COMM_SEQ),
        "op": json_path(cv.COMM_OP),
        "bytes": json_path(cv.COMM_BYTES),
        "size": json_path(cv.COMM_GROUP_SIZE),
        "desc": json_path(cv.COMM_GROUP_DESC),
        "backend": json_path(cv.COMM_BACKEND),
    }
    try:
        rows = store.con.execute(_COMM_SQL, params).fetchall()
    except DatabaseError as exc:
        raise QueryError(f"cannot read collectives from {store.path}: {exc}") from exc
    return {
        (t, s): bw.CommAttrs(g, -1 if q is None else int(q), str(op or ""), b, n, d, be)
        for t, s, g, q, op, b, n, d, be in rows
    }


def _bounds(trace_ids: list[str]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    lo = 0
    for i in range(1, len(trace_ids) + 1):
        if i == len(trace_ids) or trace_ids[i] != trace_ids[lo]:
            out[trace_ids[lo]] = (lo, i)
            lo = i
    return out


def _walk_step(
    cols: dict[str, list[Any]], lo: int, hi: int, comm: dict[tuple[str, str], bw.CommAttrs]
) -> _RankStep | None:
    t = trace_input(cols, lo, hi)
    trace_id = cols["trace_id"][lo]
    info = [comm.get((trace_id, sid)) for sid in t.span_id]
    index = {sid: i for i, sid in enumerate(t.span_id)}
    comm_total = 0
    spans: list[tuple[int, int, int, str, int]] = []
    meta: list[bw.CommAttrs] = []
    under: list[str] = []
    intervals: list[tuple[int, int]] = []
    for i, c in enumerate(info):
        s, e = t.start[i], t.end[i]
        if c is None or s is None or e is None:
            continue
        intervals.append((s, e))
        if c.seq >= 0:
            spans.append((i, s, e, c.group, c.seq))
            meta.append(c)
            parent = t.parent[i]
            p = index.get(parent) if parent is not None else None
            under.append((t.stage[p] or t.name[p]) if p is not None else cv.STEP_SPAN_NAME)
    if intervals:
        comm_total = _union(intervals)
    a = cp.analyse_trace(t)
    if isinstance(a, str):
        return None
    stages = {s.stage: s.critical_ns for s in a.stages}
    segments: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for idx, s0, s1 in a.segments:
        if a.effective_stage[idx] == cv.COMMUNICATION:
            segments[idx].append((s0, s1))
    return _RankStep(
        trace_id=trace_id,
        rank=-1,
        step=-1,
        host=None,
        duration_ns=a.duration_ns,
        samples=None,
        stages=stages,
        comm_total_ns=comm_total,
        comm_exposed_ns=stages.get(cv.COMMUNICATION, 0),
        comm_spans=spans,
        comm_meta=meta,
        comm_stage=under,
        segments=dict(segments),
    )


def _union(intervals: list[tuple[int, int]]) -> int:
    intervals.sort()
    total, cur_s, cur_e = 0, intervals[0][0], intervals[0][1]
    for s, e in intervals[1:]:
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + cur_e - cur_s


# --- across ranks: clocks, arrivals, peer wait --------------------------------------


def _host_offsets(rank_steps: list[_RankStep]) -> dict[str | None, int]:
    """Per host, the median amount its clock is ahead of the lowest rank's host."""
    ends: dict[tuple[str, int], dict[str | None, list[int]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for rs in rank_steps:
        for _i, _s, e, g, q in rs.comm_spans:
            ends[(g, q)][rs.host].append(e)
    hosts = {rs.host for rs in rank_steps}
    if len(hosts) < 2:
        return {h: 0 for h in hosts}
    ref = min(rank_steps, key=lambda r: r.rank).host
    diffs: dict[str | None, list[float]] = defaultdict(list)
    for per_host in ends.values():
        if ref not in per_host:
            continue
        # medians of Unix-ns times in float64 would lose ~100 ns: relative to the first
        base = min(per_host[ref])
        ref_end = statistics.median([e - base for e in per_host[ref]])
        for h, es in per_host.items():
            diffs[h].append(statistics.median([e - base for e in es]) - ref_end)
    return {h: int(statistics.median(diffs[h])) if diffs.get(h) else 0 for h in hosts}


@dataclass
class _Arrivals:
    """Who reached each collective when, after clock alignment."""

    last: dict[tuple[str, int], int]
    """Per collective (group, seq): the last aligned arrival."""
    lags: dict[int, list[float]]
    """Per rank: ms it trailed the median of the others, at each collective it was last."""
    lateness: dict[int, dict[int, list[float]]]
    """Per rank, per step: ms it arrived after the median of the others (negative:
    before) at each of the step's matched collectives, last or not."""
    matched: int


def _arrivals(rank_steps: list[_RankStep], offsets: dict[str | None, int], world: int) -> _Arrivals:
    arrivals: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for rs in rank_steps:
        off = offsets.get(rs.host, 0)
        for _i, s, _e, g, q in rs.comm_spans:
            arrivals[(g, q)].append((s - off, rs.rank, rs.step))
    out = _Arrivals({}, defaultdict(list), defaultdict(lambda: defaultdict(list)), 0)
    for key, arr in arrivals.items():
        out.last[key] = max(a for a, _, _ in arr)
        if len(arr) < max(world, 2):
            continue
        out.matched += 1
        arr.sort()
        t_last, r_last, _ = arr[-1]
        out.lags[r_last].append((t_last - float(np.median([a for a, _, _ in arr[:-1]]))) / NS)
        for k, (t, rank, step) in enumerate(arr):
            others = [a for j, (a, _, _) in enumerate(arr) if j != k]
            out.lateness[rank][step].append((t - float(np.median(others))) / NS)
    return out


def _split_comm(rs: _RankStep, last: dict[tuple[str, int], int], offset: int) -> None:
    """Replace the step's communication time by peer wait and transfer."""
    exposed = rs.stages.pop(cv.COMMUNICATION, 0)
    peer = 0
    for i, _s, _e, g, q in rs.comm_spans:
        arrived = last.get((g, q))
        if arrived is None:
            continue
        until = arrived + offset  # back on this rank's clock
        for s0, s1 in rs.segments.get(i, ()):
            peer += max(0, min(s1, until) - s0)
    peer = min(peer, exposed)
    rs.stages[PEER_WAIT] = peer
    rs.stages[TRANSFER] = exposed - peer


# --- one run --------------------------------------------------------------------------


def _summarise(
    label: str, world: int, rank_steps: list[_RankStep], warmup: int, link_gbps: float | None
) -> RunSteps:
    flags: list[Flag] = []
    offsets = _host_offsets(rank_steps)
    arr = _arrivals(rank_steps, offsets, world)
    last, lags, matched = arr.last, arr.lags, arr.matched
    for rs in rank_steps:
        _split_comm(rs, last, offsets.get(rs.host, 0))
    clock_offset_ms = max((abs(v) for v in offsets.values()), default=0) / NS
    if clock_offset_ms > CLOCK_FLAG_MS:
        flags.append(
            Flag(
                "clock_aligned",
                f"run {label}: host clocks disagreed by up to {clock_offset_ms:.2f} ms; "
                "arrivals were compared after aligning them on collective ends",
            )
        )
    by_step: dict[int, list[_RankStep]] = defaultdict(list)
    for rs in rank_steps:
        by_step[rs.step].append(rs)
    step_ids = sorted(by_step)
    skip = warmup if len(step_ids) > warmup + 2 else 0
    kept = step_ids[skip:]
    if any(len(by_step[s]) < world for s in kept):
        flags.append(
            Flag(
                "missing_ranks",
                f"run {label}: some steps lack spans of some of its {world} ranks "
                "(a rank's file not ingested, or sampled out)",
            )
        )
    names = sorted({k for rs in rank_steps for k in rs.stages} | {IMBALANCE})
    comp_steps: dict[str, list[float]] = {n: [] for n in names}
    step_ms: list[float] = []
    samples: list[float] = []
    tokens: list[float] = []
    for s in kept:
        group = by_step[s]
        step_ms.append(float(np.mean([r.duration_ns for r in group])) / NS)
        total_samples = [r.samples for r in group if r.samples is not None]
        samples.append(float(sum(total_samples)) if total_samples else float("nan"))
        step_tokens = [r.tokens for r in group if r.tokens is not None]
        tokens.append(float(sum(step_tokens)) if len(step_tokens) == len(group) else float("nan"))
        imbalance = 0.0
        for n in names:
            if n == IMBALANCE:
                continue
            vals = [r.stages.get(n, 0) / NS for r in group]
            mean = float(np.mean(vals))
            if n in COMPUTE_STAGES:
                comp_steps[n].append(min(vals))
                imbalance += mean - min(vals)
            else:
                comp_steps[n].append(mean)
        comp_steps[IMBALANCE].append(imbalance)
    mean_step = float(np.mean(step_ms)) if step_ms else 0.0
    components = [
        Component(n, float(np.mean(comp_steps[n])), float(np.mean(comp_steps[n])) / mean_step)
        for n in _ordered(names)
        if comp_steps[n] and (n in COMPONENT_ORDER or any(comp_steps[n]))
    ]
    total_comm = sum(r.comm_total_ns for r in rank_steps if r.step in kept)
    exposed = sum(r.comm_exposed_ns for r in rank_steps if r.step in kept)
    overlap = 1.0 - exposed / total_comm if total_comm else None
    instances = _instances(rank_steps, offsets, set(kept))
    have_samples = not any(np.isnan(samples)) and samples
    sps = float(np.sum(samples)) / (float(np.sum(step_ms)) / 1000.0) if have_samples else None
    per_rank = float(np.mean(samples)) / world if have_samples else None
    have_tokens = tokens and not any(np.isnan(tokens))
    tokens_per_rank = float(np.mean(tokens)) / world if have_tokens else None
    return RunSteps(
        label=label,
        world_size=world,
        steps=len(kept),
        step_ms=StepQuantiles(_q(step_ms, 0.5), _q(step_ms, 0.95)),
        step_ms_mean=mean_step,
        components=components,
        overlap_pct=None if overlap is None else overlap * 100.0,
        samples_per_s=sps,
        samples_per_rank_step=per_rank,
        tokens_per_rank_step=tokens_per_rank,
        ranks=_rank_rows(rank_steps, set(kept), lags),
        stragglers=_stragglers(rank_steps, arr, set(kept)),
        matched_collectives=matched,
        clock_offset_ms=clock_offset_ms,
        warmup_steps=skip,
        flags=flags,
        collectives=bw.collective_table(instances, world, link_gbps),
        groups=bw.group_table(instances, len(kept), world),
        link_gbps=link_gbps,
        step_times_ms=step_ms,
        component_steps_ms=comp_steps,
        samples_per_step=samples,
    )


def _instances(
    rank_steps: list[_RankStep], offsets: dict[str | None, int], kept: set[int]
) -> list[bw.CommInstance]:
    """The kept steps' collectives, on the aligned clock, for the bandwidth tables."""
    attrs = [f.name for f in fields(bw.CommAttrs)]
    out = []
    for rs in rank_steps:
        if rs.step not in kept:
            continue
        off = offsets.get(rs.host, 0)
        for (i, s, e, _g, _q), c, stage in zip(
            rs.comm_spans, rs.comm_meta, rs.comm_stage, strict=True
        ):
            exposed = sum(s1 - s0 for s0, s1 in rs.segments.get(i, ()))
            out.append(
                bw.CommInstance(
                    **{name: getattr(c, name) for name in attrs},
                    rank=rs.rank,
                    host=rs.host,
                    step=rs.step,
                    start=s - off,
                    end=e - off,
                    stage=stage,
                    exposed_ns=exposed,
                )
            )
    return out


def _ordered(names: list[str]) -> list[str]:
    builtin = [n for n in COMPONENT_ORDER if n in names]
    rest = sorted(n for n in names if n not in COMPONENT_ORDER and n != cv.UNATTRIBUTED)
    return builtin + rest + ([cv.UNATTRIBUTED] if cv.UNATTRIBUTED in names else [])


def _q(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else float("nan")


def _rank_rows(
    rank_steps: list[_RankStep], kept: set[int], lags: dict[int, list[float]]
) -> list[RankRow]:
    per: dict[int, list[_RankStep]] = defaultdict(list)
    for rs in rank_steps:
        if rs.step in kept:
            per[rs.rank].append(rs)
    rows = []
    for rank in sorted(per):
        mine = per[rank]

        def mean(f: Callable[[_RankStep], float], mine: list[_RankStep] = mine) -> float:
            return float(np.mean([f(r) for r in mine]))

        rows.append(
            RankRow(
                rank=rank,
                host=mine[0].host,
                steps=len(mine),
                step_ms_p50=float(np.median([r.duration_ns for r in mine])) / NS,
                data_wait_ms=mean(lambda r: r.stages.get(cv.DATA_WAIT, 0)) / NS,
                compute_ms=mean(lambda r: sum(r.stages.get(s, 0) for s in COMPUTE_STAGES)) / NS,
                comm_exposed_ms=mean(lambda r: r.comm_exposed_ns) / NS,
                peer_wait_ms=mean(lambda r: r.stages.get(PEER_WAIT, 0)) / NS,
                last_arrivals=len(lags.get(rank, [])),
            )
        )
    return rows


def _median_se(values: list[float]) -> float:
    """Standard error of the median, from the median absolute deviation (robust to stalls).

    1.4826 * MAD estimates the standard deviation of normal data; the median's standard
    error is sqrt(pi/2) = 1.2533 times the mean's.
    """
    if len(values) < 3:
        return float("inf")
    v = np.asarray(values, dtype=float)
    mad = float(np.median(np.abs(v - np.median(v))))
    return 1.2533 * 1.4826 * mad / float(np.sqrt(len(v)))


def _stragglers(rank_steps: list[_RankStep], arr: _Arrivals, kept: set[int]) -> list[Straggler]:
    hosts = {rs.rank: rs.host for rs in rank_steps}
    ranked = sorted(arr.lags.items(), key=lambda kv: (-len(kv[1]), -float(np.mean(kv[1]))))
    out = []
    for r, v in ranked[:MAX_STRAGGLERS]:
        # Per step, not per collective: a step's buckets share whatever delayed the rank
        # in that step, so they are one piece of evidence, not several.
        per_step = [float(np.median(x)) for st, x in arr.lateness[r].items() if st in kept and x]
        out.append(
            Straggler(
                rank=r,
                host=hosts.get(r),
                last_arrivals=len(v),
                share=len(v) / arr.matched if arr.matched else 0.0,
                mean_lag_ms=float(np.mean(v)),
                lateness_ms=float(np.median(per_step)) if per_step else 0.0,
                late_steps=float(np.mean([x > 0 for x in per_step])) if per_step else 0.0,
                lateness_se_ms=_median_se(per_step),
            )
        )
    return out
