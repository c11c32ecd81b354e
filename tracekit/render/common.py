"""Formatting pieces every renderer shares: milliseconds, percentages, JSON, tables.

Table and markdown text made here passes names through
:func:`tracekit.render.text.printable`, and rich never reads markup or emoji codes in it:
a name from a trace is shown as written, never acted on.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.render.text import printable

if TYPE_CHECKING:
    from rich.text import Text


def ms(value: float | None, digits: int = 1) -> str:
    """``12.3 ms``; ``–`` for missing values."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f} ms"


def signed_ms(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:+.{digits}f} ms"


def pct(value: float | None, digits: int = 0, signed: bool = False) -> str:
    """A 0..1 fraction as a percentage (``0.42`` → ``42%``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value * 100:{'+' if signed else ''}.{digits}f}%"


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        return _jsonable(obj.item())
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else round(obj, 6)
    return obj


def metric_label(metric: str) -> str:
    """How a table names the latency compared: nothing for e2e, ``TTFT`` / ``TPOT``."""
    return "" if metric == "e2e" else f" ({metric.upper()})"


HIDDEN_WAIT_MARK = "*"
HIDDEN_WAIT_NOTE = (
    "* hidden wait: a compute stage whose wall time grew while its CPU/GPU time did not "
    "(contention, the GIL, throttling, sync stalls)"
)


def kind_cell(time_kind: str, hidden_wait: bool = False) -> str:
    """A stage's kind as every command prints it: the declared ``wait`` or ``compute``,
    marked ``*`` where measurement showed hidden wait (:data:`HIDDEN_WAIT_NOTE`), so one
    stage never reads as two different kinds in two commands."""
    return time_kind + (HIDDEN_WAIT_MARK if hidden_wait else "")


def hidden_wait_note(stages: Sequence[Any]) -> list[str]:
    """The footnote for :func:`kind_cell`'s mark, when a stage carries it."""
    return [HIDDEN_WAIT_NOTE] if any(getattr(s, "hidden_wait", False) for s in stages) else []


def to_json(obj: Any) -> str:
    """Stable JSON: dataclasses become objects, NaN/inf become null, keys keep their order."""
    return json.dumps(_jsonable(obj), indent=2, allow_nan=False, ensure_ascii=False)


def requests_text(kept: int, estimated: float) -> str:
    """``1,204 requests``, or ``1,204 requests kept (~4,816)`` where sample weights make
    the requests they stand for differ from the requests in the store."""
    if estimated <= 0 or round(estimated) == kept:
        return f"{kept:,} requests"
    return f"{kept:,} requests kept (~{estimated:,.0f})"


def markdown_cell(value: Any) -> str:
    """``value`` as one markdown table cell: control characters and pipes escaped."""
    return printable(str(value)).replace("|", "\\|")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (cells as :func:`markdown_cell`)."""
    lines = ["| " + " | ".join(markdown_cell(h) for h in headers) + " |"]
    lines.append("|" + "|".join("---" for _ in headers) + "|")
    lines.extend("| " + " | ".join(markdown_cell(v) for v in row) + " |" for row in rows)
    return "\n".join(lines)


def as_text(value: Any, style: str = "") -> Text:
    """``value`` as a :class:`rich.text.Text` (never markup), control characters escaped."""
    from rich.text import Text

    return Text(printable(str(value)), style=style)


def prose_width(width: int = 110) -> int:
    """Where sentences (verdicts, flags, headings) wrap: at the terminal's width when
    stdout is one (an 80-column terminal gets 80), else at ``width``, so a log or a file
    keeps each sentence on as few lines as before. Tables keep their own width and may
    scroll."""
    import shutil
    import sys

    if not sys.stdout.isatty():
        return width
    return max(40, min(width, shutil.get_terminal_size((width, 24)).columns))


def rich_to_text(*renderables: Any, width: int = 110) -> str:
    """Render rich objects to a string (colour only when stdout is a terminal).

    Strings are shown as written: :func:`printable`, and neither rich markup
    (``[bold]``, a stray ``[/]`` would even raise) nor emoji codes (``:x:``) are read.
    Styled text is a :class:`rich.text.Text` built with ``printable`` by the caller.
    """
    import sys

    from rich.console import Console

    buf = io.StringIO()
    console = Console(
        file=buf,
        width=width,
        force_terminal=sys.stdout.isatty(),
        color_system="auto" if sys.stdout.isatty() else None,
        highlight=False,
        markup=False,
        emoji=False,
    )
    from rich.text import Text

    prose = prose_width(width)
    for r in renderables:
        if isinstance(r, str | Text):  # sentences wrap to fit the terminal; tables may scroll
            console.print(printable(r) if isinstance(r, str) else r, width=prose)
        else:
            console.print(r)
    return buf.getvalue()
