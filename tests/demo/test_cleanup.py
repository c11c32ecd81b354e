"""Whatever happens, the demo leaves no process behind; failures say what went wrong."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tracekit import cli
from tracekit.demo import processes
from tracekit.demo.processes import ServiceProcess, child_environment
from tracekit.demo.runner import run_release
from tracekit.demo.settings import ENV_TRACE_FILE
from tracekit.errors import TracekitError

from .conftest import assert_all_gone, record_started_pids


@pytest.fixture
def started_pids(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every pid a ServiceProcess launches during the test."""
    return record_started_pids(monkeypatch)


def test_ctrl_c_during_the_load_stops_both_services(
    tmp_path: Path, started_pids: list[int]
) -> None:
    def interrupt(pids: list[int]) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_release(tmp_path, "v1", "", rate=10, duration_s=5, on_started=interrupt)
    assert len(started_pids) == 2
    assert_all_gone(started_pids)


def test_a_service_that_cannot_start_is_reported_with_its_log(
    tmp_path: Path, started_pids: list[int]
) -> None:
    # No trace output configured: the service refuses to start, and says why.
    proc = ServiceProcess("pricing test", "tracekit.demo.downstream", tmp_path / "p.log")
    with pytest.raises(TracekitError, match="exited with status") as info:
        proc.start(child_environment({ENV_TRACE_FILE: ""}), timeout_s=60)
    assert "no trace output" in str(info.value)
    assert_all_gone(started_pids)


def test_a_silent_service_times_out_and_is_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started_pids: list[int]
) -> None:
    # A marker that never comes: the starter gives up, kills it and says so.
    monkeypatch.setattr(processes, "READY_MARKER", "NEVER_PRINTED")
    proc = ServiceProcess("pricing test", "tracekit.demo.downstream", tmp_path / "p.log")
    env = child_environment({ENV_TRACE_FILE: str(tmp_path / "p.jsonl")})
    with pytest.raises(TracekitError, match="did not become ready"):
        proc.start(env, timeout_s=6)
    assert_all_gone(started_pids)


@pytest.mark.slow
def test_tracekit_demo_runs_end_to_end_and_cleans_up(
    tmp_path: Path, started_pids: list[int]
) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(
            [
                "demo",
                "--regression",
                "batch",
                "--duration",
                "4",
                "--rate",
                "30",
                "--keep",
                str(tmp_path),
            ]
        )
    assert code == 0, out.getvalue()
    assert len(started_pids) == 4
    assert_all_gone(started_pids)
    text = out.getvalue()
    assert "tracekit diff found" in text
    kept = {p.name for p in tmp_path.iterdir()}
    assert {"ranker-v1.jsonl", "pricing-v2.jsonl", "tracekit.duckdb"} <= kept


def test_demo_flags_are_checked_before_anything_starts(
    started_pids: list[int], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["demo", "--duration", "0"]) == 2
    assert cli.main(["demo", "--regression", "gpu"]) == 2
    assert "--regression gpu: use one of batch, downstream" in capsys.readouterr().err
    # Each mode takes only its own regressions: a training one is no serving regression,
    # and the other way round; both refused in one line, before anything starts.
    assert cli.main(["demo", "--regression", "straggler"]) == 2
    err = capsys.readouterr().err
    assert "--regression straggler" in err and "needs --training" in err
    assert err.count("\n") == 1
    assert cli.main(["demo", "--training", "--regression", "cache"]) == 2
    err = capsys.readouterr().err
    assert "--training --regression cache: use one of straggler" in err
    assert err.count("\n") == 1
    assert started_pids == []


PARENT = """
import sys, time
from pathlib import Path
from tracekit.demo.processes import ServiceProcess, child_environment
p = ServiceProcess("sleeper", "sleeper", Path(sys.argv[1]))
p.start(child_environment({"PYTHONPATH": sys.argv[2]}), wait=False)
time.sleep(0.5)
p.pause()  # frozen, as a release is between its blocks
print(p.pid, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux (/proc, prctl)")
def test_a_frozen_service_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    # A test runner killed outright (SIGKILL, or SIGTERM without clean-up) runs no
    # finally blocks: the kernel must take its services down, frozen ones included.
    (tmp_path / "sleeper.py").write_text("import time\ntime.sleep(120)\n")
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "sleeper.log"), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        # SIGSTOP lands asynchronously: wait for the state, never read it once.
        deadline = time.monotonic() + 10
        while _state(child) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(child) == "T"  # stopped, and alive
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    deadline = time.monotonic() + 10
    while _state(child) not in ("", "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(child) in ("", "Z"), f"service {child} outlived its parent"


def _state(pid: int) -> str:
    """The process state letter from /proc (R, S, T, Z, …), or "" when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return stat.rsplit(")", 1)[1].split()[0]
