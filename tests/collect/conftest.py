"""A running collector on loopback, shared by the collect tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tracekit.collect import Collector


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    """``tracekit collect`` in-process on a free loopback port, writing a fresh store."""
    c = Collector(str(tmp_path / "live.duckdb"), port=0, flush_interval=0.05)
    c.start()
    yield c
    c.stop()
