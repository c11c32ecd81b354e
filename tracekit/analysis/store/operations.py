"""Reading ``request_operations``: the top operations of a selection of requests.

``request_operations`` holds, per request, the critical-path time of each operation
beneath its stage (:mod:`tracekit.analysis.attribution.operations` says how operations
are named and what a call is). :func:`top_operations` sums those rows over a release's
requests, or over a cohort of them (the tail: requests at or above a duration), the way
CRISP aggregates critical paths over many traces: which operations the selection's time
on the path went to, how many calls a request makes to each, whether they ran one after
another, and how many failed. The same function answers on a DuckDB file and on a
ClickHouse store (the attributed tables' rows are pulled into the same table; a pull of
spans is attributed into it). The SQL is ``sql/top_operations.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.analysis.store import DatabaseError, Store, named_statements
from tracekit.errors import QueryError


@dataclass(frozen=True)
class OperationStat:
    """One operation of a selection of requests, beneath one stage.

    Figures are weighted by each request's sample weight, as every per-request figure
    is; ``per request`` means per request of the whole selection (a request that never
    called the operation counts as 0), so the stages' and operations' figures add up.
    """

    stage: str
    service: str
    operation: str
    requests: float
    """(Weighted) requests of the selection in which the operation occurs."""
    path_ms: float
    """Critical-path time of the operation, summed over the selection."""
    path_ms_per_request: float
    share: float
    """Of the path time of every operation of the selection (which is the selection's
    whole request time)."""
    calls_per_request: float
    calls_on_path_per_request: float
    serial_share: float | None
    """Of the requests that called the operation more than once (under one stage), the
    share in which no call overlapped an earlier one under the same parent; None when
    no request called it twice."""
    errors_per_request: float


@dataclass(frozen=True)
class TopOperations:
    """The answer of :func:`top_operations`."""

    release: str
    requests: int
    """Requests selected (unweighted)."""
    weighted_requests: float
    min_duration_ms: float | None
    max_duration_ms: float | None
    operations: list[OperationStat] = field(default_factory=list)
    """Most path time first (ties: stage, service, operation)."""
    available: bool = True
    """False when the store predates ``request_operations`` (re-ingest to fill it)."""


def _statements() -> dict[str, str]:
    return named_statements("top_operations.sql")


def top_operations(
    store: Store,
    release: str,
    *,
    min_duration_ms: float | None = None,
    max_duration_ms: float | None = None,
    service: str | None = None,
    route: str | None = None,
    limit: int = 10,
) -> TopOperations:
    """The operations the selected requests' critical paths went to, most time first.

    The selection is ``release``'s requests (``''``: requests without a release label),
    of ``service`` and ``route`` (route or request name) when given, whose duration is
    at least ``min_duration_ms`` and at most ``max_duration_ms`` when given: e.g. the
    tail at or above the release's p99, ``min_duration_ms=p99``. At most ``limit`` rows.

    >>> top = top_operations(store, "v2", min_duration_ms=250.0)      # doctest: +SKIP
    >>> [(o.service, o.operation, round(o.path_ms_per_request)) for o in top.operations]
    [('mysql', 'SQL SELECT', 282), ('redis-manual', 'GetDriver', 204), ...]

    Raises :class:`QueryError` when the store cannot be read.
    """
    sql = _statements()
    params = {
        "release": release,
        "service": service,
        "route": route,
        "min_ns": None if min_duration_ms is None else round(min_duration_ms * 1e6),
        "max_ns": None if max_duration_ms is None else round(max_duration_ms * 1e6),
    }
    con = store.con
    try:
        if not store.has_table("request_operations"):
            return TopOperations(release, 0, 0.0, min_duration_ms, max_duration_ms, [], False)
        with_sel = f"WITH sel AS ({sql['selection']})\n"
        got = con.execute(with_sel + sql["totals"], params).fetchone()
        n, weight = (int(got[0]), float(got[1])) if got else (0, 0.0)
        rows = con.execute(
            with_sel + sql["operations"], {**params, "limit": max(0, int(limit))}
        ).fetchall()
    except DatabaseError as exc:
        raise QueryError(f"cannot read operations from {store.path}: {exc}") from exc
    per = weight or 1.0
    ops = [
        OperationStat(
            stage=str(stage),
            service=str(svc),
            operation=str(op),
            requests=float(reqs),
            path_ms=float(path) / 1e6,
            path_ms_per_request=float(path) / 1e6 / per,
            share=float(share or 0.0),
            calls_per_request=float(calls) / per,
            calls_on_path_per_request=float(on_path) / per,
            serial_share=float(serial) / float(repeated) if repeated else None,
            errors_per_request=float(errors) / per,
        )
        for stage, svc, op, reqs, path, calls, on_path, repeated, serial, errors, share in rows
    ]
    return TopOperations(release, n, weight, min_duration_ms, max_duration_ms, ops)
