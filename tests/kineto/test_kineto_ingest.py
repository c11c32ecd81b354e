"""Kineto rank files into step spans and GPU figures, on small profiles built here."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.ingest import kineto_comm as kc
from tracekit.analysis.ingest import kineto_stream as ks
from tracekit.analysis.ingest import kineto_timeline as tl
from tracekit.analysis.store import open_store
from tracekit.analysis.training.gpu import rank_gpu_breakdown
from tracekit.cli import main

from .builder import BASE_NS, Profile

COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def three_steps(rank: int | None = 0, comm: str = COMM) -> Profile:
    """Three 1 ms steps: data 0-100, forward 100-400, backward 400-800, optimizer 800-950 µs.

    Per step on the device: compute 150-350 and 700-800, a collective launched at 500
    (in backward) running 600-900: window 750, busy 500, compute 300, comm 300, overlap 100.
    """
    p = Profile(rank=rank)
    for i in range(3):
        t = 1000.0 * i
        p.cpu(f"ProfilerStep#{i + 1}", t, 1000)
        p.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 100)
        p.cpu("## forward ##", t + 100, 300)
        p.cpu("## backward ##", t + 400, 400)
        p.cpu("Optimizer.step#SGD.step", t + 800, 150)
        p.cpu("record_param_comms", t + 499, 3, cat="cpu_op", **{
            "Collective name": "allreduce", "In msg nelems": 1000, "dtype": "Float",
            "Process Group Name": "0", "Process Group Description": "default_pg"})  # fmt: skip
        p.kernel("void gemm_kernel<float>()", t + 120, t + 150, 200)
        p.kernel(comm, t + 500, t + 600, 300, stream=20)
        p.kernel("void relu_kernel()", t + 650, t + 700, 100)
    return p


def test_steps_become_train_step_traces_with_stages_and_collectives(store, tmp_path):
    f = three_steps().write(tmp_path / "rank0.json")
    report = ingest_paths(store, [f], version="run1")
    assert report.skipped == 0
    per_request.refresh(store, report.trace_ids)
    roots = store.run(
        "SELECT json_extract(attributes, '$.\"tracekit.step\"')::INT, end_ns - start_ns "
        "FROM spans WHERE name = $n ORDER BY 1",
        {"n": cv.STEP_SPAN_NAME},
    )
    assert roots == [(1, 1_000_000), (2, 1_000_000), (3, 1_000_000)]
    assert store.run("SELECT count(*), min(release) FROM requests") == [(3, "run1")]
    stages = dict(store.run("SELECT stage, count(*) FROM spans GROUP BY 1"))
    assert stages == {
        None: 3, cv.DATA_WAIT: 3, cv.FORWARD: 3, cv.BACKWARD: 3, cv.OPTIMIZER: 3,
        cv.COMMUNICATION: 3,
    }  # fmt: skip
    comm = store.run(
        "SELECT c.start_ns - r.start_ns, c.end_ns - r.start_ns, p.stage, c.gpu_time_ns, "
        "c.attributes->>'$.\"tracekit.comm.op\"', c.attributes->>'$.\"tracekit.comm.bytes\"', "
        "c.attributes->>'$.\"tracekit.comm.group\"', c.attributes->>'$.\"tracekit.comm.seq\"' "
        "FROM spans c JOIN spans p ON p.span_id = c.parent_span_id AND p.trace_id = c.trace_id "
        "JOIN spans r ON r.trace_id = c.trace_id AND r.parent_span_id IS NULL "
        "WHERE c.stage = 'communication' ORDER BY 8"
    )
    # launched at 500 µs under backward; kept inside backward (ends 800), device time whole
    assert comm == [
        (500_000, 800_000, cv.BACKWARD, 300_000, "all_reduce", "4000", "default", str(seq))
        for seq in range(3)
    ]


def test_gpu_figures_follow_hta_definitions(store, tmp_path):
    ingest_paths(store, [three_steps().write(tmp_path / "r.json")], version="run1")
    steps = store.run(
        "SELECT step, window_ns, busy_ns, idle_ns, compute_ns, non_compute_ns, comm_ns, "
        "overlap_ns, exposed_comm_ns FROM kineto_gpu ORDER BY step"
    )
    per_step = (750_000, 500_000, 250_000, 300_000, 200_000, 300_000, 100_000, 200_000)
    assert [s[1:] for s in steps[1:]] == [per_step] * 3
    # whole rank: HTA's window leaves out ops launched in the last step
    assert steps[0][:3] == (-1, 1_750_000, 1_000_000)
    gpu = rank_gpu_breakdown(store, "run1")[0]
    assert gpu.gpu_idle_pct == pytest.approx(100 * 750 / 1750)
    assert gpu.gpu_compute_pct == pytest.approx(100 * 600 / 1750)
    assert gpu.gpu_non_compute_pct == pytest.approx(100 * 400 / 1750)
    assert gpu.comm_overlap_pct == pytest.approx(100 / 3)
    assert gpu.exposed_comm_ms_per_step == pytest.approx(0.2)
    assert rank_gpu_breakdown(store, "other") == {}


def test_absolute_and_relative_layouts_give_the_same_times(tmp_path):
    p = three_steps()
    rel = p.write(tmp_path / "rel.json")
    absolute = p.write(tmp_path / "abs.json.gz", gz=True, absolute=True, flow="async_cpu_to_gpu")
    out = []
    for f, label in ((rel, "a"), (absolute, "b")):
        with open_store(":memory:") as s:
            ingest_paths(s, [f], version=label)
            out.append(s.run("SELECT min(start_ns), max(end_ns), count(*) FROM spans"))
    assert out[0] == out[1]
    assert out[0][0][0] == BASE_NS


@pytest.mark.parametrize(
    ("raw", "op"),
    [
        ("allreduce", "all_reduce"),
        ("AllReduce", "all_reduce"),
        ("AllGather", "all_gather"),
        ("SendRecv", "send_recv"),
        ("ReduceScatter", "reduce_scatter"),
        ("all_to_all", "all_to_all"),
        ("broadcast", "broadcast"),
        ("_allgather_base", "all_gather"),
        ("allgather_into_tensor_coalesced", "all_gather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("allreduce_coalesced", "all_reduce"),
        ("alltoall_base", "all_to_all"),
    ],
)
def test_collective_names_are_one_vocabulary(raw, op):
    assert kc.op_name(raw) == op


def test_nanosecond_fractions_are_exact():
    assert ks.us_to_ns("1711964646123456.789") == 1_711_964_646_123_456_789
    assert ks.us_to_ns("0.5") == 500
    assert ks.us_to_ns("-1.25") == -1250
    assert ks.us_to_ns("1.5e3") == 1_500_000
    assert ks.us_to_ns(12) == 12_000
    assert ks.us_to_ns("x") is None


@pytest.mark.parametrize("bad", ["Infinity", "-Infinity", "NaN", "1e400", "123456789012345678901"])
def test_a_time_that_is_no_finite_64_bit_number_costs_its_event_not_the_file(tmp_path, bad):
    # json reads Infinity/NaN as floats and 1e400 as text: none may crash the ingest
    f = three_steps().write(tmp_path / "r.json")
    text = f.read_text()
    head, sep, tail = text.partition('"traceEvents": [')
    poisoned = f'{{"ph": "X", "cat": "kernel", "name": "k", "ts": {bad}, "dur": 5, '
    poisoned += '"args": {"stream": 7}}, '
    f.write_text(head + sep + poisoned + tail)
    with open_store(tmp_path / "s.duckdb") as store:
        report = ingest_paths(store, [f], version="v")
        steps = store.con.execute("SELECT count(*) FROM spans WHERE name = 'train_step'").fetchone()
    assert report.skipped == 0
    assert steps == (3,)


def test_stream_reader_matches_json_whatever_the_chunk_size(monkeypatch):
    doc = three_steps().document()
    text = json.dumps(doc)
    monkeypatch.setattr(ks, "CHUNK_CHARS", 7)
    stream = ks.KinetoStream(io.StringIO(text))
    events = list(stream.events())
    assert len(events) == len(doc["traceEvents"])
    assert stream.meta["baseTimeNanoseconds"] == BASE_NS
    assert stream.meta["distributedInfo"]["rank"] == 0
    assert events[0]["name"] == doc["traceEvents"][0]["name"]


def test_comm_pattern_marks_user_kernels_as_communication(tmp_path):
    f = three_steps(comm="deep_ep::internode::dispatch<8>(void*)").write(tmp_path / "r.json")
    with open_store(":memory:") as s:
        ingest_paths(s, [f], version="plain")
        assert s.run("SELECT comm_ns FROM kineto_gpu WHERE step = 1") == [(0,)]
        ingest_paths(s, [f], version="deep", comm_pattern=r"deep_ep::")
        assert s.run("SELECT comm_ns FROM kineto_gpu WHERE step = 1 AND run_label = 'deep'") == [
            (300_000,)
        ]


def test_profile_without_distributed_info_is_rank_zero_with_a_warning(tmp_path, capsys):
    f = three_steps(rank=None).write(tmp_path / "solo.json")
    code = main(["ingest", str(f), "--db", str(tmp_path / "s.duckdb"), "--version", "v"])
    assert code == 0
    err = capsys.readouterr().err
    assert "no distributedInfo: read as rank 0 of 1" in err


@pytest.mark.parametrize("cut", ["gzip", "plain", "garbage"])
def test_damaged_file_is_one_line_exit_2_and_other_files_still_load(tmp_path, capsys, cut):
    good = three_steps(rank=0).write(tmp_path / "rank0.json")
    text = json.dumps(three_steps(rank=1).document(), indent=1)
    bad = tmp_path / "rank1.json"
    if cut == "gzip":
        import gzip

        bad = tmp_path / "rank1.json.gz"
        packed = gzip.compress(text.encode())
        bad.write_bytes(packed[: len(packed) // 2])
    elif cut == "plain":
        bad.write_text(text[: len(text) // 2])
    else:
        bad.write_text(text.replace('"dur": 300', '"dur": 3@0', 1))
    db = tmp_path / "s.duckdb"
    code = main(["ingest", str(good), str(bad), "--db", str(db), "--version", "v"])
    assert code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith(str(bad))]
    assert len(lines) == 1 and "file skipped" in lines[0]
    with open_store(db, read_only=True) as s:
        assert s.run("SELECT DISTINCT rank FROM kineto_gpu") == [(0,)]
        assert s.run("SELECT count(*) FROM requests") == [(3,)]


def test_second_file_of_a_rank_in_one_run_is_refused(tmp_path):
    a = three_steps(rank=0).write(tmp_path / "a.json")
    b = three_steps(rank=0).write(tmp_path / "b.json")
    with open_store(":memory:") as s:
        report = ingest_paths(s, [a, b], version="v")
    assert report.skipped == 1
    assert re.search(r"rank 0 again", report.skipping_problems[0].reason)


def test_reingesting_a_profile_changes_nothing(store, tmp_path):
    f = three_steps().write(tmp_path / "r.json")
    ingest_paths(store, [f], version="v")
    first = store.run("SELECT count(*) FROM spans"), store.run("SELECT * FROM kineto_gpu")
    assert ingest_paths(store, [f], version="v").spans_stored == 0
    assert (store.run("SELECT count(*) FROM spans"), store.run("SELECT * FROM kineto_gpu")) == first


def test_timeline_idle_split_host_wait_kernel_wait_other():
    # stream 1: ops 0-10, 15-20 (launched at 5: before the gap, short gap = kernel wait),
    # 100-110 (launched at 90, after 20 ended: host wait), 200-210 (launched at 50: other)
    us = 1000
    start = np.array([0, 15, 100, 200]) * us
    end = np.array([10, 20, 110, 210]) * us
    launch = np.array([0, 5, 90, 50]) * us
    stream = np.ones(4, dtype=np.int64)
    assert tl.idle_split(start, end, stream, launch) == (80 * us, 5 * us, 90 * us)
    assert tl.union_ns(np.array([0, 5, 20]), np.array([10, 8, 30])) == 20


# --- what collectives carry for bandwidth ----------------------------------------------

KINETO = Path(__file__).resolve().parents[1] / "data" / "corpus" / "kineto"
PG_CONFIG = [
    {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": 8,
     "ranks": list(range(8))},
    {"pg_name": "3", "pg_desc": "tp", "backend_config": "cuda:nccl", "ranks": [0, 1, 2, 3]},
    {"pg_name": "5", "pg_desc": "undefined", "backend_config": "cuda:nccl", "pg_size": 2,
     "ranks": [0, 4]},
]  # fmt: skip


def comm_attributes(store) -> list[tuple[Any, ...]]:
    keys = (cv.COMM_OP, cv.COMM_GROUP, cv.COMM_BYTES, cv.COMM_GROUP_SIZE, cv.COMM_GROUP_DESC)
    cols = ", ".join(f"attributes->>'$.\"{k}\"'" for k in keys)
    return store.run(f"SELECT {cols} FROM spans WHERE stage = 'communication' ORDER BY start_ns")


def test_collectives_carry_nccl_tests_bytes_group_size_and_description(tmp_path):
    p = Profile(rank=0, world=8, pg_config=PG_CONFIG)
    p.cpu("ProfilerStep#1", 0, 6000)
    calls = [  # (kernel, record_param_comms args or None, the kernel's own args)
        ("ncclDevKernel_AllGather_RING_LL", {
            "Collective name": "_allgather_base", "In msg nelems": 1000, "Out msg nelems": 8000,
            "dtype": "BFloat16", "Group size": 8, "Process Group Name": "0",
            "Process Group Description": "default_pg"}, {}),
        ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", {
            "Collective name": "_reduce_scatter_base", "In msg nelems": 8000,
            "Out msg nelems": 1000, "dtype": "Float", "Process Group Name": "3",
            "Process Group Description": "undefined"}, {}),
        ("ncclDevKernel_AllReduce_Sum_f16_RING_LL", {
            "Collective name": "allreduce", "In msg nelems": 500, "Out msg nelems": 500,
            "dtype": "Half", "Process Group Name": "5"}, {}),
        ("ncclDevKernel_Broadcast_RING_LL", {
            "Collective name": "broadcast", "In msg nelems": 10, "dtype": "Long"}, {}),
        ("ncclDevKernel_SendRecv", None, {  # newer files: the kernel's own args
            "Collective name": "all_to_all", "In msg nelems": 300, "Out msg nelems": 300,
            "dtype": "Float8_e4m3fn", "Group size": 4, "Process Group Name": "3"}),
    ]  # fmt: skip
    for i, (kernel, meta, own) in enumerate(calls):
        t = 100.0 + 1000 * i
        if meta is not None:
            p.cpu("record_param_comms", t - 1, 5, cat="cpu_op", **meta)
        p.kernel(f"{kernel}(ncclDevComm*, unsigned long, ncclWork*)", t, t + 10, 100, 20, **own)
    with open_store(":memory:") as s:
        ingest_paths(s, [p.write(tmp_path / "r.json")], version="v")
        assert comm_attributes(s) == [
            # all_gather: the whole output; reduce_scatter: the whole input (nccl-tests)
            ("all_gather", "default", "16000", "8", "default_pg"),
            # no Group size: pg_config's ranks; an undefined description: pg_config's
            ("reduce_scatter", "3", "32000", "4", "tp"),
            ("all_reduce", "5", "1000", "2", None),  # pg_config's desc is undefined too
            ("broadcast", "default", "80", "8", None),  # no group named: the world
            ("all_to_all", "3", "300", "4", "tp"),
        ]


def test_corpus_collectives_carry_what_their_record_param_comms_hold():
    # nccl_parser_config: In = Out msg nelems everywhere; Float 4 B, Long 8 B; Group size
    # 2 and Process Group Description default_pg on every NCCL kernel.
    # ns_resolution: host collectives (world of 1), their record_param_comms inside the
    # c10d call; Group size 1, no description.
    expected = {
        "hta_nccl_parser_config_nccl_data.json.gz": ("2", "default_pg"),
        "hta_ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": ("1", None),
    }
    for name, (size, desc) in expected.items():
        with open_store(":memory:") as s:
            ingest_paths(s, [KINETO / name], version="v")
            rows = comm_attributes(s)
        assert {(op, nbytes) for op, _, nbytes, _, _ in rows} == {
            ("all_reduce", str(2049000 * 4)),
            ("all_reduce", str(2431040 * 4)),
            ("all_reduce", str(6563840 * 4)),
            ("all_reduce", str(6637568 * 4)),
            ("all_reduce", str(7875584 * 4)),
            ("broadcast", str(53120 * 4)),
            ("broadcast", str(53 * 8)),
        }, name
        assert {(group, s, d) for _, group, _, s, d in rows} == {("default", size, desc)}, name
