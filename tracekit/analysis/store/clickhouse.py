"""Reading the OpenTelemetry Collector's ClickHouse table (``otel_traces``) as a tracekit store.

One analysis implementation serves every store: for a ClickHouse server or chDB, the
traces a command needs are selected *inside* ClickHouse (``sql/clickhouse_select_traces.sql``:
release, entry service, route, trace-id prefix, time range), their spans are reshaped
there into the columns of tracekit's ``spans`` table (``sql/clickhouse_select_spans.sql``:
ids, enum names, nanoseconds, stage columns, sample weights, attributes as JSON, one row
per span id) and streamed out as Arrow record batches into an in-memory DuckDB store with
the usual schema. The caller then runs attribution and the analysis on that store exactly
as on a file (:meth:`tracekit.Analysis.open` does both, once).

ClickHouse is only ever read here: the table is checked against the exporter's shape
(``system.columns``), then one SELECT runs. A read-only user suffices. Writing trace files
into the exporter's schema is :mod:`tracekit.analysis.ingest.clickhouse`.
"""

from __future__ import annotations

import importlib.resources
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb

from tracekit.analysis.store import SPAN_COLUMNS, SPAN_TYPES, Store, schema_sql
from tracekit.analysis.store.url import StoreURL
from tracekit.errors import ConfigError, QueryError

MAX_NS = 2**63 - 1

# The columns tracekit reads, each with the type families the exporter has used for it
# across versions (Duration was Int64 before it became UInt64; SpanName/ServiceName
# are String in some hand-made schemas). Anything else is "not the exporter's table".
_MAP = r"Map\((LowCardinality\()?String\)?, String\)"
REQUIRED_COLUMNS: dict[str, str] = {
    "Timestamp": r"DateTime64\(9(, '.*')?\)",
    "TraceId": r"String",
    "SpanId": r"String",
    "ParentSpanId": r"String",
    "TraceState": r"String",
    "SpanName": r"(LowCardinality\()?String\)?",
    "SpanKind": r"(LowCardinality\()?String\)?",
    "ServiceName": r"(LowCardinality\()?String\)?",
    "ResourceAttributes": _MAP,
    "SpanAttributes": _MAP,
    "Duration": r"U?Int64",
    "StatusCode": r"(LowCardinality\()?String\)?",
    "Links.TraceId": r"Array\(String\)",
    "Links.SpanId": r"Array\(String\)",
    "Links.Attributes": r"Array\(" + _MAP + r"\)",
}

# ClickHouse escapes "/" in JSON by default; tracekit's JSON (and Python's) does not.
_QUERY_SETTINGS = {
    "output_format_json_escape_forward_slashes": 0,
    # Columns repeated across spans (resource, names, enum values) leave as Arrow
    # dictionaries: each distinct value crosses once per batch.
    "output_format_arrow_low_cardinality_as_dictionary": 1,
}


@dataclass(frozen=True)
class Selection:
    """Which requests a command reads; empty fields select everything.

    ``releases`` match the resource ``service.version``; ``route`` matches ``http.route``
    or the span name; ``trace_prefix`` is a lower-case hex prefix (``explain``); the time
    range is on span start, ``[since_ns, until_ns)``.
    """

    releases: tuple[str, ...] = ()
    service: str | None = None
    route: str | None = None
    trace_prefix: str | None = None
    since_ns: int | None = None
    until_ns: int | None = None

    @property
    def everything(self) -> bool:
        return not (
            self.releases
            or self.service
            or self.route
            or self.trace_prefix
            or self.since_ns is not None
            or self.until_ns is not None
        )

    def parameters(self) -> dict[str, Any]:
        return {
            "releases": list(self.releases),
            "service": self.service or "",
            "route": self.route or "",
            "prefix": (self.trace_prefix or "").lower(),
            "since_ns": self.since_ns or 0,
            "until_ns": MAX_NS if self.until_ns is None else self.until_ns,
        }


class ClickHouseSnapshot(Store):
    """An in-memory DuckDB store holding the spans pulled from ClickHouse.

    ``pulled_rows``/``pulled_bytes`` say how much left the engine (Arrow buffer bytes).
    Its ``requests`` are empty until the caller runs
    :func:`tracekit.analysis.attribution.per_request.refresh` on it.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, url: StoreURL) -> None:
        super().__init__(con, url.display())
        self.url = url
        self.pulled_rows = 0
        self.pulled_bytes = 0
        self.pull_seconds = 0.0
        self.attributed = False
        """Read from tracekit's attributed tables (no span), not from the spans."""
        self.notes: list[str] = []
        """What the reader of any answer from this store should know (lag, fallback)."""
        self.training_labels: dict[str, int] = {}
        """Attributed stores: the training runs in the spans (their analysis needs spans)."""
        self.load_pairs: Any = None
        """Attributed stores: ``load_pairs(trace_ids)`` fetches those requests' attribute
        pairs into ``request_attributes`` (BubbleUp asks for the ones it ranks)."""


def _sql(name: str) -> str:
    text = importlib.resources.files("tracekit.analysis.store").joinpath(f"sql/{name}").read_text()
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


def _map_json(column: str) -> str:
    return _sql("clickhouse_map_json.sql").replace("{m}", column)


def qualified_table(url: StoreURL) -> str:
    """```database`.`table``` from allow-listed identifiers (checked by the URL parser)."""
    return f"`{url.database}`.`{url.table}`"


def spans_query(url: StoreURL, selection: Selection, *, trace_filter: str | None = None) -> str:
    """The SELECT that reshapes the selected traces' spans (values left as parameters).

    ``trace_filter`` replaces the selection's own (``tracekit attribute`` selects traces
    by their request span's end and a shard).
    """
    table = qualified_table(url)
    if trace_filter is None:
        trace_filter = selected_traces_filter(url, selection)
    return (
        _sql("clickhouse_select_spans.sql")
        .replace("{span_attributes_json}", _map_json("SpanAttributes"))
        .replace("{resource_attributes_json}", _map_json("ResourceAttributes"))
        .replace("{link_attributes_json}", _map_json("la"))
        .replace("{trace_filter}", trace_filter)
        .replace("{table}", table)
    )


def selected_traces_filter(url: StoreURL, selection: Selection) -> str:
    """``TraceId IN (…)`` of the traces ``selection`` reads (``1`` for everything); its
    values are bound parameters (:meth:`Selection.parameters`)."""
    if selection.everything:
        return "1"
    inner = _sql("clickhouse_select_traces.sql").replace("{table}", qualified_table(url))
    return f"TraceId IN ({inner})"


def traces_table_ddl(database: str, table: str) -> str:
    """The exporter's CREATE TABLE, filled in as the exporter does (no cluster, no TTL)."""
    return _sql("clickhouse_traces_table.sql") % (database, table, "", "MergeTree()", "")


def connect(url: StoreURL) -> Any:
    """A clickhouse-connect client for ``url`` (HTTP, or chDB in-process)."""
    try:
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import Error as ClickHouseError
    except ImportError as exc:
        raise ConfigError(
            "ClickHouse stores need clickhouse-connect (and chdb for chdb://): "
            "pip install 'tracekit[clickhouse]'"
        ) from exc
    try:
        if url.kind == "chdb":
            return clickhouse_connect.get_client(
                interface="chdb", path=url.path, database=url.database
            )
        return clickhouse_connect.get_client(
            host=url.host,
            port=url.port,
            username=url.user,
            password=url.password,
            database=url.database,
            secure=url.secure,
            connect_timeout=10,
        )
    except ImportError as exc:
        raise ConfigError(
            f"chdb:// needs the chdb package: pip install 'tracekit[clickhouse]' ({exc})"
        ) from exc
    except (ClickHouseError, OSError) as exc:
        raise QueryError(
            f"cannot open ClickHouse store {url.display()}: {first_line(exc)}"
        ) from exc


def first_line(exc: BaseException) -> str:
    """The first meaningful line of a driver error (ClickHouse's run to pages)."""
    text = str(exc).strip() or type(exc).__name__
    line = text.splitlines()[0]
    # Server errors repeat the whole query after the code; keep the message.
    line = re.sub(r"\s*\(version [^)]*\)\s*$", "", line)
    return line[:300]


def check_table(client: Any, url: StoreURL) -> None:
    """Raise a one-line error unless the table has the exporter's columns and types."""
    rows = run(
        client,
        url,
        "SELECT name, type FROM system.columns WHERE database = {db:String} AND table = {t:String}",
        {"db": url.database, "t": url.table},
    )
    if not rows:
        present = run(
            client,
            url,
            "SELECT name FROM system.tables WHERE database = {db:String} ORDER BY name LIMIT 20",
            {"db": url.database},
        )
        names = ", ".join(str(r[0]) for r in present) or "none"
        raise QueryError(
            f"no table {url.database}.{url.table} in {url.display()} (tables there: {names}); "
            "pass --table NAME, or fill it with `tracekit ingest FILES --store URL`"
        )
    types = {str(name): str(typ) for name, typ in rows}
    wrong = [
        f"{c} is {types[c]}"
        for c, pattern in REQUIRED_COLUMNS.items()
        if c in types and not re.fullmatch(pattern, types[c])
    ]
    missing = [c for c in REQUIRED_COLUMNS if c not in types]
    if missing:
        more = f", … ({len(missing)} in all)" if len(missing) > 4 else ""
        wrong.append(f"no {', '.join(missing[:4])}{more}")
    if wrong:
        shown = "; ".join(wrong)
        raise QueryError(
            f"{url.database}.{url.table} in {url.display()} is not the OpenTelemetry Collector "
            f"ClickHouse exporter's traces table ({shown})"
        )


@contextmanager
def driver_errors(url: StoreURL, doing: str = "ClickHouse store") -> Iterator[None]:
    """A driver or socket error in the block becomes one :class:`QueryError` line:
    ``{doing} {url}: {first line of the error}``."""
    from clickhouse_connect.driver.exceptions import Error as ClickHouseError

    try:
        yield
    except (ClickHouseError, OSError) as exc:
        raise QueryError(f"{doing} {url.display()}: {first_line(exc)}") from exc


def run(client: Any, url: StoreURL, sql: str, params: dict[str, Any] | None = None) -> list[Any]:
    """``sql``'s rows; a driver error is one :class:`QueryError` line naming the store."""
    with driver_errors(url):
        return list(client.query(sql, parameters=params or {}).result_rows)


def command(client: Any, url: StoreURL, sql: str, params: dict[str, Any] | None = None) -> None:
    """Run a statement that returns nothing (DDL, INSERT … VALUES)."""
    with driver_errors(url):
        client.command(sql, parameters=params or {})


@contextmanager
def closed_on_error(store: Store, url: StoreURL) -> Iterator[None]:
    """Close ``store`` if the block fails; a driver error becomes one QueryError line."""
    try:
        with driver_errors(url):
            yield
    except BaseException:
        store.close()
        raise


def open_snapshot(
    url: StoreURL,
    selection: Selection | None = None,
    *,
    trace_filter: str | None = None,
    params: dict[str, Any] | None = None,
    client: Any = None,
    checked: bool = False,
) -> ClickHouseSnapshot:
    """Pull the selected traces' spans out of ClickHouse into an in-memory DuckDB store.

    ``trace_filter`` and its ``params`` replace the selection (see :func:`spans_query`);
    a ``client`` given is used and left open; ``checked``: the table's shape is known good.
    """

    selection = selection or Selection()
    own = client is None
    client = client or connect(url)
    t0 = time.perf_counter()
    con = duckdb.connect(":memory:")
    store = ClickHouseSnapshot(con, url)
    try:
        with closed_on_error(store, url):
            if not checked:
                check_table(client, url)
            # The snapshot's `spans` is created from the first batch without the primary key:
            # rows arrive unique per (trace, span) (LIMIT 1 BY in ClickHouse), and keeping a
            # DuckDB index up to date costs more than the whole pull.
            select = ", ".join(
                f"CAST({c if c in _PULLED else 'NULL'} AS {SPAN_TYPES[c]}) AS {c}"
                for c in SPAN_COLUMNS
            )
            bound = {
                **selection.parameters(),
                **(params or {}),
                "source": f"clickhouse:{url.database}.{url.table}",
            }
            stream = client.query_arrow_stream(
                spans_query(url, selection, trace_filter=trace_filter),
                parameters=bound,
                settings=_QUERY_SETTINGS,
            )
            with stream:
                for batch in stream:
                    store.pulled_rows += batch.num_rows
                    store.pulled_bytes += batch.nbytes
                    con.register("tk_pull", batch)
                    try:
                        into = (
                            "INSERT INTO spans"
                            if store.pulled_rows > batch.num_rows
                            else ("CREATE TABLE spans AS")
                        )
                        con.execute(f"{into} SELECT {select} FROM tk_pull").fetchall()
                    finally:
                        con.unregister("tk_pull")
            con.execute(schema_sql()).fetchall()
    finally:
        if own:
            client.close()
    store.pull_seconds = time.perf_counter() - t0
    return store


def open_url(
    text: str,
    *,
    table: str = "otel_traces",
    selection: Selection | None = None,
    read_only: bool = True,
) -> ClickHouseSnapshot:
    """:func:`open_snapshot` from a ``--store`` URL; analysis reads ClickHouse, never writes."""
    from tracekit.analysis.store.url import parse_store_url

    url = parse_store_url(text, table=table)
    if not url.is_clickhouse:
        raise ConfigError(f"{text!r} is not a ClickHouse URL")
    if not read_only:
        raise ConfigError(
            f"{url.display()} is read-only for analysis; write traces to it with "
            "`tracekit ingest FILES --store URL`"
        )
    return open_snapshot(url, selection)


_PULLED = frozenset((*SPAN_COLUMNS, "trace_state"))
"""Columns the pull produces (sql/clickhouse_select_spans.sql); a ``spans`` column outside
it keeps its default."""
