"""`tracekit ingest`: trace files or a running Jaeger into the store, then attribution."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracekit.commands._common import add_command, add_store
from tracekit.errors import ConfigError

LISTED = 20
"""Problems named one per line at the end; the rest are counted."""

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
            report = ingest_paths(
                store,
                args.paths,
                version=args.release,
                strict=args.strict,
                progress=sys.stderr.isatty(),
                comm_pattern=args.comm_pattern,
            )
        requests = _refresh(store, report.trace_ids)
        if target.is_clickhouse:
            from tracekit.analysis.ingest.clickhouse import write_spans

            written = write_spans(store, target)
    for problem in report.skipping_problems[:LISTED]:
        print(f"{problem.where}: {problem.reason}", file=sys.stderr)
    if len(report.skipping_problems) > LISTED or report.skipped > LISTED:
        print(f"… and more: {report.skipped:,} skipped in all", file=sys.stderr)
    # Warnings (nothing dropped) are one line per kind with its first example: a normal
    # run can hold hundreds of server spans ending just after their client span.
    first: dict[str, Any] = {}
    count: dict[str, int] = {}
    for problem in report.problems:
        if not problem.skipped:
            first.setdefault(problem.kind, problem)
            count[problem.kind] = count.get(problem.kind, 0) + 1
    for kind, problem in first.items():
        more = f" (and {count[kind] - 1:,} more like it)" if count[kind] > 1 else ""
        print(f"warning: {kind}: {problem.where}: {problem.reason}{more}", file=sys.stderr)
    if args.release and report.releases and args.release not in report.releases:
        # --version only labels spans without service.version; say so before a later
        # `--before LABEL` fails with "no requests for release".
        print(
            f"warning: --version {args.release} was not applied: these spans carry "
            f"service.version ({', '.join(report.releases)}); select them by those labels",
            file=sys.stderr,
        )
    if args.jaeger and report.traces >= args.limit:
        print(
            f"warning: pulled --limit {args.limit:,} traces, so older ones in the --since window "
            "were left out; raise --limit or narrow --since to compare whole releases",
            file=sys.stderr,
        )
    if args.jaeger and report.stopped:
        print(report.stopped)  # how many traces came back and why the pull stopped
    line = report.summary_line() + f" ({report.seconds:.2f} s)"
    line += f"; {requests:,} requests attributed"
    print(line)
    if written is None:
        print(f"store: {args.db}")
    else:
        created = ", table created with the exporter's DDL" if written.created_table else ""
        print(
            f"store: {target.display()}: {written.written:,} spans written, "
            f"{written.already_present:,} already there{created}"
        )
    return 2 if report.skipped else 0


def _refresh(store: Any, trace_ids: list[str]) -> int:
    """Rebuild ``requests`` and ``request_stages`` for the touched traces."""
    from tracekit.analysis.attribution import per_request as attribution

    return int(attribution.refresh(store, trace_ids).requests)
