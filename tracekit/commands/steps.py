"""`tracekit steps`: where a training run's step time goes, per component and per rank."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import add_format, add_link_gbps, add_version
from tracekit.commands._store import add_store, open_analysis

DESCRIPTION = """\
Break each training run's step time into data_wait, forward, backward, optimizer,
compute imbalance, exposed communication (peer wait vs transfer) and unattributed time,
with step-time quantiles, samples/s, communication overlap, a per-rank table, the
ranks that arrived last at collectives (stragglers), each collective's bus bandwidth
(GB/s, as nccl-tests) and communication per process group. A run is a service.version
of processes instrumented with tracekit.train_steps, or of PyTorch profiler files.

Example:
  tracekit ingest runs/64gpu/            # one file per rank
  tracekit steps --version 64gpu
  tracekit steps --version 64gpu --link-gbps 400   # bus bandwidth as a share of 400G
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
    add_link_gbps(parser)
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with open_analysis(args, releases=args.version) as analysis:
        result = analysis.steps(args.version, warmup=args.warmup, link_gbps=args.link_gbps)
    emit(result, args.format)
    return 0
