"""tracekit's attributed tables in ClickHouse: created, written, and read as a store.

``tracekit attribute`` writes one row per request (``tracekit_requests``), one per
(request, stage) (``tracekit_request_stages``), one per (request, stage, operation)
(``tracekit_request_operations``) and the distinct attribute values of each
request's spans (``tracekit_request_attributes``) next to the Collector exporter's spans,
and keeps a watermark per shard (``tracekit_attribution_state``); the DDL is
``sql/clickhouse_attributed.sql``. :func:`open_attributed` reads the selected requests'
rows into an in-memory DuckDB store shaped like a file store's, with no span: the
analysis then runs on it unchanged, and what left the engine is per-request rows, not
spans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import duckdb

from tracekit.analysis.store import named_statements, schema_sql
from tracekit.analysis.store.clickhouse import (
    ClickHouseSnapshot,
    Selection,
    closed_on_error,
    command,
    connect,
    driver_errors,
    run,
    selected_traces_filter,
)
from tracekit.analysis.store.url import StoreURL, check_identifier


@dataclass(frozen=True)
class AttributedNames:
    """The attributed tables' names: ``PREFIX`` + requests, request_stages, …"""

    prefix: str = "tracekit_"

    def __post_init__(self) -> None:
        check_identifier(self.prefix + "x", "--tables-prefix")

    @property
    def requests(self) -> str:
        return f"{self.prefix}requests"

    @property
    def stages(self) -> str:
        return f"{self.prefix}request_stages"

    @property
    def attributes(self) -> str:
        return f"{self.prefix}request_attributes"

    @property
    def operations(self) -> str:
        return f"{self.prefix}request_operations"

    @property
    def state(self) -> str:
        return f"{self.prefix}attribution_state"

    def all(self) -> tuple[str, str, str, str, str]:
        return (self.requests, self.stages, self.attributes, self.state, self.operations)

    @classmethod
    def for_table(cls, table: str, prefix: str | None = None) -> AttributedNames:
        """The names for spans table ``table``: ``tracekit_…`` beside the exporter's
        default ``otel_traces``, ``tracekit_<table>_…`` beside any other (two spans
        tables in one database never share attributed rows); ``prefix`` overrides."""
        if prefix is not None:
            return cls(prefix)
        return cls("tracekit_" if table == "otel_traces" else f"tracekit_{table}_")


def _statements() -> dict[str, str]:
    return named_statements("clickhouse_attributed.sql")


def ddl(url: StoreURL, names: AttributedNames, *, cluster: str | None = None) -> list[str]:
    """The five CREATE TABLE statements, for ``url``'s database (``ON CLUSTER`` given a
    cluster name, with the replicated engine a cluster needs)."""
    if cluster is not None:
        check_identifier(cluster, "--cluster")
    on_cluster = f"ON CLUSTER `{cluster}`" if cluster else ""
    fill = {
        "{db}": f"`{url.database}`",
        "{requests}": f"`{names.requests}`",
        "{stages}": f"`{names.stages}`",
        "{attributes}": f"`{names.attributes}`",
        "{state}": f"`{names.state}`",
        "{operations}": f"`{names.operations}`",
        "{on_cluster}": on_cluster,
    }
    tables = {
        "requests": names.requests,
        "stages": names.stages,
        "attributes": names.attributes,
        "state": names.state,
        "operations": names.operations,
    }
    out = []
    for name, table in tables.items():
        text = _statements()[name]
        engine = "ReplacingMergeTree"
        if cluster:
            engine = (
                "ReplicatedReplacingMergeTree("
                f"'/clickhouse/tables/{{shard}}/{url.database}/{table}', '{{replica}}', "
            )
            text = text.replace("{engine}(", engine)
        else:
            text = text.replace("{engine}", engine)
        for key, value in fill.items():
            text = text.replace(key, value)
        out.append(text)
    return out


def create_tables(
    client: Any, url: StoreURL, names: AttributedNames, *, cluster: str | None = None
) -> None:
    for statement in ddl(url, names, cluster=cluster):
        command(client, url, statement)


def tables_present(client: Any, url: StoreURL, names: AttributedNames) -> bool:
    """The attributed requests and stages tables exist in ``url``'s database."""
    rows = run(
        client,
        url,
        "SELECT count() FROM system.tables WHERE database = {db:String} "
        "AND name IN ({r:String}, {s:String})",
        {"db": url.database, "r": names.requests, "s": names.stages},
    )
    return bool(rows) and int(rows[0][0]) == 2


def table_present(client: Any, url: StoreURL, table: str) -> bool:
    rows = run(
        client,
        url,
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        {"db": url.database, "t": table},
    )
    return bool(rows) and int(rows[0][0]) == 1


def watermarks(client: Any, url: StoreURL, names: AttributedNames) -> dict[str, int]:
    """Shard (``K/N``) → attributed up to (request end, ns), for ``url``'s spans table."""
    rows = run(
        client,
        url,
        f"SELECT Shard, Watermark FROM `{url.database}`.`{names.state}` FINAL "
        "WHERE SpansTable = {t:String}",
        {"t": url.table},
    )
    return {str(shard): int(mark) for shard, mark in rows}


def set_watermark(
    client: Any, url: StoreURL, names: AttributedNames, shard: str, mark: int, requests: int
) -> None:
    command(
        client,
        url,
        f"INSERT INTO `{url.database}`.`{names.state}` "
        "(SpansTable, Shard, Watermark, Requests, UpdatedAt) VALUES "
        "({t:String}, {s:String}, {m:Int64}, {n:UInt64}, now64(9))",
        {"t": url.table, "s": shard, "m": mark, "n": requests},
    )


def covered_up_to(marks: dict[str, int]) -> int | None:
    """The time up to which every request is attributed, given the shards' watermarks:
    for each split whose N shards all ran (``0/1`` alone is one), the least of their
    watermarks; the newest such split counts."""
    by_n: dict[int, dict[int, int]] = {}
    for shard, mark in marks.items():
        k, _, n = shard.partition("/")
        by_n.setdefault(int(n), {})[int(k)] = mark
    whole = [min(m.values()) for n, m in by_n.items() if len(m) == n]
    return max(whole) if whole else None


# --- reading the attributed rows as a store --------------------------------------------

_FILTER = """
    (empty({releases:Array(String)}) OR has({releases:Array(String)}, Release))
    AND ({service:String} = '' OR ServiceName = {service:String})
    AND ({route:String} = '' OR Route = {route:String} OR Name = {route:String})
    AND ({prefix:String} = '' OR startsWith(TraceId, {prefix:String}))
    AND StartNs >= {since_ns:Int64} AND StartNs < {until_ns:Int64}
"""

_REQUESTS = """
SELECT TraceId AS trace_id, RootSpanId AS root_span_id, nullIf(ServiceName, '') AS service_name,
       nullIf(Release, '') AS release, nullIf(InstanceId, '') AS instance_id,
       nullIf(HostName, '') AS host_name, nullIf(Name, '') AS name, nullIf(Route, '') AS route,
       StartNs AS start_ns, DurationNs AS duration_ns, IsError AS is_error,
       SampleWeight AS sample_weight, Inflight AS inflight, QueueDepth AS queue_depth,
       CpuUtilization AS cpu_utilization, GpuUtilization AS gpu_utilization,
       SpanCount AS span_count, SkewedSpans AS skewed_spans
FROM {requests} FINAL
WHERE {filter}
"""

_STAGES = """
SELECT TraceId AS trace_id, Stage AS stage, TimeKind AS time_kind, CriticalNs AS critical_ns,
       WallNs AS wall_ns, CpuTimeNs AS cpu_time_ns, GpuTimeNs AS gpu_time_ns
FROM {stages} FINAL
WHERE (TraceId, AttributedAt) IN (SELECT TraceId, AttributedAt FROM {requests} FINAL
                                  WHERE {filter})
"""

_OPERATIONS = """
SELECT TraceId AS trace_id, Stage AS stage, Service AS service, Operation AS operation,
       CriticalNs AS critical_ns, Calls AS calls, CallsOnPath AS calls_on_path,
       Overlapping AS overlapping, Errors AS errors
FROM {operations} FINAL
WHERE (TraceId, AttributedAt) IN (SELECT TraceId, AttributedAt FROM {requests} FINAL
                                  WHERE {filter})
"""

_ATTRIBUTES = """
SELECT TraceId AS trace_id, Attribute AS attribute, Value AS value
FROM {attributes} FINAL
WHERE (TraceId, AttributedAt) IN (SELECT TraceId, AttributedAt FROM {requests} FINAL
                                  WHERE TraceId IN {ids:Array(String)})
"""
"""The attribute pairs of the requests BubbleUp ranks (its slow cohort and its sample of
the rest): fetched when a ranking asks, not with the requests."""

_SETTINGS = {"output_format_arrow_low_cardinality_as_dictionary": 1}


def _query(sql: str, url: StoreURL, names: AttributedNames) -> str:
    db = f"`{url.database}`"
    return (
        sql.replace("{filter}", _FILTER)
        .replace("{requests}", f"{db}.`{names.requests}`")
        .replace("{stages}", f"{db}.`{names.stages}`")
        .replace("{attributes}", f"{db}.`{names.attributes}`")
        .replace("{operations}", f"{db}.`{names.operations}`")
    )


@dataclass
class Lag:
    """How far the attributed tables are behind the spans, for a selection."""

    attributed_to_ns: int | None
    """Every request that ended before this is attributed (None: no complete watermark)."""
    newer_requests: int
    """Requests of the selection in the spans table that ended after it."""


def lag(client: Any, url: StoreURL, names: AttributedNames, selection: Selection) -> Lag:
    """Requests of ``selection`` whose request span ended after the attributed tables'
    watermark: what a command on them does not see yet."""
    upto = covered_up_to(watermarks(client, url, names))
    if upto is None:
        return Lag(None, 0)
    params = {**selection.parameters(), "upto": upto}
    rows = run(
        client,
        url,
        f"SELECT count() FROM `{url.database}`.`{url.table}` "
        "WHERE ParentSpanId IN ('', '0000000000000000') "
        "AND toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) >= {upto:Int64} "
        f"AND {selected_traces_filter(url, selection)}",
        params,
    )
    return Lag(upto, int(rows[0][0]) if rows else 0)


def open_attributed(
    url: StoreURL, selection: Selection, names: AttributedNames | None = None
) -> ClickHouseSnapshot | None:
    """The selected requests' attributed rows in an in-memory DuckDB store (``requests``,
    ``request_stages``, ``request_operations``, ``request_attributes``; ``spans`` empty), or None when ``url``'s
    database has no attributed tables. ``notes`` on the store say how far they lag."""

    names = names or AttributedNames.for_table(url.table)
    client = connect(url)
    t0 = time.perf_counter()
    con = duckdb.connect(":memory:")
    store = ClickHouseSnapshot(con, url)
    try:
        with closed_on_error(store, url):
            if not tables_present(client, url, names):
                store.close()
                return None
            con.execute(schema_sql()).fetchall()
            con.execute(
                "CREATE TABLE request_attributes (trace_id VARCHAR, attribute VARCHAR, value VARCHAR)"
            ).fetchall()
            params = selection.parameters()
            for table, sql in (("requests", _REQUESTS), ("request_stages", _STAGES)):
                _pull_into(store, client, _query(sql, url, names), params, table)
            if table_present(client, url, names.operations):
                # absent until `tracekit attribute` runs again on tables it made before
                _pull_into(
                    store, client, _query(_OPERATIONS, url, names), params, "request_operations"
                )
            behind = lag(client, url, names, selection)
            store.attributed = True
            store.training_labels = training_labels(client, url, selection)

            def load_pairs(ids: list[str]) -> None:
                pairs_client = connect(url)
                try:
                    with driver_errors(url):
                        _pull_into(
                            store,
                            pairs_client,
                            _query(_ATTRIBUTES, url, names),
                            {"ids": ids},
                            "request_attributes",
                        )
                finally:
                    pairs_client.close()

            store.load_pairs = load_pairs
            store.notes.extend(lag_notes(behind, url))
    finally:
        client.close()
    store.pull_seconds = time.perf_counter() - t0
    return store


def _pull_into(
    store: ClickHouseSnapshot, client: Any, sql: str, params: dict[str, Any], table: str
) -> None:
    """Stream ``sql``'s rows as Arrow into the snapshot's ``table`` (columns by name)."""
    stream = client.query_arrow_stream(sql, parameters=params, settings=_SETTINGS)
    with stream:
        for batch in stream:
            store.pulled_rows += batch.num_rows
            store.pulled_bytes += batch.nbytes
            store.con.register("tk_pull", batch)
            try:
                store.con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM tk_pull").fetchall()
            finally:
                store.con.unregister("tk_pull")


def training_labels(client: Any, url: StoreURL, selection: Selection) -> dict[str, int]:
    """Run label → ``train_step`` spans, read in ClickHouse: training runs are analysed
    from their spans (steps per rank), never from attributed requests."""
    from tracekit import conventions as cv

    rows = run(
        client,
        url,
        "SELECT ResourceAttributes['service.version'] AS run, count() "
        f"FROM `{url.database}`.`{url.table}` WHERE SpanName = {{step:String}} "
        "AND (empty({releases:Array(String)}) OR has({releases:Array(String)}, "
        "ResourceAttributes['service.version'])) GROUP BY run",
        {**selection.parameters(), "step": cv.STEP_SPAN_NAME},
    )
    return {str(label): int(n) for label, n in rows}


def lag_notes(behind: Lag, url: StoreURL) -> list[str]:
    """The line a command prints when the attributed tables are behind the spans."""
    table = "" if url.table == "otel_traces" else f" --table {url.table}"
    fix = f"run `tracekit attribute --store {url.display().split(' ')[0]}{table}`"
    if behind.attributed_to_ns is None:
        return [f"the attributed tables have no complete watermark yet: {fix}"]
    if behind.newer_requests <= 0:
        return []
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(behind.attributed_to_ns / 1e9))
    return [
        f"attributed up to {when} UTC; ~{behind.newer_requests:,} newer requests not yet "
        f"attributed: {fix}"
    ]
