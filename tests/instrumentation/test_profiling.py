"""Profile on trigger (docs/profiling.md): rules, the budget, the capture file and its
metadata, on demand, forked workers. Real ``torch.profiler`` on CPU around a tiny model;
real files, read back with json and through the analysis' Kineto reader."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracekit
from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import profiling, setup
from tracekit.instrumentation._tracer import start_child
from tracekit.instrumentation.profiling import PROFILE_ENTER, PROFILE_EXIT, PROFILER

# The profiler's first start imports torch._inductor (~1.5 s). A service pays it on the
# profiling thread when a rule is configured; here it is paid once, up front, so that no
# test's timing depends on how a background import competes with it.
hasattr(torch, "_inductor")

MODEL = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
X = torch.randn(8, 16)
NEVER = {"above_ms": 1e9}  # a rule that never fires: its stage is profiled on demand only


class Profiled:
    """tracekit configured with profile_on rules, an in-memory exporter, a capture dir."""

    def __init__(self, directory: Path) -> None:
        self.exporter = InMemorySpanExporter()
        self.directory = directory

    def __call__(
        self, profile_on: Any = None, directory: Path | None = None, service: str = "prof-svc"
    ) -> Profiled:
        tracekit.configure(
            service_name=service,
            service_version="v7",
            exporter=self.exporter,
            profile_on=profile_on,
            profile_dir=directory or self.directory,
        )
        if PROFILER.rules:
            until_watching()  # the rules measure nothing until the profiling thread warmed up
        return self

    def spans(self, name: str) -> list[ReadableSpan]:
        setup.flush()
        return [s for s in self.exporter.get_finished_spans() if s.name == name]

    def files(self) -> list[Path]:
        return sorted(self.directory.iterdir()) if self.directory.is_dir() else []

    def meta(self, path: Path) -> dict[str, Any]:
        doc = json.loads(path.read_text())
        meta: dict[str, Any] = doc[cv.PROFILE_METADATA_KEY]
        return meta


@pytest.fixture
def profiled(tmp_path: Path) -> Iterator[Profiled]:
    previous = signal.getsignal(signal.SIGUSR2) if profiling.SIGNAL else None
    yield Profiled(tmp_path / "profiles")
    PROFILER.reset()
    tracekit.shutdown()
    if profiling.SIGNAL:
        signal.signal(signal.SIGUSR2, previous)


def execute(n: int = 1) -> None:
    for _ in range(n):
        with tracekit.model_execution():
            MODEL(X)


def until(state: str | None, timeout_s: float = 10.0) -> None:
    """Wait for the profiling thread to bring the capture to ``state``."""
    deadline = time.monotonic() + timeout_s
    while profiling.capture_state() != state:
        assert time.monotonic() < deadline, f"capture {profiling.capture_state()}, not {state}"
        time.sleep(0.02)


def until_watching(timeout_s: float = 10.0) -> None:
    """Wait for the rules to measure executions (the warm-up done, no capture in progress)."""
    deadline = time.monotonic() + timeout_s
    while profiling.watch_state() != "watching":
        assert time.monotonic() < deadline, f"rules {profiling.watch_state()}, not watching"
        time.sleep(0.01)


def ids(span: ReadableSpan) -> tuple[str, str]:
    assert span.context is not None
    return f"{span.context.trace_id:032x}", f"{span.context.span_id:016x}"


# --- rules ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rule", "says"),
    [
        ({"above": "p99"}, "profile_on.stage"),
        ({"stage": "m"}, "exactly one of above"),
        ({"stage": "m", "above": "p99", "above_ms": 4}, "exactly one of above"),
        ({"stage": "m", "above": "p100"}, "profile_on.above"),
        ({"stage": "m", "above": 0.99}, "profile_on.above"),
        ({"stage": "m", "above": "p99", "window": "soon"}, "profile_on.window"),
        ({"stage": "m", "above_ms": 40, "window": "5m"}, "profile_on.window"),
        ({"stage": "m", "above_ms": -1}, "profile_on.above_ms"),
        ({"stage": "m", "above_ms": "40"}, "profile_on.above_ms"),
        ({"stage": "m", "above_ms": 40, "steps": 0}, "profile_on.steps"),
        ({"stage": "m", "above_ms": 40, "steps": 1000}, "profile_on.steps"),
        ({"stage": "m", "above_ms": 40, "max_per_hour": 1.5}, "profile_on.max_per_hour"),
        ({"stage": "m", "above_ms": 40, "thresold": 1}, "unknown field 'thresold'"),
        ([{"stage": "m", "above_ms": 1}, {"stage": "m", "above": "p9"}], "two rules"),
        ([{"stage": "m", "above_ms": 1}, "p99"], "profile_on[1]"),
        ('{"stage": ', "not JSON"),
    ],
)
def test_a_wrong_rule_is_a_config_error_naming_the_field(rule: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        profiling.parse_rules(rule, "profile_on")


def test_rules_come_from_the_argument_else_the_environment(
    monkeypatch: pytest.MonkeyPatch, profiled: Profiled
) -> None:
    monkeypatch.setenv(
        profiling.ENV_PROFILE_ON,
        '[{"stage": "a", "above": "p99.9"}, {"stage": "b", "above_ms": 40, "steps": 2}]',
    )
    monkeypatch.setenv(profiling.ENV_PROFILE_DIR, "/somewhere/else")
    s = profiling.settings()
    assert [(r.stage, r.quantile, r.window_s, r.above_ms, r.steps) for r in s.rules] == [
        ("a", 0.999, 300.0, None, 5),
        ("b", None, 0.0, 40.0, 2),
    ]
    assert s.directory == "/somewhere/else" and s.signal
    with pytest.raises(ConfigError, match="TRACEKIT_PROFILE_ON"):
        monkeypatch.setenv(profiling.ENV_PROFILE_ON, '{"stage": "a"}')
        profiled()
    profiled({"stage": "c", "above_ms": 3})  # the argument wins
    assert [r.stage for r in PROFILER.rules] == ["c"]


def test_without_rules_no_stage_is_hooked_and_with_one_only_its_end(profiled: Profiled) -> None:
    profiled()
    assert PROFILE_ENTER == {} and PROFILE_EXIT == {}  # a stage pays two truth tests
    profiled({"stage": cv.MODEL_EXECUTE, "above": "p99"})
    assert list(PROFILE_EXIT) == [cv.MODEL_EXECUTE] and PROFILE_ENTER == {}
    if profiling.SIGNAL:
        assert signal.getsignal(signal.SIGUSR2) is profiling._on_signal
    profiled()
    assert PROFILE_EXIT == {}


def test_a_quantile_rule_fires_only_once_its_window_holds_enough_executions(
    profiled: Profiled,
) -> None:
    profiled({"stage": "score", "above": "p99", "window": "5m"})
    watch = PROFILER.watches["score"]
    watch.since = 0  # the executions below are made up, some of them before the rule was set
    now = time.time_ns()

    def run(ms: float, ended_ago_s: float = 0.0) -> Any:
        # a recorded "score" span of that duration, through the hook its stage's end calls
        end = now - int(ended_ago_s * 1e9)
        span = start_child("score", start_time=end - int(ms * 1e6))
        span.end(end_time=end)
        PROFILE_EXIT["score"](span)
        return span

    for i in range(300):
        run(1 + i / 1000, ended_ago_s=600)  # outside the window: they do not count
    for i in range(profiling.MIN_SAMPLES - 1):
        run(1 + i / 1000)
    PROFILER.refresh()
    assert watch.threshold_ns == profiling._NEVER
    run(50)  # the 100th: far above, but no threshold exists yet
    assert profiling.capture_state() is None
    PROFILER.refresh()
    assert 1_090_000 < watch.threshold_ns < 1_100_000  # p99 of the window's 100
    run(1.05)
    assert profiling.capture_state() is None
    slow = run(30)
    assert profiling.capture_state() in ("preparing", "armed")
    cap = PROFILER.active
    assert cap is not None and cap.reason == "rule"
    trace_id, span_id = slow.get_span_context().trace_id, slow.get_span_context().span_id
    assert cap.trigger == {
        "trace_id": f"{trace_id:032x}",
        "span_id": f"{span_id:016x}",
        "stage": "score",
        "duration_ms": 30.0,
        "rule": {
            "stage": "score",
            "above": "p99",
            "window_s": 300.0,
            "max_per_hour": 6,
            "steps": 5,
        },
        "threshold_ms": watch.threshold_ns / 1e6,
    }


# --- a capture, end to end -------------------------------------------------------------


def test_a_rule_profiles_the_next_steps_into_a_file_that_names_their_spans(
    profiled: Profiled, tmp_path: Path
) -> None:
    profiled({"stage": cv.MODEL_EXECUTE, "above_ms": 0, "steps": 3, "max_per_hour": 1})
    execute()  # above 0 ms: fires
    until("armed")
    execute(4)  # three captured, then one more: the budget (1 an hour) allows no second
    assert PROFILER.wait(10) and profiling.capture_state() is None

    (path,) = profiled.files()
    meta = profiled.meta(path)
    assert path.name == (
        f"tracekit-profile-prof-svc-{os.getpid()}-1-{meta['profile_id']}.pt.trace.json"
    )
    runs = profiled.spans(cv.MODEL_EXECUTE)  # in end order: trigger, 3 captured, 1 after
    assert len(runs) == 5
    resource = runs[0].resource.attributes
    assert re.fullmatch(r"[0-9a-f]{16}", meta["profile_id"])
    assert {k: meta[k] for k in ("service", "service_version", "instance_id", "pid", "reason")} == {
        "service": "prof-svc",
        "service_version": "v7",
        "instance_id": resource[cv.SERVICE_INSTANCE_ID],
        "pid": os.getpid(),
        "reason": "rule",
    }
    trigger = meta["trigger"]
    assert (trigger["trace_id"], trigger["span_id"]) == ids(runs[0])
    assert trigger["stage"] == cv.MODEL_EXECUTE and trigger["duration_ms"] > 0
    assert trigger["rule"] == {
        "stage": cv.MODEL_EXECUTE,
        "above_ms": 0.0,
        "max_per_hour": 1,
        "steps": 3,
    }
    assert [(c["trace_id"], c["span_id"]) for c in meta["captured"]] == [ids(s) for s in runs[1:4]]
    assert [(c["start_ns"], c["end_ns"]) for c in meta["captured"]] == [
        (s.start_time, s.end_time) for s in runs[1:4]
    ]
    tagged = [s for s in runs if cv.PROFILE_ID in (s.attributes or {})]
    assert tagged == runs[1:4]
    assert {s.attributes[cv.PROFILE_ID] for s in tagged} == {meta["profile_id"]}  # type: ignore[index]
    assert meta["overlapping"] == [] and meta["steps"] == 3
    assert meta["start_ns"] <= runs[1].start_time and meta["end_ns"] >= runs[3].end_time

    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::addmm" for e in events)  # the model's ops are in it
    assert not list(profiled.directory.glob(".*"))  # no temporary left behind

    # the analysis' Kineto reader takes it as a capture, nothing skipped
    from tracekit.analysis.loading import ingest

    outcome = ingest([path], store=tmp_path / "x.duckdb", jobs=1)
    assert outcome.report.files == 1
    assert outcome.report.skipped == 0 and outcome.report.problems == []


def test_executions_on_other_threads_are_captured_and_the_partly_seen_listed(
    profiled: Profiled,
) -> None:
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER})
    inside, leave = threading.Event(), threading.Event()

    def long_running() -> None:  # already running when the capture starts
        with tracekit.model_execution():
            inside.set()
            leave.wait(10)

    def other_thread() -> None:  # begins while the profiler runs: counted, and its ops recorded
        with tracekit.model_execution(), torch.autograd.profiler.record_function("other-thread"):
            MODEL(X)

    before = threading.Thread(target=long_running)
    before.start()
    assert inside.wait(5)
    assert tracekit.profile_next(steps=3, stage=cv.MODEL_EXECUTE)
    until("armed")
    execute()  # 1 of 3, starts the profiler
    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()  # 2 of 3
    leave.set()
    before.join()  # ends during the capture, not counted
    execute()  # 3 of 3: the profiler stops at its end
    assert PROFILER.wait(10)

    (path,) = profiled.files()
    meta = profiled.meta(path)
    runs = profiled.spans(cv.MODEL_EXECUTE)  # end order: main, other thread, long one, main
    assert [(c["trace_id"], c["span_id"]) for c in meta["captured"]] == [
        ids(runs[0]),
        ids(runs[1]),
        ids(runs[3]),
    ]
    assert [(c["trace_id"], c["span_id"]) for c in meta["overlapping"]] == [ids(runs[2])]
    assert cv.PROFILE_ID not in (runs[2].attributes or {})
    assert meta["reason"] == "on_demand" and meta["trigger"] is None
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    assert "other-thread" in names


def _block_export(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold every profile's file write until ``release`` is set; ``writing`` says one began."""
    writing, release = threading.Event(), threading.Event()
    real = profiling._export

    def blocked(prof: Any, tmp: str, path: str) -> None:
        writing.set()
        release.wait(10)
        real(prof, tmp, path)

    monkeypatch.setattr(profiling, "_export", blocked)
    return writing, release


def test_the_request_never_waits_for_the_profile_to_be_written(
    profiled: Profiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing, release = _block_export(monkeypatch)
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER})
    assert tracekit.profile_next(steps=1)
    until("armed")
    t0 = time.monotonic()
    execute()  # the captured one: the profiler stops at its end, the write is handed off
    execute()
    assert time.monotonic() - t0 < 5 and not release.is_set()
    assert writing.wait(5) and profiling.capture_state() == "writing"
    release.set()
    assert PROFILER.wait(10)
    assert len(profiled.files()) == 1


def test_a_capture_whose_executions_do_not_finish_is_stopped_and_written(
    profiled: Profiled,
) -> None:
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER})
    assert tracekit.profile_next(steps=3)
    until("armed")
    execute()  # one of three, and no more traffic
    assert profiling.capture_state() == "running"
    PROFILER._timeouts(time.monotonic() + profiling.RUN_TIMEOUT_S + 1)  # another thread stops it
    assert PROFILER.wait(10)
    (path,) = profiled.files()
    meta = profiled.meta(path)
    assert len(meta["captured"]) == 1 and meta["steps"] == 3


def test_a_torch_profiler_session_of_the_apps_own_is_never_taken_over(
    profiled: Profiled,
) -> None:
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER})
    assert tracekit.profile_next(steps=1)
    until("armed")
    with torch.profiler.profile() as own:
        execute()  # the capture does not start inside the app's session: it waits
    assert profiling.capture_state() == "armed"
    assert any(e.name == "aten::addmm" for e in own.events())
    execute()  # that session is over: the capture runs now
    assert PROFILER.wait(10) and len(profiled.files()) == 1


def test_a_capture_that_the_apps_own_session_ended_is_dropped_not_saved(
    profiled: Profiled, caplog: pytest.LogCaptureFixture
) -> None:
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER})
    assert tracekit.profile_next(steps=2)
    until("armed")
    execute()
    with torch.profiler.profile():  # starts over the capture; its end ends Kineto's session
        MODEL(X)
    with caplog.at_level(logging.WARNING, logger="tracekit"):
        execute()  # saving what Kineto then holds would crash the process
    assert PROFILER.wait(10) and profiled.files() == []
    assert "session of the app's ended it" in caplog.text


# --- the budget and failures --------------------------------------------------------------


def test_no_more_captures_than_the_budget_however_hard_the_trigger_is_pulled(
    profiled: Profiled,
) -> None:
    profiled({"stage": "hammer", "above_ms": 0, "steps": 1, "max_per_hour": 3})
    hammer = tracekit.stage("hammer")
    deadline = time.monotonic() + 20
    armed: list[bool] = []

    def pull() -> None:
        spare = 300  # executions after the budget is spent: none may start a fourth
        while spare and time.monotonic() < deadline:
            with hammer:  # every execution is above 0 ms
                pass
            armed.append(tracekit.profile_next(steps=1, stage="hammer"))
            if PROFILER.files >= 3 and profiling.capture_state() is None:
                spare -= 1

    threads = [threading.Thread(target=pull) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert PROFILER.wait(10)
    assert PROFILER.files == 3 and len(profiled.files()) == 3
    assert sum(armed) <= 3 and not tracekit.profile_next(steps=1, stage="hammer")
    reasons = sorted(profiled.meta(p)["reason"] for p in profiled.files())
    assert set(reasons) <= {"rule", "on_demand"}
    numbers = sorted(int(p.name.split("-")[-2]) for p in profiled.files())
    assert numbers == [1, 2, 3]


def test_an_unwritable_directory_is_logged_once_and_the_capture_dropped(
    profiled: Profiled, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a directory below a file cannot be made, not even by root
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER}, directory=blocker / "profiles")
    with caplog.at_level(logging.WARNING, logger="tracekit"):
        for _ in range(2):
            assert tracekit.profile_next(steps=1)
            until("armed")
            execute()
            assert PROFILER.wait(10)
    lines = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert len(lines) == 1 and str(blocker / "profiles") in lines[0]
    assert PROFILER.dropped == 2 and profiling.capture_state() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_profile_next_checks_its_arguments_and_refuses_a_second_capture(
    profiled: Profiled,
) -> None:
    profiled()
    with pytest.raises(ConfigError, match="steps"):
        tracekit.profile_next(steps=0)
    with pytest.raises(ConfigError, match="stage"):
        tracekit.profile_next(stage="")
    assert tracekit.profile_next(steps=2)
    assert not tracekit.profile_next(steps=2)  # one capture at a time


# --- on demand ----------------------------------------------------------------------------


@pytest.mark.skipif(profiling.SIGNAL is None, reason="SIGUSR2 is POSIX")
def test_sigusr2_arms_one_on_demand_capture_and_chains_the_previous_handler(
    profiled: Profiled,
) -> None:
    seen: list[int] = []
    signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER})
    os.kill(os.getpid(), signal.SIGUSR2)  # the handler runs in this (the main) thread
    until("armed")
    assert seen == [signal.SIGUSR2]
    execute(profiling.DEFAULT_STEPS)
    assert PROFILER.wait(10)
    (path,) = profiled.files()
    meta = profiled.meta(path)
    assert meta["reason"] == "on_demand" and meta["trigger"] is None
    assert len(meta["captured"]) == profiling.DEFAULT_STEPS
    profiled()  # no rule, no TRACEKIT_PROFILE_SIGNAL: the previous handler is back
    assert signal.getsignal(signal.SIGUSR2) is not profiling._on_signal


@pytest.mark.skipif(profiling.SIGNAL is None, reason="SIGUSR2 is POSIX")
def test_the_signal_is_installed_without_a_rule_only_when_asked(
    profiled: Profiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiled()
    assert signal.getsignal(signal.SIGUSR2) is not profiling._on_signal
    monkeypatch.setenv(profiling.ENV_PROFILE_SIGNAL, "1")
    profiled()
    assert signal.getsignal(signal.SIGUSR2) is profiling._on_signal


# --- forked workers -----------------------------------------------------------------------


def _in_child(body: Callable[[], None]) -> int:
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc(file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked worker failed (see stderr)"
    return pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.fork, on Linux")
def test_a_forked_worker_has_its_own_budget_and_numbering_and_not_the_parents_capture(
    profiled: Profiled,
) -> None:
    profiled({"stage": cv.MODEL_EXECUTE, "above_ms": 1e9, "max_per_hour": 1})
    assert tracekit.profile_next(steps=2)  # the parent's one capture this hour
    until("armed")
    execute()  # running at the fork

    def worker() -> None:
        assert profiling.capture_state() is None  # the parent's capture is not continued
        assert tracekit.profile_next(steps=1)  # a budget of its own
        until("armed")
        execute()
        assert PROFILER.wait(10) and PROFILER.files == 1

    child = _in_child(worker)
    execute()  # the parent's capture goes on and ends
    assert PROFILER.wait(10)
    assert not tracekit.profile_next(steps=1)  # the parent's budget is spent
    by_pid = {int(p.name.split("-")[-3]): p for p in profiled.files()}
    assert sorted(by_pid) == sorted([os.getpid(), child])
    assert all(p.name.split("-")[-2] == "1" for p in by_pid.values())  # each numbers from 1
    parent, worker_meta = profiled.meta(by_pid[os.getpid()]), profiled.meta(by_pid[child])
    assert len(parent["captured"]) == 2 and len(worker_meta["captured"]) == 1
    assert worker_meta["pid"] == child
    assert worker_meta["instance_id"] != parent["instance_id"]  # one replica = one process


# --- CUDA ---------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_capture_on_cuda_records_the_kernels(profiled: Profiled) -> None:
    model, x = MODEL.to("cuda"), X.to("cuda")
    profiled({"stage": cv.MODEL_EXECUTE, **NEVER})
    assert tracekit.profile_next(steps=2)
    until("armed")
    for _ in range(2):
        with tracekit.model_execution():
            model(x)
    assert PROFILER.wait(30)
    (path,) = profiled.files()
    doc = json.loads(path.read_text())
    assert len(doc[cv.PROFILE_METADATA_KEY]["captured"]) == 2
    assert any(e.get("cat") == "kernel" for e in doc["traceEvents"])


def test_a_hostile_service_name_makes_a_short_safe_file_name_and_a_valid_file(
    profiled: Profiled,
) -> None:
    hostile = "../../" + "x/" * 200 + 'say "hi"\\ \t é'
    profiled({"stage": cv.MODEL_EXECUTE, "above_ms": 0, "steps": 1}, service=hostile)
    execute()
    until("armed")
    execute()
    assert PROFILER.wait(10)
    (path,) = profiled.files()  # inside the directory, not above it
    assert len(path.name.encode()) < 255 and "/" not in path.name
    # Kineto writes metadata unescaped: a quote or a backslash must not break the file.
    assert profiled.meta(path)["service"] == "../../" + "x/" * 200 + "say 'hi'/   é"


# --- start-up: the warm-up, and what the rule measures ---------------------------------------

SERVICE = Path(__file__).with_name("profile_service.py")


def _service(*args: str) -> dict[str, Any]:
    """Run profile_service.py in a fresh interpreter (no torch._inductor, as a service)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, str(SERVICE), *args], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_a_steady_service_gets_no_capture_from_its_start_up(tmp_path: Path) -> None:
    # 3 s of watching, not 10: the warm-up is done when the rule starts watching (asserted),
    # and nothing else tracekit does at start-up comes later; the rest measures the app
    out = _service("steady", str(tmp_path), "3")
    assert out["states"][:2] == ["warming up", "watching"]  # armed only after the warm-up
    assert out["captures"] == 0 and list(tmp_path.iterdir()) == []
    assert not out["inductor"]  # the profiler never imported torch._inductor


def test_slow_executions_after_start_up_are_captured_or_named_as_missed(tmp_path: Path) -> None:
    out = _service("slow", str(tmp_path))
    first, second, third = out["slow"]
    assert out["captures"] == 2 and not out["inductor"]
    files = sorted(tmp_path.iterdir(), key=lambda p: int(p.name.split("-")[-2]))
    a, b = (json.loads(p.read_text())[cv.PROFILE_METADATA_KEY] for p in files)
    assert a["trigger"]["trace_id"] == first and b["trigger"]["trace_id"] == third
    assert [m["trace_id"] for m in a[cv.PROFILE_MISSED]] == [second]  # open while it waited
    assert a[cv.PROFILE_MISSED_COUNT] == 1 and a[cv.PROFILE_MISSED][0]["duration_ms"] > 0
    assert b[cv.PROFILE_MISSED] == [] and b[cv.PROFILE_MISSED_COUNT] == 0
    assert len(a["captured"]) == len(b["captured"]) == profiling.DEFAULT_STEPS


def test_executions_during_the_warm_up_never_fire_the_rule(
    profiled: Profiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(PROFILER, "warm", False)  # this process warmed up in an earlier test
    warming, release = threading.Event(), threading.Event()
    real = profiling._new_profile

    def held(torch_module: Any) -> Any:
        if threading.current_thread().name == "tracekit-profiler" and not release.is_set():
            warming.set()
            release.wait(10)
        return real(torch_module)

    monkeypatch.setattr(profiling, "_new_profile", held)
    tracekit.configure(
        service_name="prof-svc",
        exporter=profiled.exporter,
        profile_on={"stage": cv.MODEL_EXECUTE, "above_ms": 0, "steps": 1},
        profile_dir=profiled.directory,
    )
    assert warming.wait(10)
    execute(3)  # above 0 ms, all of them, during the warm-up
    assert profiling.watch_state() == "warming up" and profiling.capture_state() is None
    release.set()
    until_watching()
    execute()  # the first execution the rule measures fires it
    assert profiling.capture_state() in ("preparing", "armed")
    trigger = PROFILER.active.trigger  # type: ignore[union-attr]
    assert trigger is not None
    assert trigger["trace_id"] == ids(profiled.spans(cv.MODEL_EXECUTE)[-1])[0]


def test_an_execution_that_overlapped_the_export_is_no_sample_and_no_trigger(
    profiled: Profiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    writing, release = _block_export(monkeypatch)
    profiled({"stage": cv.MODEL_EXECUTE, "above_ms": 0, "steps": 1})
    inside, leave = threading.Event(), threading.Event()

    def across() -> None:  # begins while the file is written, ends after
        with tracekit.model_execution():
            inside.set()
            leave.wait(10)

    execute()  # fires
    until("armed")
    execute()  # the captured one
    assert writing.wait(5)
    worker = threading.Thread(target=across)
    worker.start()
    assert inside.wait(5)
    release.set()
    assert PROFILER.wait(10) and profiling.watch_state() == "watching"
    leave.set()
    worker.join()  # above 0 ms, but it began while tracekit was at work
    assert profiling.capture_state() is None and PROFILER.files == 1
    execute()  # measured: fires the second
    assert profiling.capture_state() is not None
