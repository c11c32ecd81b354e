"""The ``tracekit`` command: parse arguments, call one library function, render.

Each subcommand lives in ``tracekit/commands/<name>.py`` (the demo's in
``tracekit/demo/command.py``) and exposes ``register(subparsers)``; the handler it sets
returns an exit code. Any
:class:`~tracekit.errors.TracekitError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from types import ModuleType

from tracekit import __version__
from tracekit.commands import (
    attribute,
    autoscale,
    capacity,
    collect,
    diff,
    explain,
    gate,
    ingest,
    profile,
    report,
    slow,
    steps,
    summary,
)
from tracekit.commands._common import Parser
from tracekit.demo import command as demo
from tracekit.errors import TracekitError, UsageError

COMMANDS: tuple[ModuleType, ...] = (
    ingest,
    summary,
    diff,
    slow,
    explain,
    gate,
    autoscale,
    capacity,
    steps,
    profile,
    report,
    collect,
    attribute,
    demo,
)
"""The modules whose ``register(subparsers)`` add each subcommand, in help order. Each
imports what its command runs only when it runs, so ``tracekit --help`` stays quick."""

DESCRIPTION = """\
tracekit tells you where an inference request's latency goes and what a release changed.

Typical use:
  tracekit ingest traces.jsonl              # OTLP JSON(L) or Jaeger JSON into tracekit.duckdb
  tracekit diff --before v1 --after v2      # which stage grew the tail, wait or compute
  tracekit gate --before v1 --after v2      # release gate for CI (exit 0 pass, 1 fail, 3 inconclusive)
  tracekit demo                             # a real service, a real regression, found end to end
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="tracekit",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tracekit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except TracekitError as exc:
        cause = exc.__cause__
        if cause is not None and _is_database_error(cause):
            _store_unreadable(args, cause)
        else:
            print(f"tracekit {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tracekit {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        # A database error is an input problem (a damaged or foreign store), never a
        # verdict: exit 1 would read as "the gate failed" in CI.
        if not _is_database_error(exc):
            raise
        _store_unreadable(args, exc)
        return 2


def _is_database_error(exc: BaseException) -> bool:
    # The store package names the database's exceptions, so duckdb is imported there only.
    try:
        from tracekit.analysis.facade import DatabaseError
    except ImportError:
        return False
    return isinstance(exc, DatabaseError)


def _store_unreadable(args: argparse.Namespace, exc: BaseException) -> None:
    print(
        f"tracekit {args.command}: error: the store {getattr(args, 'db', '')} could not be "
        f"read ({type(exc).__name__}: {_one_line(exc)}); re-create it with `tracekit ingest`",
        file=sys.stderr,
    )


def _one_line(exc: BaseException) -> str:
    """The first non-empty line (a database error quotes the whole query after it), with
    control characters shown escaped: messages quote file and span names from the data."""
    from tracekit.render.text import printable

    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return printable(lines[0]) if lines else type(exc).__name__


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
