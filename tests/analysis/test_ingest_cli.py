"""`tracekit ingest` end to end through tracekit.cli.main: exit codes and output."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from tracekit.cli import main


def _otlp_line(trace: str, span: str, parent: str = "", version: str | None = None) -> str:
    attrs = [{"key": "service.name", "value": {"stringValue": "ranker"}}]
    if version:
        attrs.append({"key": "service.version", "value": {"stringValue": version}})
    doc = {
        "resourceSpans": [
            {
                "resource": {"attributes": attrs},
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": trace,
                                "spanId": span,
                                "parentSpanId": parent,
                                "name": "POST /predict",
                                "kind": 2,
                                "startTimeUnixNano": "1767225600000000000",
                                "endTimeUnixNano": "1767225600100000000",
                            }
                        ]
                    }
                ],
            }
        ]
    }
    return json.dumps(doc)


def test_clean_ingest_exits_0_with_a_summary_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text(_otlp_line("a" * 32, "1" * 16) + "\n" + _otlp_line("b" * 32, "2" * 16) + "\n")
    db = tmp_path / "t.duckdb"
    assert main(["ingest", str(path), "--db", str(db), "--version", "v1"]) == 0
    out = capsys.readouterr().out
    assert "ingested 1 file: 2 spans (2 new) in 2 traces; releases: v1; problems: none" in out
    with duckdb.connect(str(db)) as con:
        assert con.execute("SELECT count(*) FROM requests WHERE release = 'v1'").fetchone() == (2,)
    assert main(["ingest", str(path), "--db", str(db)]) == 0
    assert "2 spans (0 new)" in capsys.readouterr().out


def test_malformed_lines_exit_2_naming_file_and_line(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(_otlp_line("a" * 32, "1" * 16) + "\n{truncated\n")
    assert main(["ingest", str(path), "--db", str(tmp_path / "t.duckdb")]) == 2
    captured = capsys.readouterr()
    assert f"{path}:2: invalid JSON" in captured.err
    assert "1 span (1 new)" in captured.out and "skipped 1" in captured.out


def test_strict_and_missing_paths_are_one_line_errors(tmp_path: Path, capsys) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("{truncated\n" + _otlp_line("a" * 32, "1" * 16) + "\n")
    assert main(["ingest", str(path), "--strict", "--db", str(tmp_path / "t.duckdb")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"tracekit ingest: error: {path}:1:")
    assert main(["ingest", str(tmp_path / "nope.json"), "--db", str(tmp_path / "t.duckdb")]) == 2
    assert "no such file or directory" in capsys.readouterr().err
    assert (
        main(["ingest", "--jaeger", "http://127.0.0.1:9", "--db", str(tmp_path / "t.duckdb")]) == 2
    )
    assert "--service" in capsys.readouterr().err


def test_a_failed_ingest_into_a_new_path_leaves_no_store_behind(tmp_path: Path, capsys) -> None:
    db = tmp_path / "new.duckdb"
    # A missing input, a file of nothing but bad lines, and --strict: no file appears.
    assert main(["ingest", str(tmp_path / "nope.jsonl"), "--db", str(db)]) == 2
    assert not db.exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{truncated\n")
    assert main(["ingest", str(bad), "--db", str(db)]) == 2
    assert not db.exists() and not (tmp_path / "new.duckdb.wal").exists()
    assert f"store: {db} not created" in capsys.readouterr().out
    assert main(["ingest", str(bad), "--db", str(db), "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["store_created"] is False
    assert main(["ingest", str(bad), "--strict", "--db", str(db)]) == 2
    assert not db.exists()
    # An existing store is never removed, whatever the input: it holds earlier data.
    good = tmp_path / "good.jsonl"
    good.write_text(_otlp_line("a" * 32, "1" * 16) + "\n")
    assert main(["ingest", str(good), "--db", str(db)]) == 0
    assert main(["ingest", str(bad), "--db", str(db)]) == 2
    assert db.exists()
    with duckdb.connect(str(db)) as con:
        assert con.execute("SELECT count(*) FROM spans").fetchone() == (1,)
    # Some good lines beside bad ones: a new store is kept with what could be stored.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(_otlp_line("b" * 32, "2" * 16) + "\n{truncated\n")
    other = tmp_path / "other.duckdb"
    assert main(["ingest", str(mixed), "--db", str(other)]) == 2
    assert other.exists()


def test_warnings_do_not_fail_the_ingest(tmp_path: Path, capsys) -> None:
    path = tmp_path / "orphan.jsonl"
    path.write_text(_otlp_line("a" * 32, "1" * 16, parent="9" * 16) + "\n")
    assert main(["ingest", str(path), "--db", str(tmp_path / "t.duckdb")]) == 0
    captured = capsys.readouterr()
    assert "problems: 1 orphan" in captured.out and "warning:" in captured.err


def test_version_label_that_cannot_apply_is_a_warning_naming_the_real_labels(
    tmp_path: Path, capsys
) -> None:
    path = tmp_path / "labelled.jsonl"
    path.write_text(_otlp_line("c" * 32, "3" * 16, version="v7") + "\n")
    db = tmp_path / "t.duckdb"
    assert main(["ingest", str(path), "--db", str(db), "--version", "baseline"]) == 0
    err = capsys.readouterr().err
    assert "--version baseline was not applied" in err and "v7" in err
