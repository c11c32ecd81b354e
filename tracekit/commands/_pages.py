"""``--html`` and ``tracekit report``: a :class:`~tracekit.analysis.report.Report` drawn
(:func:`tracekit.render.html.render_report`) and written whole, never over an input."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit.commands._store import store_input
from tracekit.outputs import Paths, write_output

if TYPE_CHECKING:
    from tracekit.analysis.facade import Report


def write_page(
    path: str | Path,
    report: Report,
    args: argparse.Namespace,
    *,
    option: str,
    inputs: Paths | None = None,
) -> Path:
    """Draw ``report`` and write it to ``path`` atomically; ``option`` names the flag
    in errors, and neither the store nor ``inputs`` may be the path."""
    from tracekit.render.html import render_report

    read = {**store_input(args), **(inputs or {})}
    return write_output(path, render_report(report), option=option, inputs=read)
