"""`tracekit summary`: requests, tail quantiles and the per-stage split of each release."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import add_filters, add_format, add_metric, add_version
from tracekit.commands._store import add_store, open_analysis

DESCRIPTION = """\
Summarise releases in the store: requests, p50/p90/p95/p99, and per stage the mean,
the tail-cohort mean and its share of a tail request (wait or compute).

Example:
  tracekit summary                 # every release
  tracekit summary --version v2 --format markdown
  tracekit summary --version v2 --metric ttft   # LLM serving: time to first token
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub, "summary", help="tail latency of each release, split by stage", description=DESCRIPTION
    )
    add_version(parser, help="one release (default: every release in the store)")
    add_filters(parser)
    add_metric(parser)
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with open_analysis(args, releases=args.version) as analysis:
        summaries = analysis.summary(
            args.version, service=args.service, route=args.route, metric=args.metric
        )
    emit(summaries, args.format)
    return 0
