"""Fixtures every test directory may use. Subdirectories keep their own conftest.py."""

from __future__ import annotations

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
