"""`tracekit diff`: which stage grew the tail between two releases, wait or compute."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import (
    add_command,
    add_confidence,
    add_filters,
    add_format,
    add_releases,
    add_store,
    emit,
    http_url_type,
    open_analysis_store,
)

DESCRIPTION = """\
Compare two releases: tail quantiles with bootstrap intervals, the stage that explains
the tail growth (counterfactual), wait vs compute vs hidden wait, attribute values
over-represented in slow traces, and exemplar traces.

Example:
  tracekit diff --before v1 --after v2 --jaeger-url http://localhost:16686
  tracekit diff --before v1 --after v2 --format json > diff.json
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
    parser.add_argument(
        "--jaeger-url",
        default=None,
        type=http_url_type,
        metavar="URL",
        help="Jaeger UI base URL for exemplar links",
    )
    add_confidence(parser)
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.compare.diff import diff_releases

    with open_analysis_store(args, releases=(args.before, args.after)) as store:
        if _training(store, args.before, args.after):
            from tracekit.analysis.training.diff import diff_runs

            emit(diff_runs(store, args.before, args.after), args.format)
            return 0
        result = diff_releases(
            store,
            args.before,
            args.after,
            service=args.service,
            route=args.route,
            confidence=args.confidence,
            jaeger_url=args.jaeger_url,
        )
    emit(result, args.format)
    return 0


def _training(store: Any, before: str, after: str) -> bool:
    """Both labels are training runs (train_step traces): the scaling diff applies."""
    from tracekit.analysis.training.steps import training_runs

    runs = training_runs(store)
    return before in runs and after in runs
