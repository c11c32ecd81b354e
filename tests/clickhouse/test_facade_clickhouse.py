"""``tracekit.Analysis`` on a ClickHouse store (chDB): the selection, and when it is read.

The session's one chDB engine (tests/clickhouse/conftest.py): chDB holds one path per
process, so every test here uses its own table in it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tracekit.analysis.store.clickhouse as clickhouse
from tracekit import Analysis
from tracekit.analysis.facade import ingest
from tracekit.errors import ConfigError
from tracekit.testing import TraceBuilder, queue_regression


def _files(tmp_path: Path) -> Path:
    builder = TraceBuilder(service="ranker", version="v1", seed=2)
    queue_regression(builder, extra_ms=40.0, seed=3)
    return builder.write_jsonl(tmp_path / "serving.jsonl")


def test_a_selection_answers_as_the_duckdb_file_does(
    clickhouse_url: str, table: str, tmp_path: Path
) -> None:
    files = _files(tmp_path)
    db = tmp_path / "t.duckdb"
    ingest([files], store=db)
    assert ingest([files], store=clickhouse_url, table=table).report.skipped == 0
    since = "2000-01-01T00:00Z"
    with (
        Analysis.open(clickhouse_url, table=table, releases=("v1", "v2"), since=since) as remote,
        Analysis.open(db) as local,
    ):
        assert remote.diff("v1", "v2").latency == local.diff("v1", "v2").latency
    with Analysis.open(clickhouse_url, table=table, releases="v1") as only_v1:
        assert only_v1.releases() == ["v1"]


def test_a_typo_costs_no_pull(
    clickhouse_url: str, table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The selection is pulled when the first question needs it, after that question's
    # arguments are checked.
    ingest([_files(tmp_path)], store=clickhouse_url, table=table)
    pulls: list[object] = []
    real = clickhouse.open_snapshot

    def counted(*args: object, **kwargs: object) -> object:
        pulls.append(args)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(clickhouse, "open_snapshot", counted)
    with Analysis.open(clickhouse_url, table=table) as remote:
        with pytest.raises(ConfigError):
            remote.gate("v1", "v2", budgets=["p99 <== 3"])
        assert pulls == []
        remote.summary()
        remote.diff("v1", "v2")
        assert len(pulls) == 1


def test_the_unlabelled_release_can_be_selected(
    clickhouse_url: str, table: str, corpus_dir: Path
) -> None:
    ingest([corpus_dir], store=clickhouse_url, table=table)
    # Selecting "" and a release that is not there pulls the unlabelled requests alone.
    with Analysis.open(clickhouse_url, table=table, releases=("", "v9")) as analysis:
        (summary,) = analysis.summary("")
        assert summary.label == "" and summary.requests > 0


def test_an_output_inside_a_chdb_store_is_refused(
    clickhouse_url: str, table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A chDB store is a directory of the engine's own files: `-o` onto one of them
    # (or anywhere under it) would damage the store, so it is refused before any work.
    from tracekit.cli import main

    if not clickhouse_url.startswith("chdb://"):
        pytest.skip("a ClickHouse server's files are not on this machine")
    ingest([_files(tmp_path)], store=clickhouse_url, table=table)
    store_dir = Path(clickhouse_url.removeprefix("chdb://"))
    engine_file = next(p for p in store_dir.rglob("*.sql") if p.is_file())
    before = engine_file.read_bytes()
    for target in (engine_file, store_dir / "report.html", store_dir):
        capsys.readouterr()
        argv = ["report", "--before", "v1", "--after", "v2", "--store", clickhouse_url]
        assert main([*argv, "--table", table, "-o", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert "inside the store" in err and err.count("\n") == 0, err
    assert engine_file.read_bytes() == before
    assert not (store_dir / "report.html").exists()
