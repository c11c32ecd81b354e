"""Profiles without ``ProfilerStep``: top-level record_function blocks, else the whole
trace, are the step windows (docs/kineto.md, "What a profile becomes")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.facade import Analysis, ingest
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.ingest import kineto_events as ke
from tracekit.analysis.ingest.kineto import RANK_STEP, STEP_WINDOW, WHOLE_TRACE
from tracekit.analysis.store import open_store

from .builder import Profile

DATA = Path(__file__).resolve().parent / "data"
COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def roots(store) -> list[tuple[int, str, int, int]]:
    """(step, window, start µs after the first, duration µs) of each train_step span."""
    rows = store.run(
        "SELECT (attributes->>$step)::INT, attributes->>$window, start_ns, end_ns - start_ns "
        "FROM spans WHERE name = $n ORDER BY 1",
        {"step": f'$."{cv.STEP}"', "window": f'$."{STEP_WINDOW}"', "n": cv.STEP_SPAN_NAME},
    )
    first = min((r[2] for r in rows), default=0)
    return [(n, w, (s - first) // 1000, d // 1000) for n, w, s, d in rows]


def test_alexnet_profile_is_one_step_of_its_top_level_block_with_hta_figures(tmp_path):
    db = tmp_path / "s.duckdb"
    ingest([DATA / "alexnet.json.gz"], store=db, version="alexnet")
    with Analysis.open(db) as analysis:
        (run,) = analysis.steps().runs
    assert (run.label, run.world_size, run.steps, run.warmup_steps) == ("alexnet", 1, 1, 0)
    (rank,) = run.ranks
    # HTA 0.5.0's get_temporal_breakdown on this file: 99.49 / 0.08 / 0.43 %
    figures = (rank.gpu_idle_pct, rank.gpu_compute_pct, rank.gpu_non_compute_pct)
    assert [round(f or 0, 2) for f in figures] == [99.49, 0.08, 0.43]
    assert rank.comm_overlap_pct is None  # no communication kernel
    with open_store(db, read_only=True) as store:
        # [param|cuda] holds the other seven annotations (the benchmark's phases)
        assert roots(store) == [(0, "[param|cuda]", 0, 43_425_283)]
        gpu = store.run("SELECT step, kernels, window_ns FROM kineto_gpu ORDER BY step")
    assert gpu == [(RANK_STEP, 98, 12_920_244_000), (0, 98, 12_920_244_000)]


def two_blocks() -> Profile:
    """Two top-level blocks (0-1000 and 1500-2300 µs) of the main thread, with what must
    not become a window: a nested block, a stage, another process, a GPU annotation."""
    p = Profile(rank=0, world=1)
    p.cpu("aten::empty", 0, 5, cat="cpu_op")
    p.cpu("train_iter", 10, 990)
    p.cpu("## forward ##", 20, 300)
    p.cpu("inner", 30, 100)
    p.cpu("train_iter", 1500, 800)
    p.cpu("Optimizer.step#SGD.step", 2400, 50)  # top-level, but a stage: no window
    p.cpu("other_process", 0, 3000, pid=555, tid=555)
    p.cpu("train_iter", 20, 100, cat="gpu_user_annotation", pid=0, tid=7)
    p.kernel("void gemm_kernel<float>()", 40, 50, 200)
    p.kernel(COMM, 600, 620, 100, stream=20)
    p.kernel("void gemm_kernel<float>()", 1600, 1700, 300)
    p.kernel("void relu_kernel()", 2410, 2420, 30)  # launched in no window
    return p


def test_two_top_level_record_function_blocks_are_two_steps(tmp_path):
    f = two_blocks().write(tmp_path / "r.json")
    with open_store(":memory:") as store:
        report = ingest_paths(store, [f], version="v")
        assert report.skipped == 0
        assert roots(store) == [(0, "train_iter", 0, 990), (1, "train_iter", 1490, 800)]
        spans = store.run(
            "SELECT name, (attributes->>$step)::INT FROM spans WHERE name <> $n ORDER BY 1",
            {"step": f'$."{cv.STEP}"', "n": cv.STEP_SPAN_NAME},
        )
        # forward is a stage of step 0; the collective (launched at 600) is in step 0
        assert spans == [("## forward ##", None), (f"{cv.COMM_SPAN_NAME} all_reduce", 0)]
        gpu = dict(store.run("SELECT step, kernels FROM kineto_gpu"))
    # Per window: the ops launched in it; the whole rank: every op (no ProfilerStep, so
    # HTA's window; the last window is not left out as a last ProfilerStep would be).
    assert gpu == {RANK_STEP: 4, 0: 2, 1: 1}


def test_profile_without_annotations_is_one_whole_trace_step(tmp_path):
    p = Profile(rank=0, world=1)
    p.cpu("aten::empty", 0.25, 5, cat="cpu_op")  # the first event: an op kept nowhere
    p.cpu("aten::mm", 10, 30, cat="cpu_op")
    p.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 40, 60)
    p.kernel("void gemm_kernel<float>()", 12, 20, 200)
    p.cpu("cudaDeviceSynchronize", 230, 1000.125, cat="cuda_runtime")  # the last end
    doc = p.document()
    # The profiler's own footer span is not an event of the trace.
    doc["traceEvents"].append(
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": 0, "dur": 5000}
    )  # fmt: skip
    f = tmp_path / "r.json"
    f.write_text(json.dumps(doc))
    with open_store(":memory:") as store:
        ingest_paths(store, [f], version="v")
        (root,) = store.run(
            "SELECT attributes->>$window, (attributes->>$step)::INT, end_ns - start_ns "
            "FROM spans WHERE name = $n",
            {"window": f'$."{STEP_WINDOW}"', "step": f'$."{cv.STEP}"', "n": cv.STEP_SPAN_NAME},
        )
        assert root == (WHOLE_TRACE, 0, 1_230_125 - 250)  # ns, exact
        # The DataLoader block is a stage of the step, not a window of its own.
        assert store.run("SELECT stage FROM spans WHERE name <> $n", {"n": cv.STEP_SPAN_NAME}) == [
            (cv.DATA_WAIT,)
        ]
        assert store.run("SELECT step, kernels FROM kineto_gpu ORDER BY 1") == [
            (RANK_STEP, 1),
            (0, 1),
        ]


def test_whole_trace_ends_are_exact_where_floats_cannot_tell_them_apart():
    # 1 ns apart at an absolute µs time: the same float64.
    ext = ke.Extent()
    for ts, dur in [("1711964646123456.790", "0.5"), ("1711964646123456.789", "0.502")]:
        ext.add({"ph": "X", "cat": "cpu_op", "ts": ts, "dur": dur})
    ext.add({"ph": "X", "cat": "cpu_op", "ts": "1711964646123459.000", "dur": "Infinity"})
    ext.add({"ph": "i", "ts": 0})
    assert ext.bounds() == (1_711_964_646_123_456_789, 1_711_964_646_123_457_291)
    assert ke.Extent().bounds() is None


@pytest.mark.parametrize("name", ["alexnet.json.gz", "simple_add.json.gz"])
def test_data_files_are_stepless_single_rank_profiles(name):
    with open_store(":memory:") as store:
        report = ingest_paths(store, [DATA / name], version="v")
        assert report.skipped == 0 and not report.counts
        assert [w for _, w, _, _ in roots(store)] == ["[param|cuda]"]
