"""The CLI's contract for input errors: one line on stderr and exit code 2."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracekit.cli import main


@pytest.mark.parametrize(
    "argv",
    [
        ["gate", "--before", "v1", "--after", "v2"],
        ["diff", "--before", "v1", "--after", "v2"],
        ["summary"],
        ["slow"],
        ["explain", "0123456789abcdef"],
        ["autoscale", "--slo", "p95<200ms"],
    ],
)
def test_a_foreign_duckdb_file_is_an_input_error_not_a_verdict(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "other.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE unrelated (x INTEGER)")
    con.close()
    assert main([*argv, "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "not a tracekit store" in err[0] and "tracekit ingest" in err[0]


def test_a_missing_store_says_what_to_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["summary", "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "tracekit ingest" in capsys.readouterr().err


def test_a_damaged_store_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "broken.duckdb"
    db.write_bytes(b"this is not a database" * 100)
    assert main(["gate", "--before", "v1", "--after", "v2", "--db", str(db)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_store_with_a_wrong_schema_is_exit_2_not_a_gate_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "old.duckdb"
    con = duckdb.connect(str(db))
    for table in ("spans", "requests", "request_stages"):
        con.execute(f"CREATE TABLE {table} (x INTEGER)")
    con.close()
    assert main(["gate", "--before", "v1", "--after", "v2", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "could not be read" in err[0]
