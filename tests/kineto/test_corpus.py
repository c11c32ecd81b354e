"""Every real profiler file of the corpus (tests/data/corpus/kineto) ingests, with what its README says."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import open_store
from tracekit.cli import main

REPO = Path(__file__).resolve().parents[2]
KINETO = REPO / "tests" / "data" / "corpus" / "kineto"

# file: (rank, world, ProfilerStep numbers, collectives launched inside a step)
EXPECTED = {
    "hta_nccl_parser_config_nccl_data.json.gz": (0, 2, [4, 5, 6], 21),
    "hta_cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": (34, 300, [551], 2),
    "hta_ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": (
        0, 1, [101, 102, 103, 104, 105], 35),  # host calls: NCCL ran no kernel in a world of 1
    "hta_amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz": (0, 1, [1, 2], 0),
    "hta_trace_diff_test_test.json.gz": (1, 2, [1009, 1010, 1011, 1012, 1013, 1014], 64),
}  # fmt: skip


@pytest.fixture(scope="module")
def corpus_store(tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("kineto") / "corpus.duckdb"
    reports = {}
    with open_store(db) as store:
        for name in EXPECTED:
            report = ingest_paths(store, [KINETO / name], version=name)
            per_request.refresh(store, report.trace_ids)
            reports[name] = report
        yield store, reports


def test_the_corpus_lists_every_file_this_test_checks():
    assert sorted(p.name for p in KINETO.glob("*.gz")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file_ingests_with_its_steps_rank_and_collectives(corpus_store, name):
    store, reports = corpus_store
    rank, world, steps, collectives = EXPECTED[name]
    report = reports[name]
    assert report.skipped == 0, report.skipping_problems
    assert set(report.counts) <= {"kineto_no_rank"}
    rows = store.run(
        "SELECT (attributes->>'$.\"tracekit.step\"')::INT, "
        "(resource_attributes->>'$.\"tracekit.rank\"')::INT, "
        "(resource_attributes->>'$.\"tracekit.world_size\"')::INT "
        "FROM spans WHERE name = $n AND service_version = $v ORDER BY 1",
        {"n": cv.STEP_SPAN_NAME, "v": name},
    )
    assert rows == [(n, rank, world) for n in steps]
    assert store.run("SELECT count(*) FROM requests WHERE release = $v", {"v": name}) == [
        (len(steps),)
    ]
    comm = store.run(
        "SELECT count(*), count(DISTINCT (attributes->>'$.\"tracekit.comm.seq\"')) FROM spans "
        "WHERE stage = $c AND service_version = $v",
        {"c": cv.COMMUNICATION, "v": name},
    )
    assert comm == [(collectives, collectives)]


def test_rocm_profile_without_distributed_info_warns(corpus_store):
    _store, reports = corpus_store
    report = reports["hta_amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz"]
    assert report.counts == {"kineto_no_rank": 1}


def test_cpu_only_gloo_profile_has_host_collectives_and_no_gpu_rows(corpus_store):
    store, _ = corpus_store
    name = "hta_cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    ops = store.run(
        "SELECT DISTINCT attributes->>'$.\"tracekit.comm.op\"', "
        "attributes->>'$.\"tracekit.comm.backend\"', attributes->>'$.\"tracekit.comm.bytes\"' "
        "FROM spans WHERE stage = 'communication' AND service_version = $v",
        {"v": name},
    )
    # gloo:all_reduce annotations carry Input Dims and type: float32 elements
    assert {(op, backend) for op, backend, _ in ops} == {("all_reduce", "gloo")}
    assert str(321271 * 4) in {nbytes for _, _, nbytes in ops}
    assert store.run("SELECT count(*) FROM kineto_gpu WHERE run_label = $v", {"v": name}) == [(0,)]


def test_nccl_collectives_carry_op_bytes_and_group_from_record_param_comms(corpus_store):
    store, _ = corpus_store
    name = "hta_nccl_parser_config_nccl_data.json.gz"
    ops = dict(
        store.run(
            "SELECT attributes->>'$.\"tracekit.comm.op\"', count(*) FROM spans "
            "WHERE stage = 'communication' AND service_version = $v GROUP BY 1",
            {"v": name},
        )
    )
    assert ops == {"all_reduce": 15, "broadcast": 6}
    groups = store.run(
        "SELECT DISTINCT attributes->>'$.\"tracekit.comm.group\"' FROM spans "
        "WHERE stage = 'communication' AND service_version = $v",
        {"v": name},
    )
    assert groups == [("default",)]


def test_whole_corpus_directory_through_the_cli(tmp_path, capsys):
    # Several files are rank 0 of different jobs: one run label takes the first only.
    code = main(["ingest", str(KINETO), "--db", str(tmp_path / "s.duckdb"), "--version", "x"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("rank 0 again") == 2
    assert "Traceback" not in err
