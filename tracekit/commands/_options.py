"""Options several commands take, declared once so they mean the same everywhere.

``--before`` / ``--after`` and ``--version`` name releases (``service.version``) or
training runs, ``--service`` / ``--route`` select requests, ``--confidence`` is a
two-sided level, ``--store`` is where the traces are; :func:`open_analysis` opens the
front door (:class:`tracekit.Analysis`) on what those options say.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tracekit.commands._types import confidence_type, http_url_type, time_type
from tracekit.render import FORMATS

if TYPE_CHECKING:
    from tracekit.analysis.facade import Analysis


def add_releases(parser: argparse.ArgumentParser, *, what: str = "release") -> None:
    """``--before V1 --after V2``: the baseline and the candidate release (or run)."""
    parser.add_argument("--before", required=True, metavar="V1", help=f"baseline {what} (service.version)")  # fmt: skip
    parser.add_argument("--after", required=True, metavar="V2", help=f"candidate {what} (service.version)")  # fmt: skip


def add_version(
    parser: argparse.ArgumentParser, *, help: str, dest: str = "version", multiple: bool = False
) -> None:
    """``--version V``: always a release label (``service.version``); ``help`` says its role."""
    action = "append" if multiple else "store"
    parser.add_argument("--version", dest=dest, metavar="V", action=action, default=None, help=help)  # fmt: skip


def add_filters(parser: argparse.ArgumentParser, *, route: bool = True) -> None:
    """``--service`` and ``--route``: which requests a command reads."""
    parser.add_argument("--service", metavar="NAME", help="only requests entering this service")
    if route:
        parser.add_argument("--route", metavar="ROUTE", help="only this route (http.route or span name)")  # fmt: skip


def add_confidence(parser: argparse.ArgumentParser, *, default: float | None = 0.95) -> None:
    """``--confidence``: the two-sided level of every interval the command reports."""
    parser.add_argument("--confidence", type=confidence_type, default=default, help="two-sided confidence of the intervals, in [0.5, 1) (0.95 or 95%%)")  # fmt: skip


def add_jaeger_url(parser: argparse.ArgumentParser, *, links: str = "exemplar links") -> None:
    parser.add_argument("--jaeger-url", default=None, type=http_url_type, metavar="URL", help=f"Jaeger UI base URL for {links}")  # fmt: skip


def add_html(parser: argparse.ArgumentParser, what: str) -> None:
    """``--html FILE`` for a command that can draw its part of the report."""
    parser.add_argument("--html", default=None, metavar="FILE", help=f"also write {what} as a self-contained HTML page (as `tracekit report` does)")  # fmt: skip


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table", help="table for people, json for scripts (schema in docs/json.md), markdown for PRs")  # fmt: skip


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", default="tracekit.duckdb", metavar="FILE", help="tracekit store (a DuckDB file)")  # fmt: skip


def add_store(parser: argparse.ArgumentParser, *, window: bool = True) -> None:
    """``--store URL`` (alias ``--db``) and ``--table``; ``window`` adds ``--since/--until``."""
    group = parser.add_argument_group("store (docs/clickhouse.md)")
    group.add_argument(
        "--store",
        "--db",
        dest="db",
        default="tracekit.duckdb",
        metavar="URL",
        help="a DuckDB file, clickhouse://user:password@host:8123/database (the OTel "
        "Collector's ClickHouse exporter table) or chdb:///path (embedded ClickHouse)",
    )
    group.add_argument("--table", default="otel_traces", help="traces table of a ClickHouse store")
    if window:
        group.add_argument("--since", type=time_type, metavar="WHEN", help="ClickHouse stores: only requests starting at or after WHEN (a duration back from now, 2h, or an ISO time, 2026-01-01T10:00Z)")  # fmt: skip
        group.add_argument("--until", type=time_type, metavar="WHEN", help="ClickHouse stores: only requests starting before WHEN (as --since)")  # fmt: skip


def store_input(args: argparse.Namespace) -> dict[str, str]:
    """``--db`` as an input no output may overwrite: the local file or directory it reads."""
    from tracekit.analysis.facade import local_store_path

    path = local_store_path(args.db, table=getattr(args, "table", "otel_traces"))
    return {"--db": path} if path else {}


def open_analysis(
    args: argparse.Namespace,
    *,
    releases: str | Sequence[str] | None = (),
    trace_prefix: str | None = None,
) -> Analysis:
    """:meth:`Analysis.open` on ``--store`` with the command's selection: its
    ``releases``, ``--service``, ``--route``, ``--since/--until`` (ClickHouse pulls only
    these)."""
    from tracekit.analysis.facade import Analysis

    return Analysis.open(
        args.db,
        table=getattr(args, "table", "otel_traces"),
        since=getattr(args, "since", None),
        until=getattr(args, "until", None),
        releases=releases or (),
        service=getattr(args, "service", None),
        route=getattr(args, "route", None),
        trace_prefix=trace_prefix,
    )
