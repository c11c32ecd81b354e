"""A small store with a v1 → v2 batch-queue regression, and a real headless Chromium.

The store is built with :class:`tracekit.testing.TraceBuilder` and analysed by the real
attribution; its time line (two replicas, CPU, in-flight, queue depth) is long enough
for the autoscaling audit to draw windows. Browser tests skip only when
``/usr/bin/chromium`` is absent (``apt-get install chromium``; the tests install nothing).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request as attribution
from tracekit.analysis.store import SPAN_COLUMNS, open_store
from tracekit.testing import TraceBuilder

from .browser import CHROMIUM, Browser

N = 1000
"""Requests per release."""
SPACING_MS = 200.0
"""Arrival spacing: 1000 requests span 200 s, i.e. ~7 windows of 30 s per release."""


def _ms(rng: np.random.Generator, median: float, sd: float = 0.25) -> float:
    # whole microseconds, so back-to-back stages share exact nanosecond boundaries
    return round(float(rng.lognormal(np.log(median), sd)), 3)


def build(
    builder: TraceBuilder, version: str, seed: int, *, t0_ms: float, slow_queue: bool
) -> None:
    """The reference pipeline; in v2 the batch queue waits long for a quarter of requests,
    as the load rises (so the latency objective breaks while CPU stays flat)."""
    rng = np.random.default_rng(seed)
    for i in range(N):
        load = i / N
        hit = bool(rng.random() >= 0.05)
        fr = _ms(rng, 3.0) if hit else _ms(rng, 30.0, 0.1)
        queue = _ms(rng, 6.0, 0.4)
        if slow_queue and rng.random() < 0.25 + 0.5 * load:
            queue = _ms(rng, 45.0 + 40.0 * load, 0.2)
        seq = [_ms(rng, 4.0), queue, _ms(rng, 12.0, 0.15), _ms(rng, 2.0)]
        down = _ms(rng, 20.0, 0.2)
        total = round(fr + sum(seq) + down + 0.4, 3)
        inflight = 2.0 + (12.0 * load if slow_queue else 0.0) + float(rng.uniform(0, 1))
        r = builder.request(
            start_ms=t0_ms + i * SPACING_MS,
            duration_ms=total,
            version=version,
            instance_id=f"ranker-{i % 2}",
            attributes={
                cv.INFLIGHT: inflight,
                cv.QUEUE_DEPTH: inflight / 2,
                cv.CPU_UTILIZATION: 0.35 + float(rng.uniform(-0.03, 0.03)),
            },
        )
        t = 0.0
        r.stage(cv.FEATURE_RETRIEVAL, start_ms=t, duration_ms=fr, attributes={cv.CACHE_HIT: hit})
        t = round(t + fr, 3)
        for stage, d in zip(
            (cv.PREPROCESS, cv.BATCH_QUEUE, cv.MODEL_EXECUTE, cv.POSTPROCESS), seq, strict=True
        ):
            r.stage(stage, start_ms=t, duration_ms=d)
            t = round(t + d, 3)
        call = r.stage(
            cv.DOWNSTREAM, start_ms=t, duration_ms=down, attributes={cv.SERVER_ADDRESS: "pricing"}
        )
        r.span(
            "GET /price",
            start_ms=round(t + 0.2, 3),
            duration_ms=round(down - 0.4, 3),
            kind="SERVER",
            parent=call,
            service="pricing",
        )


@pytest.fixture(scope="session")
def report_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("report") / "tracekit.duckdb"
    b = TraceBuilder(service="ranker", version="v1", seed=3)
    build(b, "v1", 1, t0_ms=0.0, slow_queue=False)
    build(b, "v2", 2, t0_ms=N * SPACING_MS, slow_queue=True)
    columns = list(zip(*b.rows(), strict=True))
    params = {f"c{i}": list(col) for i, col in enumerate(columns)}
    select = ", ".join(f"unnest($c{i})" for i in range(len(SPAN_COLUMNS)))
    with open_store(path) as store:
        # One bulk statement: row-at-a-time inserts would dominate the test's runtime.
        store.con.execute(
            f"INSERT OR IGNORE INTO spans ({', '.join(SPAN_COLUMNS)}) SELECT {select}", params
        )
        attribution.refresh(store, b.trace_ids())
    return str(path)


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium package to run this test")
    with Browser(tmp_path_factory.mktemp("chromium-profile")) as b:
        yield b


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Screenshots land next to the test output: $TRACEKIT_TEST_OUTPUT, else build/
    (ignored by git) under the repository."""
    root = os.environ.get("TRACEKIT_TEST_OUTPUT")
    out = Path(root) if root else Path(__file__).resolve().parents[2] / "build" / "test-output"
    out = out / "render"
    out.mkdir(parents=True, exist_ok=True)
    return out
