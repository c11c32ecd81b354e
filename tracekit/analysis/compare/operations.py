"""Operations and patterns for ``summary``, ``slow`` and ``diff``: the stage, then what in it.

A stage's time is split by operation beneath it (``request_operations``, see
:mod:`tracekit.analysis.attribution.operations`). This module owns how the three
questions use that split:

* the top operations of a cohort's critical path (CRISP's aggregate over many traces):
  the tail for ``summary`` and ``diff``, slow vs fast for ``slow``
  (:func:`cohort_operations`, a thin call of the store reader);
* in ``diff``, the counterfactual per operation inside the primary stage
  (:func:`operation_shares`): each of the stage's top few operations' per-request path
  time in the after release is put back to its before distribution by the same weighted
  quantile matching as a stage (:func:`tracekit.analysis.cohorts.counterfactual.quantile_match`),
  and the tail quantile is recomputed; what disappears is the operation's removal;
* the operation the verdict names (:func:`named_operation`): the one that removes at
  least half of its stage's removal;
* the patterns of each cohort (:func:`cohort_patterns`) and the flags that name them
  with how often they occur on each side (:func:`pattern_flags`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tracekit.analysis.attribution.patterns import (
    ERROR_ORIGIN,
    N_PLUS_ONE,
    RETRY,
    TIMEOUT,
    ReleasePatterns,
    release_patterns,
)
from tracekit.analysis.cohorts import counterfactual as cf
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.stats import weighted_quantile
from tracekit.analysis.results import Flag, NamedOperation, release_name
from tracekit.analysis.store import Store
from tracekit.analysis.store.operation_values import operation_values
from tracekit.analysis.store.operations import OperationStat, TopOperations, top_operations

TOP_OPERATIONS = 10
"""Operations shown per cohort."""
STAGE_OPERATIONS = 3
"""Operations of the primary stage the diff's counterfactual is run on (the stage's
top by tail path time in the after release)."""
CANDIDATES = 50
"""Operations read per cohort to find the primary stage's top ones among."""
MOST_OF_STAGE = 0.5
"""The verdict names an operation that removes at least this share of its stage's removal."""
PATTERN_FLAGS = 5
"""Pattern flags at most, most frequent first."""
SERIAL_SHARE = 0.5
"""Calls repeated in a request are called serial when, in at least this share of the
requests that repeat them, none overlapped an earlier one."""


@dataclass(frozen=True)
class OperationShare:
    """One operation of the diff's primary stage: its counterfactual removal and the tail
    cohorts' figures beside it (per request of each release's tail cohort)."""

    stage: str
    service: str
    operation: str
    removed_ms: float
    """Tail growth that disappears when this operation alone is put back (may be < 0)."""
    share: float
    """Of the tail growth: positive removal / max(growth, Σ positive removals of the
    stage's operations); NaN when the tail did not grow."""
    path_before_ms: float
    path_after_ms: float
    calls_before: float
    calls_after: float
    serial: bool | None
    """In the after release's tail; None when no request there called it twice."""


@dataclass(frozen=True)
class DiffOperations:
    """What the diff says about operations: the primary stage's split and each tail's top."""

    stage: str | None
    """The primary stage the counterfactual split (None when the verdict names none)."""
    shares: list[OperationShare] = field(default_factory=list)
    """The stage's top operations, most removal first."""
    before: list[OperationStat] = field(default_factory=list)
    after: list[OperationStat] = field(default_factory=list)
    """Top operations of each release's tail cohort, most path time first."""
    available: bool = True
    """False when the store has no operation rows (re-ingest to fill them)."""


def cohort_operations(
    store: Store,
    label: str,
    *,
    min_ms: float | None = None,
    max_ms: float | None = None,
    service: str | None = None,
    route: str | None = None,
    limit: int = TOP_OPERATIONS,
) -> TopOperations:
    """Top operations of ``label``'s requests between ``min_ms`` and ``max_ms``."""
    return top_operations(
        store,
        label,
        min_duration_ms=min_ms,
        max_duration_ms=max_ms,
        service=service,
        route=route,
        limit=limit,
    )


def serial_of(stat: OperationStat | None) -> bool | None:
    if stat is None or stat.serial_share is None:
        return None
    return stat.serial_share >= SERIAL_SHARE


def _after_column(
    after: ReleaseData, trace_ids: npt.NDArray[np.object_], ms: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Per request of ``after`` (its row order), the path ms of the rows given (0 elsewhere)."""
    col = np.zeros(after.n)
    if len(ms) == 0:
        return col
    row = {t: i for i, t in enumerate(after.trace_ids.tolist())}
    idx = np.fromiter((row.get(t, -1) for t in trace_ids.tolist()), dtype=np.int64, count=len(ms))
    ok = idx >= 0
    np.add.at(col, idx[ok], ms[ok])
    return col


def _before_distribution(
    before: ReleaseData, ms: npt.NDArray[np.float64], w: npt.NDArray[np.float64]
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """The before release's per-request values: the rows given, and 0 ms for the weight of
    every request without a row (only the distribution matters, not which request)."""
    rest = max(float(before.weights.sum()) - float(w.sum()), 0.0)
    return np.concatenate([ms, [0.0]]), np.concatenate([w, [rest]])


def operation_shares(
    store: Store,
    before: ReleaseData,
    after: ReleaseData,
    stage: str,
    q: float,
    candidates: Sequence[OperationStat],
    tail_before: Sequence[OperationStat],
    *,
    service: str | None = None,
    route: str | None = None,
) -> list[OperationShare]:
    """The counterfactual per operation of ``stage`` (its ``candidates``, the top few
    of the after tail), most removal first."""
    ops = [c for c in candidates if c.stage == stage][:STAGE_OPERATIONS]
    if not ops:
        return []
    pairs = [(o.service, o.operation) for o in ops]
    vb = operation_values(store, before.label, stage, pairs, service=service, route=route)
    va = operation_values(store, after.label, stage, pairs, service=service, route=route)
    after_q = weighted_quantile(after.duration_ms, q, after.weights)
    growth = after_q - weighted_quantile(before.duration_ms, q, before.weights)
    removed = []
    for j in range(len(ops)):
        a_col = _after_column(after, va.trace_ids[va.op == j], va.path_ms[va.op == j])
        b_vals, b_w = _before_distribution(before, vb.path_ms[vb.op == j], vb.weights[vb.op == j])
        matched = cf.quantile_match(a_col, after.weights, b_vals, b_w)
        totals = after.duration_ms - a_col + matched
        removed.append(after_q - weighted_quantile(totals, q, after.weights))
    by_key = {(o.stage, o.service, o.operation): o for o in tail_before}
    out = []
    for o, r, s in zip(ops, removed, cf.shares(growth, removed), strict=True):
        b = by_key.get((o.stage, o.service, o.operation))
        out.append(
            OperationShare(
                stage=stage,
                service=o.service,
                operation=o.operation,
                removed_ms=float(r),
                share=float(s),
                path_before_ms=b.path_ms_per_request if b else 0.0,
                path_after_ms=o.path_ms_per_request,
                calls_before=b.calls_per_request if b else 0.0,
                calls_after=o.calls_per_request,
                serial=serial_of(o),
            )
        )
    return sorted(out, key=lambda x: (-x.removed_ms, x.service, x.operation))


def named_operation(
    stage_removed_ms: float, shares: Sequence[OperationShare]
) -> NamedOperation | None:
    """The operation that removes at least :data:`MOST_OF_STAGE` of its stage's removal,
    unless it is the stage's own span (an operation named as its stage)."""
    if not shares or not stage_removed_ms > 0:
        return None
    top = shares[0]
    if not top.removed_ms >= MOST_OF_STAGE * stage_removed_ms:
        return None
    if top.operation == top.stage:
        # The stage's own span (named after its stage, as tracekit.stage() names it): the
        # stage's time is in no call beneath it, and naming it again says nothing.
        return None
    return NamedOperation(
        service=top.service,
        operation=top.operation,
        removed_ms=top.removed_ms,
        stage_removed_ms=stage_removed_ms,
        share=top.share,
        calls_before=top.calls_before,
        calls_after=top.calls_after,
        serial=top.serial,
    )


def _calls(x: float) -> str:
    return f"{x:.0f}" if x >= 10 or abs(x - round(x)) < 0.05 else f"{x:.1f}"


def operation_phrase(op: NamedOperation) -> str:
    """``+180.0 ms: 160.0 ms of it redis-manual GetDriver, calls per request 3 → 14, serial``."""
    text = (
        f"{op.stage_removed_ms:+.1f} ms: {op.removed_ms:.1f} ms of it {op.service} {op.operation}"
    )
    before, after = _calls(op.calls_before), _calls(op.calls_after)
    # Calls per request are evidence only where they changed: "1 → 1" says nothing.
    if before != after:
        text += f", calls per request {before} → {after}"
    if op.serial is not None and op.calls_after > 1:
        text += ", serial" if op.serial else ", overlapping"
    return text


# --- patterns ---------------------------------------------------------------------------


def beside(store: Store) -> Store:
    """``store`` on a cursor of its own, for a query to run on another thread (a store
    of attributed rows stays itself: it has no spans for :func:`cohort_patterns`)."""
    if getattr(store, "attributed", False):
        return store
    return Store(store.con.cursor(), store.path)


def cohort_patterns(store: Store, label: str, trace_ids: Sequence[str]) -> ReleasePatterns | None:
    """Pattern counts over (a sample of) a cohort's traces; None where the store holds no
    spans to detect them in (a ClickHouse store's attributed rows)."""
    if getattr(store, "attributed", False):
        return None
    return release_patterns(store, label, list(trace_ids))


_PATTERN_WORDS = {
    N_PLUS_ONE: "serial repeated calls (an N+1) to",
    RETRY: "retried calls to",
    TIMEOUT: "calls that timed out to",
    ERROR_ORIGIN: "failures that began in",
}


def pattern_flags(
    main: ReleasePatterns | None,
    other: ReleasePatterns | None,
    cohort: str,
    other_name: str,
) -> list[Flag]:
    """``[n_plus_one] serial repeated calls (an N+1) to redis-manual GetDriver in 40% of
    v2's slow traces (v1: 0%)``: the patterns of ``main``, most frequent first, with the
    share of ``other``'s traces (``other_name``) showing the same one."""
    if main is None or not main.examined:
        return []
    seen = {}
    if other is not None:
        seen = {(p.kind, p.service, p.operation): p.share for p in other.operations}
    flags = []
    for p in main.operations[:PATTERN_FLAGS]:
        was = seen.get((p.kind, p.service, p.operation), 0.0)
        them = (
            f"{other_name}: {was:.0%}"
            if other is not None and other.examined
            else f"{other_name}: n/a"
        )
        flags.append(
            Flag(
                p.kind,
                f"{_PATTERN_WORDS.get(p.kind, p.kind)} {p.service} {p.operation} in "
                f"{p.share:.0%} of {release_name(main.release)}'s {cohort} ({them})",
            )
        )
    return flags
