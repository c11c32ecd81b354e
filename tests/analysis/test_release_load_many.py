"""load_releases: several releases from one scan and one join equal each loaded alone,
and both equal what SQL says row by row; the diff over them equals the diff of releases
loaded one by one (a real DuckDB store)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import ReleaseData, load_release, load_releases
from tracekit.analysis.compare.diff import compute_diff, diff_releases
from tracekit.analysis.store import Store, open_store
from tracekit.errors import QueryError
from tracekit.testing import TraceBuilder


def _build(store: Store) -> None:
    v1 = TraceBuilder(version="v1", seed=3)
    # Ties on the start nanosecond (the trace id decides), measured CPU on one stage.
    for k, start in enumerate([4.0, 0.0, 4.0, 2.0, 4.0, 1.0]):
        req = v1.request(start_ms=start, duration_ms=60.0 + k)
        req.stage(cv.MODEL_EXECUTE, start_ms=0.0, duration_ms=10.0 + k, cpu_ms=9.0 + k)
        req.stage(cv.DOWNSTREAM, start_ms=20.0, duration_ms=30.0)
    v2 = TraceBuilder(version="v2", seed=4, instance_id="ranker-7")
    for k in range(5):
        req = v2.request(start_ms=10.0 - k, duration_ms=40.0 + k, weight=2.0 if k % 2 else None)
        req.stage(cv.FEATURE_RETRIEVAL, start_ms=0.0, duration_ms=5.0 + k)
        # A user stage declared compute once and wait otherwise: the most common kind wins.
        kind = cv.COMPUTE if k == 0 else cv.WAIT
        req.stage("rerank", start_ms=10.0, duration_ms=3.0, time_kind=kind, gpu_ms=1.0)
    v3 = TraceBuilder(version="v3", seed=5)
    v3.request(start_ms=0.0, duration_ms=10.0, route="/other").stage(
        cv.PREPROCESS, start_ms=0.0, duration_ms=2.0
    )
    # Interleaved, so one release's rows do not lie together in the tables.
    for builder in (v2, v1, v3):
        builder.load(store)


def _expected(store: Store, label: str) -> dict[str, object]:
    """What the release holds, by SQL alone: requests in (start, trace id) order and each
    (request, stage) cell of the matrices."""
    ids = [
        r[0]
        for r in store.run(
            "SELECT trace_id FROM requests WHERE release = ? ORDER BY start_ns, trace_id", [label]
        )
    ]
    cells = {
        (t, s): (c / 1e6, w / 1e6, cpu, gpu)
        for t, s, c, w, cpu, gpu in store.run(
            "SELECT s.trace_id, s.stage, s.critical_ns, s.wall_ns, s.cpu_time_ns, s.gpu_time_ns "
            "FROM request_stages s JOIN requests r USING (trace_id) WHERE r.release = ?",
            [label],
        )
    }
    return {"ids": ids, "cells": cells}


def _same(a: ReleaseData, b: ReleaseData) -> None:
    for f in dataclasses.fields(ReleaseData):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape, f.name
            if x.dtype == object:
                assert x.tolist() == y.tolist(), f.name
            else:
                assert np.array_equal(x, y, equal_nan=True), f.name
        else:
            assert x == y, f.name


def test_several_releases_load_as_each_alone_and_as_sql_says(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.duckdb") as store:
        _build(store)
        together = load_releases(store, ["v2", "v1", "v3", "v2"])
        alone = [load_release(store, label) for label in ("v2", "v1", "v3", "v2")]
        expected = {label: _expected(store, label) for label in ("v1", "v2", "v3")}
    for a, b in zip(together, alone, strict=True):
        _same(a, b)
    # A label asked twice: equal, but arrays of its own.
    assert together[0].stage_ms is not together[3].stage_ms
    v2, v1, v3 = together[:3]
    assert v1.stages == (cv.MODEL_EXECUTE, cv.DOWNSTREAM, cv.UNATTRIBUTED)
    assert v2.stages == (cv.FEATURE_RETRIEVAL, "rerank", cv.UNATTRIBUTED)
    assert v3.stages == (cv.PREPROCESS, cv.UNATTRIBUTED)
    assert v2.time_kinds["rerank"] == cv.WAIT
    assert v2.weights.tolist() == [1.0, 2.0, 1.0, 2.0, 1.0][::-1]
    assert set(v2.instance_ids.tolist()) == {"ranker-7"}
    for rel in (v1, v2, v3):
        want = expected[rel.label]
        assert rel.trace_ids.tolist() == want["ids"]
        assert np.allclose(rel.stage_ms.sum(axis=1), rel.duration_ms)
        for i, trace_id in enumerate(rel.trace_ids):
            for j, stage in enumerate(rel.stages):
                crit, wall, cpu, gpu = want["cells"].get((trace_id, stage), (0.0, 0.0, None, None))
                assert rel.stage_ms[i, j] == crit
                assert rel.stage_wall_ms[i, j] == wall
                for got, ns in ((rel.stage_cpu_ms[i, j], cpu), (rel.stage_gpu_ms[i, j], gpu)):
                    assert math.isnan(got) if ns is None else got == ns / 1e6


def test_unknown_or_empty_release_is_named_first_in_the_order_asked(tmp_path: Path) -> None:
    with open_store(tmp_path / "s.duckdb") as store:
        _build(store)
        with pytest.raises(QueryError, match="'nope'.*v1"):
            load_releases(store, ["v1", "nope", "v2"])
        with pytest.raises(QueryError, match="release 'v1' has no requests"):
            load_releases(store, ["v3", "v1"], route="/other")
        (only,) = load_releases(store, ["v3"], route="/other")
    assert only.n == 1


def test_diff_of_releases_loaded_together_equals_the_diff_of_each_loaded_alone(
    tmp_path: Path,
) -> None:
    with open_store(tmp_path / "s.duckdb") as store:
        _build(store)
        together = diff_releases(store, "v1", "v2", jaeger_url="http://jaeger:16686")
        alone = compute_diff(
            load_release(store, "v1"), load_release(store, "v2"), jaeger_url="http://jaeger:16686"
        )
    # repr: NaN fields (shares of a tail that did not grow) compare unequal to themselves.
    # Attributes, operations and patterns are read from the store beside the statistics.
    same = dataclasses.replace(together, attributes=[], operations=None, patterns=None)
    assert repr(same) == repr(alone)
    assert [d.ci_low for d in together.latency] == [d.ci_low for d in alone.latency]
    assert together.exemplars and together.exemplars == alone.exemplars
