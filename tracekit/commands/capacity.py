"""`tracekit capacity`: which binds first — latency under bursts or cost per request."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import (
    add_filters,
    add_format,
    add_html,
    add_slo,
    add_version,
    add_window,
)
from tracekit.commands._pages import write_page
from tracekit.commands._store import add_store, open_analysis, store_input
from tracekit.commands._types import duration_ms_type
from tracekit.outputs import check_outputs

DESCRIPTION = """\
For each release: latency (p50/p95/p99 of accepted requests) in normal and in
peak windows, and how many of them miss the objective; the traffic spikes (how
many, how long, how high); the requests over the objective and how far past it
they ran; the cost (replica-seconds and, with --replica-cost, money per 1,000
accepted requests; GPU busy from the traced model executions); the headroom
(arrival rate per replica where the objective breaks, against the peak seen);
and a verdict: latency_bound, cost_bound, balanced or inconclusive. With
batching traced, the batch size and wait that keep the batch queue within
--queue-budget at the least GPU time per request, as Triton and tracekit
batcher settings. With two releases or more, which one binds the business
first, and why: latency-bound before cost-bound, and of two latency-bound
releases the one whose requests ran further past the objective in all.

Examples:
  tracekit capacity --version A --version B --slo "p95<100ms"
  tracekit capacity --version v2 --slo "p95<100ms" --window 10s \\
      --replica-cost 2.50/h
  tracekit capacity --version v2 --slo "p99<250ms" --queue-budget 20ms \\
      --format json
  tracekit capacity --version A --version B --slo "p95<100ms" \\
      --replica-cost A=4.00/h --replica-cost B=1.20/h
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "capacity",
        help="latency under bursts vs cost per request, and how to batch",
        description=DESCRIPTION,
    )
    add_version(parser, dest="release", multiple=True, help="release to size; repeat to compare")
    add_filters(parser)
    add_slo(parser, help='latency objective per window, e.g. "p95<100ms"')
    add_window(parser, default="10s", help="window length (10s, 1m; a bare number is seconds)")
    parser.add_argument(
        "--replica-cost",
        metavar="PRICE",
        action="append",
        help="a replica's price per hour, e.g. 2.50/h (for cost per 1,000 requests); "
        "per release on other hardware: --replica-cost A=4.00/h --replica-cost B=1.20/h",
    )
    parser.add_argument(
        "--gpus-per-replica", type=int, default=1, metavar="N", help="GPUs each replica holds"
    )
    parser.add_argument(
        "--queue-budget",
        type=duration_ms_type,
        default=None,
        metavar="MS",
        help="batch queue's share of the objective's latency (default: a fifth of it)",
    )
    add_html(parser, "latency against arrival rate and the cost per release")
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_outputs({"--html": args.html}, store_input(args))
    with open_analysis(args, releases=args.release) as analysis:
        result = analysis.capacity(
            args.release or [],
            slo=args.slo,
            window_s=args.window,
            replica_cost=args.replica_cost,
            gpus_per_replica=args.gpus_per_replica,
            queue_budget_ms=args.queue_budget,
            service=args.service,
            route=args.route,
        )
        if args.html:
            write_page(args.html, analysis.capacity_report(result), args, option="--html")
    emit(result, args.format)
    return 0
