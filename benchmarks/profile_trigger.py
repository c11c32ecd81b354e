"""Cost of profile on trigger (docs/profiling.md): off the trigger, and of one capture.

Part 0, start-up. What ``configure(profile_on=...)`` costs the requests while the profiling
thread warms up: a fresh process per run (the warm-up happens once per process) imports
torch, calls a 512-wide MLP (batch 32, about 0.3 ms) once, configures tracekit with no
rule (the baseline) or with the documented rule (``above_ms`` 20), then runs the model
inside ``model_execution()`` back to back for ``--startup-s`` seconds; runs alternate, and
each rule run's p99 is compared with the baseline run beside it. Also: how long after
``configure()`` the rule started watching, and whether torch._inductor was imported.

Part 1, off the trigger. The same stage (``with tracekit.stage("model_execute"):``
around trivial work) is timed in one process with no ``profile_on`` (the baseline), with
a fixed-threshold rule on it that never fires, and with a p99 rule on it, its ring
warm and its threshold set; variants interleaved over rounds, each timed by the CPU time
of the thread that runs the stages, and compared with the baseline of the same round.
Above its p99 a stage asks for a capture: those (1 in 100) find the hour's budget spent
here, the state between captures, so that no capture runs while the stage is timed.
On a shared machine the stage itself varies by more than the rules cost, so the hook
that a watched stage's end runs is also timed alone (best of 7 batches); the target is
at most 1 us per stage.

Part 2, a capture. A small model (``--width``) inside ``tracekit.model_execution()``,
profiled on demand (``profile_next``) ``--captures`` times, ``steps`` executions each.
Per execution, the wall time a request sees: unprofiled, the first captured one (which
starts the profiler, before its stage span begins), those in between (the profiler
recording), and the last (whose thread stops the profiler after its span ended); then
how long the profiling thread took to write the file, and its size.

    .venv/bin/python benchmarks/profile_trigger.py [--stages 5000] [--rounds 30] [--captures 5]
        [--startup-runs 3] [--startup-s 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import profiling, setup
from tracekit.instrumentation.profiling import PROFILER

TARGET_US = 1.0
DATA = list(range(32))
Rule = dict[str, Any]


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


EXPORTER = Discard()


def configure(profile_on: Rule | None, directory: str) -> None:
    # the same tracing set-up each time: only the profiling settings change
    tracekit.configure(
        service_name="bench", exporter=EXPORTER, profile_on=profile_on, profile_dir=directory
    )


# --- part 0: start-up -----------------------------------------------------------------


def startup_child(with_rule: bool, seconds: float) -> None:
    """One fresh process: configure, then executions back to back; prints JSON."""
    import torch

    from tracekit.instrumentation.profiling import watch_state

    model = torch.nn.Sequential(
        torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)
    )
    x = torch.randn(32, 512)
    with torch.no_grad():
        model(x)  # the model's one-off first call, before serving
    with tempfile.TemporaryDirectory() as directory:
        rule = {"stage": cv.MODEL_EXECUTE, "above_ms": 20, "max_per_hour": 2}
        t_configure = time.perf_counter()
        configure(rule if with_rule else None, directory)
        ms: list[float] = []
        watching = None
        while time.perf_counter() - t_configure < seconds:
            if watching is None and watch_state() == "watching":
                watching = time.perf_counter() - t_configure
            t0 = time.perf_counter()
            with torch.no_grad(), tracekit.model_execution():
                model(x)
            ms.append((time.perf_counter() - t0) * 1000)
        captures = PROFILER.files
    ms.sort()
    print(
        json.dumps(
            {
                "p50": ms[len(ms) // 2],
                "p99": ms[int(len(ms) * 0.99)],
                "max": ms[-1],
                "n": len(ms),
                "watching_ms": None if watching is None else watching * 1000,
                "captures": captures,
                "inductor": "torch._inductor" in sys.modules,
            }
        )
    )
    tracekit.shutdown()


def startup_cost(runs: int, seconds: float) -> None:
    def run(variant: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, __file__, "--startup-child", variant, "--startup-s", str(seconds)],
            capture_output=True,
            text=True,
            check=True,
        )
        out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return out

    rows: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for _ in range(runs):
        rows.append((run("none"), run("rule")))
    print(
        f"start-up: {runs} x 2 fresh processes, {seconds:g} s of a 512-wide MLP (batch 32) "
        "back to back from configure(); wall ms per execution"
    )
    print(
        f"{'run':<5}{'no rule p50':>12}{'p99':>8}{'max':>8}{'rule p50':>10}{'p99':>8}{'max':>8}"
        f"{'p99 ratio':>11}{'watching after ms':>19}{'captures':>10}"
    )
    ratios = []
    for i, (base, rule) in enumerate(rows, 1):
        ratio = rule["p99"] / base["p99"]
        ratios.append(ratio)
        watching = "never" if rule["watching_ms"] is None else f"{rule['watching_ms']:.1f}"
        print(
            f"{i:<5}{base['p50']:>12.3f}{base['p99']:>8.3f}{base['max']:>8.1f}{rule['p50']:>10.3f}"
            f"{rule['p99']:>8.3f}{rule['max']:>8.1f}{ratio:>11.2f}{watching:>19}"
            f"{rule['captures']:>10}"
        )
    inductor = any(r["inductor"] for _, r in rows)
    verdict = "ok" if statistics.median(ratios) <= 2 else "OVER TARGET"
    print(
        f"p99 with the rule / without, median of runs: {statistics.median(ratios):.2f} "
        f"(target <= 2: {verdict}); torch._inductor imported: {'yes' if inductor else 'no'}\n"
    )


# --- part 1: off the trigger ------------------------------------------------------------


def off_trigger(stages: int, rounds: int, directory: str) -> None:
    st = tracekit.stage(cv.MODEL_EXECUTE)

    def plain() -> None:
        sum(DATA)

    def staged() -> None:
        with st:
            sum(DATA)

    fixed: Rule = {"stage": cv.MODEL_EXECUTE, "above_ms": 1e9}
    quantile: Rule = {"stage": cv.MODEL_EXECUTE, "above": "p99"}
    variants: dict[str, tuple[Rule | None, Callable[[], None]]] = {
        "no stage (work only)": (None, plain),
        "stage, no profile_on": (None, staged),
        "stage, above_ms rule": (fixed, staged),
        "stage, p99 rule": (quantile, staged),
    }
    per: dict[str, list[float]] = {k: [] for k in variants}
    for rnd in range(rounds + 1):  # round 0 warms up
        for name, (rule, fn) in variants.items():
            configure(rule, directory)
            if rule is quantile:
                for _ in range(profiling.MIN_SAMPLES * 2):
                    fn()  # fill the window, then compute its p99 as the thread would
                PROFILER.refresh()
            PROFILER.blocked_until = time.monotonic_ns() + 3600 * 10**9  # budget spent
            t0 = time.thread_time_ns()
            for _ in range(stages):
                fn()
            took = (time.thread_time_ns() - t0) / stages / 1000
            PROFILER.blocked_until = 0
            setup.flush()
            if rnd:
                per[name].append(took)
    base = per["stage, no profile_on"]
    print(
        f"off the trigger: {rounds} rounds x {stages} stages per variant, interleaved; "
        "CPU of the stage's thread"
    )
    print(f"{'variant':<24}{'us/stage':>10}{'over baseline us':>18}{'ratio':>8}")
    for name in variants:
        # paired with the baseline of the same round: slow drifts of a shared machine cancel
        delta = statistics.median(a - b for a, b in zip(per[name], base, strict=True))
        ratio = statistics.median(a / b for a, b in zip(per[name], base, strict=True))
        print(f"{name:<24}{statistics.median(per[name]):>10.3f}{delta:>18.3f}{ratio:>8.3f}")
    hooks = hook_cost(directory, fixed, quantile)
    print(
        "the end hook alone, per stage: "
        + ", ".join(f"{name} {us:.3f} us" for name, us in hooks.items())
    )
    worst = max(hooks.values())
    verdict = "ok" if worst <= TARGET_US else "OVER TARGET"
    print(f"worst rule cost {worst:.3f} us per stage (target <= {TARGET_US:g} us: {verdict})")


def hook_cost(directory: str, fixed: Rule, quantile: Rule, n: int = 50000) -> dict[str, float]:
    """CPU of what a watched stage's end adds (best of 7 batches): the hook on an ended span."""
    from tracekit.instrumentation._tracer import start_child

    span = start_child(cv.MODEL_EXECUTE)
    span.end()
    out = {}
    for name, rule in (("above_ms rule", fixed), ("p99 rule", quantile)):
        configure(rule, directory)
        hook = profiling.PROFILE_EXIT[cv.MODEL_EXECUTE]
        for _ in range(profiling.MIN_SAMPLES * 2):
            hook(span)
        PROFILER.refresh()
        PROFILER.blocked_until = time.monotonic_ns() + 3600 * 10**9
        best = float("inf")
        for _ in range(7):
            t0 = time.thread_time_ns()
            for _ in range(n):
                hook(span)
            best = min(best, (time.thread_time_ns() - t0) / n / 1000)
        PROFILER.blocked_until = 0
        out[name] = best
    configure(None, directory)
    return out


# --- part 2: a capture -------------------------------------------------------------------


def capture_cost(captures: int, steps: int, width: int, directory: str) -> None:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)
    )
    x = torch.randn(32, width)
    # a rule elsewhere lifts the on-demand budget to what this run needs
    configure({"stage": "elsewhere", "above_ms": 1e9, "max_per_hour": captures + 1}, directory)

    def run() -> float:
        t0 = time.perf_counter()
        with tracekit.model_execution():
            model(x)
        return (time.perf_counter() - t0) * 1000

    for _ in range(50):
        run()
    plain = statistics.median(run() for _ in range(200))
    first: list[float] = []
    middle: list[float] = []
    last: list[float] = []
    written: list[float] = []
    for _ in range(captures):
        assert tracekit.profile_next(steps=steps)
        while profiling.capture_state() != "armed":
            time.sleep(0.001)
        times = [run() for _ in range(steps)]
        t_done = time.perf_counter()
        assert PROFILER.wait(30)
        written.append((time.perf_counter() - t_done) * 1000)
        first.append(times[0])
        middle.extend(times[1:-1])
        last.append(times[-1])
        for _ in range(20):
            run()
    files = sorted(Path(directory).glob(f"{cv.PROFILE_FILE_PREFIX}*"))
    size = statistics.median(p.stat().st_size for p in files) / 1024 if files else 0.0
    print()
    print(
        f"a capture: {captures} captures x {steps} executions of a {width}-wide MLP "
        f"(batch 32), CPU only; wall ms per execution, medians"
    )
    print(f"{'execution':<42}{'ms':>8}{'over unprofiled':>17}")
    rows = (
        ("unprofiled", plain),
        ("first captured (starts the profiler)", statistics.median(first)),
        ("captured, profiler recording", statistics.median(middle) if middle else plain),
        ("last captured (stops it after its span)", statistics.median(last)),
    )
    for name, ms in rows:
        print(f"{name:<42}{ms:>8.3f}{ms - plain:>17.3f}")
    print(
        f"file written {statistics.median(written):.1f} ms after the last execution, on the "
        f"profiling thread; {size:.0f} KiB each; {len(files)} files"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--stages", type=int, default=5000, help="stages per variant per round")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--captures", type=int, default=5)
    ap.add_argument("--steps", type=int, default=profiling.DEFAULT_STEPS)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--skip-capture", action="store_true", help="no part 2")
    ap.add_argument("--startup-runs", type=int, default=3, help="fresh processes per variant")
    ap.add_argument("--startup-s", type=float, default=2.0, help="seconds each one serves")
    ap.add_argument("--startup-child", choices=("none", "rule"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.startup_child:
        startup_child(args.startup_child == "rule", args.startup_s)
        return 0
    if args.startup_runs:
        startup_cost(args.startup_runs, args.startup_s)
    import torch

    # torch.compile's import, which a profiler start would make only where the app has made
    # it already: done here, first, so that no timing below depends on it
    t0 = time.perf_counter()
    hasattr(torch, "_inductor")
    print(f"torch._inductor import (not tracekit's): {time.perf_counter() - t0:.2f} s\n")
    with tempfile.TemporaryDirectory() as directory:
        off_trigger(args.stages, args.rounds, directory)
        if not args.skip_capture:
            capture_cost(args.captures, args.steps, args.width, directory)
    tracekit.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
