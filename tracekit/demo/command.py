"""`tracekit demo`: a real service, a real v1 → v2 regression, found end to end."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tracekit.commands._common import add_command

DESCRIPTION = """\
Run the reference system on loopback and let tracekit find a regression.

Starts a FastAPI + PyTorch ranker and the pricing service it calls, drives release v1
and then release v2 (which carries one regression) with an open-loop load generator,
ingests the two releases' traces and prints tracekit's summary, diff, release gate and
autoscaling audit. Everything it starts is stopped at the end, also on Ctrl-C.

Regressions (v2 only):
  batch        the batcher waits longer for bigger batches on one worker  -> batch_queue, wait
  downstream   10% of pricing calls take 40 ms longer                     -> downstream, wait
  model        a heavier model                                            -> model_execute, compute
  cache        feature cache disabled                                     -> feature_retrieval, wait
  contention   a CPU-hogging thread holds the GIL                         -> a compute stage, hidden_wait
  none         v2 = v1                                                    -> verdict none

Training (--training): a 1-rank and a 2-rank DDP job (gloo on 127.0.0.1), then
`tracekit steps` and the scaling `tracekit diff`; --regression straggler|data|comm|none.

Example:
  tracekit demo --regression cache --keep demo-out
  tracekit demo --training --regression straggler
  tracekit demo --otlp-endpoint http://localhost:4318   # the same spans also go to Jaeger
  tracekit demo --collect      # spans over OTLP into `tracekit collect`; metrics scraped
"""


def register(sub: Any) -> None:
    from tracekit.demo.regressions import DEFAULT_REGRESSION, REGRESSIONS

    # Not the runner: it imports torch, which would slow every tracekit command's start.
    from tracekit.demo.settings import DEFAULT_DURATION_S, DEFAULT_RATE

    parser = add_command(
        sub,
        "demo",
        help="run the reference service and find a v1 → v2 regression",
        description=DESCRIPTION,
    )
    from tracekit.demo.trainer import TRAINING_REGRESSIONS

    parser.add_argument(
        "--regression",
        choices=list(dict.fromkeys([*REGRESSIONS, *TRAINING_REGRESSIONS])),
        default=None,
        help=f"what v2 changes (default {DEFAULT_REGRESSION}); with --training one of "
        f"{'|'.join(TRAINING_REGRESSIONS)} (default straggler)",
    )
    parser.add_argument(
        "--training",
        action="store_true",
        help="instead: a 1-rank and a 2-rank DDP run (gloo, CPU) and the scaling diff, "
        "e.g. tracekit demo --training --regression data",
    )
    parser.add_argument(
        "--duration",
        type=float,
        default=DEFAULT_DURATION_S,
        metavar="S",
        help="seconds of load per release",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=DEFAULT_RATE,
        metavar="R",
        help="requests per second (Poisson arrivals)",
    )
    parser.add_argument(
        "--otlp-endpoint",
        default="",
        metavar="URL",
        help="also send the spans to this OTLP/HTTP endpoint, e.g. Jaeger's http://localhost:4318",
    )
    parser.add_argument(
        "--collect",
        action="store_true",
        help="send the spans to a `tracekit collect` started for the run (OTLP/HTTP) and "
        "scrape the ranker's Prometheus metrics once, e.g. tracekit demo --collect",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep trace files, service logs and the DuckDB store in DIR (default: a temporary directory)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of arrivals, data and latencies"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.demo.runner import DemoOptions, run_demo
    from tracekit.errors import ConfigError

    if args.training:
        from tracekit.demo.trainer import DEFAULT_TRAINING_REGRESSION, TRAINING_REGRESSIONS
        from tracekit.demo.training import run_training_demo

        name = args.regression or DEFAULT_TRAINING_REGRESSION
        if name not in TRAINING_REGRESSIONS:
            raise ConfigError(
                f"--training --regression {name}: use one of {', '.join(TRAINING_REGRESSIONS)}"
            )
        return run_training_demo(name, keep=args.keep, seed=args.seed)
    if args.regression is None:
        from tracekit.demo.regressions import DEFAULT_REGRESSION

        args.regression = DEFAULT_REGRESSION
    if args.duration <= 0 or args.rate <= 0:
        raise ConfigError("--duration and --rate must be positive")
    if args.duration * args.rate > 20_000:
        raise ConfigError("--duration × --rate is capped at 20000 requests per release")
    return run_demo(
        DemoOptions(
            regression=args.regression,
            duration_s=args.duration,
            rate=args.rate,
            otlp_endpoint=args.otlp_endpoint,
            keep=args.keep,
            seed=args.seed,
            collect=args.collect,
        )
    )
