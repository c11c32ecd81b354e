"""`tracekit steps`: where a training run's step time goes, per component and per rank."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import add_format, add_version
from tracekit.commands._store import add_store, open_analysis

DESCRIPTION = """\
Break each training run's step time into data_wait, forward, backward, optimizer,
compute imbalance, exposed communication (peer wait vs transfer) and unattributed time,
with step-time quantiles, samples/s, communication overlap, a per-rank table and the
ranks that arrived last at collectives (stragglers). A run is a service.version of
processes instrumented with tracekit.train_steps.

Example:
  tracekit ingest runs/64gpu/            # one file per rank
  tracekit steps --version 64gpu
  tracekit steps --format json > steps.json
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "steps",
        help="where training step time goes: data, compute, communication",
        description=DESCRIPTION,
    )
    add_version(parser, help="only this run (default: every training run in the store)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        metavar="N",
        help="leading steps to leave out (DDP builds its buckets in the first)",
    )
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with open_analysis(args, releases=args.version) as analysis:
        result = analysis.steps(args.version, warmup=args.warmup)
    emit(result, args.format)
    return 0
