"""One definition of exposed communication: ingest's tables and ``tracekit steps`` agree.

A DDP bucket (``tracekit.comm.async``) launched during ``backward`` is charged only
from the stage's last launch on; ``request_stages`` (filled at ingest by the vectorised
walk) and the steps analysis (the reference walk) must hold the same numbers.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import critical_path as cp
from tracekit.analysis.attribution import per_request
from tracekit.analysis.store import open_store
from tracekit.analysis.training.model import COMPUTE_STAGES, IMBALANCE, PEER_WAIT, TRANSFER
from tracekit.analysis.training.steps import load_run
from tracekit.testing import TraceBuilder, training_run

MS = 1_000_000


def _stage_rows(store) -> dict[tuple[int, int], dict[str, float]]:
    """(rank, step) -> stage -> critical ms, from request_stages."""
    rows = store.con.execute(
        """
        SELECT TRY_CAST(json_extract_string(s.resource_attributes, '$."tracekit.rank"') AS INT),
               TRY_CAST(json_extract_string(s.attributes, '$."tracekit.step"') AS INT),
               rs.stage, rs.critical_ns
        FROM request_stages rs JOIN requests r USING (trace_id)
        JOIN spans s ON s.trace_id = r.trace_id AND s.span_id = r.root_span_id
        WHERE s.service_version = '64gpu'
        """
    ).fetchall()
    out: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    for rank, step, stage, crit in rows:
        out[(rank, step)][stage] = crit / MS
    return out


def test_a_bucket_launched_in_backward_is_charged_only_after_the_last_launch(tmp_path):
    b = TraceBuilder(service="trainer", version="one", seed=0)
    s = b.step(0, rank=0, world_size=1, start_ms=0, duration_ms=100, samples=8, version="one")
    bw = s.stage(cv.BACKWARD, start_ms=10, duration_ms=80)
    # launched at 30 and 70 ms into the step; backward computes until 70, the buckets end
    # at 60 and 85: only 70 → 85 is exposed, 15 ms, though the spans cover 45 ms
    s.collective(0, start_ms=30, duration_ms=30, parent=bw, background=True)
    s.collective(1, start_ms=70, duration_ms=15, parent=bw, background=True)
    with open_store(tmp_path / "t.duckdb") as store:
        b.load(store)
        crit, wall = store.con.execute(
            "SELECT critical_ns, wall_ns FROM request_stages WHERE stage = 'communication'"
        ).fetchone()
        c = per_request.fetch_spans(store, None)
    assert crit == 15 * MS
    assert wall == 45 * MS  # wall time keeps the collectives' real intervals
    a = cp.analyse_trace(per_request.trace_input(c, 0, len(c["trace_id"])))
    assert {t.stage: t.critical_ns for t in a.stages}[cv.COMMUNICATION] == 15 * MS


def test_steps_components_equal_the_request_stages_rows(tmp_path):
    b = TraceBuilder(service="trainer", version="64gpu", seed=4)
    training_run(b, world_size=16, steps=8, version="64gpu", straggler=(5, 12.0), jitter_ms=3.0)
    with open_store(tmp_path / "t.duckdb") as store:
        b.load(store)
        run = load_run(store, "64gpu", warmup=1)
        rows = _stage_rows(store)
    kept = {step for _, step in rows if step >= 1}
    assert run.steps == len(kept) == 7

    def mean_of(stages: tuple[str, ...], rank: int | None = None) -> float:
        vals = [
            sum(v.get(s, 0.0) for s in stages)
            for (r, step), v in rows.items()
            if step in kept and (rank is None or r == rank)
        ]
        return sum(vals) / len(vals)

    by = {c.name: c.mean_ms for c in run.components}
    assert by[cv.DATA_WAIT] == pytest.approx(mean_of((cv.DATA_WAIT,)), abs=1e-6)
    # compute keeps the fastest rank's time; the rest of every rank's is the imbalance
    compute = sum(by[s] for s in COMPUTE_STAGES) + by[IMBALANCE]
    assert compute == pytest.approx(mean_of(COMPUTE_STAGES), abs=1e-6)
    # exposed communication, split by arrival into peer wait and transfer
    exposed = by[PEER_WAIT] + by[TRANSFER]
    assert exposed == pytest.approx(mean_of((cv.COMMUNICATION,)), abs=1e-6)
    assert exposed > 0
    for r in run.ranks:
        assert r.comm_exposed_ms == pytest.approx(mean_of((cv.COMMUNICATION,), r.rank), abs=1e-6)
        assert r.data_wait_ms == pytest.approx(mean_of((cv.DATA_WAIT,), r.rank), abs=1e-6)
        assert r.compute_ms == pytest.approx(mean_of(COMPUTE_STAGES, r.rank), abs=1e-6)


def test_random_background_collectives_attribute_as_the_reference_does(tmp_path):
    """The vectorised walk (ingest) against the reference on random steps with buckets."""
    rnd = random.Random(7)
    b = TraceBuilder(service="trainer", version="r", seed=7)
    for k in range(150):
        dur = rnd.uniform(50, 120)
        s = b.step(k, rank=0, world_size=1, start_ms=k * 200.0, duration_ms=dur, version="r")
        stages = []
        t = 0.0
        for name in (cv.DATA_WAIT, cv.FORWARD, cv.BACKWARD, cv.OPTIMIZER):
            d = rnd.uniform(0, dur / 4)
            stages.append(s.stage(name, start_ms=t, duration_ms=d))
            t += d
        for q in range(rnd.randint(0, 4)):
            parent = rnd.choice(stages)
            start = rnd.uniform(0, dur)
            s.collective(
                q,
                start_ms=start,
                duration_ms=rnd.choice([0.0, rnd.uniform(0, 40)]),
                parent=parent,
                background=rnd.random() < 0.7,
            )
    with open_store(tmp_path / "t.duckdb") as store:
        b.load(store)
        c = per_request.fetch_spans(store, None)
        want = {}
        for lo, hi in per_request.trace_bounds(c["trace_id"]):
            a = cp.analyse_trace(per_request.trace_input(c, lo, hi))
            assert not isinstance(a, str)
            want[c["trace_id"][lo]] = sorted((t.stage, t.critical_ns, t.wall_ns) for t in a.stages)
        got: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
        for tid, stage, crit, wall in store.con.execute(
            "SELECT trace_id, stage, critical_ns, wall_ns FROM request_stages"
        ).fetchall():
            got[tid].append((stage, crit, wall))
    assert {k: sorted(v) for k, v in got.items()} == want
