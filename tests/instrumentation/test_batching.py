"""DynamicBatcher and BatchRecorder: waits split into fill and worker, links, errors."""

from __future__ import annotations

import asyncio
import time

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import tracekit
from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _state


class FakeClock:
    """Epoch nanoseconds that move only when told to."""

    def __init__(self, start: int = 1_700_000_000_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now


def test_recorder_splits_queue_wait_at_batch_close(spans):
    clock = FakeClock()
    t0 = clock.now
    rec = tracekit.BatchRecorder("custom", clock=clock)
    tracer = trace.get_tracer("t")
    tickets, roots = [], []
    for offset in (0, 2_000, 5_000):
        clock.now = t0 + offset
        with tracer.start_as_current_span("request") as root:
            tickets.append(rec.enqueue())
            roots.append(root.get_span_context())
    assert rec.pending == 3 and _state.queue_depth() >= 3
    clock.now = t0 + 10_000
    batch = rec.start(tickets, closed_at_ns=t0 + 6_000)
    assert rec.pending == 0
    clock.now = t0 + 30_000
    with batch:
        inner = tracer.start_span("kernel")
        inner.end()
    got = spans.all()

    queues = sorted((s for s in got if s.name == cv.BATCH_QUEUE), key=lambda s: s.start_time)
    assert [s.attributes[cv.QUEUE_FILL_WAIT_NS] for s in queues] == [6_000, 4_000, 1_000]
    assert [s.attributes[cv.QUEUE_WORKER_WAIT_NS] for s in queues] == [4_000, 4_000, 4_000]
    assert all(s.end_time == t0 + 10_000 for s in queues)
    assert [s.parent.span_id for s in queues] == [r.span_id for r in roots]

    (bspan,) = [s for s in got if s.name == cv.BATCH_SPAN_NAME]
    assert bspan.attributes[cv.BATCH_REQUEST_COUNT] == 3 and bspan.parent is None
    assert [link.context.span_id for link in bspan.links] == [r.span_id for r in roots]
    assert (bspan.start_time, bspan.end_time) == (t0 + 10_000, t0 + 30_000)
    models = [s for s in got if s.name == cv.MODEL_EXECUTE]
    assert sorted(m.parent.span_id for m in models) == sorted(r.span_id for r in roots)
    for m in models:
        assert (m.start_time, m.end_time) == (t0 + 10_000, t0 + 30_000)
        assert m.links[0].context.span_id == bspan.context.span_id
        assert (
            m.attributes[cv.BATCH_ID]
            == bspan.attributes[cv.BATCH_ID]
            == queues[0].attributes[cv.BATCH_ID]
        )
        assert m.attributes[cv.TIME_KIND] == cv.COMPUTE
    (kernel,) = [s for s in got if s.name == "kernel"]
    assert kernel.parent.span_id == bspan.context.span_id


def test_recorder_default_close_charges_all_to_fill(spans):
    clock = FakeClock()
    rec = tracekit.BatchRecorder(clock=clock)
    ticket = rec.enqueue()
    clock.now += 7_000
    rec.start([ticket]).finish()
    (q,) = spans.named(cv.BATCH_QUEUE)
    assert (q.attributes[cv.QUEUE_FILL_WAIT_NS], q.attributes[cv.QUEUE_WORKER_WAIT_NS]) == (
        7_000,
        0,
    )


def _submit_all(batcher, items, *, tracer_name="t"):
    tracer = trace.get_tracer(tracer_name)

    async def one(x):
        with tracer.start_as_current_span(f"request-{x}"):
            return await batcher.submit(x)

    async def main():
        try:
            return await asyncio.gather(*(one(x) for x in items), return_exceptions=True)
        finally:
            await batcher.aclose()

    return asyncio.run(main())


def test_batcher_groups_requests_and_returns_each_its_result(spans):
    sizes: list[int] = []

    async def run_batch(xs: list[int]) -> list[int]:
        sizes.append(len(xs))
        await asyncio.sleep(0.005)
        return [x * x for x in xs]

    batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=4, max_wait_ms=20.0)
    assert _submit_all(batcher, range(10)) == [x * x for x in range(10)]
    assert sum(sizes) == 10 and max(sizes) <= 4 and len(sizes) < 10
    got = spans.all()
    for q in (s for s in got if s.name == cv.BATCH_QUEUE):
        a = q.attributes
        assert a[cv.QUEUE_FILL_WAIT_NS] + a[cv.QUEUE_WORKER_WAIT_NS] == q.end_time - q.start_time
        assert a[cv.QUEUE_FILL_WAIT_NS] >= 0 and a[cv.QUEUE_WORKER_WAIT_NS] >= 0
    batches = [s for s in got if s.name == cv.BATCH_SPAN_NAME]
    assert sorted(b.attributes[cv.BATCH_REQUEST_COUNT] for b in batches) == sorted(sizes)


def test_lone_request_waits_for_the_deadline_then_runs(spans):
    batcher = tracekit.DynamicBatcher(lambda xs: list(xs), max_batch_size=8, max_wait_ms=20.0)
    assert _submit_all(batcher, [5]) == [5]
    (q,) = spans.named(cv.BATCH_QUEUE)
    fill, worker = q.attributes[cv.QUEUE_FILL_WAIT_NS], q.attributes[cv.QUEUE_WORKER_WAIT_NS]
    assert fill >= 10_000_000  # it waited for company, about max_wait_ms
    assert worker < fill  # the only worker was idle
    assert q.attributes[cv.BATCH_SIZE] == 1


def test_busy_worker_shows_up_as_worker_wait(spans):
    def run_batch(xs: list[int]) -> list[int]:
        time.sleep(0.05)  # sync run_batch: runs in the batcher's worker thread
        return list(xs)

    batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=2, max_wait_ms=1.0, workers=1)
    assert _submit_all(batcher, range(4)) == [0, 1, 2, 3]
    queues = spans.named(cv.BATCH_QUEUE)
    by_batch: dict[str, list[int]] = {}
    for q in queues:
        by_batch.setdefault(q.attributes[cv.BATCH_ID], []).append(
            q.attributes[cv.QUEUE_WORKER_WAIT_NS]
        )
    first, second = sorted(by_batch.values(), key=max)
    # the second batch was full at once but had to wait for the only worker
    assert min(second) > max(first) and min(second) > 20_000_000


def test_run_batch_error_reaches_every_caller(spans):
    boom = RuntimeError("CUDA out of memory")

    async def run_batch(xs: list[int]) -> list[int]:
        raise boom

    batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=3, max_wait_ms=5.0)
    results = _submit_all(batcher, range(3))
    assert all(r is boom for r in results)
    failed = [s for s in spans.all() if s.name in (cv.MODEL_EXECUTE, cv.BATCH_SPAN_NAME)]
    assert len(failed) == 4
    for s in failed:
        assert (
            s.status.status_code is StatusCode.ERROR
            and s.attributes[cv.ERROR_TYPE] == "RuntimeError"
        )


def test_wrong_result_count_is_reported_to_callers(spans):
    batcher = tracekit.DynamicBatcher(lambda xs: xs[:1], max_batch_size=2, max_wait_ms=5.0)
    results = _submit_all(batcher, range(2))
    assert all(isinstance(r, ConfigError) and "one result per item" in str(r) for r in results)


def test_cancelled_caller_leaves_the_queue(spans):
    batcher = tracekit.DynamicBatcher(lambda xs: list(xs), max_batch_size=8, max_wait_ms=50.0)

    async def main():
        task = asyncio.create_task(batcher.submit(1))
        await asyncio.sleep(0.005)
        task.cancel()
        kept = await batcher.submit(2)
        await batcher.aclose()
        return kept

    assert asyncio.run(main()) == 2
    assert batcher.pending == 0
    (bspan,) = spans.named(cv.BATCH_SPAN_NAME)
    assert bspan.attributes[cv.BATCH_REQUEST_COUNT] == 1


def test_bad_batcher_arguments():
    with pytest.raises(ConfigError):
        tracekit.DynamicBatcher(lambda xs: xs, max_batch_size=0)
    with pytest.raises(ConfigError):
        tracekit.DynamicBatcher(lambda xs: xs, workers=0)


def test_sync_run_batch_cpu_time_reaches_every_member_model_execute_span(spans):
    def run_batch(xs: list[int]) -> list[int]:
        t_end = time.thread_time_ns() + 3_000_000  # burn ~3 ms of this thread's CPU
        while time.thread_time_ns() < t_end:
            pass
        time.sleep(0.01)  # blocked time is wall time, not CPU time
        return list(xs)

    batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=4, max_wait_ms=5.0)
    assert _submit_all(batcher, range(4)) == [0, 1, 2, 3]
    members = spans.named(cv.MODEL_EXECUTE)
    assert len(members) == 4
    for m in members:
        cpu = m.attributes[cv.CPU_TIME_NS]
        assert cpu >= 3_000_000
        assert cpu < m.end_time - m.start_time  # the 10 ms sleep is not CPU


def test_every_member_model_execute_says_how_device_time_was_taken(spans):
    """Issue 9: on a CPU-only machine the members' spans had no tracekit.gpu.sync."""

    def with_model_execution(xs: list[int]) -> list[int]:
        with tracekit.model_execution():  # no CUDA here: sync "none"
            return list(xs)

    def without(xs: list[int]) -> list[int]:
        return list(xs)

    for run_batch in (with_model_execution, without):
        spans.clear()
        batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=2, max_wait_ms=1.0)
        assert _submit_all(batcher, range(2)) == [0, 1]
        members = [s for s in spans.named(cv.MODEL_EXECUTE) if cv.BATCH_ID in s.attributes]
        assert len(members) == 2
        for m in members:
            assert m.attributes[cv.GPU_SYNC] == cv.SYNC_NONE
            assert cv.GPU_TIME_NS not in m.attributes
