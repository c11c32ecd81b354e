"""One trace explained: its spans as a waterfall, the critical path, and the stage split.

:func:`explain_trace` reads one trace's spans from the store, runs the same walk as
:func:`tracekit.analysis.attribution.per_request.refresh`, and returns an :class:`Explanation`
that the renderers in :mod:`tracekit.render.explain` draw. It works from ``spans``
alone, so a trace can be explained before (or without) a refresh. Stage spans that ingest
derived from an engine's latency attributes (``tracekit.stage.derived``) are marked, and
so are the stages their time makes. A trace that triggered a profile capture, or ran
under one (its spans carry ``tracekit.profile.id``), gets each profile's top ops and GPU
figures from the ``profiles`` table (:func:`trace_profiles`; docs/kineto.md,
"Profiles captured on trigger").
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tracekit import conventions as cv
from tracekit.analysis.attribution import critical_path as cp
from tracekit.analysis.attribution import per_request as attribution
from tracekit.analysis.attribution.operations import (
    OperationRow,
    request_operations,
    trace_calls,
)
from tracekit.analysis.attribution.patterns import Pattern, trace_patterns, wanted_attributes
from tracekit.analysis.store import Store
from tracekit.analysis.store.span_attributes import span_attributes
from tracekit.errors import QueryError

NS_PER_MS = 1_000_000.0
_STAGE_DERIVED_PATH = '$."' + cv.STAGE_DERIVED + '"'
MIN_PREFIX = 8
"""Shortest trace id prefix accepted."""

_HEX = re.compile(r"[0-9a-f]+")
_FIND_SQL = """
SELECT DISTINCT trace_id FROM spans WHERE starts_with(trace_id, $prefix) ORDER BY 1 LIMIT 3
"""
_RELEASE_SQL = "SELECT service_version FROM spans WHERE trace_id = $trace AND span_id = $span"
_PROFILE_ID_PATH = '$."' + cv.PROFILE_ID + '"'
_SPAN_PROFILES_SQL = """
SELECT DISTINCT json_extract_string(attributes, $path) FROM spans
WHERE trace_id = $trace AND json_extract_string(attributes, $path) IS NOT NULL
"""
_PROFILE_COLUMNS = (
    "profile_id",
    "reason",
    "service",
    "service_version",
    "source",
    "trigger_trace_id",
    "trigger_span_id",
    "stage",
    "trigger_duration_ms",
    "captured",
    "overlapping",
    "wall_ns",
    "cpu_self_ns",
    "kernel_ns",
    "top_ops",
    "top_kernels",
    "gpu",
)
_PROFILES_SQL = f"""
SELECT {", ".join(_PROFILE_COLUMNS)} FROM profiles
WHERE list_contains(trace_ids, $trace) OR list_contains($ids, profile_id)
ORDER BY start_ns NULLS LAST, profile_id
"""
_PROFILE_IDS_SQL = """
SELECT profile_id FROM profiles WHERE list_contains(trace_ids, $trace) ORDER BY profile_id
"""
_DERIVED_SQL = """
SELECT span_id, json_extract_string(attributes, $path) FROM spans
WHERE trace_id = $trace AND stage IS NOT NULL AND json_extract_string(attributes, $path) IS NOT NULL
"""


@dataclass
class ExplainSpan:
    """One span of the waterfall; times are ms from the request start, clipped."""

    span_id: str
    parent_span_id: str | None
    name: str
    service: str | None
    kind: str
    status: str
    depth: int
    start_ms: float
    end_ms: float
    stage: str | None
    """The stage the span's time counts toward: its own ``tracekit.stage``, else the
    nearest staged ancestor's, and ``downstream`` anywhere under a downstream call
    (None: unattributed)."""
    own_stage: str | None
    """The span's own ``tracekit.stage`` when it differs from ``stage`` (a called
    service's own model_execute under ``downstream``); None otherwise."""
    time_kind: str | None
    critical_ms: float
    """Time on the critical path charged to this span itself (not to its children)."""
    path: list[tuple[float, float]] = field(default_factory=list)
    """This span's own pieces of the critical path, (start_ms, end_ms), earliest first."""
    derived: str | None = None
    """Where tracekit made this stage span from at ingest (``attributes``: an engine's
    latency attributes, :mod:`tracekit.analysis.ingest.genai`); None for a span the trace
    carried."""

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms

    @property
    def on_critical_path(self) -> bool:
        return self.critical_ms > 0


@dataclass(frozen=True)
class Operation:
    """One operation of the request beneath one stage: a row of ``request_operations``
    (:class:`~tracekit.analysis.attribution.operations.OperationRow`, which says how
    operations are named, what a call is and when one failed), with its time in ms."""

    service: str
    operation: str
    stage: str
    path_ms: float
    """Critical-path time charged to the operation's spans themselves (a CLIENT span's
    and its callee SERVER span's own time, not their children's)."""
    calls: int
    calls_on_path: int
    serial: bool
    """No call started while an earlier call of it under the same parent still ran."""
    errors: int
    """Calls in which the CLIENT span or its SERVER span failed."""

    @classmethod
    def of_row(cls, row: OperationRow) -> Operation:
        return cls(
            service=row.service,
            operation=row.operation,
            stage=row.stage,
            path_ms=row.critical_ns / NS_PER_MS,
            calls=row.calls,
            calls_on_path=row.calls_on_path,
            serial=row.serial,
            errors=row.errors,
        )


@dataclass
class ExplainStage:
    """One stage of the request: its share of the critical path and its wait/compute."""

    stage: str
    time_kind: str
    critical_ms: float
    share: float
    wall_ms: float
    cpu_ms: float | None
    gpu_ms: float | None
    derived: str | None = None
    """``attributes`` when the stage's time comes from spans derived from an engine's
    latency attributes rather than spans the trace carried."""


@dataclass(frozen=True)
class ProfileOp:
    """One CPU op or device kernel of a profile, by self time."""

    name: str
    calls: int
    self_ms: float
    share: float
    """Of the profile's summed CPU self time (kernels: of its summed device time)."""


@dataclass(frozen=True)
class ProfileGpu:
    """A profile's GPU time line, with HTA's definitions (docs/kineto.md)."""

    kernels: int
    """Device ops (kernels, memcpy, memset)."""
    window_ms: float
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    comm_overlap_pct: float | None
    """None without communication kernels."""
    host_wait_ms: float
    """Idle gaps on the streams that the host's late launches caused."""


@dataclass(frozen=True)
class ExplainProfile:
    """A profile captured on trigger that this request triggered or ran under."""

    profile_id: str
    role: str
    """``triggered`` (this request's slow stage fired the rule), ``captured`` (its stage
    ran under the profiler), ``overlapping`` (only part of it did) or ``linked`` (a span
    names the profile, the metadata does not name the trace)."""
    ingested: bool
    """False when a span names the profile but its file was not ingested (no figures)."""
    reason: str | None = None
    """``rule`` or ``on_demand``."""
    service: str | None = None
    release: str | None = None
    source: str | None = None
    trigger_trace_id: str | None = None
    trigger_span_id: str | None = None
    stage: str | None = None
    """The trigger's stage (on demand: the captured executions')."""
    trigger_ms: float | None = None
    captured: int = 0
    """Stage executions the capture ran for."""
    captured_ms: float | None = None
    """This request's captured (or overlapping) execution's duration, when it is one."""
    wall_ms: float = 0.0
    cpu_ms: float = 0.0
    """Self time of every CPU op, summed."""
    kernel_ms: float = 0.0
    top_ops: list[ProfileOp] = field(default_factory=list)
    top_kernels: list[ProfileOp] = field(default_factory=list)
    gpu: ProfileGpu | None = None


@dataclass
class Explanation:
    """One request trace, ready to render."""

    trace_id: str
    root_span_id: str
    name: str
    service: str | None
    release: str | None
    duration_ms: float
    spans: list[ExplainSpan]
    """Walked spans in waterfall order (depth-first, children by start time)."""
    stages: list[ExplainStage]
    """Stages in request order; their ``critical_ms`` sum to ``duration_ms``."""
    span_count: int
    hidden_spans: int
    """Spans not drawn: outside the request's interval, or not connected to it."""
    skewed_spans: int
    fallback: bool
    """Stages derived from span names/kinds (the trace carries no ``tracekit.stage``)."""
    profiles: list[ExplainProfile] = field(default_factory=list)
    """Profiles captured on trigger that this request triggered or ran under."""
    operations: list[Operation] = field(default_factory=list)
    """What the request's spans called, beneath each stage, longest path time first: the
    rows the store keeps for the request (``request_operations``), computed alike."""
    patterns: list[Pattern] = field(default_factory=list)
    """``n_plus_one``, ``retry``, ``timeout`` and ``error_origin`` findings, with evidence."""


def resolve_trace_id(store: Store, trace_id: str) -> str:
    """The full trace id for ``trace_id`` or a unique prefix of at least 8 hex digits."""
    prefix = trace_id.strip().lower()
    if len(prefix) < MIN_PREFIX or not _HEX.fullmatch(prefix):
        raise QueryError(
            f"{trace_id!r} is not a trace id: give the hex id (or its first {MIN_PREFIX}+ digits), "
            "e.g. from the exemplars of `tracekit diff` or `tracekit slow`"
        )
    found = [t for (t,) in store.con.execute(_FIND_SQL, {"prefix": prefix}).fetchall()]
    if not found:
        raise QueryError(
            f"no trace {prefix} in {store.path}: ingest it first (tracekit ingest FILE) "
            "or pick one from the exemplars of `tracekit slow`"
        )
    if len(found) > 1:
        raise QueryError(
            f"trace id prefix {prefix} is ambiguous ({', '.join(found[:2])}, ...): give more digits"
        )
    return str(found[0])


def explain_trace(store: Store, trace_id: str) -> Explanation:
    """Explain the request trace ``trace_id`` (full id or unique prefix)."""
    full = resolve_trace_id(store, trace_id)
    c = attribution.fetch_spans(store, [full])
    t = attribution.trace_input(c, 0, len(c["trace_id"]))
    a = cp.analyse_trace(t)
    if a == cp.SKIP_BATCH:
        raise QueryError(
            f"trace {full} is a batch execution, not a request: explain one of the requests "
            "it links to (each request's own trace holds its model_execute span)"
        )
    if a == cp.SKIP_NO_TIMESTAMPS:
        raise QueryError(f"trace {full} has spans without timestamps: nothing to explain")
    if isinstance(a, str):
        raise QueryError(f"trace {full} has no root span (its parent links form a cycle)")

    t0 = a.start_ns
    pieces: dict[int, list[tuple[float, float]]] = {}
    for i, seg_start, seg_end in reversed(a.segments):
        pieces.setdefault(i, []).append(((seg_start - t0) / NS_PER_MS, (seg_end - t0) / NS_PER_MS))
    kinds = {st.stage: st.time_kind for st in a.stages}
    derived = dict(
        store.con.execute(_DERIVED_SQL, {"trace": full, "path": _STAGE_DERIVED_PATH}).fetchall()
    )
    derived_stages: dict[str, str] = {}
    spans = []
    for i in _waterfall_order(a):
        cs, ce = a.clipped_start[i], a.clipped_end[i]
        assert cs is not None and ce is not None
        stage = a.effective_stage[i]
        spans.append(
            ExplainSpan(
                span_id=t.span_id[i],
                parent_span_id=t.parent[i],
                name=t.name[i],
                service=t.service[i],
                kind=t.kind[i],
                status=c["status_code"][i],
                depth=a.depth[i],
                start_ms=(cs - t0) / NS_PER_MS,
                end_ms=(ce - t0) / NS_PER_MS,
                stage=stage,
                own_stage=t.stage[i] if t.stage[i] not in (None, stage) else None,
                time_kind=kinds.get(stage or cv.UNATTRIBUTED),
                critical_ms=a.critical_ns[i] / NS_PER_MS,
                path=pieces.get(i, []),
                derived=derived.get(t.span_id[i]),
            )
        )
        if stage is not None and stage == t.stage[i] and t.span_id[i] in derived:
            derived_stages.setdefault(stage, derived[t.span_id[i]])
    by_stage = {st.stage: st for st in a.stages}
    stages = []
    for name in cv.order_stages(list(by_stage)):
        s = by_stage[name]
        stages.append(
            ExplainStage(
                stage=name,
                time_kind=s.time_kind,
                critical_ms=s.critical_ns / NS_PER_MS,
                share=s.critical_ns / a.duration_ns if a.duration_ns else 0.0,
                wall_ms=s.wall_ns / NS_PER_MS,
                cpu_ms=None if s.cpu_time_ns is None else s.cpu_time_ns / NS_PER_MS,
                gpu_ms=None if s.gpu_time_ns is None else s.gpu_time_ns / NS_PER_MS,
                derived=derived_stages.get(name),
            )
        )
    attrs = span_attributes(store, [full])
    calls = trace_calls(t, a)
    operations = sorted(
        (Operation.of_row(row) for row in request_operations(t, a, calls)),
        key=lambda o: (-o.path_ms, o.stage, o.service, o.operation),
    )
    patterns = trace_patterns(
        t, a, [wanted_attributes(attrs.get((full, s))) for s in t.span_id], calls
    )
    root_id = t.span_id[a.root]
    release = store.con.execute(_RELEASE_SQL, {"trace": full, "span": root_id}).fetchone()
    return Explanation(
        trace_id=full,
        root_span_id=root_id,
        name=t.name[a.root],
        service=t.service[a.root],
        release=release[0] if release else None,
        duration_ms=a.duration_ns / NS_PER_MS,
        spans=spans,
        stages=stages,
        span_count=len(t.span_id),
        hidden_spans=len(t.span_id) - len(spans),
        skewed_spans=a.skewed_spans,
        fallback=a.fallback,
        profiles=trace_profiles(store, full),
        operations=operations,
        patterns=patterns,
    )


# --- profiles captured on trigger ------------------------------------------------------


def profile_ids(store: Store, trace_ids: Sequence[str]) -> dict[str, list[str]]:
    """The profiles each trace triggered or ran under, by id (sorted; empty when none):
    those its spans name (``tracekit.profile.id``) and those whose metadata names it."""
    spans, table = store.has_table("spans"), store.has_table("profiles")
    out: dict[str, list[str]] = {}
    for trace in trace_ids:
        found = set(_span_profile_ids(store, trace)) if spans else set()
        if table:
            found.update(r[0] for r in store.run(_PROFILE_IDS_SQL, {"trace": trace}))
        out[trace] = sorted(found)
    return out


def trace_profiles(store: Store, trace_id: str) -> list[ExplainProfile]:
    """What ``explain`` shows of the profiles of ``trace_id`` (the trigger first)."""
    named = _span_profile_ids(store, trace_id) if store.has_table("spans") else []
    rows = []
    if store.has_table("profiles"):
        rows = store.run(_PROFILES_SQL, {"trace": trace_id, "ids": named})
    found = [_profile(trace_id, row) for row in rows]
    seen = {p.profile_id for p in found}
    found += [ExplainProfile(pid, "linked", ingested=False) for pid in named if pid not in seen]
    order = {"triggered": 0, "captured": 1, "overlapping": 2, "linked": 3}
    return sorted(found, key=lambda p: order[p.role])  # stable: by start within a role


def _span_profile_ids(store: Store, trace_id: str) -> list[str]:
    rows = store.run(_SPAN_PROFILES_SQL, {"trace": trace_id, "path": _PROFILE_ID_PATH})
    return sorted(str(r[0]).lower() for r in rows)


def _profile(trace_id: str, row: Sequence[Any]) -> ExplainProfile:
    r = dict(zip(_PROFILE_COLUMNS, row, strict=True))
    captured = json.loads(r["captured"])
    mine = [c for c in captured if c.get("trace_id") == trace_id]
    part = [c for c in json.loads(r["overlapping"]) if c.get("trace_id") == trace_id]
    here = None
    for c in (mine or part)[:1]:
        if c.get("start_ns") is not None and c.get("end_ns") is not None:
            here = (c["end_ns"] - c["start_ns"]) / NS_PER_MS
    role = "captured" if mine else "overlapping" if part else "linked"
    if r["trigger_trace_id"] == trace_id:
        role = "triggered"
    return ExplainProfile(
        profile_id=r["profile_id"],
        role=role,
        ingested=True,
        reason=r["reason"],
        service=r["service"],
        release=r["service_version"],
        source=r["source"],
        trigger_trace_id=r["trigger_trace_id"],
        trigger_span_id=r["trigger_span_id"],
        stage=r["stage"],
        trigger_ms=r["trigger_duration_ms"],
        captured=len(captured),
        captured_ms=here,
        wall_ms=r["wall_ns"] / NS_PER_MS,
        cpu_ms=r["cpu_self_ns"] / NS_PER_MS,
        kernel_ms=r["kernel_ns"] / NS_PER_MS,
        top_ops=_ops(r["top_ops"], r["cpu_self_ns"]),
        top_kernels=_ops(r["top_kernels"], r["kernel_ns"]),
        gpu=None if r["gpu"] is None else _gpu(json.loads(r["gpu"])),
    )


def _ops(text: str, total_ns: int) -> list[ProfileOp]:
    return [
        ProfileOp(
            name=o["name"],
            calls=int(o["calls"]),
            self_ms=o["self_ns"] / NS_PER_MS,
            share=o["self_ns"] / total_ns if total_ns else 0.0,
        )
        for o in json.loads(text)
    ]


def _gpu(f: dict[str, int]) -> ProfileGpu:
    window = f["window_ns"] or 1
    return ProfileGpu(
        kernels=f["kernels"],
        window_ms=f["window_ns"] / NS_PER_MS,
        idle_pct=100.0 * f["idle_ns"] / window,
        compute_pct=100.0 * f["compute_ns"] / window,
        non_compute_pct=100.0 * f["non_compute_ns"] / window,
        comm_overlap_pct=100.0 * f["overlap_ns"] / f["comm_ns"] if f["comm_ns"] else None,
        host_wait_ms=f["host_wait_ns"] / NS_PER_MS,
    )


def _waterfall_order(a: cp.TraceAnalysis) -> list[int]:
    """Walked spans depth-first, siblings by (clipped) start time."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(a.tree_parent):
        if p is not None:
            kids.setdefault(p, []).append(i)
    out: list[int] = []
    stack = [a.root]
    while stack:
        i = stack.pop()
        out.append(i)
        stack.extend(sorted(kids.get(i, []), key=lambda c: (a.clipped_start[c], c), reverse=True))
    return out
