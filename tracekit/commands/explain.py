"""`tracekit explain`: one trace as a waterfall, its critical path and stage split."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import add_format
from tracekit.commands._store import add_store, open_analysis

DESCRIPTION = """\
Draw one request trace as a waterfall with its critical path marked (★, and █ for the
time a span itself spends on the path), and split the request's duration by stage,
each marked wait or compute. The stage times add up to the request's duration.

TRACE_ID is the hex trace id or a unique prefix of at least 8 digits, e.g. one of
the exemplar trace ids that `tracekit diff` and `tracekit slow` print.

Example:
  tracekit explain 4bf92f3577b34da6a3ce929d0e0e4736
  tracekit explain 4bf92f35 --format json --db traces.duckdb
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "explain",
        help="one trace as a waterfall with the critical path and stage split",
        description=DESCRIPTION,
    )
    parser.add_argument("trace_id", metavar="TRACE_ID", help="trace id or a unique 8+ digit prefix")
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with open_analysis(args, trace_prefix=args.trace_id) as analysis:
        explanation = analysis.explain(args.trace_id)
    emit(explanation, args.format)
    return 0
