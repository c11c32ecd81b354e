"""A full request through a real app calling a real second app over httpx (uvicorn on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import defaultdict

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import sampler

RID = "test.request_id"  # a test-only attribute that says which request a span served


def _apps(
    downstream_url: list[str], *, retries: int = 0, timeout: float = 5.0
) -> tuple[FastAPI, FastAPI]:
    scorer = FastAPI()

    @scorer.get("/score/{rid}")
    async def score(rid: int) -> dict[str, int]:
        with tracekit.stage("score", **{RID: rid}):
            await asyncio.sleep(0)
        return {"rid": rid}

    @scorer.get("/slow")
    async def slow() -> dict[str, bool]:
        await asyncio.sleep(0.3)
        return {"ok": True}

    ranker = FastAPI()

    def run_batch(items: list[int]) -> list[int]:
        with tracekit.model_execution():
            return [x * 10 for x in items]

    batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=8, max_wait_ms=5.0, workers=2)
    state: dict[str, httpx.AsyncClient] = {}

    def client() -> httpx.AsyncClient:
        if "c" not in state:
            state["c"] = tracekit.instrument_httpx(
                httpx.AsyncClient(base_url=downstream_url[0], timeout=timeout), retries=retries
            )
        return state["c"]

    @tracekit.stage(cv.FEATURE_RETRIEVAL)
    async def fetch(rid: int) -> list[int]:
        await asyncio.sleep(0.001)
        return [rid]

    @ranker.get("/predict/{rid}")
    async def predict(rid: int) -> dict[str, int]:
        features = await fetch(rid)
        with tracekit.stage(cv.PREPROCESS) as span:
            span.set_attribute(RID, rid)
            x = features[0]
        y = await batcher.submit(x)
        with tracekit.stage(cv.POSTPROCESS):
            out = {"rid": rid, "y": y}
        r = await client().get(f"/score/{rid}")
        r.raise_for_status()
        return out

    @ranker.get("/fails")
    async def fails() -> None:
        with tracekit.stage(cv.PREPROCESS):
            raise HTTPException(status_code=503, detail="model not loaded")

    @ranker.get("/calls-slow")
    async def calls_slow() -> dict[str, str]:
        try:
            await client().get("/slow")
        except httpx.TimeoutException as exc:
            return {"error": type(exc).__name__}
        return {"error": ""}

    tracekit.instrument_fastapi(scorer, sample_interval_s=0.02)
    tracekit.instrument_fastapi(ranker, sample_interval_s=0.02)
    return ranker, scorer


def _wait_for_cpu_sample() -> None:
    deadline = time.monotonic() + 5
    while (s := sampler.current()) is None or s.cpu is None:
        assert time.monotonic() < deadline, "sampler produced no CPU reading"
        time.sleep(0.01)


def test_full_request_gives_one_trace_with_every_stage(spans, serve_app):
    url: list[str] = []
    ranker, scorer = _apps(url)
    with serve_app(scorer) as scorer_url, serve_app(ranker) as ranker_url:
        url.append(scorer_url)
        _wait_for_cpu_sample()
        r = httpx.get(f"{ranker_url}/predict/7", timeout=10)
        assert r.json() == {"rid": 7, "y": 70}
    got = spans.all()
    servers = [s for s in got if s.kind is SpanKind.SERVER]
    root = next(s for s in servers if s.attributes[cv.HTTP_ROUTE] == "/predict/{rid}")
    tid = root.context.trace_id
    in_trace = [s for s in got if s.context.trace_id == tid]
    children = {
        s.attributes.get(cv.STAGE): s
        for s in in_trace
        if s.parent and s.parent.span_id == root.context.span_id
    }
    assert set(children) == {
        cv.FEATURE_RETRIEVAL,
        cv.PREPROCESS,
        cv.BATCH_QUEUE,
        cv.MODEL_EXECUTE,
        cv.POSTPROCESS,
        cv.DOWNSTREAM,
    }
    # stages run in request order
    order = sorted(children.values(), key=lambda s: s.start_time)
    assert [s.attributes[cv.STAGE] for s in order] == list(cv.STAGES)

    a = root.attributes
    assert a[cv.HTTP_REQUEST_METHOD] == "GET" and a[cv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert a[cv.INFLIGHT] >= 1 and a[cv.QUEUE_DEPTH] >= 0
    assert 0.0 <= a[cv.CPU_UTILIZATION] <= 1.0
    assert cv.GPU_UTILIZATION not in a  # no GPU here

    client = children[cv.DOWNSTREAM]
    assert client.kind is SpanKind.CLIENT and client.attributes[cv.TIME_KIND] == cv.WAIT
    assert client.attributes[cv.SERVER_ADDRESS] == "127.0.0.1"
    assert client.attributes[cv.URL_FULL].endswith("/score/7")
    assert client.attributes[cv.HTTP_RESPONSE_STATUS_CODE] == 200
    # the downstream service joined the trace through traceparent
    remote = next(s for s in servers if s.attributes[cv.HTTP_ROUTE] == "/score/{rid}")
    assert remote.context.trace_id == tid and remote.parent.span_id == client.context.span_id
    score = next(s for s in in_trace if s.name == "score")
    assert score.parent.span_id == remote.context.span_id

    queue, model = children[cv.BATCH_QUEUE], children[cv.MODEL_EXECUTE]
    assert queue.attributes[cv.QUEUE_FILL_WAIT_NS] + queue.attributes[cv.QUEUE_WORKER_WAIT_NS] == (
        queue.end_time - queue.start_time
    )
    assert model.attributes[cv.BATCH_ID] == queue.attributes[cv.BATCH_ID]
    (batch,) = [s for s in got if s.name == cv.BATCH_SPAN_NAME]
    assert batch.context.trace_id != tid and batch.parent is None
    assert [link.context.span_id for link in batch.links] == [root.context.span_id]
    assert model.links[0].context.span_id == batch.context.span_id
    inner = [s for s in got if s.parent and s.parent.span_id == batch.context.span_id]
    assert [s.attributes[cv.GPU_SYNC] for s in inner] == [cv.SYNC_NONE]


def test_100_concurrent_requests_give_100_separate_traces(spans, serve_app):
    url: list[str] = []
    ranker, scorer = _apps(url)
    n = 100

    async def load(base: str) -> list[dict[str, int]]:
        limits = httpx.Limits(max_connections=n)
        async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
            rs = await asyncio.gather(*(client.get(f"/predict/{i}") for i in range(n)))
        return [r.json() for r in rs]

    with serve_app(scorer) as scorer_url, serve_app(ranker) as ranker_url:
        url.append(scorer_url)
        results = asyncio.run(load(ranker_url))
    assert sorted(r["rid"] for r in results) == list(range(n))
    assert all(r["y"] == r["rid"] * 10 for r in results)

    got = spans.all()
    by_trace = defaultdict(list)
    for s in got:
        by_trace[s.context.trace_id].append(s)
    roots = [
        s
        for s in got
        if s.kind is SpanKind.SERVER and s.attributes[cv.HTTP_ROUTE] == "/predict/{rid}"
    ]
    assert len({r.context.trace_id for r in roots}) == n
    request_root_ids = set()
    for root in roots:
        members = by_trace[root.context.trace_id]
        rids = {s.attributes[RID] for s in members if RID in (s.attributes or {})}
        assert len(rids) == 1, (
            f"spans of different requests share trace {root.context.trace_id:032x}"
        )
        stages = [s.attributes.get(cv.STAGE) for s in members]
        assert stages.count(cv.BATCH_QUEUE) == 1 and stages.count(cv.MODEL_EXECUTE) == 1
        assert sum(1 for s in members if s.kind is SpanKind.SERVER) == 2  # ranker + scorer
        request_root_ids.add(root.context.span_id)
    batches = [s for s in got if s.name == cv.BATCH_SPAN_NAME]
    assert sum(b.attributes[cv.BATCH_REQUEST_COUNT] for b in batches) == n
    linked = {link.context.span_id for b in batches for link in b.links}
    assert linked == request_root_ids
    assert all(b.attributes[cv.BATCH_REQUEST_COUNT] <= 8 for b in batches)


def test_timeouts_and_retries_mark_client_spans(spans, serve_app):
    url: list[str] = []
    ranker, scorer = _apps(url, retries=2, timeout=0.05)
    with serve_app(scorer) as scorer_url, serve_app(ranker) as ranker_url:
        url.append(scorer_url)
        r = httpx.get(f"{ranker_url}/calls-slow", timeout=10)
    assert r.json() == {"error": "ReadTimeout"}
    clients = sorted(
        (s for s in spans.all() if s.kind is SpanKind.CLIENT), key=lambda s: s.start_time
    )
    assert len(clients) == 3
    assert [s.attributes.get(cv.HTTP_REQUEST_RESEND_COUNT) for s in clients] == [None, 1, 2]
    assert len({s.context.trace_id for s in clients}) == 1
    for s in clients:
        assert s.attributes[cv.ERROR_TYPE] == "ReadTimeout"
        assert s.status.status_code is StatusCode.ERROR
        assert s.attributes[cv.STAGE] == cv.DOWNSTREAM


def test_handler_error_marks_request_and_stage(spans, serve_app):
    ranker, _ = _apps(["http://127.0.0.1:9"])
    with serve_app(ranker) as ranker_url:
        r = httpx.get(f"{ranker_url}/fails", timeout=10)
    assert r.status_code == 503
    got = spans.all()
    (stage,) = [s for s in got if s.name == cv.PREPROCESS]
    assert stage.attributes[cv.ERROR_TYPE] == "HTTPException"
    (root,) = [s for s in got if s.kind is SpanKind.SERVER]
    assert root.attributes[cv.HTTP_RESPONSE_STATUS_CODE] == 503
    assert root.status.status_code is StatusCode.ERROR


def test_instrumenting_twice_changes_nothing(spans, serve_app):
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> str:
        return "pong"

    assert tracekit.instrument_fastapi(app) is app
    tracekit.instrument_fastapi(app)
    client = httpx.AsyncClient()
    assert tracekit.instrument_httpx(client) is tracekit.instrument_httpx(client)
    with serve_app(app) as base:
        assert httpx.get(f"{base}/ping", timeout=10).json() == "pong"
    assert len([s for s in spans.all() if s.kind is SpanKind.SERVER]) == 1


@pytest.mark.parametrize("bad", [object(), "app"])
def test_instrument_rejects_non_apps(bad):
    from tracekit.errors import ConfigError

    with pytest.raises(ConfigError):
        tracekit.instrument_fastapi(bad)
    with pytest.raises(ConfigError):
        tracekit.instrument_httpx(bad)


def test_a_request_after_shutdown_starts_no_sampler_thread():
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    tracekit.instrument_fastapi(app, sample_interval_s=0.02)  # starts the sampler
    assert sampler.current() is not None
    tracekit.shutdown()
    assert sampler.current() is None
    # configured again (as a test suite or a reload does): the request span records,
    # so the request hook runs in full
    exporter = InMemorySpanExporter()  # shutdown() closed the fixture's
    tracekit.configure(service_name="test-svc", exporter=exporter)
    threads = threading.active_count()

    async def requests() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return [await client.get("/ping") for _ in range(3)]

    responses = asyncio.run(requests())
    assert [r.json() for r in responses] == [{"ok": True}] * 3
    assert sampler.current() is None
    assert threading.active_count() <= threads
    tracekit.shutdown()
    servers = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert len(servers) == 3
    assert all(cv.INFLIGHT in s.attributes for s in servers)
    assert all(cv.CPU_UTILIZATION not in s.attributes for s in servers)


def test_the_first_request_after_start_up_carries_cpu_utilization(spans):
    """Issue 9: requests served before the sampler's first window closed had no reading."""
    sampler.stop()
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, bool]:
        return {"ok": True}

    tracekit.instrument_fastapi(app, sample_interval_s=60.0)  # no window closes in this test

    async def first_request() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            return await client.get("/ping")

    assert asyncio.run(first_request()).json() == {"ok": True}
    (server,) = [s for s in spans.all() if s.kind is SpanKind.SERVER]
    assert 0.0 <= server.attributes[cv.CPU_UTILIZATION] <= 1.0
    sampler.stop()
