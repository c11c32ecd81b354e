"""Spans recorded on the request path and built later: OTel interop, concurrency, limits, fork."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import _recorder, _spans
from tracekit.instrumentation._recorder import RECORDER
from tracekit.instrumentation._tracer import FAST_PROVIDER

TASK = "test.task"


def _by_name(spans):
    return {s.name: s for s in spans.all()}


def test_otel_span_inside_a_stage_is_the_stages_child(spans):
    user = trace.get_tracer("user.code")
    with tracekit.stage(cv.PREPROCESS) as stage, user.start_as_current_span("tokenize") as inner:
        assert inner.get_span_context().trace_id == stage.get_span_context().trace_id
    got = _by_name(spans)
    assert got["tokenize"].parent.span_id == got[cv.PREPROCESS].context.span_id
    assert got["tokenize"].context.trace_id == got[cv.PREPROCESS].context.trace_id


def test_stage_inside_otel_span_inside_stage_nests_all_the_way(spans):
    user = trace.get_tracer("user.code")
    with (
        user.start_as_current_span("request"),
        tracekit.stage("outer"),
        user.start_as_current_span("library"),
        tracekit.stage("inner"),
    ):
        pass
    got = _by_name(spans)
    assert got["outer"].parent.span_id == got["request"].context.span_id
    assert got["library"].parent.span_id == got["outer"].context.span_id
    assert got["inner"].parent.span_id == got["library"].context.span_id
    assert len({s.context.trace_id for s in got.values()}) == 1


def test_traceparent_injected_inside_a_stage_names_the_stage(spans):
    carrier: dict[str, str] = {}
    with tracekit.stage(cv.DOWNSTREAM):
        inject(carrier)
    (stage,) = spans.named(cv.DOWNSTREAM)
    version, trace_id, span_id, flags = carrier["traceparent"].split("-")
    assert int(trace_id, 16) == stage.context.trace_id
    assert int(span_id, 16) == stage.context.span_id
    assert int(flags, 16) & 1  # sampled


def test_current_span_inside_a_stage_carries_the_stages_context(spans):
    with tracekit.stage(cv.PREPROCESS) as span:
        current = trace.get_current_span()
        assert current is span and current.is_recording()
        ctx = current.get_span_context()
    assert not span.is_recording()  # ended
    (stage,) = spans.named(cv.PREPROCESS)
    assert (ctx.trace_id, ctx.span_id) == (stage.context.trace_id, stage.context.span_id)
    assert ctx.trace_flags == stage.context.trace_flags


def test_concurrent_asyncio_tasks_each_get_their_own_trace(spans):
    user = trace.get_tracer("user.code")

    @tracekit.stage(cv.FEATURE_RETRIEVAL)
    async def fetch(i: int) -> None:
        await asyncio.sleep(0.001 * (i % 3))

    async def request(i: int) -> None:
        with user.start_as_current_span(f"request-{i}", attributes={TASK: i}):
            await fetch(i)
            async with tracekit.stage(cv.DOWNSTREAM, **{TASK: i}):
                await asyncio.sleep(0.001 * (i % 2))
                with tracekit.stage("nested", **{TASK: i}):
                    pass

    async def main() -> None:
        await asyncio.gather(*(request(i) for i in range(30)))

    asyncio.run(main())
    got = spans.all()
    roots = {s.attributes[TASK]: s for s in got if s.name.startswith("request-")}
    assert len(roots) == 30 and len({r.context.trace_id for r in roots.values()}) == 30
    by_id = {s.context.span_id: s for s in got}
    for s in got:
        if s.name in (cv.DOWNSTREAM, "nested"):
            root = roots[s.attributes[TASK]]
            assert s.context.trace_id == root.context.trace_id
    for s in (s for s in got if s.name == "nested"):
        assert by_id[s.parent.span_id].name == cv.DOWNSTREAM
        assert by_id[s.parent.span_id].attributes[TASK] == s.attributes[TASK]
    for s in (s for s in got if s.name == cv.FEATURE_RETRIEVAL):
        assert by_id[s.parent.span_id].name.startswith("request-")


def test_threads_and_executor_workers_land_under_the_right_parent(spans):
    user = trace.get_tracer("user.code")

    def in_worker(tag: str) -> None:
        with tracekit.stage("work", **{TASK: tag}):
            pass

    def own_thread(i: int) -> None:
        with user.start_as_current_span(f"thread-{i}"), tracekit.stage("t", **{TASK: f"t{i}"}):
            in_worker(f"t{i}")

    threads = [threading.Thread(target=own_thread, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def request(i: int, pool: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        with user.start_as_current_span(f"request-{i}"):
            async with tracekit.stage("handler", **{TASK: f"r{i}"}):
                # the two ways an asyncio service hands the context to a worker thread
                await asyncio.to_thread(in_worker, f"r{i}-to_thread")
                ctx = contextvars.copy_context()
                await loop.run_in_executor(pool, ctx.run, in_worker, f"r{i}-executor")

    async def main() -> None:
        with ThreadPoolExecutor(4) as pool:
            await asyncio.gather(*(request(i, pool) for i in range(10)))

    asyncio.run(main())
    got = spans.all()
    by_tag = {s.attributes[TASK]: s for s in got if TASK in s.attributes and s.name != "work"}
    work = [s for s in got if s.name == "work"]
    assert len(work) == 8 + 20
    for s in work:
        tag = s.attributes[TASK]
        parent = by_tag[tag.split("-")[0]]  # the thread's stage / the request's handler stage
        assert s.parent.span_id == parent.context.span_id
        assert s.context.trace_id == parent.context.trace_id
    assert len({by_tag[f"t{i}"].context.trace_id for i in range(8)}) == 8
    assert len({by_tag[f"r{i}"].context.trace_id for i in range(10)}) == 10


def test_a_full_buffer_drops_and_counts_instead_of_waiting(spans, monkeypatch, caplog):
    RECORDER.stop()  # nothing drains while the buffer fills
    monkeypatch.setattr(RECORDER, "capacity", 10)
    monkeypatch.setattr(RECORDER, "_warned", False)
    monkeypatch.setattr(RECORDER, "dropped", 0)
    caplog.set_level(logging.WARNING, logger="tracekit")
    for i in range(25):
        with tracekit.stage(cv.PREPROCESS) as span:
            span.set_attribute(TASK, i)
    assert RECORDER.dropped == 15 and _recorder.stats()["pending"] == 10
    full = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(full) == 1  # one line, not one per span
    assert sorted(s.attributes[TASK] for s in spans.all()) == list(range(10))
    tracekit.shutdown()
    summary = [r.getMessage() for r in caplog.records if "15 spans were dropped" in r.getMessage()]
    assert len(summary) == 1


class _StuckAtFirst(InMemorySpanExporter):
    """An exporter whose first export hangs for a while (a slow collector)."""

    def __init__(self, stuck_s: float) -> None:
        super().__init__()
        self.stuck_s, self.first = stuck_s, True

    def export(self, spans):
        if self.first:
            self.first = False
            threading.Event().wait(self.stuck_s)
        return super().export(spans)


def test_shutdown_exports_every_span_recorded_even_past_the_export_queue():
    exporter = _StuckAtFirst(1.0)
    tracekit.configure(service_name="burst", exporter=exporter)
    RECORDER.stop()  # all of them are still buffered when shutdown() starts
    n = 5000  # more than the exporter's batch queue holds (2048) while it is stuck
    for _ in range(n):
        with tracekit.stage(cv.PREPROCESS):
            pass
    tracekit.shutdown()
    assert len(exporter.get_finished_spans()) == n


def test_a_failure_building_a_span_never_reaches_user_code(spans, no_strict, monkeypatch, caplog):
    def broken(self):
        raise RuntimeError("builder exploded")

    monkeypatch.setattr(_spans.FastSpan, "_build", broken)
    for _ in range(3):
        with tracekit.stage(cv.PREPROCESS):
            pass
    spans.all()  # flush: the failure is reported once, here, not in the stage
    assert sum("builder exploded" in r.getMessage() for r in caplog.records) == 1


def test_stage_under_an_unsampled_parent_records_nothing(spans):
    user = trace.get_tracer("user.code")
    parent = trace.NonRecordingSpan(
        trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(0))
    )
    with trace.use_span(parent), tracekit.stage(cv.PREPROCESS) as span:
        assert not span.is_recording()
        assert span.get_span_context().trace_id == 0xABC
        with user.start_as_current_span("inner"):
            pass
    assert list(spans.all()) == []


def test_stage_under_a_remote_parent_joins_its_trace_and_under_an_invalid_one_starts_one(spans):
    remote = trace.SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED)
    )
    with trace.use_span(trace.NonRecordingSpan(remote)), tracekit.stage("joined"):
        pass
    with trace.use_span(trace.INVALID_SPAN), tracekit.stage("new-root"):
        pass
    got = _by_name(spans)
    assert got["joined"].context.trace_id == 0xABC and got["joined"].parent.span_id == 0xDEF
    assert got["joined"].parent.is_remote
    assert got["new-root"].parent is None and got["new-root"].context.trace_id != 0xABC


def _tracer(which: str) -> trace.Tracer:
    """The OTel SDK's tracer (through the global provider), or a FastTracer: same behaviour."""
    if which == "otel":
        return trace.get_tracer("user.code")
    return FAST_PROVIDER.get_tracer("user.code")


@pytest.mark.parametrize("which", ["otel", "fast"])
def test_start_as_current_span_decorates_a_function_with_a_span_per_call(spans, which):
    @_tracer(which).start_as_current_span("work", attributes={TASK: "w"})
    def work(x: int) -> tuple[int, int]:
        """Doubles."""
        with tracekit.stage("inside"):
            pass
        return x * 2, trace.get_current_span().get_span_context().span_id

    @_tracer(which).start_as_current_span("fails")
    def fails() -> None:
        raise ValueError("bad input")

    assert (work.__name__, work.__doc__) == ("work", "Doubles.")
    assert spans.all() == []  # decorating starts nothing
    with tracekit.stage("request"):
        (a, current_a), (b, current_b) = work(1), work(2)
        with pytest.raises(ValueError, match="bad input"):
            fails()
    assert (a, b) == (2, 4)
    got = spans.all()
    request = next(s for s in got if s.name == "request")
    calls = [s for s in got if s.name == "work"]
    assert [s.context.span_id for s in calls] == [current_a, current_b]  # current while it runs
    assert all(s.parent.span_id == request.context.span_id for s in calls)
    assert all(dict(s.attributes) == {TASK: "w"} for s in calls)
    inside = [s.parent.span_id for s in got if s.name == "inside"]
    assert inside == [current_a, current_b]
    (failed,) = [s for s in got if s.name == "fails"]
    assert failed.status.status_code == trace.StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]


@pytest.mark.parametrize("which", ["otel", "fast"])
def test_start_as_current_span_decorates_a_coroutine_function_for_its_whole_run(spans, which):
    @_tracer(which).start_as_current_span("fetch")
    async def fetch(i: int) -> int:
        await asyncio.sleep(0)  # the other call runs here
        with tracekit.stage("after-await", **{TASK: i}):
            pass
        return i

    async def main() -> list[int]:
        return list(await asyncio.gather(fetch(0), fetch(1)))

    with tracekit.stage("request"):
        assert asyncio.run(main()) == [0, 1]
    got = spans.all()
    calls = {s.context.span_id: s for s in got if s.name == "fetch"}
    assert len(calls) == 2
    for inner in (s for s in got if s.name == "after-await"):
        call = calls[inner.parent.span_id]  # under its own call's span, after the await
        assert call.end_time >= inner.end_time


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_after_configure_records_its_own_spans(tmp_path):
    path = tmp_path / "traces.jsonl"
    tracekit.configure(service_name="forked", exporter="file", path=path)
    try:
        with tracekit.stage("before-fork"):
            pass
        # hold the builder so that "before-fork" is still buffered when the child is made
        with RECORDER._lock:
            pid = os.fork()
            if pid == 0:  # the worker: configured by inheritance, as under gunicorn
                code = 1
                try:
                    with (
                        tracekit.stage("in-child"),
                        trace.get_tracer("u").start_as_current_span("x"),
                    ):
                        pass
                    tracekit.shutdown()
                    code = 0
                finally:
                    os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        with tracekit.stage("after-fork"):
            pass
    finally:
        tracekit.shutdown()
    names = [
        s["name"]
        for line in path.read_text().splitlines()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    ]
    # the child exported its own spans, and not a second copy of its parent's
    assert sorted(names) == ["after-fork", "before-fork", "in-child", "x"]
