"""Outputs never destroy inputs: the store, config files and a kept demo directory.

Every output flag (``report -o``, ``gate --html/--junit/--markdown``, ``slow --html``,
``autoscale --html``, ``capacity --html``) refuses a path that is the store or another
input, or any file holding data tracekit reads (a store, a trace file), in one line and
exit 2, before the analysis runs; files are replaced atomically. ``demo --keep DIR``
refuses a directory holding files the demo did not write, before anything starts.
"""

from __future__ import annotations

import os
import stat
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.cli import main


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding releases v1 and v2 (v2's model stage slower)."""
    from tracekit.analysis.store import open_store
    from tracekit.testing import TraceBuilder

    path = tmp_path_factory.mktemp("outputs") / "tracekit.duckdb"
    rng = np.random.default_rng(7)
    with open_store(path) as store:
        for seed, (version, slow) in enumerate((("v1", 0.0), ("v2", 5.0)), start=1):
            b = TraceBuilder(version=version, seed=seed)
            for i in range(60):
                pre, model = float(rng.uniform(2, 4)), float(rng.uniform(10, 30)) + slow
                r = b.request(start_ms=i * 50.0, duration_ms=pre + model)
                r.stage(cv.PREPROCESS, start_ms=0.0, duration_ms=pre)
                r.stage(cv.MODEL_EXECUTE, start_ms=pre, duration_ms=model)
            b.load(store)
    return path


@pytest.fixture
def store_copy(db: Path, tmp_path: Path) -> Path:
    """A private copy of the store: a test that goes wrong may only damage its own."""
    copy = tmp_path / "store.duckdb"
    copy.write_bytes(db.read_bytes())
    return copy


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


RELEASES = ["--before", "v1", "--after", "v2"]

OUTPUT_FLAGS: list[tuple[str, list[str], str]] = [
    ("report", RELEASES, "-o"),
    ("report", RELEASES, "--output"),
    ("gate", RELEASES, "--html"),
    ("gate", RELEASES, "--junit"),
    ("gate", RELEASES, "--markdown"),
    ("slow", ["--version", "v2"], "--html"),
    ("autoscale", ["--slo", "p95<50ms"], "--html"),
    ("capacity", ["--version", "v2", "--slo", "p95<50ms"], "--html"),
]


# --- outputs never overwrite the store or another input ------------------------------


@pytest.mark.parametrize(("command", "args", "flag"), OUTPUT_FLAGS)
def test_an_output_flag_naming_the_store_is_refused_and_the_store_kept(
    command: str,
    args: list[str],
    flag: str,
    store_copy: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = store_copy.read_bytes()
    assert main([command, *args, flag, str(store_copy), "--db", str(store_copy)]) == 2
    line = one_error_line(capsys)
    assert line.count(str(store_copy)) >= 2 and flag in line and "--db" in line
    assert store_copy.read_bytes() == before


DATA_FILES: dict[str, bytes] = {
    "otlp.jsonl": b'{"resourceSpans": [{"scopeSpans": []}]}\n',
    "kineto.pt.trace.json": b'{"schemaVersion": 1, "traceEvents": []}',
    "jaeger.json": b'{"data": [{"traceID": "ab", "spans": []}]}',
    "traces.jsonl.gz": b"\x1f\x8b\x08\x00rest",
}


@pytest.mark.parametrize("name", sorted(DATA_FILES))
@pytest.mark.parametrize(("command", "args", "flag"), OUTPUT_FLAGS[::2])
def test_an_output_onto_a_trace_file_or_another_store_is_refused_and_the_file_kept(
    command: str,
    args: list[str],
    flag: str,
    name: str,
    db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Not this command's input, but data tracekit reads: an output never replaces it.
    data = tmp_path / name
    data.write_bytes(DATA_FILES[name])
    assert main([command, *args, flag, str(data), "--db", str(db)]) == 2
    line = one_error_line(capsys)
    assert str(data) in line and flag in line and "another path" in line
    assert data.read_bytes() == DATA_FILES[name]
    other = tmp_path / "other.duckdb"
    other.write_bytes(db.read_bytes())
    assert main([command, *args, flag, str(other), "--db", str(db)]) == 2
    assert "DuckDB" in one_error_line(capsys) and other.read_bytes() == db.read_bytes()


def test_report_refuses_a_symlink_to_the_store(
    store_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "report.html"
    link.symlink_to(store_copy)
    before = store_copy.read_bytes()
    assert main(["report", *RELEASES, "-o", str(link), "--db", str(store_copy)]) == 2
    line = one_error_line(capsys)
    assert str(link) in line and str(store_copy) in line
    assert store_copy.read_bytes() == before and link.is_symlink()


def test_report_refuses_the_store_named_by_another_spelling(
    store_copy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(store_copy.parent)
    before = store_copy.read_bytes()
    other = f"../{store_copy.parent.name}/./{store_copy.name}"
    assert main(["report", *RELEASES, "-o", other, "--db", store_copy.name]) == 2
    assert other in one_error_line(capsys)
    assert store_copy.read_bytes() == before


def test_gate_refuses_to_overwrite_its_config_file(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "gate.toml"
    cfg.write_text('[gate]\nbudgets = ["p99 <= +10%"]\n')
    code = main(["gate", *RELEASES, "--config", str(cfg), "--junit", str(cfg), "--db", str(db)])
    assert code == 2
    line = one_error_line(capsys)
    assert "--junit" in line and "--config" in line
    assert cfg.read_text() == '[gate]\nbudgets = ["p99 <= +10%"]\n'


def test_gate_refuses_two_outputs_to_one_file(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gate.out"
    argv = ["gate", *RELEASES, "--junit", str(out), "--markdown", str(out), "--db", str(db)]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert "--junit" in line and "--markdown" in line
    assert not out.exists()


# --- an unwritable output is one line, exit 2, before the analysis runs --------------


def _unwritable(tmp_path: Path) -> dict[str, Path]:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    a_dir = tmp_path / "a-dir"
    a_dir.mkdir()
    return {
        "is a directory": a_dir,
        "under a file": a_file / "report.html",
        "in a missing directory": tmp_path / "missing" / "report.html",
    }


@pytest.mark.parametrize("case", ["is a directory", "under a file", "in a missing directory"])
@pytest.mark.parametrize(
    ("command", "args", "flag"),
    OUTPUT_FLAGS,
)
def test_an_unwritable_output_is_one_line_naming_the_flag_before_any_analysis(
    case: str,
    command: str,
    args: list[str],
    flag: str,
    db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tracekit import Analysis

    def no_analysis(*a: Any, **k: Any) -> Any:
        raise AssertionError("the analysis ran although its output cannot be written")

    for method in ("report", "gate", "autoscale", "slow"):
        monkeypatch.setattr(Analysis, method, no_analysis)
    path = _unwritable(tmp_path)[case]
    assert main([command, *args, flag, str(path), "--db", str(db)]) == 2
    line = one_error_line(capsys)
    assert flag in line and str(path) in line


def test_slow_html_that_cannot_be_written_is_one_line(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "a-dir"
    target.mkdir()
    assert main(["slow", "--version", "v2", "--html", str(target), "--db", str(db)]) == 2
    line = one_error_line(capsys)
    assert "--html" in line and "is a directory" in line


# --- files are replaced atomically ---------------------------------------------------


def _leftovers(directory: Path, keep: set[str]) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name not in keep)


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(lambda report: (_ for _ in ()).throw(RuntimeError("boom")), id="raises"),
        # A lone surrogate (valid in JSON trace attributes) fails half-way through writing.
        pytest.param(lambda report: "<html>" + "x" * 100_000 + "\ud800", id="unencodable"),
    ],
)
def test_a_failing_render_leaves_the_previous_report_whole_and_no_temporary_file(
    failure: Callable[[Any], str],
    db: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "report.html"
    out.write_text("the previous report")
    monkeypatch.setattr("tracekit.render.html.render_report", failure)
    with pytest.raises((RuntimeError, UnicodeEncodeError)):
        main(["report", *RELEASES, "-o", str(out), "--db", str(db)])
    assert out.read_text() == "the previous report"
    assert _leftovers(out_dir, {"report.html"}) == []


def test_gate_outputs_are_written_whole_and_keep_their_mode(db: Path, tmp_path: Path) -> None:
    junit, md = tmp_path / "gate.xml", tmp_path / "gate.md"
    md.write_text("old")
    md.chmod(0o640)
    code = main(["gate", *RELEASES, "--junit", str(junit), "--markdown", str(md), "--db", str(db)])
    assert code in (0, 1, 3)
    assert junit.read_text().startswith("<?xml") and "|" in md.read_text()
    assert stat.S_IMODE(md.stat().st_mode) == 0o640
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(junit.stat().st_mode) == 0o666 & ~umask
    assert _leftovers(tmp_path, {"gate.xml", "gate.md"}) == []


def test_an_output_through_a_symlink_replaces_the_target_not_the_link(
    db: Path, tmp_path: Path
) -> None:
    real = tmp_path / "artifacts" / "gate.md"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "summary.md"
    link.symlink_to(real)
    assert main(["gate", *RELEASES, "--markdown", str(link), "--db", str(db)]) in (0, 1, 3)
    assert link.is_symlink() and "|" in real.read_text()


def test_an_output_to_a_device_is_written_in_place(db: Path) -> None:
    # /dev/stdout or a pipe as --markdown: never replaced by a regular file.
    assert main(["gate", *RELEASES, "--markdown", os.devnull, "--db", str(db)]) in (0, 1, 3)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


# --- demo --keep: checked before anything starts -------------------------------------


@pytest.fixture
def no_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail at once if the demo would start (and spare importing torch)."""

    def started(*a: Any, **k: Any) -> int:
        raise AssertionError("the demo started")

    for name, attr in (
        ("tracekit.demo.runner", "run_demo"),
        ("tracekit.demo.training", "run_training_demo"),
    ):
        fake = types.ModuleType(name)
        setattr(fake, attr, started)
        fake.DemoOptions = lambda **k: k  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, fake)


@pytest.mark.parametrize("training", [False, True])
def test_demo_keep_refuses_a_directory_holding_a_store_it_did_not_write(
    training: bool, tmp_path: Path, no_demo: None, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "tracekit.duckdb"
    store.write_bytes(b"sixty requests of somebody's own")
    (tmp_path / "ranker-v1.jsonl").write_text("{}\n")
    argv = ["demo", "--keep", str(tmp_path)] + (["--training"] if training else [])
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert str(store) in line and "empty" in line
    assert store.read_bytes() == b"sixty requests of somebody's own"
    assert (tmp_path / "ranker-v1.jsonl").read_text() == "{}\n"


def test_demo_keep_refuses_trace_files_it_did_not_write(
    tmp_path: Path, no_demo: None, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "pricing-v2.jsonl").write_text("{}\n")
    assert main(["demo", "--keep", str(tmp_path)]) == 2
    assert "pricing-v2.jsonl" in one_error_line(capsys)


@pytest.mark.parametrize("case", ["a file", "under a file"])
def test_demo_keep_that_cannot_be_a_directory_is_one_line(
    case: str, tmp_path: Path, no_demo: None, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    target = a_file if case == "a file" else a_file / "demo-out"
    assert main(["demo", "--keep", str(target)]) == 2
    assert "--keep" in one_error_line(capsys)
    assert a_file.read_text() == "mine"


def test_demo_keep_claims_a_new_or_empty_directory_and_reuses_its_own(tmp_path: Path) -> None:
    from tracekit.demo.command import prepare_keep

    fresh = tmp_path / "new" / "demo-out"
    assert prepare_keep(fresh) == fresh and fresh.is_dir()
    # What an earlier demo left there (its store, traces, logs) is the demo's to replace.
    (fresh / "tracekit.duckdb").write_bytes(b"an earlier demo's store")
    (fresh / "ranker-v1.jsonl").write_text("{}\n")
    assert prepare_keep(fresh) == fresh
    empty = tmp_path / "empty"
    empty.mkdir()
    assert prepare_keep(empty) == empty


@pytest.mark.parametrize("name", ["traces.jsonl", "traces.json", "spans.csv", "spans.parquet"])
def test_a_store_path_onto_an_existing_data_file_is_refused_and_the_file_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    # DuckDB opens an existing JSON/CSV/Parquet file given as a database as an in-memory
    # database over it: an ingest would report success and keep nothing.
    from tracekit.testing import TraceBuilder

    data = tmp_path / name
    b = TraceBuilder(version="v1", seed=1)
    b.request(start_ms=0.0, duration_ms=5.0)
    b.write_jsonl(data)
    before = data.read_bytes()
    assert main(["ingest", str(data), "--db", str(data)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a DuckDB database but a data file" in err[0], err
    assert data.read_bytes() == before
