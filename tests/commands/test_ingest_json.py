"""`tracekit ingest --format json`: one document on stdout, problems included, same exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.cli import main
from tracekit.testing import TraceBuilder


def _file(tmp_path: Path, *, bad_line: bool) -> Path:
    b = TraceBuilder(service="ranker", version="v1")
    for i in range(3):
        r = b.request(duration_ms=20.0, start_ms=100.0 * i)
        r.stage("preprocess", start_ms=1.0, duration_ms=5.0)
    path = tmp_path / "t.jsonl"
    b.write_jsonl(path, spans_per_line=2)
    if bad_line:
        with path.open("a") as f:
            f.write("{not json\n")
    return path


def test_json_report_counts_what_the_table_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, bad_line=False)
    db = str(tmp_path / "s.duckdb")
    assert main(["ingest", str(path), "--db", db, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"] == 1 and doc["traces"] == 3 and doc["requests_attributed"] == 3
    assert doc["spans_read"] == doc["spans_stored"] == 6
    assert doc["releases"] == ["v1"] and doc["skipped"] == 0 and doc["exit_code"] == 0
    assert doc["store"] == db
    # a second ingest stores nothing new, and says so in the same fields
    assert main(["ingest", str(path), "--db", db, "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["spans_read"] == 6 and again["spans_stored"] == 0


def test_json_report_names_the_malformed_line_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _file(tmp_path, bad_line=True)
    bad = len(path.read_text().splitlines())  # the appended line is the last
    assert main(["ingest", str(path), "--db", str(tmp_path / "s.duckdb"), "--format", "json"]) == 2
    captured = capsys.readouterr()
    doc = json.loads(captured.out)  # stdout stays one parseable document
    assert doc["skipped"] == 1 and doc["exit_code"] == 2 and doc["traces"] == 3
    skipped = [p for p in doc["problems"] if p["skipped"]]
    assert skipped and skipped[0]["where"] == f"{path}:{bad}"
    assert captured.err == ""  # nothing for people on stderr in JSON mode
