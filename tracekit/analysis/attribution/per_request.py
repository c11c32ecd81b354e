"""Derived tables ``requests`` and ``request_stages``, rebuilt from ``spans``.

:func:`refresh` reads the spans of the chosen traces in one ordered query, runs
:func:`tracekit.analysis.attribution.critical_path.analyse_trace` on each trace, and writes the
results back in bulk (delete, then insert from in-memory columns, in one transaction),
so running it twice changes nothing. Request-level attributes (release, route, error,
in-flight count, utilisation) are read from the root span's row by SQL in the same
insert, which keeps JSON parsing out of the Python loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.attribution import bulk
from tracekit.analysis.attribution import critical_path as cp
from tracekit.analysis.attribution.operations import (
    ClientAttrs,
    failed_rows,
    operation_codes,
    span_failed,
)
from tracekit.analysis.ingest.jaeger import REF_TYPE_ATTR
from tracekit.analysis.store import DatabaseError, Store, iter_chunks, schema_sql
from tracekit.errors import QueryError

# Database-client attributes (OTel semantic conventions, old and new names) that mark
# a span as a call out of the process for the fallback stages.
_DB_SYSTEM_KEYS = (cv.DB_SYSTEM, cv.DB_SYSTEM_NAME)


# A span tied to its trace only by FOLLOWS_FROM (a link naming its parent with
# opentracing.ref_type follows_from, as the OpenTelemetry Collector translates a Jaeger
# FOLLOWS_FROM parent) or, parentless, only by a link into its own trace: the walk
# leaves it and its subtree off the path (critical_path.TraceInput.follows). {n} is the
# spans table's alias; most spans have no links and stop at the first test.
_FOLLOWS_SQL = """CASE WHEN {n}links IS NULL OR length({n}links::VARCHAR) <= 2 THEN false
  ELSE coalesce(len(list_filter(from_json({n}links, $link_shape), lambda l:
    CASE WHEN {n}parent_span_id IS NULL THEN l.trace_id = {n}trace_id
         ELSE l.span_id = {n}parent_span_id
              AND json_extract_string(l.attributes, $ref_type) = 'follows_from' END)) > 0,
    false) END"""
_LINK_SHAPE = '[{"trace_id": "VARCHAR", "span_id": "VARCHAR", "attributes": "JSON"}]'


# A CLIENT span's server address and URL: what its operation names when the called
# service left no SERVER span (operations.client_target). {a} is the attributes column.
_CLIENT_SQL = """CASE WHEN {when} THEN [json_extract_string({a}, $cl_method),
    json_extract_string({a}, $cl_address), json_extract_string({a}, $cl_port),
    json_extract_string({a}, $cl_template), json_extract_string({a}, $cl_url)] END AS client"""


# A span's HTTP status code where operations.span_failed reads it (an UNSET CLIENT or
# SERVER span whose attributes name it); NULL elsewhere, so most spans parse nothing.
_HTTP_STATUS_SQL = """CASE WHEN {n}status_code = 'UNSET' AND {n}kind IN ('CLIENT', 'SERVER')
  AND contains({n}attributes::VARCHAR, $http_status_key)
  THEN TRY_CAST(json_extract_string({n}attributes, $http_status) AS DOUBLE) END"""


def _http_status_params() -> dict[str, str]:
    return {
        "http_status_key": cv.HTTP_RESPONSE_STATUS_CODE,
        "http_status": json_path(cv.HTTP_RESPONSE_STATUS_CODE),
    }


def _client_params() -> dict[str, str]:
    return {
        "cl_method": json_path(cv.HTTP_REQUEST_METHOD),
        "cl_address": json_path(cv.SERVER_ADDRESS),
        "cl_port": json_path(cv.SERVER_PORT),
        "cl_template": json_path(cv.URL_TEMPLATE),
        "cl_url": json_path(cv.URL_FULL),
    }


def json_path(key: str) -> str:
    """The DuckDB JSON path of a top-level attribute whose name contains dots."""
    return '$."' + key.replace('"', '\\"') + '"'


_SPANS_SQL = """
WITH ids AS (SELECT trace_id FROM _tk_ids)
SELECT trace_id, span_id, parent_span_id, name, kind, status_code,
       start_ns IS NOT NULL AND end_ns IS NOT NULL AS has_ts,
       coalesce(start_ns, 0) AS start_ns, coalesce(end_ns, 0) AS end_ns,
       service_name, stage, time_kind,
       coalesce(cpu_time_ns, -1) AS cpu_ns, coalesce(gpu_time_ns, -1) AS gpu_ns,
       name = $batch_name OR coalesce(json_exists(attributes, $batch_path), false) AS is_batch,
       CASE WHEN stage IS NULL THEN
            json_extract_string(attributes, $db1) IS NOT NULL
            OR json_extract_string(attributes, $db2) IS NOT NULL END AS is_db,
       CASE WHEN stage IS NULL THEN json_extract_string(attributes, $route) END AS route,
       coalesce(TRY_CAST(json_extract_string(attributes, $async_path) AS BOOLEAN), false)
         AS background,
       {follows} AS follows,
       {http_status} AS http_status,
       {client}
FROM spans
WHERE $all OR trace_id IN (SELECT trace_id FROM ids)
ORDER BY trace_id, span_id
""".format(
    follows=_FOLLOWS_SQL.format(n=""),
    http_status=_HTTP_STATUS_SQL.format(n=""),
    client=_CLIENT_SQL.format(a="attributes", when="kind = 'CLIENT'"),
)

_DELETE_SQL = """
DELETE FROM {table}
WHERE $all OR trace_id IN (SELECT trace_id FROM _tk_ids)
"""


@dataclass
class RefreshReport:
    """What one :func:`refresh` did: traces read, requests written, what was set aside."""

    traces: int = 0
    spans: int = 0
    requests: int = 0
    batch_traces: int = 0
    """Traces whose root is a batch span: not requests."""
    skipped_no_timestamps: int = 0
    skipped_no_root: int = 0
    orphans_attached: int = 0
    """Parentless spans inside the root's interval, walked as children of the root."""
    orphans_dropped: int = 0
    skewed_spans: int = 0
    """Children clipped to their parent, or ignored lying wholly outside it."""
    fallback_traces: int = 0
    """Requests without any ``tracekit.stage``: stages derived from span names/kinds."""
    seconds: float = 0.0


def fetch_spans(store: Store, ids: list[str] | None) -> dict[str, list[Any]]:
    """Span columns of the traces ``ids`` (all when None) as lists, rows ordered by trace.

    Missing timestamps and measurements are None; the keys are :class:`TraceInput`'s
    fields plus ``trace_id`` and ``status_code``.
    """
    params = {
        "all": ids is None,
        "batch_name": cv.BATCH_SPAN_NAME,
        "batch_path": json_path(cv.BATCH_REQUEST_COUNT),
        "db1": json_path(_DB_SYSTEM_KEYS[0]),
        "db2": json_path(_DB_SYSTEM_KEYS[1]),
        "route": json_path(cv.HTTP_ROUTE),
        "async_path": json_path(cv.COMM_ASYNC),
        "link_shape": _LINK_SHAPE,
        "ref_type": json_path(REF_TYPE_ATTR),
        **_client_params(),
        **_http_status_params(),
    }
    try:
        with trace_ids_table(store, ids):
            cols = store.con.execute(_SPANS_SQL, params).fetchnumpy()
    except DatabaseError as exc:
        raise QueryError(f"cannot read spans from {store.path}: {exc}") from exc
    c: dict[str, list[Any]] = {}
    for name, arr in cols.items():
        if isinstance(arr, np.ma.MaskedArray):
            # NULLs come back masked; Python None is what the walk expects.
            data = arr.data.astype(object)
            data[np.ma.getmaskarray(arr)] = None
            c[name] = data.tolist()
        else:
            c[name] = arr.tolist()
    has_ts = c.pop("has_ts")
    c["start"] = [v if ok else None for v, ok in zip(c.pop("start_ns"), has_ts, strict=True)]
    c["end"] = [v if ok else None for v, ok in zip(c.pop("end_ns"), has_ts, strict=True)]
    c["cpu_ns"] = [None if v < 0 else v for v in c["cpu_ns"]]
    c["gpu_ns"] = [None if v < 0 else v for v in c["gpu_ns"]]
    c["is_db"] = [bool(v) for v in c["is_db"]]
    c["background"] = [bool(v) for v in c["background"]]
    c["follows"] = [bool(v) for v in c["follows"]]
    c["error"] = [
        span_failed(kind, status, http)
        for kind, status, http in zip(
            c["kind"], c["status_code"], c.pop("http_status"), strict=True
        )
    ]
    c["client"] = [None if v is None else _attrs_tuple(v) for v in c["client"]]
    c["parent"] = c.pop("parent_span_id")
    c["service"] = c.pop("service_name")
    return c


def _attrs_tuple(v: Any) -> ClientAttrs:
    """A fetched list of client attributes as a tuple (its NULLs come back masked)."""
    mask = np.ma.getmaskarray(v).tolist()
    values = np.ma.getdata(v).tolist()
    return tuple(None if m else x for x, m in zip(values, mask, strict=True))  # type: ignore[return-value]


def trace_input(c: dict[str, list[Any]], lo: int, hi: int) -> cp.TraceInput:
    """Rows ``lo:hi`` of :func:`fetch_spans` columns (one trace) as a TraceInput."""
    return cp.TraceInput(
        span_id=c["span_id"][lo:hi],
        parent=c["parent"][lo:hi],
        name=c["name"][lo:hi],
        kind=c["kind"][lo:hi],
        start=c["start"][lo:hi],
        end=c["end"][lo:hi],
        service=c["service"][lo:hi],
        stage=c["stage"][lo:hi],
        time_kind=c["time_kind"][lo:hi],
        cpu_ns=c["cpu_ns"][lo:hi],
        gpu_ns=c["gpu_ns"][lo:hi],
        is_batch=c["is_batch"][lo:hi],
        is_db=c["is_db"][lo:hi],
        route=c["route"][lo:hi],
        background=c["background"][lo:hi],
        follows=c["follows"][lo:hi],
        error=c["error"][lo:hi],
        client=c["client"][lo:hi],
    )


def trace_bounds(trace_ids: list[str]) -> list[tuple[int, int]]:
    """(first, past-last) row of each trace in rows ordered by trace id."""
    n = len(trace_ids)
    if n == 0:
        return []
    arr = np.array(trace_ids, dtype=object)
    cuts = (np.flatnonzero(arr[1:] != arr[:-1]) + 1).tolist()
    edges = [0, *cuts, n]
    return list(zip(edges[:-1], edges[1:], strict=True))


_ATTR_SQL = """
CREATE OR REPLACE TEMP TABLE _tk_attr AS
WITH sel AS (
    SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, service_name,
           stage, time_kind, cpu_time_ns, gpu_time_ns, attributes, links, status_code
    FROM spans
    WHERE $all OR trace_id IN (SELECT trace_id FROM _tk_ids)
),
services AS (
    SELECT service_name, row_number() OVER (ORDER BY service_name)::BIGINT AS svc
    FROM (SELECT DISTINCT service_name FROM sel WHERE service_name IS NOT NULL)
),
num AS (
    -- One sort of the span ids: the trace number is the running count of first rows
    -- (numbered in NumPy), and services are numbered by a join to their few names.
    SELECT sel.*, (row_number() OVER w - 1)::BIGINT AS row,
           trace_id IS DISTINCT FROM lag(trace_id) OVER w AS first_of_trace,
           coalesce(services.svc, -1) AS svc
    FROM sel LEFT JOIN services USING (service_name)
    WINDOW w AS (ORDER BY trace_id, span_id)
)
SELECT n.row, n.first_of_trace, n.trace_id, n.span_id, coalesce(p.row, -1)::BIGINT AS parent_row,
       n.start_ns IS NOT NULL AND n.end_ns IS NOT NULL AS has_ts,
       coalesce(n.start_ns, 0) AS start_ns, coalesce(n.end_ns, 0) AS end_ns,
       n.stage,
       coalesce(list_position($kinds, n.time_kind) - 1, -1)::BIGINT AS tk,
       n.svc,
       n.kind = 'SERVER' AS is_server, n.kind IN ('CLIENT', 'PRODUCER') AS is_outcall,
       n.kind = 'PRODUCER' AS is_producer, n.kind = 'CONSUMER' AS is_consumer,
       n.kind = 'CLIENT' AS is_client, n.status_code = 'ERROR' AS is_error,
       {http_status} AS http_status,
       n.service_name,
       -- what a CLIENT span calls, read only when its callee left no SERVER span
       CASE WHEN n.kind = 'CLIENT' THEN n.attributes END AS client_attributes,
       {follows} AS follows,
       -- A substring test first: parsing every span's attributes costs more than the walk.
       n.name = $batch_name OR (contains(n.attributes::VARCHAR, $batch_key)
            AND coalesce(json_exists(n.attributes, $batch_path), false)) AS is_batch,
       CASE WHEN n.stage IS NULL AND contains(n.attributes::VARCHAR, 'db.system') THEN
            json_extract_string(n.attributes, $db1) IS NOT NULL
            OR json_extract_string(n.attributes, $db2) IS NOT NULL ELSE false END AS is_db,
       n.name,
       CASE WHEN n.stage IS NULL AND contains(n.attributes::VARCHAR, $route_key)
            THEN json_extract_string(n.attributes, $route) END AS route,
       coalesce(n.cpu_time_ns, -1) AS cpu_ns, coalesce(n.gpu_time_ns, -1) AS gpu_ns,
       -- a collective launched while its stage computed on (DDP bucket): see bulk.py
       contains(n.attributes::VARCHAR, $async_key) AND coalesce(TRY_CAST(
            json_extract_string(n.attributes, $async_path) AS BOOLEAN), false) AS background
FROM num n LEFT JOIN num p ON p.trace_id = n.trace_id AND p.span_id = n.parent_span_id
""".format(follows=_FOLLOWS_SQL.format(n="n."), http_status=_HTTP_STATUS_SQL.format(n="n."))

# Operations are named per distinct (service, span name), never per span: one code each.
_PAIRS_SQL = """
CREATE OR REPLACE TEMP TABLE _tk_pairs AS
SELECT svc, service_name, name, (row_number() OVER (ORDER BY svc, name) - 1)::BIGINT AS pair
FROM (SELECT DISTINCT svc, service_name, name FROM _tk_attr)
"""

_ARRAYS_SQL = """
SELECT first_of_trace, parent_row, has_ts, start_ns, end_ns, p.pair,
       coalesce(is_client, false) AS is_client, coalesce(is_error, false) AS is_error,
       coalesce(http_status, 'NaN'::DOUBLE) AS http_status,
       coalesce(list_position($stages, stage) - 1, -1)::BIGINT AS stage_code,
       tk, svc, is_server, is_outcall, is_batch, coalesce(is_db, false) AS is_db, cpu_ns, gpu_ns,
       coalesce(background, false) AS background, coalesce(is_producer, false) AS is_producer,
       coalesce(is_consumer, false) AS is_consumer, follows
FROM _tk_attr a JOIN _tk_pairs p USING (svc, name) ORDER BY row
"""

_BULK_REQUESTS_SQL = """
INSERT INTO requests
SELECT a.trace_id, a.span_id, s.service_name, s.service_version, s.instance_id,
       s.host_name, s.name, json_extract_string(s.attributes, $route),
       r.start_ns, r.duration_ns,
       s.status_code = 'ERROR'
         OR coalesce(TRY_CAST(json_extract_string(s.attributes, $status) AS DOUBLE), 0) >= 500,
       s.sample_weight,
       TRY_CAST(json_extract_string(s.attributes, $inflight) AS DOUBLE),
       TRY_CAST(json_extract_string(s.attributes, $queue_depth) AS DOUBLE),
       TRY_CAST(json_extract_string(s.attributes, $cpu) AS DOUBLE),
       TRY_CAST(json_extract_string(s.attributes, $gpu) AS DOUBLE),
       r.span_count, r.skewed_spans
FROM tk_refresh_requests r
JOIN _tk_attr a ON a.row = r.root_row
JOIN spans s ON s.trace_id = a.trace_id AND s.span_id = a.span_id
"""

# One row per (request, stage, operation); operation names come once per code.
_BULK_OPERATIONS_SQL = """
INSERT INTO request_operations
SELECT a.trace_id, $stages[r.stage + 1], o.service, o.operation, r.critical_ns, r.calls,
       r.calls_on_path, r.overlapping, r.errors
FROM tk_refresh_operations r JOIN _tk_attr a ON a.row = r.root_row
JOIN tk_refresh_op_names o ON o.code = r.op
"""

_BULK_STAGES_SQL = """
INSERT INTO request_stages
SELECT a.trace_id, $stages[r.stage + 1], $kinds[r.kind + 1], r.critical_ns, r.wall_ns,
       nullif(r.cpu_time_ns, -1), nullif(r.gpu_time_ns, -1)
FROM tk_refresh_stages r JOIN _tk_attr a ON a.row = r.root_row
"""


@contextmanager
def trace_ids_table(store: Store, ids: list[str] | None) -> Iterator[None]:
    """Expose ``ids`` as the view ``_tk_ids`` (one column, trace_id) while the block runs.

    A registered numpy column reaches DuckDB without conversion; the same ids as a
    list parameter cost ~0.1 s CPU per 40k and a slower plan for the semi-join.
    """
    # A new statement closes a result the caller left half-read (register alone would
    # refuse to run beside it, where the query it replaces did not).
    store.con.execute("SELECT 1").fetchall()
    store.con.register("_tk_ids", {"trace_id": np.array(ids or [], dtype=object)})
    try:
        yield
    finally:
        store.con.unregister("_tk_ids")


def load_arrays(store: Store, ids: list[str] | None) -> bulk.SpanArrays:
    """The spans of ``ids`` (every trace when None) as :class:`bulk.SpanArrays`.

    Leaves the temporary table ``_tk_attr`` behind (row -> ids, names) for the writes
    and for :func:`names_for`; :func:`refresh` drops it.
    """
    params = {
        "all": ids is None,
        "kinds": list(cv.TIME_KINDS),
        "batch_name": cv.BATCH_SPAN_NAME,
        "batch_path": json_path(cv.BATCH_REQUEST_COUNT),
        "batch_key": cv.BATCH_REQUEST_COUNT,
        "db1": json_path(_DB_SYSTEM_KEYS[0]),
        "db2": json_path(_DB_SYSTEM_KEYS[1]),
        "route": json_path(cv.HTTP_ROUTE),
        "route_key": cv.HTTP_ROUTE,
        "async_key": cv.COMM_ASYNC,
        "async_path": json_path(cv.COMM_ASYNC),
        "link_shape": _LINK_SHAPE,
        "ref_type": json_path(REF_TYPE_ATTR),
        **_http_status_params(),
    }
    try:
        with trace_ids_table(store, ids):
            store.con.execute(_ATTR_SQL, params)
        stages = [
            str(r[0])
            for r in store.con.execute(
                "SELECT DISTINCT stage FROM _tk_attr WHERE stage IS NOT NULL ORDER BY 1"
            ).fetchall()
        ]
        store.con.execute(_PAIRS_SQL)
        pair_names = [
            (None if svc is None else str(svc), str(name))
            for svc, name in store.con.execute(
                "SELECT service_name, name FROM _tk_pairs ORDER BY pair"
            ).fetchall()
        ]
        cols = store.con.execute(_ARRAYS_SQL, {"stages": stages}).fetchnumpy()
    except DatabaseError as exc:
        raise QueryError(f"cannot read spans from {store.path}: {exc}") from exc

    def col(name: str, dtype: Any) -> Any:
        return np.asarray(cols[name], dtype=dtype)

    parent = col("parent_row", np.int64)
    op, op_names = operation_codes(
        parent,
        col("is_client", bool),
        np.asarray(np.ma.filled(cols["is_server"], False), dtype=bool),
        col("start_ns", np.int64),
        col("pair", np.int64),
        pair_names,
        clients_for(store),
    )

    return bulk.SpanArrays(
        trace=np.cumsum(col("first_of_trace", bool), dtype=np.int64) - 1,
        parent=parent,
        start=col("start_ns", np.int64),
        end=col("end_ns", np.int64),
        has_ts=col("has_ts", bool),
        stage=col("stage_code", np.int64),
        time_kind=col("tk", np.int64),
        service=col("svc", np.int64),
        is_server=np.asarray(np.ma.filled(cols["is_server"], False), dtype=bool),
        is_outcall=np.asarray(np.ma.filled(cols["is_outcall"], False), dtype=bool),
        is_batch=np.asarray(np.ma.filled(cols["is_batch"], False), dtype=bool),
        is_db=col("is_db", bool),
        cpu_ns=col("cpu_ns", np.int64),
        gpu_ns=col("gpu_ns", np.int64),
        stage_names=stages,
        background=col("background", bool),
        is_producer=col("is_producer", bool),
        is_consumer=col("is_consumer", bool),
        follows=col("follows", bool),
        op=op,
        op_names=op_names,
        is_error=failed_rows(
            col("is_error", bool),
            col("http_status", np.float64),
            col("is_client", bool),
            np.asarray(np.ma.filled(cols["is_server"], False), dtype=bool),
        ),
    )


def clients_for(store: Store) -> Callable[[Any], list[ClientAttrs]]:
    """:data:`ClientAttrs` of rows of ``_tk_attr`` (CLIENT spans without a callee)."""

    def fetch(rows: Any) -> list[ClientAttrs]:
        got = store.con.execute(
            "SELECT row, "
            + _CLIENT_SQL.format(a="client_attributes", when="true")
            + " FROM _tk_attr WHERE row IN (SELECT unnest($rows::BIGINT[]))",
            {"rows": [int(r) for r in rows], **_client_params()},
        ).fetchall()
        by_row = {int(r): tuple(v) for r, v in got}
        return [by_row[int(r)] for r in rows]

    return fetch


def names_for(store: Store) -> bulk.NamesFor:
    """(name, http.route) of rows of ``_tk_attr``, for fallback stage names."""

    def fetch(rows: Any) -> list[tuple[str, str | None]]:
        got = store.con.execute(
            "SELECT row, name, route FROM _tk_attr WHERE row IN (SELECT unnest($rows::BIGINT[]))",
            {"rows": [int(r) for r in rows]},
        ).fetchall()
        by_row = {int(r): (str(nm or ""), rt) for r, nm, rt in got}
        return [by_row[int(r)] for r in rows]

    return fetch


def refresh(store: Store, trace_ids: Iterable[str] | None = None) -> RefreshReport:
    """Rebuild ``requests``/``request_stages`` for ``trace_ids`` (every trace when None).

    Delete-then-insert in one transaction: idempotent, and a partial refresh leaves
    other traces' rows alone. The traces are attributed all at once by
    :func:`tracekit.analysis.attribution.bulk.analyse_all` (the same results as
    :func:`~tracekit.analysis.attribution.critical_path.analyse_trace` trace by trace).
    """
    t0 = time.perf_counter()
    ids = None if trace_ids is None else sorted(set(trace_ids))
    report = RefreshReport()
    if ids is not None and not ids:
        return report
    every = ids
    if every is None and _trace_count(store) > REFRESH_TRACES:
        every = [str(r[0]) for r in store.run("SELECT DISTINCT trace_id FROM spans ORDER BY 1")]
    if every is not None and len(every) > REFRESH_TRACES:
        # Memory follows the batch, not the store: clear the rows of these traces once,
        # then attribute and insert them a batch of traces at a time.
        _clear(store, ids)
        for chunk in iter_chunks(every, REFRESH_TRACES):
            _refresh_batch(store, chunk, report, cleared=True)
    else:
        _refresh_batch(store, ids, report, cleared=False)
    report.seconds = time.perf_counter() - t0
    return report


REFRESH_TRACES = 100_000
"""Traces attributed per batch (a million spans or so in memory at a time)."""


def _trace_count(store: Store) -> int:
    return int(store.run("SELECT count(DISTINCT trace_id) FROM spans")[0][0])


def _clear(store: Store, ids: list[str] | None) -> None:
    """Drop the derived rows of ``ids`` (all when None) in one rebuild."""
    con = store.con
    con.execute("BEGIN")
    try:
        with trace_ids_table(store, ids):
            _rebuild_tables(store, {"all": ids is None})
        con.execute("COMMIT")
    except DatabaseError as exc:
        store.rollback()
        raise QueryError(f"cannot write attribution to {store.path}: {exc}") from exc


def _refresh_batch(
    store: Store, ids: list[str] | None, report: RefreshReport, *, cleared: bool
) -> None:
    """Attribute the traces ``ids`` (all when None) and write them; add to ``report``."""
    try:
        arrays = load_arrays(store, ids)
        res = bulk.analyse_all(arrays, names_for(store))
        report.spans += len(arrays.trace)
        report.traces += res.traces
        report.requests += len(res.req_trace)
        report.batch_traces += res.batch_traces
        report.skipped_no_timestamps += res.skipped_no_timestamps
        report.skipped_no_root += res.skipped_no_root
        report.orphans_attached += res.orphans_attached
        report.orphans_dropped += res.orphans_dropped
        report.skewed_spans += res.skewed_spans
        report.fallback_traces += res.fallback_traces
        req = {
            "root_row": res.req_root,
            "start_ns": res.req_start,
            "duration_ns": res.req_duration,
            "span_count": res.req_span_count,
            "skewed_spans": res.req_skewed,
        }
        stages = {
            "root_row": res.st_root,
            "stage": res.st_stage,
            "kind": res.st_kind,
            "critical_ns": res.st_critical,
            "wall_ns": res.st_wall,
            "cpu_time_ns": res.st_cpu,
            "gpu_time_ns": res.st_gpu,
        }
        operations = {
            "root_row": res.op_root,
            "stage": res.op_stage,
            "op": res.op_code,
            "critical_ns": res.op_critical,
            "calls": res.op_calls,
            "calls_on_path": res.op_on_path,
            "overlapping": res.op_overlapping,
            "errors": res.op_errors,
        }
        names = {
            "code": np.arange(len(arrays.op_names), dtype=np.int64),
            "service": np.array([svc for svc, _ in arrays.op_names], dtype=object),
            "operation": np.array([op for _, op in arrays.op_names], dtype=object),
        }
        _write(store, ids, req, stages, res.stage_names, cleared=cleared, ops=(operations, names))
    finally:
        store.con.execute("DROP TABLE IF EXISTS _tk_attr")
        store.con.execute("DROP TABLE IF EXISTS _tk_pairs")


def _write(
    store: Store,
    ids: list[str] | None,
    req: dict[str, Any],
    stages: dict[str, Any],
    stage_names: list[str],
    *,
    cleared: bool = False,
    ops: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> None:
    con = store.con
    params = {
        "route": json_path(cv.HTTP_ROUTE),
        "status": json_path(cv.HTTP_RESPONSE_STATUS_CODE),
        "inflight": json_path(cv.INFLIGHT),
        "queue_depth": json_path(cv.QUEUE_DEPTH),
        "cpu": json_path(cv.CPU_UTILIZATION),
        "gpu": json_path(cv.GPU_UTILIZATION),
    }
    scope = {"all": ids is None}
    con.register("tk_refresh_requests", req)
    con.register("tk_refresh_stages", stages)
    if ops is not None:
        con.register("tk_refresh_operations", ops[0])
        con.register("tk_refresh_op_names", ops[1])
    try:
        con.execute("BEGIN")
        try:
            with trace_ids_table(store, ids):
                _replace_scope(store, ids, scope, cleared=cleared)
            if len(req["root_row"]):
                store.insert_keyed("requests", _BULK_REQUESTS_SQL, params)
                store.insert_keyed(
                    "request_stages",
                    _BULK_STAGES_SQL,
                    {"stages": stage_names, "kinds": list(cv.TIME_KINDS)},
                )
            if ops is not None and len(ops[0]["root_row"]):
                store.insert_keyed(
                    "request_operations", _BULK_OPERATIONS_SQL, {"stages": stage_names}
                )
            con.execute("COMMIT")
        except DatabaseError as exc:
            store.rollback()
            raise QueryError(f"cannot write attribution to {store.path}: {exc}") from exc
    finally:
        con.unregister("tk_refresh_requests")
        con.unregister("tk_refresh_stages")
        if ops is not None:
            con.unregister("tk_refresh_operations")
            con.unregister("tk_refresh_op_names")


def _replace_scope(
    store: Store, ids: list[str] | None, scope: dict[str, Any], *, cleared: bool
) -> None:
    """Remove the derived rows of ``ids`` (``_tk_ids``) before their new rows go in."""
    if cleared:
        return  # the caller removed these traces' rows already
    if ids is None or _existing(store) > _REBUILD_ABOVE:
        _rebuild_tables(store, scope)
    else:
        # The dependent tables first.
        store.con.execute(_DELETE_SQL.format(table="request_operations"), scope)
        store.con.execute(_DELETE_SQL.format(table="request_stages"), scope)
        store.con.execute(_DELETE_SQL.format(table="requests"), scope)


# Deleting many rows and inserting the same primary keys again in one transaction is
# slow in DuckDB (about 20 s at 100k requests, against 2 s to rebuild the tables), so
# past this many rows to replace the derived tables are rebuilt instead.
_REBUILD_ABOVE = 5_000

_DERIVED = ("requests", "request_stages", "request_operations")
"""The tables refresh derives from ``spans`` (identifiers, never user input)."""

_EXISTING_SQL = "SELECT count(*) FROM requests WHERE trace_id IN (SELECT trace_id FROM _tk_ids)"


def _existing(store: Store) -> int:
    row = store.con.execute(_EXISTING_SQL).fetchone()
    return int(row[0]) if row else 0


def _rebuild_tables(store: Store, scope: dict[str, Any]) -> None:
    """Drop and recreate the derived tables, keeping rows outside ``scope``."""
    con = store.con
    for table in _DERIVED:
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE tk_keep_{table} AS SELECT * FROM {table} "
            "WHERE NOT ($all OR trace_id IN (SELECT trace_id FROM _tk_ids))",
            scope,
        )
    for table in reversed(_DERIVED):
        con.execute(f"DROP TABLE {table}")
    con.execute(schema_sql())
    for table in _DERIVED:
        con.execute(f"INSERT INTO {table} SELECT * FROM tk_keep_{table}")
        con.execute(f"DROP TABLE tk_keep_{table}")
