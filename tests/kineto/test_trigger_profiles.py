"""Profiles captured on trigger: real torch.profiler captures of one process load as
profiles, not training ranks, and explain / slow / diff link them to the traces
(docs/kineto.md, "Profiles captured on trigger")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution.explain import trace_profiles
from tracekit.analysis.facade import Analysis, ingest
from tracekit.analysis.ingest import kineto_profiles as tp
from tracekit.analysis.store import open_store
from tracekit.cli import main
from tracekit.render.explain import render_json, render_markdown, render_table
from tracekit.testing import TraceBuilder

from .builder import Profile

RULE_ID = "3f2a0000deadbeef"
ON_DEMAND_ID = "77aa0000cafef00d"
REAL_OPS = {"aten::addmm", "aten::linear", "aten::relu", "aten::t", "aten::clamp_min"}
"""CPU ops a Linear-ReLU-Linear forward runs (some of them, by version)."""


def capture(path: Path, meta: dict[str, Any]) -> Path:
    """A real torch.profiler capture of a tiny CPU model, with tracekit's metadata."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(8, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prof.add_metadata_json(cv.PROFILE_METADATA_KEY, json.dumps(meta))
        for _ in range(3):
            with torch.no_grad():
                model(x)
    prof.export_chrome_trace(str(path))
    return path


def meta(
    profile_id: str, reason: str, trigger: Any, captured: list[Any], **more: Any
) -> dict[str, Any]:
    return {
        **more,
        "profile_id": profile_id,
        "service": "ranker",
        "service_version": "v2",
        "instance_id": "ranker-0",
        "pid": os.getpid(),
        "reason": reason,
        "trigger": trigger,
        "captured": captured,
    }


def capture_file(directory: Path, n: int, profile_id: str) -> Path:
    name = f"{cv.PROFILE_FILE_PREFIX}ranker-{os.getpid()}-{n}-{profile_id}.pt.trace.json"
    return directory / name


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """v1 (fast) and v2, whose request 30 triggered a rule capture of the next three
    requests' model_execute; request 5 ran under an on-demand capture. Both captures
    come from this one process; everything is ingested once (read-only below)."""
    tmp = tmp_path_factory.mktemp("trigger")
    before = TraceBuilder(service="ranker", version="v1", seed=1)
    for i in range(40):
        r = before.request(start_ms=i * 200, duration_ms=50)
        r.stage(cv.PREPROCESS, start_ms=0, duration_ms=5)
        r.stage(cv.MODEL_EXECUTE, start_ms=5, duration_ms=40)
    after = TraceBuilder(service="ranker", version="v2", seed=2)
    reqs, stages = [], []
    for i in range(40):
        model_ms = 290.0 if i == 30 else 150.0 if i in (31, 32, 33) else 40.0
        r = after.request(start_ms=i * 400, duration_ms=model_ms + 10)
        r.stage(cv.PREPROCESS, start_ms=0, duration_ms=5)
        profiled = RULE_ID if i in (31, 32, 33) else ON_DEMAND_ID if i == 5 else None
        attrs = {cv.PROFILE_ID: profiled} if profiled else {}
        stages.append(r.stage(cv.MODEL_EXECUTE, start_ms=5, duration_ms=model_ms, attributes=attrs))
        reqs.append(r)

    def entry(i: int) -> dict[str, Any]:
        s = stages[i]
        return {
            "trace_id": reqs[i].trace_id,
            "span_id": s.span_id,
            "stage": cv.MODEL_EXECUTE,
            "start_ns": s.start_ns,
            "end_ns": s.end_ns,
        }

    trigger = {
        "trace_id": reqs[30].trace_id,
        "span_id": stages[30].span_id,
        "stage": cv.MODEL_EXECUTE,
        "duration_ms": 290.0,
        "rule": {"stage": cv.MODEL_EXECUTE, "above_ms": 200.0, "steps": 3},
        "threshold_ms": 200.0,  # fields tracekit does not read are no harm
    }
    files = [
        capture(
            capture_file(tmp, 0, RULE_ID),
            meta(RULE_ID, "rule", trigger, [entry(i) for i in (31, 32, 33)], steps=3),
        ),
        capture(
            capture_file(tmp, 1, ON_DEMAND_ID),
            meta(ON_DEMAND_ID, "on_demand", None, [entry(5)], overlapping=[entry(6)]),
        ),
    ]
    traces = [before.write_jsonl(tmp / "v1.jsonl"), after.write_jsonl(tmp / "v2.jsonl")]
    db = tmp / "t.duckdb"
    outcome = ingest([*files, *traces], store=db, jobs=1)
    return {
        "db": db,
        "files": files,
        "traces": traces,
        "report": outcome.report,
        "trigger": reqs[30].trace_id,
        "captured": reqs[31].trace_id,
        "on_demand": reqs[5].trace_id,
        "overlapping": reqs[6].trace_id,
        "plain": reqs[10].trace_id,
    }


def test_two_captures_from_one_process_both_load_as_profiles_not_ranks(world):
    report = world["report"]
    assert report.skipped == 0 and report.counts == {}  # no "rank 0 again", no kineto_no_rank
    assert (report.profiles, report.profiles_stored) == (2, 2)
    assert "2 triggered profiles (2 new)" in report.summary_line()
    with open_store(world["db"], read_only=True) as store:
        rows = store.run("SELECT profile_id, reason, pid, stage FROM profiles ORDER BY 1")
        assert rows == [
            (RULE_ID, "rule", os.getpid(), cv.MODEL_EXECUTE),
            (ON_DEMAND_ID, "on_demand", os.getpid(), cv.MODEL_EXECUTE),
        ]
        # no training run: no train_step spans, no GPU rows, no "pytorch" requests
        assert store.run(
            "SELECT count(*) FROM spans WHERE name = $n", {"n": cv.STEP_SPAN_NAME}
        ) == [(0,)]
        assert not store.has_table("kineto_gpu") or store.run(
            "SELECT count(*) FROM kineto_gpu"
        ) == [(0,)]
        assert [label for label, _ in store.releases()] == ["v1", "v2"]


def test_explain_of_the_trigger_shows_the_profile_top_ops(world):
    with Analysis.open(world["db"]) as analysis:
        e = analysis.explain(world["trigger"])
    (p,) = e.profiles
    assert (p.profile_id, p.role, p.reason, p.captured) == (RULE_ID, "triggered", "rule", 3)
    names = [o.name for o in p.top_ops]
    assert REAL_OPS & set(names) and ("aten::addmm" in names or "aten::linear" in names)
    assert sum(o.share for o in p.top_ops) <= 1.0 + 1e-9 and p.top_ops[0].self_ms > 0
    assert p.gpu is None and p.top_kernels == []  # a CPU capture
    table = render_table(e)
    heading = (
        f"profile {RULE_ID} (rule, captured 3 executions, triggered by "
        f"{world['trigger']} {cv.MODEL_EXECUTE} 290.0 ms)"
    )
    assert heading in table and "fired the capture" in table
    assert names[0] in table
    doc = json.loads(render_json(e))
    assert doc["profiles"][0]["profile_id"] == RULE_ID
    assert doc["profiles"][0]["top_ops"][0]["name"] == names[0]


def test_explain_of_a_captured_request_shows_the_profile_it_ran_under(world, capsys):
    assert main(["explain", world["captured"], "--db", str(world["db"]), "--format", "json"]) == 0
    (p,) = json.loads(capsys.readouterr().out)["profiles"]
    assert (p["profile_id"], p["role"], p["captured_ms"]) == (RULE_ID, "captured", 150.0)
    assert REAL_OPS & {o["name"] for o in p["top_ops"]}
    with Analysis.open(world["db"]) as analysis:
        md = render_markdown(analysis.explain(world["on_demand"]))
    assert f"#### profile {ON_DEMAND_ID} (on_demand, captured 1 execution)" in md
    assert "ran under the profiler" in md
    with Analysis.open(world["db"]) as analysis:
        (part,) = analysis.explain(world["overlapping"]).profiles
    assert (part.profile_id, part.role, part.captured_ms) == (ON_DEMAND_ID, "overlapping", 40.0)


def test_a_trace_without_a_profile_gets_nothing(world):
    with Analysis.open(world["db"]) as analysis:
        e = analysis.explain(world["plain"])
    assert e.profiles == [] and "profile" not in render_table(e)
    assert json.loads(render_json(e))["profiles"] == []


def test_slow_and_diff_exemplars_list_their_profile_ids(world, capsys):
    db = str(world["db"])
    assert main(["slow", "--version", "v2", "--db", db, "--format", "json"]) == 0
    slow = {
        e["trace_id"]: e["profile_ids"] for e in json.loads(capsys.readouterr().out)["exemplars"]
    }
    assert slow[world["trigger"]] == [RULE_ID] and slow[world["captured"]] == [RULE_ID]
    assert main(["diff", "--before", "v1", "--after", "v2", "--db", db, "--format", "json"]) == 0
    diff = json.loads(capsys.readouterr().out)["exemplars"]
    assert all(e["profile_ids"] == [RULE_ID] for e in diff), diff
    assert main(["slow", "--version", "v2", "--db", db]) == 0
    assert f"profile {RULE_ID}" in capsys.readouterr().out
    assert (
        main(["diff", "--before", "v1", "--after", "v2", "--db", db, "--format", "markdown"]) == 0
    )
    assert f"profile {RULE_ID}" in capsys.readouterr().out
    with Analysis.open(world["db"]) as analysis:
        fast = analysis.diff("v2", "v1").exemplars  # v1's tail: no profile
    assert fast and all(e.profile_ids == [] for e in fast)


def test_reingesting_the_captures_adds_nothing(world, tmp_path):
    db = tmp_path / "again.duckdb"
    files = world["files"]
    ingest([*files, *world["traces"]], store=db, jobs=1)
    # again, and a copy of one capture beside it: the same capture, stored once
    copy = tmp_path / files[0].name
    copy.write_bytes(files[0].read_bytes())
    again = ingest([*files, copy], store=db, jobs=2)  # in worker processes, as a directory
    assert again.report.spans_stored == 0 and again.report.skipped == 0
    assert again.report.counts == {"duplicate": 1}
    with open_store(db, read_only=True) as store:
        assert store.run("SELECT count(*) FROM profiles") == [(2,)]


def test_malformed_metadata_is_counted_and_the_file_read_as_a_plain_profile(world, tmp_path):
    doc = json.loads(world["files"][0].read_text())
    doc[cv.PROFILE_METADATA_KEY] = {"profile_id": "not-hex", "reason": "rule"}
    bad = tmp_path / "bad.pt.trace.json"
    bad.write_text(json.dumps(doc))
    with open_store(":memory:") as store:
        from tracekit.analysis.ingest import ingest_paths

        report = ingest_paths(store, [bad], version="plain", jobs=1)
        assert report.counts.get(tp.BAD_METADATA) == 1 and report.skipped == 0
        (problem,) = [p for p in report.problems if p.kind == tp.BAD_METADATA]
        assert "\n" not in str(problem) and "profile_id" in str(problem)
        assert store.run("SELECT count(*) FROM profiles") == [(0,)]
        steps = store.run("SELECT count(*) FROM spans WHERE name = $n", {"n": cv.STEP_SPAN_NAME})
        assert steps == [(1,)]  # the whole trace, as any profile without ProfilerStep


def test_gpu_figures_and_kernels_of_a_capture_whose_metadata_is_json_text(tmp_path):
    """Synthetic device ops (this machine has no GPU); the metadata as a JSON string,
    after the events."""
    p = Profile(rank=None)
    p.cpu("aten::mm", 0, 100, cat="cpu_op")
    p.kernel("void gemm_kernel<float>()", launch=10, ts=20, dur=300)
    p.kernel("void gemm_kernel<float>()", launch=40, ts=400, dur=300)
    p.kernel("Memcpy DtoH (Device -> Pageable)", launch=50, ts=800, dur=100, cat="gpu_memcpy")
    doc = p.document()
    trigger = {
        "trace_id": "a" * 32,
        "span_id": "b" * 16,
        "stage": cv.MODEL_EXECUTE,
        "duration_ms": 12.5,
        "rule": {"stage": "model_execute", "above_ms": 10},
    }
    doc[cv.PROFILE_METADATA_KEY] = json.dumps(meta("0123456789abcdef", "rule", trigger, []))
    path = tmp_path / "gpu.pt.trace.json"
    path.write_text(json.dumps(doc))
    with open_store(":memory:") as store:
        from tracekit.analysis.ingest import ingest_paths

        report = ingest_paths(store, [path], jobs=1)
        assert report.counts == {} and report.skipped == 0
        (p0,) = trace_profiles(store, "a" * 32)
    assert p0.role == "triggered" and p0.gpu is not None
    assert [(k.name, k.calls) for k in p0.top_kernels][0] == ("void gemm_kernel<float>()", 2)
    # window 20..900 µs, busy 700 µs: idle 180/880, compute 600/880
    assert p0.gpu.kernels == 3 and round(p0.gpu.idle_pct, 2) == round(100 * 180 / 880, 2)
    assert round(p0.gpu.compute_pct, 2) == round(100 * 600 / 880, 2)
    assert "GPU: 3 device ops" in render_table_of(p0)


def render_table_of(p: Any) -> str:
    from tracekit.render.explain import profile_gpu_line

    return profile_gpu_line(p) or ""


def test_profile_command_signals_a_real_process(tmp_path, capsys):
    armed, ready = tmp_path / "armed", tmp_path / "ready"
    code = (
        "import signal, time, pathlib\n"
        f"signal.signal(signal.SIGUSR2, lambda *a: pathlib.Path({str(armed)!r}).write_text('armed'))\n"
        f"pathlib.Path({str(ready)!r}).write_text('1')\n"
        "time.sleep(10)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 10
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert main(["profile", "--pid", str(child.pid), "--steps", "3"]) == 0
        out = capsys.readouterr().out
        assert f"process {child.pid}" in out and "advisory" in out and "tracekit-profiles" in out
        # The handler creates the file, then writes it: wait for the word, not the file.
        deadline = time.monotonic() + 10
        while not (armed.exists() and armed.read_text() == "armed"):
            assert time.monotonic() < deadline, "the signal was not handled"
            time.sleep(0.01)
        assert child.poll() is None  # handled, not killed
    finally:
        child.kill()
        child.wait()


def test_profile_command_refuses_a_missing_pid_in_one_line(capsys):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that existed and is gone
    assert main(["profile", "--pid", str(child.pid)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tracekit profile: error: no process") and "\n" not in err


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc (Linux)")
def test_profile_command_does_not_signal_a_process_that_would_die_of_it(capsys):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:
        time.sleep(0.05)
        assert main(["profile", "--pid", str(child.pid)]) == 2
        assert "does not handle SIGUSR2" in capsys.readouterr().err
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()
