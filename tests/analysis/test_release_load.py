"""load_release: request order and the stage matrix, on a real store."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import load_release
from tracekit.analysis.store import open_store
from tracekit.testing import TraceBuilder


def test_requests_come_in_start_then_trace_id_order_with_their_stage_rows(
    tmp_path: Path,
) -> None:
    builder = TraceBuilder()
    # Ties on the start nanosecond (trace id decides) among distinct starts.
    for k, start in enumerate([5.0, 0.0, 5.0, 5.0, 1.0, 0.0]):
        req = builder.request(start_ms=start, duration_ms=50.0 + k)
        req.stage(cv.MODEL_EXECUTE, start_ms=0.0, duration_ms=10.0 + k)
    other = TraceBuilder(version="v2", seed=1)
    other.request(start_ms=2.0).stage(cv.PREPROCESS, start_ms=0.0, duration_ms=3.0)
    with open_store(tmp_path / "s.duckdb") as store:
        builder.load(store)
        other.load(store)
        rel = load_release(store, "v1")
        expected = store.run(
            "SELECT trace_id, duration_ns FROM requests WHERE release = 'v1' "
            "ORDER BY start_ns, trace_id"
        )
    assert rel.trace_ids.tolist() == [t for t, _ in expected]
    assert rel.duration_ms.tolist() == [d / 1e6 for _, d in expected]
    assert cv.PREPROCESS not in rel.stages  # the other release's stage
    model = rel.stage_column(cv.MODEL_EXECUTE)
    assert np.allclose(rel.duration_ms - model, 40.0)
    assert np.allclose(rel.stage_ms.sum(axis=1), rel.duration_ms)
