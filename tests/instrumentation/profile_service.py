"""A serving process as docs/profiling.md has it, run by test_profiling.py in a fresh
interpreter: torch imported, ``configure(profile_on=...)``, then a request loop of a small
model inside ``model_execution()``. A fresh process because what is under test happens
once per process (the warm-up, torch's first profiler start), and the test module itself
has imported torch._inductor.

    python profile_service.py steady <profile_dir> <window_s>
    python profile_service.py slow <profile_dir>

``steady``: executions back to back from ``configure()`` on, none of them slow, until the
rules have watched for ``window_s``. ``slow``: after start-up, three injected slow
executions: #1 fires the rule; #2, open since before #1 and ending while #1's capture is
armed, is the slow one that capture misses; #3, after the first file, fires the second.
Prints one JSON line: what happened, for the test to judge.
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import profiling
from tracekit.instrumentation.profiling import PROFILER

RULE: dict[str, Any] = {"stage": cv.MODEL_EXECUTE, "above_ms": 20, "max_per_hour": 2}
MODEL = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
X = torch.randn(32, 256)
GAP_S = 0.001  # between requests: a service that is not CPU-bound, as most are


class Discard(SpanExporter):
    """Spans go nowhere: kept in memory they would make the collector's pauses the app's."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def until(check: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.005)


def calibrate() -> float:
    """The rule's threshold: the documented 20 ms, or four times the slowest of 300 executions
    before tracekit is configured when the machine's load alone makes them slower: a
    service whose executions the load makes slow has slow executions, and this one must
    have none of its own (4x: what the load does next is not what it did)."""
    worst = 0.0
    for _ in range(300):
        t0 = time.perf_counter()
        execute()
        worst = max(worst, time.perf_counter() - t0)
        time.sleep(GAP_S)
    return max(20.0, 4000 * worst)


def execute(slow_s: float = 0.0) -> str:
    """One execution; its trace id."""
    with torch.no_grad(), tracekit.model_execution():
        MODEL(X)
        if slow_s:
            time.sleep(slow_s)
        return f"{trace.get_current_span().get_span_context().trace_id:032x}"


def steady(window_s: float) -> dict[str, Any]:
    states: list[str | None] = []
    executions = 0
    watching_at = None
    while watching_at is None or time.monotonic() - watching_at < window_s:
        state = profiling.watch_state()
        if not states or states[-1] != state:
            states.append(state)
        if state == "watching" and watching_at is None:
            watching_at = time.monotonic()
        execute()
        executions += 1
        time.sleep(GAP_S)
    return {"states": states, "executions": executions}


def serve_the_capture() -> None:
    """Fast executions while the capture takes its steps, then wait for its file."""
    while profiling.capture_state() is not None:
        if profiling.capture_state() in ("armed", "running"):
            execute()
        else:
            time.sleep(0.005)


def slow() -> dict[str, Any]:
    until(lambda: profiling.watch_state() == "watching", "the rule to watch")
    opened, leave = threading.Event(), threading.Event()
    second: list[str] = []

    def long_one() -> None:  # #2: open before #1, ends once #1's capture is armed
        with torch.no_grad(), tracekit.model_execution():
            opened.set()
            leave.wait(30)
            second.append(f"{trace.get_current_span().get_span_context().trace_id:032x}")

    other = threading.Thread(target=long_one)
    other.start()
    until(opened.is_set, "#2 to open")
    first = execute(slow_s=1.5 * RULE["above_ms"] / 1000)  # a sleep never ends early
    until(lambda: profiling.capture_state() == "armed", "the first capture to be armed")
    leave.set()
    other.join()
    serve_the_capture()
    until(lambda: profiling.watch_state() == "watching", "the rule to watch again")
    third = execute(slow_s=1.5 * RULE["above_ms"] / 1000)
    until(lambda: profiling.capture_state() == "armed", "the second capture to be armed")
    serve_the_capture()
    return {"slow": [first, second[0], third]}


def main() -> None:
    mode, directory = sys.argv[1], sys.argv[2]
    # start-up as a service does it: the model's first call (a one-off 100 ms and more)
    # before serving, and what the imports made moved out of the collector's way
    execute()
    gc.freeze()
    RULE["above_ms"] = calibrate()
    tracekit.configure(
        service_name="svc",
        exporter=Discard(),
        profile_on=RULE,
        profile_dir=directory,
    )
    out = steady(float(sys.argv[3])) if mode == "steady" else slow()
    assert PROFILER.wait(30)
    out["captures"] = PROFILER.files
    out["above_ms"] = RULE["above_ms"]
    out["inductor"] = "torch._inductor" in sys.modules
    tracekit.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
