"""Collective bandwidth and process groups (``tracekit.analysis.training.bandwidth``).

Three layers: the nccl-tests factors and the transfer-time rule on hand-made
collectives; generated runs whose bytes and transfer times are known exactly, through
the store and ``load_run``/``diff_runs``; and a real 2-process gloo job whose tensors
(and DDP buckets) have sizes torch itself reports.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.training.gloo_allreduce_job import HAND_SIZES, trace_file
from tracekit import conventions as cv
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import Store, open_store
from tracekit.analysis.training.bandwidth import (
    INTER,
    INTRA,
    CommInstance,
    bus_factor,
    collective_table,
    group_role,
    transfer_times,
)
from tracekit.analysis.training.diff import compare_runs, diff_runs
from tracekit.analysis.training.model import PEER_WAIT, CollectiveBandwidth, RunSteps
from tracekit.analysis.training.steps import load_run
from tracekit.demo.trainer import free_ports
from tracekit.testing import TraceBuilder, training_run

MS = 1_000_000
MIB = 1 << 20
BUCKET = 25 * MIB
"""Bytes of each of ``training_run``'s two buckets."""
NS_TOLERANCE_MS = 1e-5
"""The builder rounds each span's start and duration to whole ns: a few ns of slack."""


def _gb_s(nbytes: float, ms: float) -> float:
    return nbytes / (ms / 1000.0) / 1e9


def _only(rows: list[CollectiveBandwidth], **match: Any) -> CollectiveBandwidth:
    hits = [r for r in rows if all(getattr(r, k) == v for k, v in match.items())]
    assert len(hits) == 1, (match, rows)
    return hits[0]


# --- bus factors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 1, 0.0),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 8, 1.75),
        ("all_reduce", 64, 2 * 63 / 64),
        ("all_reduce_coalesced", 4, 1.5),
        ("all_gather", 2, 0.5),
        ("all_gather", 8, 0.875),
        ("all_gather_into_tensor_coalesced", 8, 0.875),
        ("reduce_scatter", 8, 0.875),
        ("reduce_scatter_tensor", 4, 0.75),  # not reduce's factor: reduce_scatter matched first
        ("all_to_all", 4, 0.75),
        ("all_to_all_single", 16, 15 / 16),
        ("broadcast", 2, 1.0),
        ("broadcast", 64, 1.0),
        ("reduce", 8, 1.0),
        ("reduce", 1, 1.0),
    ],
)
def test_bus_factor_is_nccl_tests_for_every_op_and_group_size(op: str, n: int, factor: float):
    assert bus_factor(op, n) == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize(("op", "n"), [("gather", 2), ("barrier", 8), ("all_reduce", 0)])
def test_bus_factor_is_none_without_a_known_factor(op: str, n: int):
    assert bus_factor(op, n) is None


# --- transfer time on hand-made collectives ------------------------------------------


def _ci(
    rank: int,
    seq: int,
    start_ms: float,
    end_ms: float,
    *,
    group: str = "default",
    host: str | None = "h0",
    op: str = "all_reduce",
    nbytes: int | None = 8 * MIB,
    group_size: int | None = None,
    backend: str | None = None,
) -> CommInstance:
    return CommInstance(
        rank=rank,
        host=host,
        step=0,
        group=group,
        seq=seq,
        op=op,
        nbytes=nbytes,
        group_size=group_size,
        group_desc=None,
        start=round(start_ms * MS),
        end=round(end_ms * MS),
        stage=cv.BACKWARD,
        exposed_ns=0,
        backend=backend,
    )


def test_a_late_rank_is_peer_wait_not_transfer():
    times = transfer_times([_ci(0, 0, 0, 25), _ci(1, 0, 20, 25)])
    # rank 0 waited 20 ms for rank 1; both transferred for the last 5
    assert times == {("default", 0): [5 * MS, 5 * MS]}


def test_a_queued_collective_transfers_only_after_the_previous_one_left():
    times = transfer_times(
        [_ci(0, 0, 0, 30), _ci(1, 0, 0, 30), _ci(0, 1, 10, 40), _ci(1, 1, 10, 40)]
    )
    # seq 1 was launched at 10 but sat behind seq 0 until 30
    assert times[("default", 1)] == [10 * MS, 10 * MS]
    assert times[("default", 0)] == [30 * MS, 30 * MS]


def test_the_queue_is_each_ranks_own_and_the_collective_takes_the_median():
    inst = [_ci(0, 0, 0, 30), _ci(1, 0, 0, 20), _ci(0, 1, 10, 40), _ci(1, 1, 10, 40)]
    assert sorted(transfer_times(inst)[("default", 1)]) == [10 * MS, 20 * MS]
    row = _only(collective_table([c for c in inst if c.seq == 1], 2, None))
    # seq 0 alone would not queue seq 1: 30 ms on both ranks
    assert row.time_ms == pytest.approx(30.0)
    row = _only(collective_table(inst, 2, None), count=2)
    # (30 + 20) / 2 for seq 0, median(10, 20) = 15 for seq 1
    assert row.time_ms == pytest.approx((25.0 + 15.0) / 2)


def test_another_groups_collective_does_not_queue():
    times = transfer_times([_ci(0, 0, 0, 30, group="a"), _ci(0, 0, 10, 40, group="b")])
    assert times[("b", 0)] == [30 * MS]


def test_a_collective_that_finished_before_the_previous_one_still_counts():
    # gloo runs a group's collectives on several worker threads at once: one that ends
    # before the previous one was not queued behind it
    inst = [_ci(r, 0, 0, 50) for r in (0, 1)] + [_ci(r, 1, 10, 20) for r in (0, 1)]
    assert transfer_times(inst)[("default", 1)] == [10 * MS, 10 * MS]


def test_rows_are_per_op_group_and_size_class_with_summed_bytes_over_summed_time():
    inst = []
    # one class (2**24 ≤ bytes < 2**25): 20 MiB in 2 ms and 24 MiB in 6 ms
    for seq, (nbytes, ms) in enumerate([(20 * MIB, 2.0), (24 * MIB, 6.0), (1 * MIB, 1.0)]):
        t0 = seq * 100.0
        inst += [_ci(r, seq, t0, t0 + ms, nbytes=nbytes) for r in range(4)]
    rows = collective_table(inst, 4, None)
    assert [r.count for r in rows] == [1, 2]  # sorted by size class within (group, op)
    big = rows[1]
    assert big.bytes == 22 * MIB and big.time_ms == pytest.approx(4.0)
    # Σbytes / Σtime (44 MiB in 8 ms), not the mean of 10 and 4.2 GB/s
    assert big.algbw_gb_s == pytest.approx(_gb_s(44 * MIB, 8.0))
    assert big.busbw_gb_s == pytest.approx(big.algbw_gb_s * 1.5)
    # the default group without a size attribute is the world
    assert big.group_size == 4 and big.scope == INTRA


def test_group_size_comes_from_the_spans_else_the_world_else_the_ranks_seen():
    inst = [_ci(r, 0, 0, 1, group="default") for r in range(2)]
    inst += [_ci(r, 0, 0, 1, group="sub") for r in range(2)]
    inst += [_ci(r, 0, 0, 1, group="sized", group_size=8) for r in range(2)]
    n = {r.group: r.group_size for r in collective_table(inst, 16, None)}
    assert n == {"default": 16, "sub": 2, "sized": 8}


def test_scope_and_link_fraction_follow_the_hosts_of_the_group():
    inst = [_ci(r, 0, 0, 2, group="x", host=f"h{r}") for r in range(2)]
    inst += [_ci(r, 0, 0, 2, group="y", host="h0") for r in range(2)]
    rows = {r.group: r for r in collective_table(inst, 2, 200.0)}
    assert rows["x"].scope == INTER
    assert rows["x"].link_fraction == pytest.approx(rows["x"].busbw_gb_s / 25.0)
    assert rows["y"].scope == INTRA and rows["y"].link_fraction is None
    no_link = collective_table(inst, 2, None)
    assert all(r.link_fraction is None for r in no_link)


def test_collectives_without_bytes_have_no_row():
    assert collective_table([_ci(r, 0, 0, 2, nbytes=None) for r in range(2)], 2, None) == []


@pytest.mark.parametrize(
    ("group", "desc", "ops", "role"),
    [
        ("fsdp_shard", None, ["all_gather"], "fsdp"),
        ("3", None, ["all_gather_into_tensor", "reduce_scatter_tensor"], "fsdp"),
        ("0", "default_pg", ["all_reduce"], "data_parallel"),
        ("5", None, ["all_reduce"], "data_parallel"),
        ("5", "tp_group", ["all_reduce"], "tensor"),  # the description beats the op
        ("pp_0", None, ["send", "recv"], "pipeline"),
        ("7", None, ["recv"], "pipeline"),
        ("ep", None, ["all_to_all"], "expert"),
        ("9", None, ["all_to_all_single"], "expert"),
        ("7", None, ["broadcast"], "other"),
    ],
)
def test_group_role_from_description_name_or_ops(group, desc, ops, role):
    assert group_role(group, desc, ops) == role


# --- generated runs with known bytes and times ----------------------------------------


_STORES = itertools.count()


def _run(tmp_path: Path, link_gbps: float | None = None, **kw: Any) -> RunSteps:
    b = TraceBuilder(service="trainer", version="r", seed=3)
    training_run(b, steps=8, version="r", **kw)
    with open_store(tmp_path / f"r{next(_STORES)}.duckdb") as store:
        b.load(store)
        return load_run(store, "r", link_gbps=link_gbps)


def _queued_ms(b: TraceBuilder) -> list[float]:
    """Per step: bucket 2's end minus its last arrival (more than its transfer when queued)."""
    spans = [s for s in b.spans if s.attributes.get(cv.COMM_SEQ, 0) % 2 == 1]
    per: dict[int, list[Any]] = {}
    for s in spans:
        per.setdefault(s.attributes[cv.COMM_SEQ], []).append(s)
    return [(s[0].end_ns - max(x.start_ns for x in s)) / MS for s in per.values()]


@pytest.mark.parametrize("transfer_ms", [10.0, 30.0])
def test_bucket_transfer_time_and_bus_bandwidth_are_exact(tmp_path, transfer_ms):
    run = _run(tmp_path, world_size=8, transfer_ms=transfer_ms, link_gbps=400)
    row = _only(run.collectives)
    assert (row.op, row.group, row.group_size, row.scope) == ("all_reduce", "default", 8, INTRA)
    assert row.bytes == BUCKET and row.count == 2 * run.steps and run.steps == 7
    # both buckets: bucket 2 is timed from bucket 1's end when it queued behind it
    assert row.time_ms == pytest.approx(transfer_ms, abs=NS_TOLERANCE_MS)
    assert row.algbw_gb_s == pytest.approx(_gb_s(BUCKET, transfer_ms), rel=1e-6)
    assert row.busbw_gb_s == pytest.approx(row.algbw_gb_s * 2 * 7 / 8, rel=1e-12)
    assert row.link_fraction is None  # intra-node: the link is not what moved it


def test_the_second_bucket_really_queues_at_a_long_transfer():
    for transfer_ms, queued in ((10.0, False), (30.0, True)):
        b = TraceBuilder(service="trainer", version="r", seed=3)
        training_run(b, world_size=8, steps=4, version="r", transfer_ms=transfer_ms)
        waits = _queued_ms(b)
        assert all((w > transfer_ms + 1) is queued for w in waits), (transfer_ms, waits)


def test_a_straggler_does_not_lower_the_bandwidth(tmp_path):
    even = _run(tmp_path, world_size=8)
    slow = _run(tmp_path, world_size=8, straggler=(3, 25.0))
    peer = {c.name: c.mean_ms for c in slow.components}[PEER_WAIT]
    assert peer > 20  # the others did wait for rank 3 at every bucket
    assert slow.groups[0].wall_ms > even.groups[0].wall_ms + 20
    a, b = _only(even.collectives), _only(slow.collectives)
    assert b.time_ms == pytest.approx(10.0, abs=NS_TOLERANCE_MS)
    assert b.busbw_gb_s == pytest.approx(a.busbw_gb_s, rel=1e-6)


def test_ranks_on_several_hosts_are_inter_node_with_a_link_fraction(tmp_path):
    # host 1's clock 7 ms ahead: transfers are measured on the aligned clock
    run = _run(tmp_path, world_size=16, ranks_per_host=8, host_offsets_ms={1: 7.0}, link_gbps=400.0)
    assert run.clock_offset_ms == pytest.approx(7.0, abs=1e-3)
    row = _only(run.collectives)
    assert row.scope == INTER and row.group_size == 16
    # the host offset is a median of ends relative to the first (not of absolute Unix-ns
    # times in float64, 256 ns apart at 2026's epoch)
    assert row.time_ms == pytest.approx(10.0, abs=NS_TOLERANCE_MS)
    assert row.busbw_gb_s == pytest.approx(_gb_s(BUCKET, 10.0) * 2 * 15 / 16, rel=1e-4)
    assert row.link_fraction == pytest.approx(row.busbw_gb_s / 50.0, rel=1e-12)
    assert run.link_gbps == 400.0


def test_the_diff_compares_bus_bandwidth_across_scopes(tmp_path):
    b = TraceBuilder(service="trainer", version="8gpu", seed=4)
    training_run(b, world_size=8, steps=8, version="8gpu")
    training_run(b, world_size=16, steps=8, version="16gpu", ranks_per_host=8, transfer_ms=40.0)
    with open_store(tmp_path / "t.duckdb") as store:
        b.load(store)
        d = diff_runs(store, "8gpu", "16gpu", link_gbps=400.0)
        again = compare_runs(
            load_run(store, "8gpu", link_gbps=400.0), load_run(store, "16gpu", link_gbps=400.0)
        )
    bw = d.bandwidth
    assert bw is not None and bw == again.bandwidth
    assert (bw.op, bw.scope, bw.before_scope) == ("all_reduce", INTER, INTRA)
    assert bw.before_busbw_gb_s == pytest.approx(_gb_s(BUCKET, 10.0) * 1.75, rel=1e-6)
    assert bw.after_busbw_gb_s == pytest.approx(_gb_s(BUCKET, 40.0) * 2 * 15 / 16, rel=1e-6)
    assert bw.link_gbps == 400.0
    assert bw.link_fraction == pytest.approx(bw.after_busbw_gb_s / 50.0, rel=1e-12)
    text = bw.sentence()
    assert "intra-node" in text and "inter-node" in text and "400 Gb/s link" in text


# --- every op through the store: FSDP, DDP, broadcast, experts -----------------------

WORLD = 8
STEPS = 5
KEPT = STEPS - 1
# (group, op, bytes, group_size, desc, stage, start ms, end ms, background, ranks)
PLAN = [
    ("fsdp_shard", "all_gather", 64 * MIB, 8, None, cv.FORWARD, 5, 20, False, range(8)),
    ("fsdp_shard", "reduce_scatter", 32 * MIB, 8, None, cv.BACKWARD, 45, 50, True, range(8)),
    ("default", "all_reduce", 16 * MIB, None, "default_pg", cv.BACKWARD, 55, 63, True, range(8)),
    ("7", "broadcast", 4 * MIB, 8, None, cv.BACKWARD, 70, 72, False, range(8)),
    ("ep", "all_to_all", 8 * MIB, 4, None, cv.BACKWARD, 75, 79, False, range(4)),
]
LATE_RANK, LATE_MS = 5, 3.0
"""Rank 5 reaches each step's all-gather 3 ms after the others: peer wait, not transfer."""
# transfer per collective: the all-gather's from the late arrival, the others' whole span
TRANSFER_MS = {"all_gather": 12.0, "reduce_scatter": 5.0, "all_reduce": 8.0}
TRANSFER_MS |= {"broadcast": 2.0, "all_to_all": 4.0}
FACTOR = {"all_gather": 7 / 8, "reduce_scatter": 7 / 8, "all_reduce": 14 / 8}
FACTOR |= {"broadcast": 1.0, "all_to_all": 3 / 4}


@pytest.fixture(scope="module")
def multi_op(tmp_path_factory: pytest.TempPathFactory) -> RunSteps:
    """Eight ranks on two hosts; FSDP-style gathers and reduce-scatters, a DDP all-reduce,
    a broadcast in a group torch would name ``7`` and an all-to-all among ranks 0–3."""
    b = TraceBuilder(service="trainer", version="mix", seed=5)
    seqs: dict[str, int] = {}
    for step in range(STEPS):
        numbered = []
        for group, *_ in PLAN:
            numbered.append(seqs.get(group, 0))
            seqs[group] = numbered[-1] + 1
        for rank in range(WORLD):
            s = b.step(
                step,
                rank=rank,
                world_size=WORLD,
                start_ms=100.0 * step,
                duration_ms=100,
                samples=8,
                host=f"node-{rank // 4}",
            )
            s.stage(cv.DATA_WAIT, start_ms=0, duration_ms=2)
            stages = {
                cv.FORWARD: s.stage(cv.FORWARD, start_ms=2, duration_ms=38),
                cv.BACKWARD: s.stage(cv.BACKWARD, start_ms=40, duration_ms=50),
            }
            s.stage(cv.OPTIMIZER, start_ms=90, duration_ms=10)
            for (group, op, nbytes, size, desc, stage, t0, t1, bg, ranks), seq in zip(
                PLAN, numbered, strict=True
            ):
                if rank not in ranks:
                    continue
                late = LATE_MS if (rank, op) == (LATE_RANK, "all_gather") else 0.0
                s.collective(
                    seq,
                    start_ms=t0 + late,
                    duration_ms=t1 - t0 - late,
                    parent=stages[stage],
                    op=op,
                    nbytes=nbytes,
                    group=group,
                    group_size=size,
                    group_desc=desc,
                    background=bg,
                )
    with open_store(tmp_path_factory.mktemp("mix") / "t.duckdb") as store:
        b.load(store)
        return load_run(store, "mix", link_gbps=400.0)


@pytest.mark.parametrize("entry", PLAN, ids=lambda e: e[1])
def test_each_op_gets_its_own_factor_and_group_size(multi_op: RunSteps, entry):
    group, op, nbytes, size, desc, *_ = entry
    row = _only(multi_op.collectives, op=op)
    assert row.group == group and row.bytes == nbytes and row.count == KEPT
    assert row.group_size == (size or WORLD) and row.group_desc == desc
    assert row.time_ms == pytest.approx(TRANSFER_MS[op], abs=NS_TOLERANCE_MS)
    assert row.algbw_gb_s == pytest.approx(_gb_s(nbytes, TRANSFER_MS[op]), rel=1e-6)
    assert row.busbw_gb_s == pytest.approx(row.algbw_gb_s * FACTOR[op], rel=1e-12)
    if op == "all_to_all":  # ranks 0–3: all on node-0
        assert row.scope == INTRA and row.link_fraction is None
    else:
        assert row.scope == INTER
        assert row.link_fraction == pytest.approx(row.busbw_gb_s / 50.0, rel=1e-12)


def test_the_group_table_names_roles_and_where_collectives_were_launched(multi_op: RunSteps):
    groups = {g.group: g for g in multi_op.groups}
    assert set(groups) == {"fsdp_shard", "default", "7", "ep"}
    fsdp, ddp = groups["fsdp_shard"], groups["default"]
    assert (fsdp.role, fsdp.launched_under, fsdp.group_size) == ("fsdp", cv.FORWARD, 8)
    assert fsdp.ops == ["all_gather", "reduce_scatter"] and fsdp.per_step == 2.0
    # wall time per rank and step: 15 ms gathers (12 on the late rank) and 5 ms scatters
    assert fsdp.wall_ms == pytest.approx((7 * 15 + 12) / 8 + 5, abs=NS_TOLERANCE_MS)
    assert (ddp.role, ddp.launched_under, ddp.group_desc) == (
        "data_parallel",
        cv.BACKWARD,
        "default_pg",
    )
    assert ddp.group_size == WORLD and ddp.per_step == 1.0
    assert ddp.wall_ms == pytest.approx(8.0, abs=NS_TOLERANCE_MS)
    assert groups["7"].role == "other" and groups["ep"].role == "expert"
    # per rank of the group: the all-to-all ran on 4 ranks, once a step each
    assert groups["ep"].group_size == 4 and groups["ep"].per_step == 1.0
    assert groups["ep"].wall_ms == pytest.approx(4.0, abs=NS_TOLERANCE_MS)
    for g in multi_op.groups:
        assert 0.0 <= g.exposed_ms <= g.wall_ms + NS_TOLERANCE_MS
    # a synchronous collective is on the critical path throughout
    assert groups["7"].exposed_ms == pytest.approx(2.0, abs=NS_TOLERANCE_MS)
    assert [g.wall_ms for g in multi_op.groups] == sorted(
        (g.wall_ms for g in multi_op.groups), reverse=True
    )


# --- a real 2-process gloo job --------------------------------------------------------

JOB = Path(__file__).with_name("gloo_allreduce_job.py")
JOB_STEPS = 6
JOB_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, dict[str, Any]]]:
    pytest.importorskip("torch.distributed")
    out = tmp_path_factory.mktemp("gloo")
    (port,) = free_ports(1)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRACEKIT_STRICT": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(JOB), str(rank), "2", str(port), str(out), str(JOB_STEPS)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        errs = [p.communicate(timeout=JOB_TIMEOUT_S)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, err) in enumerate(zip(procs, errs, strict=True)):
        assert p.returncode == 0, f"rank {rank} failed:\n{err[-3000:]}"
    files = [trace_file(out, label, r) for label in ("hand", "ddp") for r in range(2)]
    meta = [json.loads((out / f"meta-rank{r}.json").read_text()) for r in range(2)]
    assert meta[0] == meta[1]
    with open_store(out / "t.duckdb") as store:
        ingest_paths(store, files)
        yield store, meta[0]


def _comm_spans(store: Store, label: str, first_step: int) -> list[tuple[int, int, int]]:
    """(bytes, duration ns, step) of the run's communication spans from ``first_step`` on."""
    rows = store.con.execute(
        """
        SELECT TRY_CAST(json_extract_string(attributes, $bytes) AS BIGINT),
               end_ns - start_ns,
               TRY_CAST(json_extract_string(attributes, $step) AS BIGINT) AS step
        FROM spans WHERE service_version = $v AND stage = $comm
        """,
        {
            "bytes": f'$."{cv.COMM_BYTES}"',
            "step": f'$."{cv.STEP}"',
            "v": label,
            "comm": cv.COMMUNICATION,
        },
    ).fetchall()
    return [(int(b), int(d), int(s)) for b, d, s in rows if s >= first_step]


def test_hand_called_all_reduces_give_one_row_per_size_with_the_tensor_bytes(gloo):
    store, meta = gloo
    run = load_run(store, "hand")
    kept_from = run.warmup_steps
    assert run.steps == JOB_STEPS - 1 and kept_from == 1 and run.world_size == 2
    sizes = sorted(set(HAND_SIZES))
    assert [r.bytes for r in run.collectives] == sizes
    spans = _comm_spans(store, "hand", kept_from)
    for row in run.collectives:
        assert (row.op, row.group, row.scope) == ("all_reduce", "default", INTRA)
        assert row.count == HAND_SIZES.count(int(row.bytes)) * run.steps
        # the process group as torch reports it
        assert row.group_size == meta["group_size"] == 2
        assert row.group_desc == meta["group_desc"]
        # factor 2(n−1)/n = 1 at n = 2
        assert row.busbw_gb_s == row.algbw_gb_s
        assert row.algbw_gb_s == pytest.approx(_gb_s(row.bytes, row.time_ms), rel=1e-9)
        # transfer ≤ the span on every rank; with 2 ranks a collective's median is their
        # mean, so the row's mean cannot exceed the spans' mean duration
        durations = [d for b, d, _ in spans if b == row.bytes]
        assert len(durations) == 2 * row.count
        assert 0 < row.time_ms <= sum(durations) / len(durations) / MS + NS_TOLERANCE_MS
    (group,) = run.groups
    assert (group.role, group.group_size, group.group_desc) == (
        "data_parallel",
        2,
        meta["group_desc"],
    )
    assert group.launched_under == cv.STEP_SPAN_NAME and group.per_step == len(HAND_SIZES)


def test_ddp_bucket_rows_carry_the_bucket_buffers_torch_reports(gloo):
    store, meta = gloo
    run = load_run(store, "ddp")
    # DDP's buckets after its first step, from its own logging, and recomputed from the
    # parameters each bucket holds
    logged = sorted(int(x) for x in meta["rebuilt_bucket_sizes"].split(","))
    params = meta["param_bytes"]
    buckets = [
        sum(params[int(i)] for i in group.split())
        for group in meta["rebuilt_per_bucket_param_indices"].split(",")
    ]
    assert sorted(buckets) == logged and sum(buckets) == sum(params)
    spans = _comm_spans(store, "ddp", run.warmup_steps)
    assert sorted({b for b, _, _ in spans}) == logged
    assert len(spans) == 2 * len(logged) * run.steps  # every bucket, every rank, every step
    assert sorted(r.bytes for r in run.collectives) == logged
    for row in run.collectives:
        assert (row.group_size, row.group_desc) == (2, meta["group_desc"])
        assert row.busbw_gb_s == row.algbw_gb_s and row.time_ms > 0
        assert row.algbw_gb_s == pytest.approx(_gb_s(row.bytes, row.time_ms), rel=1e-9)
    # every bucket counted every step, also one that gloo finished before the one before it
    assert all(r.count == run.steps for r in run.collectives)
    (group,) = run.groups
    assert (group.role, group.launched_under) == ("data_parallel", cv.BACKWARD)
    assert group.per_step == len(logged)


def test_gloo_collectives_of_a_group_run_at_once_and_are_never_queued():
    # c0 runs 0-100 ms, c1 launched at 10 ends at 120: on NCCL c1 waits for c0's end,
    # on gloo (worker threads) it transfers from its launch
    nccl = [_ci(0, 0, 0, 100, backend="nccl"), _ci(0, 1, 10, 120, backend="nccl")]
    gloo = [_ci(0, 0, 0, 100, backend="gloo"), _ci(0, 1, 10, 120, backend="gloo")]
    assert transfer_times(nccl)[("default", 1)] == [20 * MS]
    assert transfer_times(gloo)[("default", 1)] == [110 * MS]


def test_an_op_without_a_bus_factor_has_no_bus_bandwidth():
    rows = collective_table([_ci(r, 0, 0, 10, op="gather") for r in range(4)], 4, 400.0)
    (row,) = rows
    assert row.algbw_gb_s == pytest.approx(_gb_s(8 * MIB, 10.0))
    assert row.busbw_gb_s is None and row.link_fraction is None
    assert bus_factor("send", 8) == 1.0


def test_the_world_groups_name_says_nothing_so_fsdp_on_it_is_told_by_its_ops():
    assert group_role("default", "default_pg", ["all_gather", "reduce_scatter"]) == "fsdp"
    assert group_role("default", "default_pg", ["all_reduce"]) == "data_parallel"
    assert group_role("3", "dp_replicate", ["all_gather"]) == "data_parallel"
