"""`tracekit ingest`: trace files or a running Jaeger into the store, then attribution."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracekit.commands._common import add_command, add_format, add_store, emit, progress_bar
from tracekit.errors import ConfigError

DESCRIPTION = """\
Read traces into the tracekit store (a DuckDB file), then attribute each request's
latency to stages. Formats are recognised from content: OTLP JSON or JSON lines
(Collector file exporter, tracekit's exporter), gzip-compressed or not, Jaeger JSON
(query API, single trace, span array, api_v3), PyTorch profiler (Kineto) traces, one
file per rank (run label from --version), and directories of these. Ingesting
the same file twice stores nothing new. Exit 0, or 2 when input had to be skipped.

examples:
  tracekit ingest traces.jsonl --version v2
  tracekit ingest exports/ --db perf.duckdb
  tracekit ingest profiles/8gpu/ --version 8gpu --comm-pattern 'deep_ep|all2all'
  tracekit ingest exports/ --store clickhouse://default:@localhost:8123/otel   # otel_traces
  tracekit ingest --jaeger http://localhost:16686 --service ranker --since 2h
"""


def register(sub: Any) -> None:
    from tracekit.analysis.ingest.jaeger_api import DEFAULT_LIMIT

    parser = add_command(
        sub, "ingest", help="read OTLP/Jaeger traces into the store", description=DESCRIPTION
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="trace files or directories")
    add_store(parser, window=False)
    add_format(parser)
    parser.add_argument(
        "--version",
        dest="release",
        metavar="LABEL",
        help="release label for spans whose resource has no service.version",
    )
    parser.add_argument(
        "--strict", action="store_true", help="stop at the first problem that would skip data"
    )
    parser.add_argument(
        "--comm-pattern",
        metavar="REGEX",
        help="profiler files: kernels matching this are communication too (besides nccl)",
    )
    jaeger = parser.add_argument_group("pull from a running Jaeger")
    jaeger.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query service, e.g. http://localhost:16686"
    )
    jaeger.add_argument("--service", metavar="NAME", help="service whose traces to pull")
    jaeger.add_argument("--since", default="1h", help="how far back: 30m, 1h, 2d")
    jaeger.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, metavar="N", help="at most N traces"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.ingest import ingest_jaeger, ingest_paths
    from tracekit.analysis.store import open_store
    from tracekit.analysis.store.url import parse_store_url
    from tracekit.render.ingest import IngestOutcome, problem_lines
    from tracekit.render.text import printable

    # A ClickHouse store is written through an in-memory staging store: the same readers
    # and problem log, then the spans go to the exporter's table (docs/clickhouse.md).
    target = parse_store_url(args.db, table=args.table)
    written = None
    if args.jaeger and not args.service:
        raise ConfigError("--jaeger needs --service NAME (the service whose traces to pull)")
    if not args.jaeger and not args.paths:
        raise ConfigError("give trace files or directories, or --jaeger URL --service NAME")
    with open_store(":memory:" if target.is_clickhouse else target.path) as store:
        if args.jaeger:
            report = ingest_jaeger(
                store,
                args.jaeger,
                args.service,
                since=args.since,
                limit=args.limit,
                version=args.release,
                strict=args.strict,
            )
        else:
            with progress_bar("ingest", enabled=sys.stderr.isatty()) as advance:
                report = ingest_paths(
                    store,
                    args.paths,
                    version=args.release,
                    strict=args.strict,
                    progress=advance,
                    comm_pattern=args.comm_pattern,
                )
        requests = _refresh(store, None if report.every_trace else report.trace_ids)
        if target.is_clickhouse:
            from tracekit.analysis.ingest.clickhouse import write_spans

            written = write_spans(store, target)
    outcome = IngestOutcome(
        report=report,
        store=target.display() if target.is_clickhouse else args.db,
        requests_attributed=requests,
        version=args.release,
        jaeger_limit=args.limit if args.jaeger else None,
        written=written.written if written is not None else None,
        already_present=written.already_present if written is not None else None,
        created_table=bool(written is not None and written.created_table),
    )
    if args.format == "table":
        for line in problem_lines(outcome):
            print(printable(line), file=sys.stderr)
    emit(outcome, args.format)
    return outcome.exit_code


def _refresh(store: Any, trace_ids: list[str] | None) -> int:
    """Rebuild ``requests`` and ``request_stages`` for the touched traces (None: all)."""
    from tracekit.analysis.attribution import per_request as attribution

    return int(attribution.refresh(store, trace_ids).requests)
