"""Profiler rank files parsed in worker processes (``--jobs``) store what a serial ingest
stores: the same rows, problems, exit code and duplicate-rank rule, in file order."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kineto.builder import Profile
from tracekit.analysis.facade import ingest
from tracekit.analysis.ingest import detect, parallel
from tracekit.analysis.store import open_store
from tracekit.cli import main
from tracekit.errors import IngestError

COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def rank_profile(rank: int | None, world: int = 6, kernels: int = 3) -> Profile:
    """Three 1 ms steps with forward, backward, an optimizer step and one all-reduce."""
    p = Profile(rank=rank, world=world)
    for i in range(3):
        t = 1000.0 * i
        p.cpu(f"ProfilerStep#{i + 1}", t, 1000)
        p.cpu("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, 100)
        p.cpu("## forward ##", t + 100, 300)
        p.cpu("## backward ##", t + 400, 400)
        p.cpu("Optimizer.step#SGD.step", t + 800, 150)
        for k in range(kernels):
            p.kernel("void gemm_kernel<float>()", t + 120 + k * 0.01, t + 150 + k * 10, 8)
        p.kernel(COMM, t + 500 + (rank or 0), t + 600, 300, stream=20)
    return p


def rank_dir(folder: Path, ranks: int = 6) -> Path:
    folder.mkdir()
    for r in range(ranks):
        rank_profile(r).write(folder / f"rank{r}.json", gz=r % 2 == 1)
    return folder


def contents(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tables an ingest writes, in a fixed order (times of day left out)."""
    with open_store(db, read_only=True) as s:
        return {
            "spans": s.run("SELECT * FROM spans ORDER BY ALL"),
            "kineto_gpu": s.run("SELECT * FROM kineto_gpu ORDER BY ALL"),
            "requests": s.run("SELECT * FROM requests ORDER BY ALL"),
            "ingest_log": s.run("SELECT source, spans, problems FROM ingest_log ORDER BY ALL"),
        }


def both_ways(inputs: list[Path], tmp_path: Path, **kw: Any) -> tuple[Any, Any]:
    """The same ingest with ``jobs=1`` and ``jobs=2``, each into its own store."""
    outcomes = []
    for jobs in (1, 2):
        db = tmp_path / f"jobs{jobs}.duckdb"
        outcomes.append((ingest(inputs, store=db, version="run", jobs=jobs, **kw), db))
    return outcomes[0], outcomes[1]


def test_parallel_ingest_stores_the_rows_a_serial_one_does(tmp_path):
    folder = rank_dir(tmp_path / "ranks")
    (serial, db1), (pooled, db2) = both_ways([folder], tmp_path)
    assert serial.report.skipped == pooled.report.skipped == 0
    first, second = contents(db1), contents(db2)
    assert len(first["spans"]) > 6 * 3 and len(first["kineto_gpu"]) == 6 * 4
    assert first == second
    assert pooled.report.summary_line() == serial.report.summary_line()
    assert pooled.report.trace_ids == serial.report.trace_ids


def test_damaged_file_and_second_rank_file_give_the_same_problems_and_exit_2(tmp_path, capsys):
    folder = rank_dir(tmp_path / "ranks", ranks=5)
    text = json.dumps(rank_profile(5).document(), indent=1)
    (folder / "rank3.json").write_text(text[: len(text) // 2])  # cut short: rank 3 not read
    rank_profile(2).write(folder / "rank5_again_2.json")  # after rank2.json in file order
    rank_profile(None).write(folder / "rank6_no_info.json")  # rank 0 of 1: rank 0 again
    (serial, db1), (pooled, db2) = both_ways([folder], tmp_path)
    assert pooled.report.problems == serial.report.problems
    assert pooled.report.counts == serial.report.counts
    assert serial.report.skipped == 3
    reasons = {Path(p.where).name: p.reason for p in serial.report.skipping_problems}
    assert set(reasons) == {"rank3.json", "rank5_again_2.json", "rank6_no_info.json"}
    assert "file ends early" in reasons["rank3.json"]
    assert reasons["rank5_again_2.json"].startswith(f"rank 2 again (first in {folder}/rank2.json")
    assert contents(db1) == contents(db2)
    with open_store(db2, read_only=True) as s:
        assert s.run("SELECT DISTINCT rank FROM kineto_gpu ORDER BY 1") == [(0,), (1,), (2,), (4,)]

    outputs = []
    for jobs in ("1", "2"):
        db = tmp_path / f"cli{jobs}.duckdb"
        code = main(["ingest", str(folder), "--db", str(db), "--version", "run", "--jobs", jobs])
        err = capsys.readouterr().err.splitlines()
        outputs.append((code, err))
    assert outputs[0] == outputs[1]
    code, err = outputs[0]
    assert code == 2
    assert [ln for ln in err if ln.startswith(str(folder / "rank3.json"))] == [
        f"{folder / 'rank3.json'}: {reasons['rank3.json']}"
    ]


def test_strict_stops_at_the_same_file_with_the_same_error(tmp_path):
    folder = rank_dir(tmp_path / "ranks", ranks=4)
    rank_profile(1).write(folder / "rank1_again.json")  # the first problem, in file order
    (folder / "rank3.json").write_text('{"schemaVersion": 1, "traceEvents": [')
    errors = []
    for jobs in (1, 2):
        with pytest.raises(IngestError) as caught:
            ingest([folder], store=tmp_path / f"s{jobs}.duckdb", strict=True, jobs=jobs)
        errors.append(str(caught.value))
        assert not (tmp_path / f"s{jobs}.duckdb").exists()  # a failed ingest leaves no store
    assert errors[0] == errors[1] and "rank 1 again" in errors[0]


def test_progress_names_each_file_once_and_ends_at_the_total(tmp_path):
    folder = rank_dir(tmp_path / "ranks")
    (folder / "notes.jsonl").write_text("")  # not a profile: read in this process
    files = sorted(str(p) for p in folder.iterdir())
    total = sum(Path(f).stat().st_size for f in files)
    for jobs in (1, 2):
        told: list[tuple[int, int, str]] = []
        ingest(
            [folder],
            store=tmp_path / f"p{jobs}.duckdb",
            version="run",
            jobs=jobs,
            progress=lambda done, of, name: told.append((done, of, name)),  # noqa: B023
        )
        assert sorted(name for _, _, name in told) == files
        assert [done for done, _, _ in told] == sorted(done for done, _, _ in told)
        assert told[-1][:2] == (total, total)
        if jobs == 1:
            assert [name for _, _, name in told] == files  # one after another


def test_a_two_argument_progress_gets_bytes_only(tmp_path):
    folder = rank_dir(tmp_path / "ranks", ranks=3)
    told: list[tuple[int, int]] = []
    ingest([folder], store=tmp_path / "s.duckdb", jobs=2, progress=lambda d, t: told.append((d, t)))
    assert len(told) == 3 and told[-1][0] == told[-1][1]


def test_no_worker_for_one_job_one_profile_or_other_formats(tmp_path):
    folder = rank_dir(tmp_path / "ranks", ranks=2)
    (folder / "otlp.jsonl").write_text('{"resourceSpans": []}\n')
    files = list(detect.expand([folder]))
    options: dict[str, Any] = {"version": None, "comm_pattern": None, "on_done": lambda n: None}
    with parallel.KinetoPool.start(files, 1, **options) as pool:
        assert not any(n in pool for n in range(len(files)))
    with parallel.KinetoPool.start(files[:1] + files[2:], 4, **options) as pool:
        assert not any(n in pool for n in range(len(files) - 1))  # one profile: no pool
    with parallel.KinetoPool.start(files, 4, **options) as pool:
        assert [n in pool for n in range(len(files))] == [False, True, True]  # otlp.jsonl first


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_jobs_below_one_is_one_line_exit_2(tmp_path, capsys, jobs):
    folder = rank_dir(tmp_path / "ranks", ranks=2)
    code = main(["ingest", str(folder), "--db", str(tmp_path / "s.duckdb"), "--jobs", jobs])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"--jobs {jobs}" in err[0]


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").iterdir():
            kids = [int(k) for k in (task / "children").read_text().split()]
            found.extend(kids)
            todo.extend(kids)
    return found


def _kill_the_reader_of(path: Path, stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL the process (a worker, below this one) that has ``path`` open."""
    target = str(path)
    while not stop.is_set():
        for pid in _descendants(os.getpid()):
            try:
                fds = list(Path(f"/proc/{pid}/fd").iterdir())
                if any(os.readlink(fd) == target for fd in fds):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                    return
            except OSError:  # it ended meanwhile
                continue
        time.sleep(0.001)


@pytest.mark.skipif(
    not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(),
    reason="finds the worker through /proc/PID/task/TID/children (Linux)",
)
def test_a_worker_that_dies_loses_only_the_file_it_was_reading(tmp_path):
    folder = rank_dir(tmp_path / "ranks", ranks=5)
    # A profile big enough to be caught while a worker parses it (~0.3 s), first in order.
    big = rank_profile(9, world=10, kernels=4000).write(folder / "rank0_big.json")
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_the_reader_of, args=(big, stop, killed))
    killer.start()
    try:
        outcome = ingest([folder], store=tmp_path / "s.duckdb", version="run", jobs=2)
    finally:
        stop.set()
        killer.join()
    assert killed, "the big profile was parsed before its worker could be killed"
    assert [str(p) for p in outcome.report.skipping_problems] == [f"{big}: {parallel.WORKER_DIED}"]
    with open_store(tmp_path / "s.duckdb", read_only=True) as s:
        assert s.run("SELECT DISTINCT rank FROM kineto_gpu ORDER BY 1") == [(r,) for r in range(5)]
