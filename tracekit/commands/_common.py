"""The CLI's frame: the argument parser, a command's help, output and exit codes.

A command module declares its options (:mod:`tracekit.commands._options`), makes one
:class:`tracekit.Analysis` call and hands the result to :func:`emit`. Exit codes are
decided here, never by the analysis: 0 ok or pass, 1 the gate failed, 3 the gate was
inconclusive, 2 a usage or input error (``tracekit.cli`` turns errors into it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from tracekit.analysis.results import FAIL, INCONCLUSIVE, PASS
from tracekit.errors import UsageError
from tracekit.render import render

EXIT_CODES: dict[str, int] = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}
"""Process exit code per gate outcome."""
INPUT_SKIPPED = 2
"""``tracekit ingest``: some input had to be skipped (the rest was kept)."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the examples in a command's description as written, shows real defaults."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # "(default: None)" / "(default: False)" tells a newcomer nothing.
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def add_command(sub: Any, name: str, *, help: str, description: str) -> argparse.ArgumentParser:
    """A subparser whose description (with its example) is printed as written."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, formatter_class=HelpFormatter
    )
    return parser


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and a :class:`UsageError`.

    argparse would print the whole usage block and exit; tracekit's rule is one line that
    says what to do, exit code 2 (the CLI's ``main`` turns the error into both).
    """

    def error(self, message: str) -> NoReturn:
        # "argument --window: 'soon': expected …" reads better as "--window 'soon': …".
        if message.startswith("argument ") and ": " in message:
            option, _, rest = message[len("argument ") :].partition(": ")
            option = option.split("/")[-1]
            if rest.startswith(option):
                message = rest
            else:
                message = f"{option} {rest}" if rest.startswith("'") else f"{option}: {rest}"
        raise UsageError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")


def emit(result: Any, fmt: str) -> None:
    """Render ``result`` in ``fmt`` (by its type, :func:`tracekit.render.render`) to stdout."""
    text = render(result, fmt)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@contextmanager
def progress_bar(
    label: str, *, enabled: bool | None = None, counts: bool = False
) -> Iterator[Callable[..., None]]:
    """A transient bar on stderr fed by ``(done, total)`` bytes (``counts``: items); a
    no-op off a terminal.

    Long analysis calls take this callback (``progress=``): the analysis reports how far
    it is, the CLI decides how (or whether) to show it.
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Column

    done_column = MofNCompleteColumn() if counts else DownloadColumn()
    # The figures never shrink: the description gives way (cut with an ellipsis) and the
    # bar is narrow, so "160/1,300 0:00:12" stays whole in an 80-column terminal.
    console = Console(stderr=True)
    figures = 20 + 19 + 7 + 3  # bar, "123.4/567.8 MB" or "1,300/13,000", 0:00:12, gaps
    text = Column(no_wrap=True, overflow="ellipsis", max_width=max(8, console.width - figures))
    columns = (
        TextColumn("{task.description}", table_column=text),
        BarColumn(bar_width=20),
        done_column,
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(label, total=None)

        def advance(done: int, total: int, name: str | None = None) -> None:
            # ``name``: the input just finished (a parallel ingest's files finish unordered)
            shown = "".join(c if c.isprintable() else "?" for c in name or "")
            desc = label if name is None else f"{label} {escape(shown)}"
            bar.update(task, completed=done, total=max(total, 1), description=desc)

        yield advance
