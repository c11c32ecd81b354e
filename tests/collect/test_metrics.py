"""configure(metrics="prometheus"): a real FastAPI app on uvicorn, its /metrics scraped over
HTTP and parsed with prometheus_client's parser; the series are the ones autoscale names."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import setup
from tracekit.instrumentation._recorder import DRAIN_INTERVAL_S
from tracekit.instrumentation.metrics import PROMETHEUS_SERIES


def _serve(app: Any) -> Iterator[str]:
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def metrics_port() -> Iterator[int]:
    tracekit.configure(
        service_name="ranker",
        service_version="v1",
        exporter=InMemorySpanExporter(),
        metrics="prometheus",
        metrics_port=0,
    )
    state = setup._STATE.metrics
    assert state is not None
    yield state.port
    tracekit.shutdown()


def _scrape(port: int) -> dict[str, Any]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_prometheus_endpoint_exports_the_named_series(metrics_port: int) -> None:
    from fastapi import FastAPI

    app = FastAPI()

    @app.get("/predict/{item}")
    async def predict(item: str) -> dict[str, str]:
        with tracekit.stage(cv.FEATURE_RETRIEVAL):
            await asyncio.sleep(0.004)
        with tracekit.stage(cv.MODEL_EXECUTE):
            time.sleep(0.002)
        return {"item": item}

    tracekit.instrument_fastapi(app)
    gen = _serve(app)
    base = next(gen)
    try:
        with httpx.Client() as http:
            for i in range(5):
                assert http.get(f"{base}/predict/{i}").status_code == 200
    finally:
        next(gen, None)
    setup.flush()
    families = _scrape(metrics_port)

    # prometheus_client's parser names histogram families without the _bucket suffix.
    request = families[PROMETHEUS_SERIES[cv.METRIC_HTTP_SERVER_DURATION]]
    assert request.type == "histogram"
    counts = [s for s in request.samples if s.name.endswith("_count")]
    assert [s.labels[cv.HTTP_ROUTE.replace(".", "_")] for s in counts] == ["/predict/{item}"]
    assert counts[0].value == 5
    bounds = {s.labels["le"] for s in request.samples if s.name.endswith("_bucket")}
    assert {"0.001", "0.005", "0.01"} <= bounds  # milliseconds resolved

    stage = families[PROMETHEUS_SERIES[cv.METRIC_STAGE_DURATION]]
    by_stage = {
        (s.labels["tracekit_stage"], s.labels["tracekit_time_kind"]): s.value
        for s in stage.samples
        if s.name.endswith("_count")
    }
    assert by_stage == {(cv.FEATURE_RETRIEVAL, cv.WAIT): 5, (cv.MODEL_EXECUTE, cv.COMPUTE): 5}
    inflight = families[PROMETHEUS_SERIES[cv.METRIC_INFLIGHT]]
    assert inflight.type == "gauge" and inflight.samples[0].value == 0
    assert families[PROMETHEUS_SERIES[cv.METRIC_QUEUE_DEPTH]].type == "gauge"


def test_a_scrape_counts_every_request_that_completed_before_it(
    metrics_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No flush before the scrape: the histograms must already hold all 50 requests.

    Stage durations are recorded when the span builder (every 50 ms) hands spans over;
    the scrape itself builds what has ended. Without that, a scrape right after a burst
    counted 40 of 50. The builder is slowed to one look every 30 s here, so only the
    scrape's own drain can make the count whole."""
    from fastapi import FastAPI

    from tracekit.instrumentation._recorder import RECORDER

    monkeypatch.setattr(RECORDER, "interval_s", 30.0)
    time.sleep(3 * DRAIN_INTERVAL_S)  # the builder's current 50 ms wait ends; the next is 30 s

    app = FastAPI()

    @app.get("/predict")
    async def predict() -> dict[str, str]:
        with tracekit.stage(cv.MODEL_EXECUTE):
            pass
        return {}

    tracekit.instrument_fastapi(app)
    gen = _serve(app)
    base = next(gen)
    try:
        with httpx.Client() as http:
            for _ in range(50):
                assert http.get(f"{base}/predict").status_code == 200
            families = _scrape(metrics_port)  # at once, the server still running
    finally:
        next(gen, None)
    stage = families[PROMETHEUS_SERIES[cv.METRIC_STAGE_DURATION]]
    counts = [s.value for s in stage.samples if s.name.endswith("_count")]
    assert counts == [50]
    request = families[PROMETHEUS_SERIES[cv.METRIC_HTTP_SERVER_DURATION]]
    assert [s.value for s in request.samples if s.name.endswith("_count")] == [50]


def test_the_metrics_port_is_loopback_and_free_after_shutdown() -> None:
    tracekit.configure(
        service_name="ranker", exporter=InMemorySpanExporter(), metrics="prometheus", metrics_port=0
    )
    state = setup._STATE.metrics
    port = state.port
    assert state._server.server_address[0] == "127.0.0.1"
    tracekit.shutdown()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_autoscale_snippets_name_the_series_the_endpoint_exports() -> None:
    from tracekit.analysis.autoscale import metric_queries as mq
    from tracekit.analysis.autoscale import rules as sr

    exported = set(PROMETHEUS_SERIES.values())
    assert sr.METRIC_NAMES[sr.INFLIGHT] in exported
    assert sr.METRIC_NAMES[sr.QUEUE_DEPTH] in exported
    assert mq.HISTOGRAM in exported
    rule = sr.ScalingRule(controller="HPA", name="ranker", metrics=(), target_ref="ranker")
    keda = mq.keda_snippet(sr.INFLIGHT, 4.0, rule)
    assert 'query: sum(tracekit_inflight{job="ranker"})' in keda
    assert "metricType: AverageValue" in keda and 'threshold: "4"' in keda
    assert mq.per_replica_promql(sr.INFLIGHT, "ranker") == 'avg(tracekit_inflight{job="ranker"})'
    rate_rule = mq.adapter_rule(sr.REQUEST_RATE)
    assert "http_server_request_duration_seconds_count" in rate_rule
    assert sr.METRIC_NAMES[sr.REQUEST_RATE] in rate_rule
