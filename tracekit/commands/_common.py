"""Options every analysis command shares, and writing a rendered result out."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any

FORMATS = ("table", "json", "markdown")


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


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", default="tracekit.duckdb", metavar="FILE", help="tracekit store (a DuckDB file)"
    )


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table for people, json for scripts (schema in README), markdown for PRs",
    )


def emit(result: Any, fmt: str, renderers: Mapping[str, Callable[[Any], str]]) -> None:
    """Render ``result`` with the renderer for ``fmt`` and write it to stdout."""
    text = renderers[fmt](result)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
