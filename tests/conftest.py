"""Fixtures every test directory may use. Subdirectories keep their own conftest.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "data" / "corpus" / "traces"


@pytest.fixture
def corpus_dir() -> Path:
    """The corpus of real trace files kept in the repository (tests/data/corpus/traces)."""
    return CORPUS


@pytest.fixture
def store(tmp_path: Path):
    """A fresh store in a real DuckDB file."""
    from tracekit.analysis.store import open_store

    s = open_store(tmp_path / "tracekit.duckdb")
    yield s
    s.close()


class Vocabulary:
    """The words every command's table and markdown output must agree on (issue 35):
    a stage's kind is one word everywhere, units match figures, a count of one is
    singular, and the verdict builders write sentences. ``check`` reads one output;
    the kinds seen are remembered across outputs, so two commands that call one stage
    by two kinds fail."""

    KINDS = ("wait", "compute")
    STAGE_ROW = re.compile(r"^[│|]\s*([a-z_][\w.]*)\s*[│|]\s*([a-z][a-z ]*\*?)\s*[│|]")

    def __init__(self) -> None:
        self.kinds: dict[str, tuple[str, str]] = {}

    def check(self, text: str, where: str) -> None:
        problems = []
        if "problems: none (" in text:
            problems.append("'problems: none (…)' reads as a problem lasting that long")
        for m in re.finditer(
            r"(?<![\d.,])1 (ranks|requests|steps|windows|budgets|spans|"
            r"traces|files|replicas|releases|runs|profiles)\b",
            text,
        ):
            problems.append(f"plural after one: {m.group(0)!r}")
        for m in re.finditer(r"the issue is [\w-]+\.", text):
            problems.append(f"not a sentence: {m.group(0)!r}")
        for m in re.finditer(r"(?<![.\w])(?!e\.g|i\.e|vs)[a-z]{2,}\. [a-z]{2,}", text):
            problems.append(f"a sentence that starts in lower case: {m.group(0)!r}")
        for unit in ("GB/s", "MB/s", "KB/s"):
            if re.search(rf"in {re.escape(unit)}\b", text):
                others = [u for u in ("GB/s", "MB/s", "KB/s", "B/s") if u != unit]
                figures = re.findall(r"\d (GB/s|MB/s|KB/s|B/s)\b", text)
                if any(f in others for f in figures):
                    problems.append(f"a header says {unit} over figures in {set(figures)}")
        for line in re.findall(r"[^\n]*samples_per_s[^\n]*%[^\n]*", text):
            if "of ideal" not in line:
                problems.append(f"a scaling figure without 'of ideal': {line.strip()!r}")
        for line in text.splitlines():
            m = self.STAGE_ROW.match(line.strip())
            if not m or m.group(2).strip().rstrip("*") not in self.KINDS + ("hidden wait",):
                continue
            stage, kind = m.group(1), m.group(2).strip().rstrip("*")
            if kind == "hidden wait":
                problems.append(f"{stage}: 'hidden wait' as a kind (it is a finding: '*')")
            seen = self.kinds.setdefault(stage, (kind, where))
            if seen[0] != kind:
                problems.append(f"{stage} is {kind} here but {seen[0]} in {seen[1]}")
        assert not problems, f"{where}: " + "; ".join(problems)


@pytest.fixture
def vocabulary() -> Vocabulary:
    """A :class:`Vocabulary` to check every command's words with."""
    return Vocabulary()
