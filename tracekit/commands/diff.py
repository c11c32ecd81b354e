"""`tracekit diff`: which stage grew the tail between two releases, wait or compute."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import (
    add_confidence,
    add_filters,
    add_format,
    add_jaeger_url,
    add_link_gbps,
    add_metric,
    add_releases,
)
from tracekit.commands._store import add_store, open_analysis

DESCRIPTION = """\
Compare two releases: tail quantiles with bootstrap intervals, the stage that explains
the tail growth (counterfactual), wait vs compute vs hidden wait, attribute values
over-represented in slow traces, and exemplar traces. Two training runs: scaling
efficiency and what ate it (data loading, communication with its bus bandwidth, a
straggler rank, or compute).

Example:
  tracekit diff --before v1 --after v2 --jaeger-url http://localhost:16686
  tracekit diff --before 8gpu --after 64gpu --link-gbps 400
  tracekit diff --before v1 --after v2 --format json > diff.json
  tracekit diff --before v1 --after v2 --metric ttft   # LLM: time to first token
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "diff",
        help="what a release changed in the tail, and which stage",
        description=DESCRIPTION,
    )
    add_releases(parser)
    add_filters(parser)
    add_metric(parser)
    add_jaeger_url(parser)
    add_confidence(parser)
    add_link_gbps(parser)
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with open_analysis(args, releases=(args.before, args.after)) as analysis:
        result = analysis.diff(
            args.before,
            args.after,
            service=args.service,
            route=args.route,
            confidence=args.confidence,
            jaeger_url=args.jaeger_url,
            link_gbps=args.link_gbps,
            metric=args.metric,
        )
    emit(result, args.format)
    return 0
