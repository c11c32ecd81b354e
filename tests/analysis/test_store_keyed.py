"""Store.insert_keyed: an empty table gets its rows first and its primary key after."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracekit.analysis.store import open_store

TABLES = ("spans", "requests", "request_stages")


def shape(con: duckdb.DuckDBPyConnection, table: str) -> tuple[list[tuple], list[tuple]]:
    columns = con.execute(f"DESCRIBE {table}").fetchall()
    keys = con.execute(
        "SELECT constraint_type, constraint_column_names FROM duckdb_constraints() "
        "WHERE table_name = ? AND constraint_type IN ('PRIMARY KEY', 'NOT NULL') ORDER BY ALL",
        [table],
    ).fetchall()
    return columns, keys


@pytest.mark.parametrize("table", TABLES)
def test_an_empty_table_is_refilled_with_the_same_columns_and_key(
    tmp_path: Path, table: str
) -> None:
    with open_store(tmp_path / "fresh.duckdb") as fresh:
        expected = shape(fresh.con, table)
    with open_store(tmp_path / "s.duckdb") as s:
        row = {
            "spans": "('a', 'b', NULL, 'n', 'SERVER', 1, 2, 'UNSET', NULL, NULL, NULL, NULL, "
            "NULL, NULL, NULL, NULL, 1.0, '{}', '{}', '[]', 'x:1', NULL)",
            "requests": "('a', 'b', NULL, NULL, NULL, NULL, NULL, NULL, 1, 2, false, 1.0, "
            "NULL, NULL, NULL, NULL, 1, 0)",
            "request_stages": "('a', 'model_execute', 'compute', 1, 1, NULL, NULL)",
        }[table]
        s.run("BEGIN")
        s.insert_keyed(table, f"INSERT INTO {table} VALUES {row}")
        s.run("COMMIT")
        assert shape(s.con, table) == expected
        assert s.run(f"SELECT count(*) FROM {table}") == [(1,)]
        # The key holds again: the same row a second time is refused, and the refused
        # statement leaves the first row in place.
        with pytest.raises(duckdb.ConstraintException):
            s.insert_keyed(table, f"INSERT INTO {table} VALUES {row}")
        assert s.run(f"SELECT count(*) FROM {table}") == [(1,)]


def test_a_repeated_key_in_one_bulk_insert_fails_the_commit_and_stores_nothing(
    tmp_path: Path,
) -> None:
    # DuckDB checks a key added inside a transaction when the transaction commits.
    with open_store(tmp_path / "s.duckdb") as s:
        rows = "('a', 'x', 'wait', 1, 1, NULL, NULL), ('a', 'x', 'wait', 2, 2, NULL, NULL)"
        s.run("BEGIN")
        s.insert_keyed("request_stages", f"INSERT INTO request_stages VALUES {rows}")
        with pytest.raises(duckdb.Error, match="duplicate key"):
            s.run("COMMIT")
        s.rollback()  # what callers do on any error: no second error here
        assert s.run("SELECT count(*) FROM request_stages") == [(0,)]
        assert shape(s.con, "request_stages")[1]  # the key is still declared
