"""Operation names are attacker-controlled text: the operations tables, the verdict that
names one, the pattern flags and the HTML report show them escaped, as stage names are;
JSON keeps them raw (its own escaping makes them harmless)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tracekit import Analysis
from tracekit.analysis.store import open_store
from tracekit.cli import main
from tracekit.render.html import render_report
from tracekit.testing import TraceBuilder

OPERATION = "get\x1b[K\u202e|<script>alert(x)</script>"
"""Erase line, a bidi override, a markdown cell's pipe and markup."""
SHOWN = "get\\x1b[K\\u202e"
RAW = ("\x1b", "\u202e")
N = 240


def _build(b: TraceBuilder, version: str, seed: int, *, t0_ms: float, calls: int) -> None:
    rng = np.random.default_rng(seed)
    for i in range(N):
        call_ms = [round(float(rng.lognormal(np.log(3.0), 0.2)), 3) for _ in range(calls)]
        down = round(sum(call_ms) + 1.0, 3)
        r = b.request(start_ms=t0_ms + i * 100.0, duration_ms=down + 6.0, version=version)
        r.stage("preprocess", start_ms=0.5, duration_ms=4.0)
        stage = r.stage("downstream", start_ms=5.0, duration_ms=down)
        t = 5.5
        for d in call_ms:
            r.span(OPERATION, start_ms=t, duration_ms=d, parent=stage)
            t = round(t + d, 3)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    path = tmp_path_factory.mktemp("hostile-ops") / "tracekit.duckdb"
    b = TraceBuilder(service="ranker", version="v1", seed=3)
    _build(b, "v1", 1, t0_ms=0.0, calls=2)
    _build(b, "v2", 2, t0_ms=N * 100.0, calls=7)
    with open_store(path) as store:
        b.load(store)
    yield str(path)


COMMANDS = {
    "summary": ["summary", "--version", "v2"],
    "slow": ["slow", "--version", "v2"],
    "diff": ["diff", "--before", "v1", "--after", "v2"],
    "gate": ["gate", "--before", "v1", "--after", "v2", "--budget", "p95<=+1%"],
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr().out
    assert code in (0, 1, 3), out
    return out


@pytest.mark.parametrize("fmt", ["table", "markdown"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_operation_names_are_escaped_in_table_and_markdown(
    command: str, fmt: str, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _run([*COMMANDS[command], "--db", db, "--format", fmt], capsys)
    for ch in RAW:
        assert ch not in out, f"raw {ch!r} in {command} {fmt}:\n{out}"
    assert SHOWN in out, out
    if fmt == "markdown":
        # the pipe in a name never opens a new cell
        for line in out.splitlines():
            if SHOWN in line and line.startswith("|"):
                assert "\\|<script>" in line, line


@pytest.mark.parametrize("command", ["summary", "slow", "diff"])
def test_json_keeps_operation_names_raw(
    command: str, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(_run([*COMMANDS[command], "--db", db, "--format", "json"], capsys))
    found = list(_strings(doc))
    assert OPERATION in found, command
    assert not any(SHOWN in s for s in found)


def _strings(doc: object) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from _strings(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from _strings(v)


def test_the_verdict_and_gate_name_the_operation(db: str) -> None:
    with Analysis.open(db) as analysis:
        diff = analysis.diff("v1", "v2")
        gate = analysis.gate("v1", "v2", budgets=["p95<=+1%"])
    assert diff.verdict.primary_stage == "downstream", diff.verdict.summary
    assert diff.verdict.operation is not None
    assert diff.verdict.operation.operation == OPERATION
    assert OPERATION in diff.verdict.summary
    assert diff.operations is not None and diff.operations.shares
    assert diff.operations.shares[0].calls_before == pytest.approx(2.0)
    assert diff.operations.shares[0].calls_after == pytest.approx(7.0)
    assert diff.operations.shares[0].serial is True
    failed = [c for c in gate.checks if str(c.result) == "fail"]
    assert failed and OPERATION in failed[0].message


def test_the_report_escapes_operation_names(db: str, tmp_path: Path) -> None:
    with Analysis.open(db) as analysis:
        page = render_report(analysis.report("v1", "v2"))
    markup = re.sub(r"<script[^>]*>.*?</script>", "", page, flags=re.S)
    assert "&lt;script&gt;alert(x)&lt;/script&gt;" in markup
    assert "<script>alert(x)" not in markup
    assert 'id="operations"' in page or "operations" in markup
