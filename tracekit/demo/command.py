"""`tracekit demo`: a real service, a real v1 → v2 regression, found end to end."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Collection
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
  tracekit demo --llm --regression decode   # a token-streaming service: TTFT, TPOT, e2e
"""


def description() -> str:
    """The help text, its regression lists drawn from the tables the runs use."""
    from tracekit.demo.llm.regressions import DEFAULT_LLM_REGRESSION, LLM_REGRESSIONS
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
    llm = [
        entry(r.name, r.description, f"{r.expected} in {r.metric}")
        for r in LLM_REGRESSIONS.values()
    ]
    return "\n".join(
        [
            DESCRIPTION_HEAD.format(block_s=DEFAULT_BLOCK_S).rstrip("\n"),
            *serving,
            "",
            "Training (--training): a 1-rank and a 2-rank DDP job (gloo on 127.0.0.1), then",
            "`tracekit steps` and the scaling `tracekit diff`. Regressions of the 2-rank run",
            f"(default {DEFAULT_TRAINING_REGRESSION}):",
            *training,
            "",
            "LLM serving (--llm): a token-streaming FastAPI service over a tiny PyTorch decoder",
            "with continuous batching, v1 and v2 in turns; the diff of TTFT, TPOT and e2e.",
            f"Regressions of v2 (default {DEFAULT_LLM_REGRESSION}):",
            *llm,
            DESCRIPTION_TAIL,
        ]
    )


def register(sub: Any) -> None:
    from tracekit.demo.llm.regressions import DEFAULT_LLM_REGRESSION, LLM_REGRESSIONS
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
        f"(default {DEFAULT_TRAINING_REGRESSION}); "
        f"with --llm {'|'.join(LLM_REGRESSIONS)} (default {DEFAULT_LLM_REGRESSION})",
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
        "--llm",
        action="store_true",
        help="instead: a token-streaming LLM service (continuous batching, tiny PyTorch "
        "decoder) as v1 and v2, and the diff of TTFT, TPOT and e2e latency, "
        "e.g. tracekit demo --llm --regression decode",
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


def check_regression(name: str | None, *, training: bool, llm: bool = False) -> str:
    """The regression to run for this mode (its default when ``name`` is None).

    A name of another mode, or of none, is a :class:`ConfigError` (one line, exit 2)
    raised before anything starts; the hint names the mode it is for.
    """
    from tracekit.demo.llm.regressions import DEFAULT_LLM_REGRESSION, LLM_REGRESSIONS
    from tracekit.demo.regressions import DEFAULT_REGRESSION, REGRESSIONS
    from tracekit.demo.trainer import DEFAULT_TRAINING_REGRESSION, TRAINING_REGRESSIONS
    from tracekit.errors import ConfigError

    # mode: its names, its default, the flags that select it, where another mode's names go
    modes: dict[str, tuple[Collection[str], str, str, str]] = {
        "serving": (REGRESSIONS, DEFAULT_REGRESSION, "--regression", "is for the serving demo"),
        "training": (
            TRAINING_REGRESSIONS,
            DEFAULT_TRAINING_REGRESSION,
            "--training --regression",
            "needs --training",
        ),
        "llm": (LLM_REGRESSIONS, DEFAULT_LLM_REGRESSION, "--llm --regression", "needs --llm"),
    }
    mode = "llm" if llm else "training" if training else "serving"
    own, default, flags, _ = modes[mode]
    if name is None:
        return default
    if name in own:
        return name
    hint = next(
        (
            f" (that one {where})"
            for m, (names, _, _, where) in modes.items()
            if m != mode and name in names
        ),
        "",
    )
    raise ConfigError(f"{flags} {name}: use one of {', '.join(own)}{hint}")


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

    if args.llm:
        if args.training or args.capacity or args.collect:
            raise ConfigError("--llm runs alone: drop --training, --capacity, --collect")
        name = check_regression(args.regression, training=False, llm=True)
        if args.keep is not None:
            prepare_keep(args.keep)
        from tracekit.demo.llm.demo import run_llm_demo

        return run_llm_demo(name, keep=args.keep, seed=args.seed)
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
