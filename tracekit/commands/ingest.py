"""`tracekit ingest`: trace files or a running Jaeger into the store, then attribution."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from tracekit.commands._common import INPUT_SKIPPED, add_command, emit, progress_bar
from tracekit.commands._options import add_format
from tracekit.commands._store import add_store

DESCRIPTION = """\
Read traces into the tracekit store (a DuckDB file), then attribute each request's
latency to stages. Formats are recognised from content: OTLP JSON or JSON lines
(Collector file exporter, tracekit's exporter), gzip-compressed or not, Jaeger JSON
(query API, single trace, span array, api_v3), PyTorch profiler (Kineto) traces, one
file per rank (run label from --version, parsed in --jobs processes at once), and
directories of these. Ingesting the same file twice stores nothing new. Exit 0, or 2
when input had to be skipped.

examples:
  tracekit ingest traces.jsonl --version v2
  tracekit ingest exports/ --db perf.duckdb
  tracekit ingest profiles/8gpu/ --version 8gpu --comm-pattern 'deep_ep|all2all'
  tracekit ingest profiles/64gpu/ --version 64gpu --jobs 8
  tracekit ingest exports/ --store clickhouse://default:@localhost:8123/otel   # otel_traces
  tracekit ingest --jaeger http://localhost:16686 --service ranker --since 2h
"""


def register(sub: Any) -> None:
    from tracekit.analysis.facade import JAEGER_LIMIT

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
    parser.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="profiler files: parse N rank files at once, in N processes (default: the CPU "
        "cores this process may use; 1: one after another)",
    )
    jaeger = parser.add_argument_group("pull from a running Jaeger")
    jaeger.add_argument(
        "--jaeger", metavar="URL", help="Jaeger query service, e.g. http://localhost:16686"
    )
    jaeger.add_argument("--service", metavar="NAME", help="service whose traces to pull")
    jaeger.add_argument("--since", default="1h", help="how far back: 30m, 1h, 2d")
    jaeger.add_argument(
        "--limit", type=int, default=JAEGER_LIMIT, metavar="N", help="at most N traces"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.facade import ingest
    from tracekit.render.ingest import problem_lines
    from tracekit.render.text import printable

    with progress_bar("ingest", enabled=sys.stderr.isatty() and not args.jaeger) as advance:
        outcome = ingest(
            args.paths,
            store=args.db,
            table=args.table,
            version=args.release,
            strict=args.strict,
            comm_pattern=args.comm_pattern,
            jaeger=args.jaeger,
            service=args.service,
            since=args.since,
            limit=args.limit,
            progress=advance,
            jobs=args.jobs,
        )
    code = INPUT_SKIPPED if outcome.report.skipped else 0
    outcome = dataclasses.replace(outcome, exit_code=code)
    if args.format == "table":
        for line in problem_lines(outcome):
            print(printable(line), file=sys.stderr)
    emit(outcome, args.format)
    return code
