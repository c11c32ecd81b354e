"""In an 80-column terminal the progress line keeps its figures and sentences fit."""

from __future__ import annotations

import io
import re
import sys

import pytest
from rich.console import Console

from tracekit.commands import _common
from tracekit.render.common import as_text, rich_to_text

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LONG_NAME = "profiles/a-very-long-directory-name/rank-00017.Jul_15_10_52_41.1074.pt.trace.json.gz"


def _lines(raw: str) -> list[str]:
    return [ANSI.sub("", line) for line in raw.replace("\r", "\n").splitlines()]


@pytest.mark.parametrize("counts", [True, False])
def test_progress_line_keeps_its_figures_in_80_columns(monkeypatch, counts: bool) -> None:
    buf = io.StringIO()

    def console(*_args, **_kwargs) -> Console:  # the bar's console, as an 80-column terminal
        return Console(file=buf, width=80, force_terminal=True, color_system=None)

    monkeypatch.setattr("rich.console.Console", console)
    with _common.progress_bar("ingest", enabled=True, counts=counts) as advance:
        advance(160, 1300, LONG_NAME) if counts else advance(160 << 20, 1300 << 20, LONG_NAME)
    shown = [line for line in _lines(buf.getvalue()) if "ingest" in line]
    assert shown, buf.getvalue()
    last = shown[-1]
    assert len(last.rstrip()) <= 80, last
    figures = "160/1300" if counts else "0.2/1.4 GB"
    assert figures in last and re.search(r"\d:\d\d:\d\d", last), last
    assert "…" in last  # the long name gave way, not the figures


def test_sentences_wrap_at_the_terminal_width_and_tables_keep_theirs(monkeypatch) -> None:
    from rich.table import Table

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    table = Table("a very wide column header that goes on", "and another wide header here")
    table.add_row("x" * 60, "y" * 40)
    out = rich_to_text(as_text("word " * 40), table)
    lines = _lines(out)
    prose = [line for line in lines if line.startswith("word")]
    assert len(prose) >= 3 and all(len(line.rstrip()) <= 80 for line in prose), prose
    assert max(len(line) for line in lines) > 80  # the table scrolls rather than squeezes
    # Off a terminal (a file, a CI log) sentences keep the wide layout as before.
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert max(len(line) for line in rich_to_text(as_text("word " * 40)).splitlines()) > 80
