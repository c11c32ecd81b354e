"""Real 2-rank DDP over gloo (processes on 127.0.0.1), read back through ingest.

One 1-rank baseline is shared; each injected problem is one 2-rank job of a few steps.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import open_store
from tracekit.analysis.training.diff import diff_runs
from tracekit.analysis.training.steps import load_run
from tracekit.demo.trainer import TRAINING_REGRESSIONS, JobSpec, run_job

STEPS = 8


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("baseline")
    return run_job(JobSpec("1rank", 1, out, steps=STEPS))


@pytest.mark.parametrize("problem", ["straggler", "data", "comm"])
def test_the_injected_problem_is_named(problem: str, baseline: list[Path], tmp_path: Path) -> None:
    spec = JobSpec("2rank", 2, tmp_path, TRAINING_REGRESSIONS[problem], steps=STEPS)
    files = run_job(spec)
    with open_store(tmp_path / "t.duckdb") as store:
        ingest_paths(store, [*baseline, *files])
        run = load_run(store, "2rank", warmup=0)
        d = diff_runs(store, "1rank", "2rank")
        steps = store.con.execute(
            "SELECT count(*) FROM spans WHERE name = $n AND service_version = '2rank'",
            {"n": cv.STEP_SPAN_NAME},
        ).fetchone()
        seqs = store.con.execute(
            "SELECT json_extract_string(attributes, '$.\"tracekit.comm.seq\"'), "
            "json_extract_string(resource_attributes, '$.\"tracekit.rank\"') "
            "FROM spans WHERE stage = 'communication' AND service_version = '2rank'"
        ).fetchall()
    assert steps == (2 * STEPS,)
    # every collective number appears once on each rank
    per_seq = Counter(seq for seq, _ in seqs)
    assert per_seq and set(per_seq.values()) == {2}
    assert run.collectives == len(per_seq)
    # critical-path components add up to the step time
    assert sum(c.mean_ms for c in run.components) == pytest.approx(run.step_ms_mean, rel=1e-6)
    assert d.verdict.bottleneck == TRAINING_REGRESSIONS[problem].expected, d.verdict.summary
    if problem == "straggler":
        assert run.stragglers[0].rank == 1 and d.verdict.ranks == [1]
