"""Real profiles of a real 2-rank DDP job (gloo, CPU) against the step spans of that job.

One job, two views of the same steps: tracekit's ``train_steps``/``instrument_ddp``
spans and ``torch.profiler``'s Kineto files. Ingested into one store, the profile's
steps are the instrumented steps it recorded, on both ranks, and its collectives take
the time the DDP hook measured (within 30 %: the hook starts its clock before the
collective's call and stops it on a callback), matched across ranks by (group, seq).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import ingest_paths

pytest.importorskip("torch")

JOB = Path(__file__).with_name("ddp_profile_job.py")
PROFILED_STEPS = [2, 3, 4, 5]  # schedule(wait=1, warmup=1, active=4)

_STEP = "(attributes->>'$.\"tracekit.step\"')::INT"
_RANK = "(resource_attributes->>'$.\"tracekit.rank\"')::INT"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ddp")
    subprocess.run(
        [sys.executable, str(JOB), str(out), str(_port())],
        check=True,
        timeout=240,
        capture_output=True,
    )
    return out


def test_profiles_and_step_spans_of_one_ddp_job_agree(job, store):
    spans = ingest_paths(store, sorted(job.glob("steps-rank*.jsonl")))
    profiles = ingest_paths(store, sorted(job.glob("rank*.pt.trace.json")), version="prof")
    assert spans.skipped == 0 and profiles.skipped == 0
    per_request.refresh(store)

    steps = store.run(
        f"SELECT service_version, {_RANK}, list({_STEP} ORDER BY {_STEP}) FROM spans "
        "WHERE name = $n GROUP BY ALL ORDER BY ALL",
        {"n": cv.STEP_SPAN_NAME},
    )
    by_view = {(view, rank): numbers for view, rank, numbers in steps}
    for rank in (0, 1):
        assert by_view[("prof", rank)] == PROFILED_STEPS
        assert set(PROFILED_STEPS) <= set(by_view[("spans", rank)])
    assert store.run("SELECT count(*) FROM requests WHERE release = 'prof'") == [(8,)]

    comm = store.run(
        f"SELECT service_version, {_RANK}, count(*), sum(end_ns - start_ns) FROM spans "
        f"WHERE stage = $c AND {_STEP} IN (2, 3, 4, 5) GROUP BY ALL",
        {"c": cv.COMMUNICATION},
    )
    total = {(view, rank): (n, ns) for view, rank, n, ns in comm}
    for rank in (0, 1):
        (n_prof, ns_prof), (n_spans, ns_spans) = total[("prof", rank)], total[("spans", rank)]
        assert n_prof == n_spans  # one collective per DDP bucket in both views
        assert 0.7 <= ns_prof / ns_spans <= 1.3, (rank, ns_prof, ns_spans)

    # the same collectives carry the same (group, seq) on both ranks
    keys = store.run(
        f"SELECT {_RANK}, list(seq ORDER BY seq) FROM (SELECT *, (attributes->>'$.\"tracekit.comm.seq\"')::INT AS seq "
        "FROM spans) WHERE stage = $c AND service_version = 'prof' GROUP BY 1 ORDER BY 1",
        {"c": cv.COMMUNICATION},
    )
    assert keys[0][1] == keys[1][1] == list(range(len(keys[0][1])))
