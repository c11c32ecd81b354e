"""stage(): decorator and context-manager forms, CPU time, errors, nesting, guarding."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import tracekit
from tracekit import conventions as cv
from tracekit.errors import ConfigError, InstrumentationError
from tracekit.instrumentation import stages


def _burn(ns: int) -> None:
    end = time.thread_time_ns() + ns
    while time.thread_time_ns() < end:
        pass


def test_every_form_writes_a_stage_span_with_default_time_kind(spans):
    @tracekit.stage(cv.FEATURE_RETRIEVAL)
    def fetch() -> int:
        return 1

    @tracekit.stage(cv.POSTPROCESS)
    async def post() -> int:
        await asyncio.sleep(0)
        return 2

    async def main() -> None:
        async with tracekit.stage(cv.DOWNSTREAM):
            await asyncio.sleep(0)
        assert await post() == 2

    assert fetch() == 1
    with tracekit.stage(cv.PREPROCESS, **{cv.CACHE_HIT: False}):
        pass
    with tracekit.stage("rerank"):
        pass
    with tracekit.stage("lookup", time_kind=cv.WAIT):
        pass
    asyncio.run(main())

    got = {s.name: dict(s.attributes or {}) for s in spans.all()}
    assert got[cv.FEATURE_RETRIEVAL][cv.TIME_KIND] == cv.WAIT
    assert got[cv.PREPROCESS][cv.TIME_KIND] == cv.COMPUTE
    assert got[cv.PREPROCESS][cv.CACHE_HIT] is False
    assert got[cv.DOWNSTREAM][cv.TIME_KIND] == cv.WAIT
    assert got[cv.POSTPROCESS][cv.TIME_KIND] == cv.COMPUTE
    assert got["rerank"][cv.TIME_KIND] == cv.COMPUTE
    assert got["lookup"][cv.TIME_KIND] == cv.WAIT
    for name, a in got.items():
        assert a[cv.STAGE] == name
    # CPU time where one thread ran the whole stage; none for `async with`
    for name in (cv.FEATURE_RETRIEVAL, cv.PREPROCESS, cv.POSTPROCESS):
        assert got[name][cv.CPU_TIME_NS] >= 0
    assert cv.CPU_TIME_NS not in got[cv.DOWNSTREAM]


def test_stages_nest_under_the_current_span(spans):
    outer = trace.get_tracer("t")
    with (
        outer.start_as_current_span("request") as root,
        tracekit.stage(cv.PREPROCESS),
        tracekit.stage("tokenize"),
    ):
        pass
    by_name = {s.name: s for s in spans.all()}
    assert by_name[cv.PREPROCESS].parent.span_id == root.get_span_context().span_id
    assert by_name["tokenize"].parent.span_id == by_name[cv.PREPROCESS].context.span_id
    assert len({s.context.trace_id for s in by_name.values()}) == 1


def test_async_decorator_charges_only_its_own_steps(spans):
    """Another task burning CPU on the same thread while the stage awaits is not charged to it."""

    @tracekit.stage(cv.FEATURE_RETRIEVAL)
    async def waits() -> None:
        await asyncio.sleep(0.05)

    async def burner() -> int:
        await asyncio.sleep(0.005)
        t0 = time.thread_time_ns()
        _burn(30_000_000)
        return time.thread_time_ns() - t0

    async def main() -> int:
        _, burned = await asyncio.gather(waits(), burner())
        return burned

    burned = asyncio.run(main())
    (span,) = spans.named(cv.FEATURE_RETRIEVAL)
    assert span.attributes[cv.CPU_TIME_NS] < burned / 4


def test_sync_stage_cpu_time_tracks_work(spans):
    with tracekit.stage(cv.PREPROCESS):
        _burn(20_000_000)
    (span,) = spans.named(cv.PREPROCESS)
    assert span.attributes[cv.CPU_TIME_NS] >= 20_000_000


@pytest.mark.parametrize("form", ["with", "decorator", "async_with", "async_decorator"])
def test_user_exception_is_recorded_and_reraised_unchanged(spans, form):
    boom = KeyError("feature store down")

    def sync_fn() -> None:
        raise boom

    async def async_fn() -> None:
        await asyncio.sleep(0)
        raise boom

    async def run_async() -> None:
        if form == "async_with":
            async with tracekit.stage(cv.FEATURE_RETRIEVAL):
                await async_fn()
        else:
            await tracekit.stage(cv.FEATURE_RETRIEVAL)(async_fn)()

    with pytest.raises(KeyError) as info:
        if form == "with":
            with tracekit.stage(cv.FEATURE_RETRIEVAL):
                sync_fn()
        elif form == "decorator":
            tracekit.stage(cv.FEATURE_RETRIEVAL)(sync_fn)()
        else:
            asyncio.run(run_async())
    assert info.value is boom
    (span,) = spans.named(cv.FEATURE_RETRIEVAL)
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[cv.ERROR_TYPE] == "KeyError"
    assert [e.name for e in span.events] == ["exception"]


def test_one_stage_object_shared_by_concurrent_tasks(spans):
    shared = tracekit.stage(cv.PREPROCESS)
    tracer = trace.get_tracer("t")

    async def request(i: int) -> int:
        with tracer.start_as_current_span(f"req-{i}") as root:
            async with shared:
                await asyncio.sleep(0.001 * (i % 3))
            return root.get_span_context().span_id

    async def main() -> list[int]:
        return await asyncio.gather(*(request(i) for i in range(20)))

    roots = asyncio.run(main())
    parents = sorted(s.parent.span_id for s in spans.named(cv.PREPROCESS))
    assert parents == sorted(roots)


def test_decorated_function_keeps_name_and_result(spans):
    @tracekit.stage(cv.POSTPROCESS)
    def to_response(x: int) -> dict[str, int]:
        """Docstring."""
        return {"score": x}

    assert to_response(3) == {"score": 3}
    assert to_response.__name__ == "to_response"
    assert to_response.__doc__ == "Docstring."


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="time_kind"):
        tracekit.stage(cv.PREPROCESS, time_kind="sleeping")
    with pytest.raises(ConfigError, match="name"):
        tracekit.stage("")

    def gen():
        yield 1

    with pytest.raises(ConfigError, match="generator"):
        tracekit.stage(cv.PREPROCESS)(gen)


def test_internal_failure_never_reaches_serving_code(spans, no_strict, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("tracer exploded")

    monkeypatch.setattr(stages._TRACER, "start_span", broken)

    @tracekit.stage(cv.PREPROCESS)
    def work(x: int) -> int:
        return x * 2

    assert [work(i) for i in range(5)] == [0, 2, 4, 6, 8]
    with tracekit.stage(cv.POSTPROCESS):
        pass
    failures = [r for r in caplog.records if "tracer exploded" in r.getMessage()]
    assert len(failures) == 1  # logged once for that place, not per call


def test_internal_failure_is_raised_under_strict(spans, monkeypatch):
    monkeypatch.setenv("TRACEKIT_STRICT", "1")

    def broken(*args, **kwargs):
        raise RuntimeError("tracer exploded")

    monkeypatch.setattr(stages._TRACER, "start_span", broken)
    with (
        pytest.raises(InstrumentationError, match="tracer exploded"),
        tracekit.stage(cv.PREPROCESS),
    ):
        pass


def test_stages_are_noops_before_configure():
    tracekit.shutdown()
    with tracekit.stage(cv.PREPROCESS) as span:
        assert not span.is_recording()
