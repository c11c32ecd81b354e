"""``tracekit demo --training``: a 1-rank and a 2-rank DDP run, and what scaling lost.

Runs a real DDP job (:mod:`tracekit.demo.trainer`, gloo on 127.0.0.1) twice — a 1-rank
baseline and a 2-rank run carrying the injected problem, one after the other in the
same two processes (starting torch is the slow part) — ingests the per-rank trace
files, and prints what ``tracekit steps`` and the scaling ``tracekit diff`` print,
through the same front door (:class:`tracekit.Analysis`) and renderers. The closing
lines are the serving demo's (:func:`tracekit.demo.runner.print_result`): what was
injected, what was expected, what the diff found, with ✓ or ✗; the exit code is 0 when
the diff named the injected bottleneck.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tracekit.demo.trainer import (
    NOISE_BOTTLENECKS,
    JobSpec,
    Run,
    TrainingProblem,
    get_problem,
    run_job,
    verdict_matches,
)

BEFORE, AFTER = "1rank", "2rank"
DB_NAME = "tracekit.duckdb"


def _print(text: str) -> None:
    """As the command prints it, and a blank line after."""
    print(text if text.endswith("\n") else text + "\n")


def expected_words(problem: TrainingProblem) -> str:
    """What the result line expects, with what :func:`verdict_matches` also accepts."""
    if problem.expected != "none":
        return problem.expected
    noise = " or ".join(NOISE_BOTTLENECKS)
    return f"none (below 90% efficiency on a busy machine: {noise}, no one rank)"


def run_training_demo(
    regression: str,
    *,
    keep: Path | None = None,
    steps: int = 16,
    seed: int = 0,
    say: Callable[[str], None] | None = None,
) -> int:
    """Run both jobs, print steps and diff; 0 when the verdict names the injected problem."""
    from tracekit.analysis.facade import Analysis, TrainingDiff, ingest
    from tracekit.demo.runner import print_result
    from tracekit.render import render

    problem = get_problem(regression)
    note = say or (lambda m: print(m, file=sys.stderr))
    work = keep or Path(tempfile.mkdtemp(prefix="tracekit-train-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        started = time.perf_counter()
        note(f"training demo: injected problem {problem.name!r} — {problem.description}")
        note(
            f"running {AFTER} (2 ranks), then {BEFORE} (1 rank): DDP over gloo on 127.0.0.1, "
            f"{steps} steps each …"
        )
        # the 2-rank run first: a rank that sat idle through a run starts the next one
        # ahead of the others (the scheduler's doing), which reads as a straggler
        runs = (Run(AFTER, 2, problem), Run(BEFORE, 1))
        files = run_job(JobSpec(runs, work / "traces", steps=steps, seed=seed))
        db = work / DB_NAME
        outcome = ingest(files, store=db)
        if outcome.report.skipped:
            note(f"tracekit ingest skipped {outcome.report.skipped:,} inputs")
            return 2
        with Analysis.open(db) as analysis:
            print("$ tracekit steps")
            _print(render(analysis.steps(), "table"))
            print(f"$ tracekit diff --before {BEFORE} --after {AFTER}")
            diff = analysis.diff(BEFORE, AFTER)
            _print(render(diff, "table"))
        if isinstance(diff, TrainingDiff):
            named = diff.verdict.bottleneck
            ok = verdict_matches(problem, named, diff.verdict.ranks, diff.scaling.efficiency)
            ranks = ", ".join(str(r) for r in diff.verdict.ranks)
            found = f"{named} (rank {ranks})" if ranks else named
        else:
            found, ok = diff.verdict.kind, False
        print_result(
            target=AFTER,
            injected=problem.name,
            description=problem.description,
            expected=expected_words(problem),
            found=found,
            ok=ok,
        )
        note(f"run time {time.perf_counter() - started:.0f} s")
        if keep:
            note(f"trace files and the store are in {work}")
        return 0 if ok else 1
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
