"""The demo's parts behave as their docstrings say: cache, knobs, settings, model."""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.demo import settings as st
from tracekit.demo.features import CACHE_CAPACITY, HOT_USERS, FeatureStore, LRUCache
from tracekit.demo.processes import ServiceProcess, child_environment, pid_alive
from tracekit.demo.regressions import BASELINE, REGRESSIONS, get_regression, knobs_for
from tracekit.errors import ConfigError


def test_lru_evicts_the_least_recently_used() -> None:
    cache = LRUCache(2)
    a, b, c = (np.full(2, v, dtype=np.float32) for v in (1, 2, 3))
    cache.put(1, a)
    cache.put(2, b)
    assert cache.get(1) is a  # 1 is now the most recent
    cache.put(3, c)
    assert 2 not in cache and 1 in cache and 3 in cache


def test_feature_store_hits_after_warm_up_and_misses_go_to_the_table() -> None:
    store = FeatureStore(seed=0)
    try:
        assert store.warm() == HOT_USERS
        vec, hit = asyncio.run(store.get(7))
        assert hit and vec.shape == (32,)
        cold = HOT_USERS + 1000
        assert not store.is_cached(cold)
        vec2, hit2 = asyncio.run(store.get(cold))
        assert not hit2 and store.misses == 1
        assert store.is_cached(cold)  # a miss fills the cache
        assert len(store.cache) <= CACHE_CAPACITY
    finally:
        store.close()


def test_disabled_cache_misses_every_time_and_data_matches() -> None:
    warm, cold = FeatureStore(seed=0), FeatureStore(cache_enabled=False, seed=0)
    try:
        warm.warm()
        assert cold.warm() == 0
        for _ in range(2):
            vec, hit = asyncio.run(cold.get(5))
            assert not hit
        assert cold.misses == 2 and cold.hits == 0
        np.testing.assert_array_equal(vec, asyncio.run(warm.get(5))[0])
    finally:
        warm.close()
        cold.close()


def test_each_regression_changes_its_own_knobs_only() -> None:
    assert knobs_for("") == BASELINE == knobs_for("none")
    assert get_regression("batch").knobs.batch_max_wait_ms > BASELINE.batch_max_wait_ms
    assert not get_regression("cache").knobs.cache_enabled
    assert get_regression("contention").knobs.contention_threads >= 1
    assert get_regression("downstream").knobs.downstream_slow_fraction > 0
    assert get_regression("model").knobs.model_hidden > BASELINE.model_hidden
    assert REGRESSIONS["contention"].expected_kind == cv.HIDDEN_WAIT
    with pytest.raises(ConfigError, match="choose one of"):
        get_regression("gpu")


def test_flags_win_over_environment_and_defaults_fill_the_rest() -> None:
    parser = st.build_parser("svc", "test", downstream=True)
    env = {st.ENV_VERSION: "v9", st.ENV_PORT: "1234", st.ENV_REGRESSION: "cache"}
    s = st.parse_settings(parser, ["--version", "v2"], env)
    assert (s.version, s.port, s.regression, s.host) == ("v2", 1234, "cache", "127.0.0.1")
    assert not s.knobs.cache_enabled
    with pytest.raises(ConfigError, match="not an integer"):
        st.parse_settings(parser, [], {st.ENV_PORT: "eighty"})
    with pytest.raises(ConfigError, match="unknown regression"):
        st.parse_settings(parser, ["--regression", "nope"], {})


def test_a_busy_port_is_a_clear_error() -> None:
    taken = st.bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot bind 127.0.0.1:{port}"):
            # SO_REUSEADDR does not allow two listeners on one port
            st.bind("127.0.0.1", port)
    finally:
        taken.close()
    assert isinstance(taken, socket.socket)


def test_model_and_preprocess_shapes() -> None:
    import torch

    from tracekit.demo import model as m

    items = m.item_table(0)
    enc = m.FeatureEncoder(seed=0)
    stats = m.FeatureStats(m.sample_inputs(items, 0))
    x = m.preprocess(np.ones(32, dtype=np.float32), list(range(10)), items, enc, stats)
    assert x.shape == (m.CANDIDATES, m.INPUT_DIM)
    ranker = m.Ranker(hidden=16, layers=1, seed=0)
    rows = m.score_batch(ranker, [x, x])
    assert len(rows) == 2 and torch.equal(rows[0], rows[1])
    top = m.postprocess(list(range(m.CANDIDATES)), rows[0], [1.0] * m.CANDIDATES)
    assert len(top) == m.TOP_K and len(set(top)) == m.TOP_K


def test_a_stats_refresh_holds_the_lock_that_preprocess_needs() -> None:
    import threading
    import time

    from tracekit.demo import model as m

    items = m.item_table(0)
    stats = m.FeatureStats(m.sample_inputs(items, 0))
    refresher = threading.Thread(target=stats.refresh, args=(0.15,))
    refresher.start()
    time.sleep(0.02)
    started = time.perf_counter()
    cpu = time.thread_time()
    stats.snapshot()  # blocks until the refresh lets go
    waited, used = time.perf_counter() - started, time.thread_time() - cpu
    refresher.join()
    assert waited > 0.08 and used < waited / 4  # wall time, not CPU time: hidden wait


def test_a_paused_service_is_frozen_and_still_stops_cleanly(tmp_path: Path) -> None:
    # The demo freezes the release not under load; a frozen process must thaw to act on
    # SIGTERM, so stop() has to thaw it first or it would wait for SIGKILL.
    proc = ServiceProcess("pricing test", "tracekit.demo.downstream", tmp_path / "p.log")
    env = child_environment({st.ENV_TRACE_FILE: str(tmp_path / "p.jsonl")})
    proc.start(env, timeout_s=60, wait=False)
    try:
        proc.wait_ready(60)
        proc.pause()
        assert _state(proc) == "T"
        proc.resume()
        assert _state(proc) != "T"
        proc.pause()
    finally:
        code = proc.stop(timeout_s=10)
    # Ended by SIGTERM (uvicorn re-raises it after its graceful shutdown), not SIGKILL.
    assert code in (0, -signal.SIGTERM)
    assert proc.pid is not None and not pid_alive(proc.pid)


def _state(proc: ServiceProcess) -> str:
    deadline = time.monotonic() + 5
    while True:  # the signal is delivered asynchronously
        state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        if state == "T" or time.monotonic() > deadline:
            return state
        if state in "RS" and not proc.paused:
            return state
        time.sleep(0.01)


class _SlowEnd:
    """Span exporter whose export (run as the span ends: SimpleSpanProcessor) takes a
    while, as ending a span does when a busy machine deschedules the event loop; it
    notes when each server span's end was done."""

    def __init__(self) -> None:
        self.ended: list[float] = []

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        time.sleep(0.5)
        self.ended.extend(time.monotonic() for s in spans if s.kind.name == "SERVER")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 0) -> bool:
        return True


def _received_vs_span_end(wrap: bool) -> tuple[float, float]:
    """When a client had the whole response, and when the server span had ended."""
    import httpx
    import uvicorn
    from fastapi import FastAPI
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    exporter = _SlowEnd()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[arg-type]
    app = FastAPI()

    @app.get("/x")
    async def x() -> dict[str, int]:
        return {"ok": 1}

    traced = OpenTelemetryMiddleware(
        app, tracer_provider=provider, exclude_spans=["receive", "send"]
    )
    sock = st.bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(st.SpansBeforeResponse(traced) if wrap else traced, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.01)
        response = httpx.get(f"http://127.0.0.1:{port}/x", timeout=10)
        received = time.monotonic()
        assert response.json() == {"ok": 1}
        while not exporter.ended:  # the unwrapped server is still ending its span
            assert time.monotonic() < deadline + 10
            time.sleep(0.01)
        return received, exporter.ended[0]
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        provider.shutdown()


def test_a_response_arrives_only_after_its_server_span_has_ended() -> None:
    # The interleaved runs freeze a release the moment its last response arrives: a span
    # still open then would end a round later, as a request hundreds of ms slower.
    received, ended = _received_vs_span_end(wrap=True)
    assert received >= ended
    # Unwrapped (the control): the response is out half a second before the span ends.
    received, ended = _received_vs_span_end(wrap=False)
    assert received < ended


def test_a_full_collection_after_start_up_walks_only_what_serving_created() -> None:
    import gc

    # This test process holds what a service holds after start-up (torch, FastAPI, numpy)
    import torch  # noqa: F401

    try:
        st.freeze_startup_heap()
        assert gc.get_freeze_count() > 10_000
        frozen_s = float("inf")
        for _ in range(3):  # the quickest of three: a busy machine only adds time
            started = time.perf_counter()
            gc.collect()
            frozen_s = min(frozen_s, time.perf_counter() - started)
    finally:
        gc.unfreeze()
    started = time.perf_counter()
    gc.collect()
    # Side by side, in the same process: the frozen walk is a fraction of the full one.
    assert frozen_s < (time.perf_counter() - started) / 3
