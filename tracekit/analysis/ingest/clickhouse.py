"""Writing trace files into the OpenTelemetry Collector ClickHouse exporter's schema.

``tracekit ingest FILES --store clickhouse://…|chdb://…`` reads the files with the usual
readers (every format, the same problem log) into an in-memory staging store, then writes
the spans to the exporter's table as the exporter would have: the table is created with
the exporter's own DDL when missing (``store/sql/clickhouse_traces_table.sql``), ids are
lower-case hex, ``SpanKind``/``StatusCode`` are the ``SPAN_KIND_*``/``STATUS_CODE_*``
names, attribute values are strings as pcommon's ``Value.AsString()`` writes them (JSON
for arrays and maps, Go's shortest ``'f'`` format for doubles).

Writing twice changes nothing: spans whose (TraceId, SpanId) the table already holds are
left out. Stage spans ingest derived from an LLM engine's latency attributes
(:mod:`.genai`) are not written: the table keeps what the exporters sent, and ``tracekit
attribute`` derives them again when it attributes. Analysis never writes to ClickHouse;
this module is the only writer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.ingest import IngestReport, genai, ingest_paths
from tracekit.analysis.store import SPAN_COLUMNS, Store, iter_chunks, open_store
from tracekit.analysis.store.clickhouse import (
    check_table,
    connect,
    first_line,
    qualified_table,
    traces_table_ddl,
)
from tracekit.analysis.store.url import StoreURL
from tracekit.errors import QueryError

BATCH_ROWS = 50_000
"""Rows per INSERT: large enough for ClickHouse's parts, small enough for memory."""

INSERT_COLUMNS: tuple[str, ...] = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "ScopeName",
    "ScopeVersion",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "StatusMessage",
    "Events.Timestamp",
    "Events.Name",
    "Events.Attributes",
    "Links.TraceId",
    "Links.SpanId",
    "Links.TraceState",
    "Links.Attributes",
)
"""The exporter's INSERT column list (``internal/sqltemplates/traces_insert.sql``)."""


@dataclass
class ClickHouseWrite:
    """What one write did: spans sent, spans already there, and whether the table was new."""

    written: int = 0
    already_present: int = 0
    created_table: bool = False


def as_string(value: Any) -> str:
    """An attribute value as the exporter stores it (pcommon ``Value.AsString()``)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        # Go's strconv.FormatFloat(v, 'f', -1, 64): shortest digits, never an exponent.
        return str(np.format_float_positional(value, trim="-"))
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _attribute_map(raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    parsed = json.loads(raw) if isinstance(raw, str) else raw
    if not isinstance(parsed, dict):
        return {}
    return {str(k): as_string(v) for k, v in parsed.items()}


def _row(span: dict[str, Any]) -> list[Any]:
    start = span["start_ns"]
    end = span["end_ns"]
    resource = _attribute_map(span["resource_attributes"])
    # `ingest --version` labels spans whose resource has no service.version; the exporter's
    # table has no other place for the label than the resource attribute itself.
    if span["service_version"] is not None and cv.SERVICE_VERSION not in resource:
        resource[cv.SERVICE_VERSION] = span["service_version"]
    links = json.loads(span["links"]) if span["links"] else []
    return [
        start or 0,
        span["trace_id"],
        span["span_id"],
        span["parent_span_id"] or "",
        span.get("trace_state") or "",
        span["name"],
        f"SPAN_KIND_{span['kind']}",
        span["service_name"] or "",
        resource,
        "",
        "",
        _attribute_map(span["attributes"]),
        max(0, (end or 0) - (start or 0)) if start and end else 0,
        f"STATUS_CODE_{span['status_code']}",
        "",
        [],
        [],
        [],
        [link.get("trace_id") or "" for link in links],
        [link.get("span_id") or "" for link in links],
        ["" for _ in links],
        [_attribute_map(link.get("attributes")) for link in links],
    ]


def _spans(staging: Store) -> Iterator[list[dict[str, Any]]]:
    """The staging store's spans (not the derived ones) in chunks of dicts, ordered by trace."""
    cols = ", ".join(SPAN_COLUMNS)
    cur = staging.con.execute(
        f"SELECT {cols} FROM spans WHERE {genai.NOT_DERIVED} ORDER BY trace_id, span_id",
        genai.not_derived_params(),
    )
    while True:
        rows = cur.fetchmany(BATCH_ROWS)
        if not rows:
            return
        yield [dict(zip(SPAN_COLUMNS, r, strict=True)) for r in rows]


def write_spans(staging: Store, url: StoreURL) -> ClickHouseWrite:
    """Write every span of ``staging`` to ``url``'s table, creating it when missing."""
    from clickhouse_connect.driver.exceptions import Error as ClickHouseError

    result = ClickHouseWrite()
    client = connect(url)
    table = qualified_table(url)
    try:
        exists = client.query(
            "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}",
            parameters={"db": url.database, "t": url.table},
        ).result_rows[0][0]
        if not exists:
            client.command(f"CREATE DATABASE IF NOT EXISTS `{url.database}`")
            client.command(traces_table_ddl(url.database, url.table))
            result.created_table = True
        check_table(client, url)
        for chunk in _spans(staging):
            present = _present(client, table, chunk)
            fresh = [s for s in chunk if (s["trace_id"], s["span_id"]) not in present]
            result.already_present += len(chunk) - len(fresh)
            for part in iter_chunks(fresh, BATCH_ROWS):
                client.insert(table, [_row(s) for s in part], column_names=list(INSERT_COLUMNS))
                result.written += len(part)
    except (ClickHouseError, OSError) as exc:
        raise QueryError(
            f"cannot write to ClickHouse store {url.display()}: {first_line(exc)}"
        ) from exc
    finally:
        client.close()
    return result


def _present(client: Any, table: str, chunk: Sequence[dict[str, Any]]) -> set[tuple[str, str]]:
    ids = sorted({s["trace_id"] for s in chunk})
    rows = client.query(
        f"SELECT TraceId, SpanId FROM {table} WHERE TraceId IN {{ids:Array(String)}}",
        parameters={"ids": ids},
    ).result_rows
    return {(str(t), str(s)) for t, s in rows}


def ingest_into_clickhouse(
    url: StoreURL,
    paths: Sequence[str | Path],
    *,
    version: str | None = None,
    strict: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[IngestReport, ClickHouseWrite]:
    """Read ``paths`` as ``tracekit ingest`` does and write their spans to ``url``."""
    with open_store(":memory:") as staging:
        report = ingest_paths(staging, paths, version=version, strict=strict, progress=progress)
        written = write_spans(staging, url)
    return report, written
