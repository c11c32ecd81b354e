"""generation(): queue / prefill / decode stage spans and vLLM's gen_ai.* attributes.

Real OTel SDK (in-memory exporter); one test streams tokens from a real FastAPI app on
uvicorn, read with httpx streaming. Times are only compared with each other.
"""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import tracekit
from tracekit import conventions as cv
from tracekit.errors import ConfigError, InstrumentationError
from tracekit.instrumentation import generation as gen_module
from tracekit.instrumentation import setup
from tracekit.instrumentation.generation import GENERATION_SPAN_NAME

NS = 1e9
TOL = 1e-6  # seconds: float rounding of integer-ns differences


def _children(got: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    kids = [s for s in got if s.parent and s.parent.span_id == parent.context.span_id]
    return sorted(kids, key=lambda s: (s.start_time, s.end_time))


def _dur(span: ReadableSpan) -> float:
    return (span.end_time - span.start_time) / NS


def _stages(got: list[ReadableSpan], parent: ReadableSpan) -> list[ReadableSpan]:
    return [s for s in _children(got, parent) if (s.attributes or {}).get(cv.STAGE)]


def _assert_contiguous(stages: list[ReadableSpan]) -> None:
    for before, after in zip(stages, stages[1:], strict=False):
        assert before.end_time == after.start_time, (before.name, after.name)


def _sleep_ms(ms: float) -> None:
    time.sleep(ms / 1000)


def test_phases_are_contiguous_stages_under_the_generation_span(spans):
    with tracekit.generation(prompt_tokens=7, max_tokens=32, model="tiny") as g:
        _sleep_ms(3)
        g.admitted()
        _sleep_ms(3)
        g.first_token()
        for _ in range(4):
            _sleep_ms(1)
            g.token()
        assert g.completion_tokens == 5
    got = spans.all()
    (root,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    assert root.parent is None and root.kind is SpanKind.INTERNAL
    stages = _stages(got, root)
    assert [s.name for s in stages] == [cv.QUEUE, cv.PREFILL, cv.DECODE]
    assert [s.attributes[cv.STAGE] for s in stages] == list(cv.LLM_STAGES)
    assert [s.attributes[cv.TIME_KIND] for s in stages] == [cv.WAIT, cv.COMPUTE, cv.COMPUTE]
    _assert_contiguous(stages)
    queue, prefill, decode = stages
    assert queue.start_time == root.start_time and decode.end_time <= root.end_time
    assert all(s.status.status_code is StatusCode.UNSET for s in (*stages, root))

    a = root.attributes
    assert a[cv.GEN_AI_LATENCY_TIME_IN_QUEUE] == pytest.approx(_dur(queue), abs=TOL)
    assert a[cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL] == pytest.approx(_dur(prefill), abs=TOL)
    assert a[cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] == pytest.approx(_dur(decode), abs=TOL)
    # arrival is the generation span's own start: TTFT is exactly queue + prefill
    assert a[cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] == pytest.approx(
        _dur(queue) + _dur(prefill), abs=TOL
    )
    assert a[cv.GEN_AI_LATENCY_E2E] == pytest.approx(_dur(root), abs=TOL)
    assert a[cv.GENERATION_FIRST_TOKEN_NS] == prefill.end_time == decode.start_time
    assert a[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 5
    assert a[cv.GEN_AI_USAGE_PROMPT_TOKENS] == 7
    assert a[cv.GEN_AI_REQUEST_MAX_TOKENS] == 32
    assert a[cv.GEN_AI_RESPONSE_MODEL] == "tiny"
    # the stages carry stage attributes only; the request's numbers are on their parent
    assert not any(k.startswith("gen_ai.") for s in stages for k in s.attributes)


def test_inside_a_server_span_the_request_span_carries_the_attributes_and_stages(spans):
    server = setup.tracer("test.server")
    with server.start_as_current_span("POST /generate", kind=SpanKind.SERVER) as request:
        _sleep_ms(3)  # tokenising, before the generation starts: in TTFT, in no phase
        with tracekit.generation(prompt_tokens=3) as g:
            g.admitted()
            _sleep_ms(2)
            g.first_token()
            g.token()
        assert trace.get_current_span() is request
    got = spans.all()
    assert not [s for s in got if s.name == GENERATION_SPAN_NAME]
    (root,) = [s for s in got if s.kind is SpanKind.SERVER]
    stages = _stages(got, root)
    assert [s.name for s in stages] == [cv.QUEUE, cv.PREFILL, cv.DECODE]
    _assert_contiguous(stages)
    queue, prefill, decode = stages
    a = root.attributes
    before_generation = (queue.start_time - root.start_time) / NS
    assert before_generation > 0
    # arrival is the SERVER span's start: TTFT = time before the generation + queue + prefill
    assert a[cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] == pytest.approx(
        before_generation + _dur(queue) + _dur(prefill), abs=TOL
    )
    assert a[cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] > (
        a[cv.GEN_AI_LATENCY_TIME_IN_QUEUE] + a[cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL]
    )
    assert a[cv.GEN_AI_LATENCY_E2E] >= (decode.end_time - root.start_time) / NS - TOL
    assert a[cv.GEN_AI_LATENCY_E2E] <= _dur(root)
    assert a[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 2
    assert a[cv.GEN_AI_USAGE_PROMPT_TOKENS] == 3
    assert cv.GEN_AI_REQUEST_MAX_TOKENS not in a and cv.GEN_AI_RESPONSE_MODEL not in a


def test_under_a_span_that_is_not_a_server_span_the_generation_gets_its_own(spans):
    with tracekit.stage("handler") as handler, tracekit.generation() as g:
        g.token()
    got = spans.all()
    (own,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    assert own.parent.span_id == handler.get_span_context().span_id
    assert [s.name for s in _stages(got, own)] == [cv.PREFILL, cv.DECODE]
    (stage,) = [s for s in got if s.name == "handler"]
    assert cv.GEN_AI_LATENCY_E2E not in stage.attributes


def test_async_with_and_spans_started_inside_stay_under_the_current_span(spans):
    async def serve() -> None:
        async with tracekit.generation(max_tokens=4) as g:
            await asyncio.sleep(0.002)
            g.admitted()
            with tracekit.model_execution():
                await asyncio.sleep(0.001)
            g.first_token()
            for _ in range(3):
                await asyncio.sleep(0)
                g.token()

    asyncio.run(serve())
    got = spans.all()
    (root,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    (model,) = [s for s in got if s.name == cv.MODEL_EXECUTE]
    assert model.parent is None  # generation() changes no context: it was a root span
    stages = _stages(got, root)
    assert [s.name for s in stages] == [cv.QUEUE, cv.PREFILL, cv.DECODE]
    _assert_contiguous(stages)
    assert root.attributes[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 4


def test_token_before_first_token_is_the_first_token_and_late_marks_are_ignored(spans):
    with tracekit.generation() as g:
        g.admitted()
        _sleep_ms(2)
        g.token()  # no first_token(): this is it
        t_first = time.time_ns()
        _sleep_ms(2)
        g.first_token()  # ignored: the first token is out
        g.admitted()  # ignored: it was admitted
        g.token()
        g.token()
    got = spans.all()
    (root,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    queue, prefill, decode = _stages(got, root)
    assert prefill.end_time <= t_first  # the first token() ended prefill, not first_token()
    assert root.attributes[cv.GENERATION_FIRST_TOKEN_NS] == decode.start_time
    assert root.attributes[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 3
    assert len(_stages(got, root)) == 3


def test_without_admitted_there_is_no_queue_and_prefill_starts_with_the_generation(spans):
    with tracekit.generation() as g:
        _sleep_ms(2)
        g.first_token()
    got = spans.all()
    (root,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    prefill, decode = _stages(got, root)
    assert (prefill.name, decode.name) == (cv.PREFILL, cv.DECODE)
    assert prefill.start_time == root.start_time
    assert decode.start_time == decode.end_time  # one token: no time between tokens
    a = root.attributes
    assert a[cv.GEN_AI_LATENCY_TIME_IN_QUEUE] == 0.0
    assert a[cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] == 0.0
    assert a[cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] == pytest.approx(_dur(prefill), abs=TOL)
    assert a[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 1


@pytest.mark.parametrize("admitted", [False, True], ids=["in-queue", "in-prefill"])
def test_a_block_ending_before_any_token_ends_in_the_phase_it_was_in(spans, admitted):
    with tracekit.generation() as g:
        if admitted:
            g.admitted()
        _sleep_ms(1)
    got = spans.all()
    (root,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    stages = _stages(got, root)
    assert [s.name for s in stages] == ([cv.QUEUE, cv.PREFILL] if admitted else [cv.QUEUE])
    _assert_contiguous(stages)
    assert stages[-1].end_time == root.end_time
    a = root.attributes
    assert a[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 0
    assert cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN not in a
    assert cv.GENERATION_FIRST_TOKEN_NS not in a
    assert cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE not in a
    assert (cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL in a) is admitted
    assert a[cv.GEN_AI_LATENCY_E2E] == pytest.approx(_dur(root), abs=TOL)


class ModelCrashed(Exception):
    pass


@pytest.mark.parametrize("phase", list(cv.LLM_STAGES))
def test_an_exception_ends_its_phase_with_error_and_propagates_unchanged(spans, phase):
    crash = ModelCrashed("out of memory")
    with pytest.raises(ModelCrashed) as caught, tracekit.generation() as g:
        if phase != cv.QUEUE:
            g.admitted()
        if phase == cv.DECODE:
            g.first_token()
            g.token()
        _sleep_ms(1)
        raise crash
    assert caught.value is crash
    got = spans.all()
    (root,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    stages = _stages(got, root)
    assert stages[-1].name == phase
    _assert_contiguous(stages)
    failed = stages[-1]
    assert failed.end_time == root.end_time  # ends where it struck, not at the last token
    for span in (failed, root):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[cv.ERROR_TYPE] == "ModelCrashed"
    assert all(s.status.status_code is StatusCode.UNSET for s in stages[:-1])


def test_the_server_span_status_is_left_to_its_instrumentation(spans):
    server = setup.tracer("test.server")
    with (
        pytest.raises(ModelCrashed),
        server.start_as_current_span(
            "POST /generate", kind=SpanKind.SERVER, record_exception=False,
            set_status_on_exception=False,
        ),
        tracekit.generation() as g,
    ):  # fmt: skip
        g.token()
        raise ModelCrashed("boom")
    got = spans.all()
    (root,) = [s for s in got if s.kind is SpanKind.SERVER]
    assert root.status.status_code is StatusCode.UNSET
    assert root.attributes[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 1
    (decode,) = [s for s in got if s.name == cv.DECODE]
    assert decode.status.status_code is StatusCode.ERROR


def test_token_is_a_count_and_a_clock_read(spans):
    with tracekit.generation() as g:
        g.first_token()
        own = g._own
        sets_before = list(own._sets or [])
        only_here = [tracemalloc.Filter(True, gen_module.__file__)]  # not other threads'
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot().filter_traces(only_here)
            for _ in range(20_000):
                g.token()
            after = tracemalloc.take_snapshot().filter_traces(only_here)
        finally:
            tracemalloc.stop()
        kept = sum(d.size_diff for d in after.compare_to(before, "filename"))
        assert kept <= 64  # at most the latest count and clock reading: nothing per token
        assert list(own._sets or []) == sets_before  # no attribute written per token
    got = spans.all()
    assert [s.name for s in got] == [cv.PREFILL, cv.DECODE, GENERATION_SPAN_NAME]
    (root,) = [s for s in got if s.name == GENERATION_SPAN_NAME]
    assert root.attributes[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == 20_001


def test_without_tracing_it_counts_and_writes_nothing():
    tracekit.shutdown()
    with tracekit.generation(prompt_tokens=1) as g:
        g.admitted()
        g.first_token()
        g.token()
    assert g.completion_tokens == 2

    async def run() -> None:
        async with tracekit.generation() as h:
            h.token()

    asyncio.run(run())


def test_under_an_unsampled_parent_nothing_is_recorded(spans):
    parent = trace.NonRecordingSpan(
        trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(0))
    )
    with trace.use_span(parent), tracekit.generation() as g:
        g.admitted()
        g.token()
    assert spans.all() == []


class Exploding(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        raise RuntimeError("collector down")

    def shutdown(self) -> None:
        pass


def test_a_raising_exporter_never_reaches_the_user(no_strict, caplog):
    exporter = Exploding()
    tracekit.configure(service_name="test-svc", exporter=exporter)
    try:
        for _ in range(3):
            with tracekit.generation() as g:
                g.admitted()
                g.first_token()
                g.token()
        setup.flush()
    finally:
        tracekit.shutdown()
    assert exporter.calls >= 1


def test_an_internal_failure_never_reaches_the_user(spans, no_strict, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("tracer exploded")

    monkeypatch.setattr(gen_module._TRACER, "start_span", broken)
    for _ in range(3):
        with tracekit.generation() as g:
            g.first_token()
            g.token()
        assert g.completion_tokens == 2
    with pytest.raises(ModelCrashed), tracekit.generation() as g:
        raise ModelCrashed("still the user's own")
    assert sum("tracer exploded" in r.getMessage() for r in caplog.records) == 1


def test_a_failure_after_entry_never_reaches_the_user(spans, no_strict, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("stage exploded")

    with tracekit.generation() as g:
        monkeypatch.setattr(gen_module.Generation, "_stage", broken)
        g.first_token()
        g.token()
    assert g.completion_tokens == 2
    assert any("stage exploded" in r.getMessage() for r in caplog.records)


def test_an_internal_failure_is_raised_under_strict(spans, monkeypatch):
    monkeypatch.setenv("TRACEKIT_STRICT", "1")

    def broken(*args, **kwargs):
        raise RuntimeError("tracer exploded")

    monkeypatch.setattr(gen_module._TRACER, "start_span", broken)
    with pytest.raises(InstrumentationError, match="tracer exploded"), tracekit.generation():
        pass


def test_entering_one_generation_twice_is_reported(spans, monkeypatch):
    monkeypatch.setenv("TRACEKIT_STRICT", "1")
    g = tracekit.generation()
    with g:
        pass
    with pytest.raises(InstrumentationError, match="entered once"), g:
        pass


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="prompt_tokens"):
        tracekit.generation(prompt_tokens="12")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_tokens"):
        tracekit.generation(max_tokens=-1)
    with pytest.raises(ConfigError, match="prompt_tokens"):
        tracekit.generation(prompt_tokens=True)
    with pytest.raises(ConfigError, match="model"):
        tracekit.generation(model=3)  # type: ignore[arg-type]


def _streaming_app(n_tokens: int, most: int) -> FastAPI:
    app = FastAPI()

    @app.get("/generate")
    async def generate(prompt: str) -> StreamingResponse:
        ids = prompt.split()

        async def stream():
            async with tracekit.generation(
                prompt_tokens=len(ids), max_tokens=n_tokens, model="tiny"
            ) as g:
                await asyncio.sleep(0.002)  # queued until the engine's next step admits it
                g.admitted()
                await asyncio.sleep(0.002)  # prefill
                g.first_token()
                yield "tok0\n"
                for i in range(1, n_tokens):
                    await asyncio.sleep(0.001)
                    g.token()
                    yield f"tok{i}\n"

        return StreamingResponse(stream(), media_type="text/plain")

    @app.get("/endless")
    async def endless() -> StreamingResponse:
        async def stream():
            async with tracekit.generation(max_tokens=most) as g:
                for i in range(most):
                    await asyncio.sleep(0.001)
                    g.token()
                    yield f"tok{i}\n"

        return StreamingResponse(stream(), media_type="text/plain")

    return tracekit.instrument_fastapi(app)


def _wait_for_server_span(spans: Any) -> list[ReadableSpan]:
    """The finished spans once a SERVER span is among them (bounded: 10 s)."""
    deadline = time.monotonic() + 10
    got = spans.all()
    while not [s for s in got if s.kind is SpanKind.SERVER]:
        assert time.monotonic() < deadline, "the request never ended"
        time.sleep(0.01)
        got = spans.all()
    return list(got)


def _server_span(got: list[ReadableSpan], route: str) -> ReadableSpan:
    (root,) = [s for s in got if s.kind is SpanKind.SERVER and s.attributes[cv.HTTP_ROUTE] == route]
    return root


def test_a_streaming_endpoint_on_uvicorn_read_with_httpx_and_a_client_hanging_up(spans, serve_app):
    n_tokens, most = 6, 500
    with serve_app(_streaming_app(n_tokens, most)) as url, httpx.Client(base_url=url) as client:
        with client.stream("GET", "/generate", params={"prompt": "a b c d"}) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        assert lines == [f"tok{i}" for i in range(n_tokens)]
        # The last byte can reach the client before the server ends its span.
        whole = _wait_for_server_span(spans)
        spans.clear()
        with client.stream("GET", "/endless") as r:
            lines = r.iter_lines()
            assert [next(lines) for _ in range(3)] == ["tok0", "tok1", "tok2"]
        # the server sees the hang-up and cancels the stream; its spans end soon after
        cut = _wait_for_server_span(spans)

    # the whole stream: the SERVER span carries the attributes and the three stages
    root = _server_span(whole, "/generate")
    assert not [s for s in whole if s.name == GENERATION_SPAN_NAME]
    stages = _stages(whole, root)
    assert [s.name for s in stages] == [cv.QUEUE, cv.PREFILL, cv.DECODE]
    _assert_contiguous(stages)
    queue, prefill, decode = stages
    assert root.start_time <= queue.start_time and decode.end_time <= root.end_time
    a = root.attributes
    assert a[cv.HTTP_RESPONSE_STATUS_CODE] == 200
    assert a[cv.GEN_AI_USAGE_COMPLETION_TOKENS] == n_tokens
    assert a[cv.GEN_AI_USAGE_PROMPT_TOKENS] == 4
    assert a[cv.GEN_AI_REQUEST_MAX_TOKENS] == n_tokens
    assert a[cv.GEN_AI_RESPONSE_MODEL] == "tiny"
    assert a[cv.GEN_AI_LATENCY_TIME_IN_QUEUE] == pytest.approx(_dur(queue), abs=TOL)
    assert a[cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL] == pytest.approx(_dur(prefill), abs=TOL)
    assert a[cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] == pytest.approx(_dur(decode), abs=TOL)
    ttft = a[cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN]
    assert ttft == pytest.approx(
        (queue.start_time - root.start_time) / NS + _dur(queue) + _dur(prefill), abs=TOL
    )
    assert ttft <= a[cv.GEN_AI_LATENCY_E2E] <= _dur(root)
    assert a[cv.GENERATION_FIRST_TOKEN_NS] == decode.start_time
    assert all(s.status.status_code is StatusCode.UNSET for s in stages)

    # the hang-up: decode ends with an error where the stream was cancelled
    root = _server_span(cut, "/endless")
    prefill, decode = _stages(cut, root)
    assert (prefill.name, decode.name) == (cv.PREFILL, cv.DECODE)
    assert decode.status.status_code is StatusCode.ERROR
    assert 3 <= root.attributes[cv.GEN_AI_USAGE_COMPLETION_TOKENS] < most
    assert root.attributes[cv.GEN_AI_LATENCY_E2E] >= _dur(prefill) + _dur(decode) - TOL


def test_under_another_providers_server_span_the_attributes_let_ingest_derive() -> None:
    # tracekit is not configured: its stage spans are not recorded, so the first-token
    # mark (which tells ingest "real stages are here") must not be written either.
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = provider.get_tracer("other").start_as_current_span("POST /gen", kind=SpanKind.SERVER)
    with server, tracekit.generation(prompt_tokens=3) as g:
        g.admitted()
        g.first_token()
        g.token()
    (server,) = exporter.get_finished_spans()
    attrs = dict(server.attributes or {})
    assert cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN in attrs
    assert cv.GEN_AI_USAGE_COMPLETION_TOKENS in attrs
    assert cv.GENERATION_FIRST_TOKEN_NS not in attrs
