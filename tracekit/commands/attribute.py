"""`tracekit attribute`: attribute each trace once, inside ClickHouse, for every command."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from tracekit.commands._common import add_command, emit, progress_bar
from tracekit.commands._options import add_format
from tracekit.commands._types import duration_type, time_type

DESCRIPTION = """\
Attribute the traces of the OpenTelemetry Collector's ClickHouse table once, where they
live: for each request whose span ended in the window and at least --settle ago, the
per-stage critical path, wait vs compute, CPU/GPU time and weights (the same code as
`tracekit ingest`), written into tracekit_requests, tracekit_request_stages and
tracekit_request_attributes next to the spans. Every analysis command on the store then
reads those rows instead of pulling spans. Incremental (a watermark per shard) and
idempotent (a trace is written again only when its spans grew: late spans); --shard K/N
splits the table between N workers with no coordination but ClickHouse. Needs SELECT on
the spans and CREATE TABLE + INSERT on its own tables (docs/clickhouse.md).

Example:
  tracekit attribute --store clickhouse://tracekit:secret@ch:8123/otel
  tracekit attribute --store chdb:///var/lib/traces --shard 0/4 --settle 2m
  tracekit attribute --store clickhouse://… --follow --interval 1m   # a Deployment
"""


def register(sub: Any) -> None:
    parser = add_command(sub, "attribute", help="attribute traces once, inside ClickHouse", description=DESCRIPTION)  # fmt: skip
    add = parser.add_argument
    add("--store", "--db", dest="db", required=True, metavar="URL", help="clickhouse://user:password@host:8123/database or chdb:///path")  # fmt: skip
    add("--table", default="otel_traces", help="the exporter's traces table")
    add("--since", type=time_type, metavar="WHEN", help="requests that ended at or after WHEN (2h, or an ISO time; default: the shard's watermark, the whole table the first time)")  # fmt: skip
    add("--until", type=time_type, metavar="WHEN", help="requests that ended before WHEN (and at least --settle ago)")  # fmt: skip
    add("--settle", type=duration_type(positive=False), default="2m", help="leave requests that ended less than this ago: their spans may still be arriving")  # fmt: skip
    add("--recheck", type=duration_type(positive=False), default="15m", help="look again this far before the watermark for traces whose spans grew")  # fmt: skip
    add("--shard", default="0/1", metavar="K/N", help="this worker's share: traces with cityHash64(TraceId) %% N = K")  # fmt: skip
    add("--batch-traces", type=int, default=50_000, metavar="N", help="requests attributed at a time (memory follows it)")  # fmt: skip
    add("--tables-prefix", metavar="PREFIX", help="names of the attributed tables, PREFIXrequests, …; default tracekit_ beside otel_traces, tracekit_TABLE_ beside another table (the names the analysis commands read)")  # fmt: skip
    add("--cluster", metavar="NAME", help="create the tables ON CLUSTER NAME (replicated engines)")
    add("--follow", action="store_true", help="keep running: attribute every --interval until SIGTERM or Ctrl-C")  # fmt: skip
    add("--interval", type=duration_type(), default="1m", help="with --follow: time between runs")
    add_format(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.facade import (
        AttributedNames,
        ConfigError,
        attribute,
        follow,
        parse_shard,
        parse_store_url,
    )

    url = parse_store_url(args.db, table=args.table)
    if not url.is_clickhouse:
        raise ConfigError(f"--store {args.db}: tracekit attribute writes next to a ClickHouse table; a DuckDB store is attributed by `tracekit ingest`")  # fmt: skip
    options: dict[str, Any] = dict(since_ns=args.since, until_ns=args.until, settle_s=args.settle, recheck_s=args.recheck, shard=parse_shard(args.shard), batch_traces=args.batch_traces, names=AttributedNames.for_table(args.table, args.tables_prefix), cluster=args.cluster)  # fmt: skip
    if not args.follow:
        with progress_bar("attribute (requests)", counts=True) as advance:
            report = attribute(url, progress=advance, **options)
        emit(report, args.format)
        return 0

    def show(report: Any) -> None:
        emit(report, args.format)
        sys.stdout.flush()

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    follow(
        url,
        interval_s=args.interval,
        stop=stop,
        on_report=show,
        on_error=lambda exc: print(
            f"tracekit attribute: error: {exc}", file=sys.stderr, flush=True
        ),
        **options,
    )
    return 0
