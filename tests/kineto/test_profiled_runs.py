"""Profiled runs in `tracekit steps` (each rank's GPU time line) and `tracekit diff`."""

from __future__ import annotations

import json
from pathlib import Path

from tracekit.cli import main

from .builder import Profile

COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def rank_profile(rank: int, world: int, comm_us: float, steps: int = 6) -> Profile:
    """Steps whose backward waits for its all-reduce: a slower collective, a longer step."""
    p = Profile(rank=rank, world=world)
    t = 0.0
    for n in range(steps):
        backward = max(400.0, 360 + comm_us + 20)
        length = 400 + backward + 200
        p.cpu(f"ProfilerStep#{n}", t, length)
        p.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 100)
        p.cpu("## forward ##", t + 100, 300)
        p.cpu("## backward ##", t + 400, backward)
        p.cpu("Optimizer.step#SGD.step", t + 400 + backward, 150)
        p.kernel("void gemm_kernel<float>()", t + 120, t + 150, 200)
        p.kernel("void gemm_bwd_kernel<float>()", t + 420, t + 450, 300)
        p.kernel(COMM, t + 500, t + 760, comm_us, stream=20)
        p.kernel("void sgd_kernel()", t + 400 + backward + 10, t + 400 + backward + 20, 100)
        t += length
    return p


def ingest(tmp_path: Path, label: str, world: int, comm_us: float) -> Path:
    folder = tmp_path / label
    folder.mkdir()
    for rank in range(world):
        rank_profile(rank, world, comm_us).write(folder / f"rank{rank}.pt.trace.json.gz", gz=True)
    db = tmp_path / "s.duckdb"
    assert main(["ingest", str(folder), "--db", str(db), "--version", label]) == 0
    return db


def test_steps_shows_each_ranks_gpu_time_line(tmp_path, capsys):
    db = ingest(tmp_path, "2gpu", 2, comm_us=150)
    capsys.readouterr()
    assert main(["steps", "--version", "2gpu", "--db", str(db), "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    assert [r["rank"] for r in run["ranks"]] == [0, 1]
    for r in run["ranks"]:
        assert {
            "gpu_idle_pct",
            "gpu_compute_pct",
            "gpu_non_compute_pct",
            "comm_overlap_pct",
        } <= set(r)
        assert abs(r["gpu_idle_pct"] + r["gpu_compute_pct"] + r["gpu_non_compute_pct"] - 100) < 1e-6
        assert r["comm_overlap_pct"] == 0.0  # the all-reduce runs after the backward kernel
    assert main(["steps", "--version", "2gpu", "--db", str(db)]) == 0
    table = capsys.readouterr().out
    assert "GPU idle" in table and "comm overlap" in table


def test_diff_of_two_profiled_runs_gives_the_scaling_verdict(tmp_path, capsys):
    ingest(tmp_path, "2gpu", 2, comm_us=150)
    db = ingest(tmp_path, "4gpu", 4, comm_us=900)
    capsys.readouterr()
    code = main(
        ["diff", "--before", "2gpu", "--after", "4gpu", "--db", str(db), "--format", "json"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["scaling"]["ideal"] == 2.0
    assert out["scaling"]["efficiency"] < 0.9
    assert out["verdict"]["bottleneck"] == "communication", out["verdict"]
