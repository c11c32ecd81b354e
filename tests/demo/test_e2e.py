"""End to end: real services, real load, and `tracekit diff` names what v2 broke.

One v1 run is shared by every case; each case runs its own v2 (labelled ``v2-<kind>``)
with one regression, ingests both into a fresh store and reads the verdict of
``tracekit diff --format json`` through the CLI. Runs are short (a few seconds at a
modest rate), so the whole module stays within a couple of minutes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.demo.regressions import REGRESSIONS
from tracekit.demo.runner import ReleaseRun, diff_verdict, ingest, run_release

from .conftest import assert_all_gone

RATE = 30.0
DURATION_S = 8.0
SEED = 0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> ReleaseRun:
    workdir = tmp_path_factory.mktemp("v1")
    run = run_release(workdir, "v1", "", rate=RATE, duration_s=DURATION_S, seed=SEED)
    assert_all_gone(run.pids)
    return run


# "none" first: v1 against v1 is only meaningful when both ran under the same conditions,
# so it runs right after the shared baseline.
KINDS = ["none", *(k for k in REGRESSIONS if k != "none")]


@pytest.mark.parametrize("kind", KINDS)
def test_diff_names_the_injected_stage_and_kind(
    baseline: ReleaseRun, kind: str, tmp_path: Path
) -> None:
    regression = REGRESSIONS[kind]
    label = f"v2-{kind}"
    run = run_release(tmp_path, label, kind, rate=RATE, duration_s=DURATION_S, seed=SEED)
    assert_all_gone(run.pids)
    assert run.load.failed == 0, run.load.errors
    db = tmp_path / "tracekit.duckdb"
    assert ingest(db, [*baseline.trace_files, *run.trace_files]) == 0
    verdict = diff_verdict(db, "v1", label)
    message = f"{kind}: {verdict.get('summary')}"
    assert verdict["kind"] == regression.expected_kind, message
    if regression.expected_stages:
        assert verdict["primary_stage"] in regression.expected_stages, message
