"""`tracekit demo`: a real service, a real v1 → v2 regression, found end to end."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

from tracekit.commands._common import add_command
from tracekit.outputs import claim_output_dir

DB_NAME = "tracekit.duckdb"
"""The store the demo writes in its directory (the runner's ``DB_NAME``)."""

DESCRIPTION_HEAD = """\
Run the reference system on loopback and let tracekit find a regression.

Starts a FastAPI + PyTorch ranker and the pricing service it calls twice, release v1
and release v2 (which carries one regression), all at once. An open-loop load generator
then drives the two releases in turns of {block_s:g} s, the one not under load frozen, so that
whatever else the machine does falls on both alike. It ingests both releases' traces and
prints tracekit's summary, diff, release gate and autoscaling audit. Everything it
starts is stopped at the end, also on Ctrl-C.

Regressions (v2 only; each with what tracekit should find):
"""

DESCRIPTION_TAIL = """
Example:
  tracekit demo --regression cache --keep demo-out
  tracekit demo --training --regression straggler
  tracekit demo --otlp-endpoint http://localhost:4318   # the same spans also go to Jaeger
  tracekit demo --collect      # spans over OTLP into `tracekit collect`; metrics scraped
  tracekit demo --capacity     # small vs big batches under bursty load: `tracekit capacity`
"""


def description() -> str:
    """The help text, its regression lists drawn from the tables the runs use."""
    from tracekit.demo.regressions import REGRESSIONS
    from tracekit.demo.settings import DEFAULT_BLOCK_S
    from tracekit.demo.trainer import DEFAULT_TRAINING_REGRESSION, TRAINING_REGRESSIONS

    def entry(name: str, text: str, found: str) -> str:
        return textwrap.fill(
            f"{text} -> {found}",
            width=88,
            initial_indent=f"  {name:<11} ",
            subsequent_indent=" " * 14,
        )

    serving = [
        entry(r.name, r.description, f"{'/'.join(r.expected_stages)}, {r.expected_kind}")
        if r.expected_stages
        else entry(r.name, r.description, "verdict none")
        for r in REGRESSIONS.values()
    ]
    training = [entry(p.name, p.description, p.expected) for p in TRAINING_REGRESSIONS.values()]
    return "\n".join(
        [
            DESCRIPTION_HEAD.format(block_s=DEFAULT_BLOCK_S).rstrip("\n"),
            *serving,
            "",
            "Training (--training): a 1-rank and a 2-rank DDP job (gloo on 127.0.0.1), then",
            "`tracekit steps` and the scaling `tracekit diff`. Regressions of the 2-rank run",
            f"(default {DEFAULT_TRAINING_REGRESSION}):",
            *training,
            DESCRIPTION_TAIL,
        ]
    )


def register(sub: Any) -> None:
    from tracekit.demo.regressions import DEFAULT_REGRESSION, REGRESSIONS

    # Not the runner: it imports torch, which would slow every tracekit command's start.
    from tracekit.demo.settings import DEFAULT_DURATION_S, DEFAULT_RATE
    from tracekit.demo.trainer import DEFAULT_TRAINING_REGRESSION, TRAINING_REGRESSIONS

    parser = add_command(
        sub,
        "demo",
        help="run the reference service and find a v1 → v2 regression",
        description=description(),
    )
    # No argparse choices: the serving and the training demo each take their own names,
    # and run() checks the name against the mode it is for (a union of both lists would
    # accept `--regression straggler` for the serving demo).
    parser.add_argument(
        "--regression",
        default=None,
        metavar="NAME",
        help=f"what v2 changes: {'|'.join(REGRESSIONS)} (default {DEFAULT_REGRESSION}); "
        f"with --training {'|'.join(TRAINING_REGRESSIONS)} "
        f"(default {DEFAULT_TRAINING_REGRESSION})",
    )
    parser.add_argument(
        "--training",
        action="store_true",
        help="instead: a 1-rank and a 2-rank DDP run (gloo, CPU) and the scaling diff, "
        "e.g. tracekit demo --training --regression data",
    )
    parser.add_argument(
        "--capacity",
        action="store_true",
        help="instead: release A (batches of 2, two workers) and B (batches of 16, one "
        "worker) under bursty load, and `tracekit capacity`'s verdict for each, "
        "e.g. tracekit demo --capacity --keep cap-out",
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
        help="send the spans to a `tracekit collect` started for the run and "
        "scrape the ranker's Prometheus metrics once, e.g. tracekit demo --collect",
    )
    parser.add_argument(
        "--collect-protocol",
        choices=("http", "grpc"),
        default="http",
        help="with --collect: export over OTLP/HTTP (protobuf) or OTLP/gRPC",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep trace files, service logs, the DuckDB store and the HTML report in DIR "
        "(default: a temporary directory). DIR must be new, empty or one an earlier demo "
        "wrote (it leaves a .tracekit-output file there): the demo replaces its own files, "
        "and rather than pick a subdirectory you did not ask for, it refuses a directory "
        "holding anything else, e.g. your own tracekit.duckdb",
    )
    parser.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of arrivals, data and latencies"
    )
    parser.set_defaults(handler=run)


def check_regression(name: str | None, *, training: bool) -> str:
    """The regression to run for this mode (its default when ``name`` is None).

    A name of the other mode, or of none, is a :class:`ConfigError` (one line, exit 2)
    raised before anything starts.
    """
    from tracekit.demo.regressions import DEFAULT_REGRESSION, REGRESSIONS
    from tracekit.demo.trainer import DEFAULT_TRAINING_REGRESSION, TRAINING_REGRESSIONS
    from tracekit.errors import ConfigError

    own, other = (
        (TRAINING_REGRESSIONS, REGRESSIONS) if training else (REGRESSIONS, TRAINING_REGRESSIONS)
    )
    if name is None:
        return DEFAULT_TRAINING_REGRESSION if training else DEFAULT_REGRESSION
    if name in own:
        return name
    mode = "--training --regression" if training else "--regression"
    hint = ""
    if name in other:
        hint = " (that one is for the serving demo)" if training else " (that one needs --training)"
    raise ConfigError(f"{mode} {name}: use one of {', '.join(own)}{hint}")


def prepare_keep(path: Path) -> Path:
    """Claim ``path`` for the demo's files (``--keep DIR``), before anything starts.

    A new or empty directory, or one an earlier demo wrote, is the demo's; the store an
    earlier demo left there is removed, so that this run's traces are not added to it.
    A directory holding files the demo did not write, a file, or a path that cannot be
    created is a :class:`ConfigError` of one line, and nothing there is touched.
    """
    from tracekit.errors import ConfigError

    claim_output_dir(path, option="--keep", owner="tracekit demo")
    try:
        (path / DB_NAME).unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"--keep {path}: cannot replace the earlier demo's {path / DB_NAME} "
            f"({exc.strerror or exc}); give a new or empty directory"
        ) from exc
    return path


def run(args: argparse.Namespace) -> int:
    from tracekit.errors import ConfigError

    if args.capacity:
        if args.training or args.regression is not None or args.collect:
            raise ConfigError("--capacity runs alone: drop --training, --regression, --collect")
        if args.keep is not None:
            prepare_keep(args.keep)
        from tracekit.demo.capacity import run_capacity_demo

        return run_capacity_demo(keep=args.keep, seed=args.seed)
    name = check_regression(args.regression, training=args.training)
    if args.keep is not None:
        prepare_keep(args.keep)
    if args.training:
        from tracekit.demo.training import run_training_demo

        return run_training_demo(name, keep=args.keep, seed=args.seed)
    if args.duration <= 0 or args.rate <= 0:
        raise ConfigError("--duration and --rate must be positive")
    if args.duration * args.rate > 20_000:
        raise ConfigError("--duration × --rate is capped at 20000 requests per release")
    from tracekit.demo.runner import DemoOptions, run_demo

    return run_demo(
        DemoOptions(
            regression=name,
            duration_s=args.duration,
            rate=args.rate,
            otlp_endpoint=args.otlp_endpoint,
            keep=args.keep,
            seed=args.seed,
            collect=args.collect,
            collect_protocol=args.collect_protocol,
        )
    )
