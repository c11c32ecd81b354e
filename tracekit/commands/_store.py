"""Where a command reads its traces: ``--store`` (alias ``--db``), ``--table`` and the
ClickHouse window ``--since/--until``; :func:`open_analysis` opens the front door
(:class:`tracekit.Analysis`) on what they and the command's selection say."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tracekit.commands._types import time_type

if TYPE_CHECKING:
    from tracekit.analysis.facade import Analysis


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", default="tracekit.duckdb", metavar="FILE", help="tracekit store (a DuckDB file)"
    )


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
        group.add_argument(
            "--since",
            type=time_type,
            metavar="WHEN",
            help="ClickHouse stores: only requests starting at or after WHEN (a duration back from now, 2h, or an ISO time, 2026-01-01T10:00Z)",
        )
        group.add_argument(
            "--until",
            type=time_type,
            metavar="WHEN",
            help="ClickHouse stores: only requests starting before WHEN (as --since)",
        )


def store_input(args: argparse.Namespace) -> dict[str, str]:
    """``--db`` as an input no output may overwrite: the local file or directory it reads."""
    from tracekit.analysis.facade import local_store_path

    path = local_store_path(args.db, table=getattr(args, "table", "otel_traces"))
    return {"--db": path} if path else {}


@contextmanager
def open_analysis(
    args: argparse.Namespace,
    *,
    releases: str | Sequence[str] | None = (),
    trace_prefix: str | None = None,
) -> Iterator[Analysis]:
    """:meth:`Analysis.open` on ``--store`` with the command's selection: its
    ``releases``, ``--service``, ``--route``, ``--since/--until`` (ClickHouse pulls only
    these). What the answer's reader should know about its source (the attributed
    tables' lag) goes to stderr after the command's work."""
    from tracekit.analysis.facade import Analysis
    from tracekit.render.text import printable

    with Analysis.open(
        args.db,
        table=getattr(args, "table", "otel_traces"),
        since=getattr(args, "since", None),
        until=getattr(args, "until", None),
        releases=releases or (),
        service=getattr(args, "service", None),
        route=getattr(args, "route", None),
        trace_prefix=trace_prefix,
    ) as analysis:
        yield analysis
        for note in analysis.notes:
            print(printable(f"note: {note}"), file=sys.stderr)
