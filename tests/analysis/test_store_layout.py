"""The span table's layout: keyed by (trace_id, span_id) without a primary-key index.

New stores are written without the index; stores written with it (before the change)
must still be read and written alike. Real DuckDB files, real ingest.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracekit.analysis.attribution.per_request import refresh
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import open_store, schema_sql
from tracekit.testing import TraceBuilder, worked_example

OLD_SPANS = """
CREATE TABLE spans (
    trace_id VARCHAR NOT NULL, span_id VARCHAR NOT NULL, parent_span_id VARCHAR,
    name VARCHAR NOT NULL, kind VARCHAR NOT NULL, start_ns BIGINT, end_ns BIGINT,
    status_code VARCHAR NOT NULL, service_name VARCHAR, service_version VARCHAR,
    instance_id VARCHAR, host_name VARCHAR, stage VARCHAR, time_kind VARCHAR,
    cpu_time_ns BIGINT, gpu_time_ns BIGINT, sample_weight DOUBLE NOT NULL DEFAULT 1.0,
    attributes JSON, resource_attributes JSON, links JSON, source VARCHAR,
    PRIMARY KEY (trace_id, span_id)
)
"""


def _traces(tmp_path: Path) -> tuple[TraceBuilder, Path]:
    builder = TraceBuilder()
    for k in range(5):
        worked_example(builder, start_ms=200.0 * k)
    return builder, builder.write_jsonl(tmp_path / "t.jsonl", spans_per_line=7)


def _primary_keys(path: Path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        got = con.execute(
            "SELECT count(*) FROM duckdb_constraints() "
            "WHERE table_name = 'spans' AND constraint_type = 'PRIMARY KEY'"
        ).fetchone()
        return int(got[0]) if got else 0
    finally:
        con.close()


def _ingest_twice(db: Path, data: Path) -> tuple[int, int, int, int]:
    with open_store(db) as store:
        first = ingest_paths(store, [data])
        refresh(store, first.trace_ids)
        again = ingest_paths(store, [data])
        refresh(store, again.trace_ids)
        requests = int(store.run("SELECT count(*) FROM requests")[0][0])
        keys = int(store.run("SELECT count(DISTINCT (trace_id, span_id)) FROM spans")[0][0])
        assert keys == store.span_count()
        return first.spans_stored, again.spans_stored, store.span_count(), requests


def test_new_store_has_no_index_and_ingesting_twice_stores_nothing_new(tmp_path: Path) -> None:
    builder, data = _traces(tmp_path)
    db = tmp_path / "new.duckdb"
    stored, again, total, requests = _ingest_twice(db, data)
    assert (stored, again, total) == (len(builder.spans), 0, len(builder.spans))
    assert requests == 5
    assert _primary_keys(db) == 0


def test_store_written_with_the_key_is_read_and_written_alike(tmp_path: Path) -> None:
    builder, data = _traces(tmp_path)
    old = tmp_path / "old.duckdb"
    con = duckdb.connect(str(old))
    con.execute(OLD_SPANS)
    # The rest of today's schema (the ALTER adds trace_state to the old table).
    con.execute(schema_sql())
    con.close()
    assert _primary_keys(old) == 1
    got_old = _ingest_twice(old, data)
    got_new = _ingest_twice(tmp_path / "new.duckdb", data)
    assert got_old == got_new


def test_insert_spans_keeps_the_first_of_repeated_keys(tmp_path: Path) -> None:
    builder = TraceBuilder()
    worked_example(builder)
    rows = builder.rows()
    changed = (*rows[0][:3], "renamed", *rows[0][4:])
    with open_store(tmp_path / "s.duckdb") as store:
        assert store.insert_spans([*rows, changed]) == len(rows)
        assert store.insert_spans([changed]) == 0
        names = store.run(
            "SELECT name FROM spans WHERE trace_id = ? AND span_id = ?", [rows[0][0], rows[0][1]]
        )
    assert names == [(rows[0][3],)]
