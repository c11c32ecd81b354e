"""Names from traces reach the terminal escaped: no control character, bidi override or
rich markup in a span, stage, service or release name acts on the reader's terminal.

Table and markdown output show such characters as ``\\x1b``, ``\\n``, ``\\u202e``; JSON
keeps the raw strings (JSON's own escaping makes them harmless).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tracekit.analysis.store import open_store
from tracekit.cli import main
from tracekit.render.text import printable
from tracekit.testing import TraceBuilder, queue_regression, training_run

STAGE = "bq\x1b[1A\x1b[2Kstage"
"""Cursor up, erase line: would hide the line above it (a gate's ``fail:``)."""
SERVICE = "svc\r\u202e[/]"
"""Carriage return, right-to-left override, and a closing tag with nothing open."""
AFTER = "v2\nFORGED"
"""A newline forging an output line that starts with ``FORGED``."""
SPAN = "[bold red]x[/]:smile:\u2066"
"""Rich markup and an emoji code, which must show as written, and a bidi isolate."""
ROOT = "POST /p\x1b]0;pwned\x07"
"""An OSC sequence that retitles the terminal window."""

RAW = ("\x1b", "\r", "\x07", "\u202e", "\u2066", "😄")
"""Characters that must never reach the output raw (😄 is what ``:smile:`` would become)."""


def escaped(name: str) -> str:
    return {
        STAGE: "bq\\x1b[1A\\x1b[2Kstage",
        SERVICE: "svc\\r\\u202e[/]",
        AFTER: "v2\\nFORGED",
        SPAN: "[bold red]x[/]:smile:\\u2066",
        ROOT: "POST /p\\x1b]0;pwned\\x07",
    }[name]


def build(builder: TraceBuilder) -> None:
    """v1, then the hostile release where the hostile stage's tail grows."""
    queue_regression(
        builder,
        releases=("v1", AFTER),
        requests=300,
        extra_ms=30.0,
        stage=STAGE,
        name=ROOT,
        model_child=SPAN,
    )


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(store path, trace id of a request in the hostile release)."""
    builder = TraceBuilder(service=SERVICE, version="v1", seed=1)
    build(builder)
    path = tmp_path_factory.mktemp("hostile") / "tracekit.duckdb"
    with open_store(path) as store:
        builder.load(store)
    yield str(path), builder.requests[-1].trace_id


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_safe(text: str, names: tuple[str, ...]) -> None:
    for ch in RAW:
        assert ch not in text, f"raw {ch!r} in output:\n{text}"
    # every FORGED is the tail of the escaped release name, never a line of its own
    assert text.count("FORGED") == text.count("v2\\nFORGED")
    for name in names:
        assert escaped(name) in text, f"{escaped(name)!r} not in output:\n{text}"


def strings(doc: Any) -> Iterator[str]:
    """Every string in a JSON document, keys included."""
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield k
            yield from strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from strings(v)


COMMANDS: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "summary": (["summary"], (STAGE, AFTER)),
    "explain": (["explain", "{trace}"], (STAGE, SERVICE, SPAN, ROOT, AFTER)),
    "diff": (["diff", "--before", "v1", "--after", AFTER], (STAGE, AFTER)),
    "gate": (["gate", "--before", "v1", "--after", AFTER], (STAGE, AFTER)),
    "slow": (["slow", "--version", AFTER], (STAGE, AFTER)),
}
"""Command → (argv, the names its table and markdown output must show escaped)."""


def _argv(command: str, hostile: tuple[str, str]) -> list[str]:
    db, trace = hostile
    argv, _ = COMMANDS[command]
    return [a.replace("{trace}", trace) for a in argv] + ["--db", db]


@pytest.mark.parametrize("fmt", ["table", "markdown"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_names_are_escaped_in_table_and_markdown_output(
    command: str, fmt: str, hostile: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([*_argv(command, hostile), "--format", fmt], capsys)
    assert code in (0, 1, 3), err
    assert_safe(out, COMMANDS[command][1])
    assert_safe(err, ())


@pytest.mark.parametrize("command", list(COMMANDS))
def test_json_output_keeps_the_raw_names(
    command: str, hostile: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run([*_argv(command, hostile), "--format", "json"], capsys)
    assert code in (0, 1, 3), err
    found = set(strings(json.loads(out)))
    for name in COMMANDS[command][1]:
        assert any(name in s for s in found), name
        assert not any(escaped(name) in s for s in found)


@pytest.fixture
def hostile_files(tmp_path: Path) -> Path:
    """A directory of a good trace file and an unreadable one with a hostile file name."""
    builder = TraceBuilder(service=SERVICE, version="v1", seed=2)
    build(builder)
    folder = tmp_path / "in"
    folder.mkdir()
    builder.write_jsonl(folder / "good.jsonl")
    (folder / "bad\x1b[2Kname.jsonl").write_text('{"resourceSpans": [\n')
    return folder


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_ingest_escapes_releases_and_file_names(
    fmt: str, hostile_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "out.duckdb"
    _, out, err = run(["ingest", str(hostile_files), "--db", str(db), "--format", fmt], capsys)
    assert_safe(out, (AFTER,))
    assert_safe(err, ())
    problems = out if fmt == "markdown" else err
    assert "bad\\x1b[2Kname.jsonl" in problems


def test_ingest_json_keeps_the_raw_names(
    hostile_files: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "out.duckdb"
    _, out, _ = run(["ingest", str(hostile_files), "--db", str(db), "--format", "json"], capsys)
    doc = json.loads(out)
    assert AFTER in doc["releases"]
    assert any("bad\x1b[2Kname.jsonl" in p["where"] for p in doc["problems"])


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain name", "plain name"),
        ("a\x1b[1Ab", "a\\x1b[1Ab"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x00\x7f\x85\x9f", "\\x00\\x7f\\x85\\x9f"),
        ("\u2028\u2029", "\\u2028\\u2029"),
        ("\u202a\u202b\u202c\u202d\u202e", "\\u202a\\u202b\\u202c\\u202d\\u202e"),
        ("\u2066\u2067\u2068\u2069", "\\u2066\\u2067\\u2068\\u2069"),
        ("GET /users/{id} → ok ★ é 日本", "GET /users/{id} → ok ★ é 日本"),
        ("[bold]x[/]", "[bold]x[/]"),
    ],
)
def test_printable_escapes_exactly_the_dangerous_characters(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert printable(shown) == shown


def test_junit_xml_carries_escaped_names_and_stays_valid_xml(
    hostile: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "gate.xml"
    argv = ["gate", "--before", "v1", "--after", AFTER, "--db", hostile[0], "--junit", str(junit)]
    code, _, err = run(argv, capsys)
    assert code in (0, 1, 3), err
    text = junit.read_text(encoding="utf-8")
    ET.fromstring(text.split("\n", 1)[1])  # XML 1.0 has no ESC at all: raw, it would not parse
    assert "\x1b" not in text and escaped(STAGE) in text and escaped(AFTER) in text


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A training run with a hostile label."""
    builder = TraceBuilder(service="trainer", version=None, seed=3)
    training_run(builder, world_size=2, steps=4, version=AFTER)
    path = tmp_path_factory.mktemp("hostile-run") / "tracekit.duckdb"
    with open_store(path) as store:
        builder.load(store)
    return str(path)


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_steps_escapes_run_labels(
    fmt: str, hostile_run: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["steps", "--db", hostile_run, "--format", fmt], capsys)
    assert code == 0, err
    assert_safe(out, (AFTER,))
