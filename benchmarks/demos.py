"""Does each demo keep the README's promise, run after run? A tally of N runs.

Each run is ``tracekit demo …`` as a user starts it, a subprocess of its own with a fresh
temporary ``--keep`` directory (its store, traces and logs), removed afterwards. A run
*held* when it exited 0 and printed at least one result line ending in ✓ and none
ending in ✗ (the ``tracekit … found: … ✓`` lines every demo closes with); otherwise
the last lines of its output are printed. To reproduce a loaded machine, keep a core
busy beside it, e.g. ``python -c 'while 1: pass' &`` (and kill it afterwards).

    .venv/bin/python benchmarks/demos.py [--runs 10] [--demo capacity|…|all]

A demo is one line of :data:`DEMOS`: its name and the arguments after ``tracekit demo``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEMOS: dict[str, list[str]] = {
    "serving": [],  # make demo: the batch regression, found and failed by the gate
    "none": ["--regression", "none"],  # no change: verdict none and the gate passes
    "capacity": ["--capacity"],
    "llm": ["--llm"],
    "training": ["--training"],
}
"""Demo name → the arguments of ``tracekit demo`` that run it (``--keep`` is added)."""

TRACEKIT = Path(sys.executable).with_name("tracekit")
FOUND = re.compile(r"^tracekit \S+ found: .*([✓✗])", re.M)


@dataclass
class Run:
    demo: str
    held: bool
    code: int
    marks: str
    """The ✓ and ✗ of its result lines, in order."""
    seconds: float
    tail: str


def run_once(demo: str, args: list[str], timeout_s: float) -> Run:
    workdir = Path(tempfile.mkdtemp(prefix=f"tracekit-bench-{demo}-"))
    began = time.monotonic()
    try:
        proc = subprocess.run(
            [str(TRACEKIT), "demo", *args, "--keep", str(workdir / "out")],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = -1, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    marks = "".join(FOUND.findall(out))
    held = code == 0 and "✓" in marks and "✗" not in marks
    tail = "\n".join((out + err).splitlines()[-25:])
    return Run(demo, held, code, marks, time.monotonic() - began, tail)


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else raw.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each demo (default 10)")
    parser.add_argument(
        "--demo", choices=[*DEMOS, "all"], default="all", help="which demo (default all)"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, metavar="S", help="seconds a run may take"
    )
    args = parser.parse_args(argv)
    names = list(DEMOS) if args.demo == "all" else [args.demo]
    tally: dict[str, list[Run]] = {name: [] for name in names}
    for name in names:
        for i in range(args.runs):
            run = run_once(name, DEMOS[name], args.timeout)
            tally[name].append(run)
            word = "held" if run.held else "FAILED"
            print(
                f"{name} run {i + 1}/{args.runs}: {word} (exit {run.code}, result "
                f"{run.marks or 'none'}, {run.seconds:.0f} s)",
                flush=True,
            )
            if not run.held:
                print("  " + run.tail.replace("\n", "\n  "), flush=True)
    print()
    for name, runs in tally.items():
        held = sum(r.held for r in runs)
        times = sorted(r.seconds for r in runs)
        print(
            f"{name}: {held} of {len(runs)} runs held every expectation "
            f"(median {times[len(times) // 2]:.0f} s a run)"
        )
    return 0 if all(r.held for runs in tally.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
