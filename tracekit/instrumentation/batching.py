"""Dynamic batching with per-request traces: ``DynamicBatcher`` and the ``BatchRecorder`` hooks.

One batch execution serves many traces (the OTel messaging-batch pattern). For each
member request the recorder writes, in that request's trace:

- ``batch_queue`` (wait): from joining the queue to the start of execution, split into
  ``tracekit.queue.fill_wait_ns`` (until the batch closed: full, or ``max_wait_ms``
  after its first member) and ``tracekit.queue.worker_wait_ns`` (closed, waiting for a
  free worker);
- ``model_execute`` (compute): the whole batch's execution, as Triton charges it,
  linked to the batch span;

and, in a trace of its own, one ``tracekit.batch`` span with
``tracekit.batch.request_count`` and a link to every member's request span. Spans
from ``run_batch`` itself (e.g. ``model_execution``) nest under the batch span.

A custom batcher records the same spans through :class:`BatchRecorder`::

    rec = BatchRecorder("my-batcher")
    ticket = rec.enqueue()                     # in the request's task, on joining the queue
    batch = rec.start(tickets, closed_at_ns=t) # a worker takes the batch (t: when it closed)
    with batch:                                # run it; spans made inside nest under it
        outputs = run(inputs)
    # leaving the block (or batch.finish(error)) ends every span; errors are recorded
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard, _state
from tracekit.instrumentation._spans import attach_span, current_context, detach
from tracekit.instrumentation._tracer import FAST_PROVIDER
from tracekit.instrumentation.stages import record_error
from tracekit.instrumentation.torch import BATCH_SINK

T = TypeVar("T")
R = TypeVar("R")

# FastSpans: cheap on the request path (enqueue) and in the batch loop, built later
_TRACER = FAST_PROVIDER.get_tracer("tracekit.batching")
_ids = itertools.count(1)


class Ticket:
    """One request's place in a batch queue (from :meth:`BatchRecorder.enqueue`)."""

    __slots__ = ("enqueued_ns", "parent", "request", "span", "_recorder", "_open")

    def __init__(self, recorder: BatchRecorder, enqueued_ns: int) -> None:
        self._recorder = recorder
        self.enqueued_ns = enqueued_ns
        self.parent: Context = current_context()
        current = _state.REQUEST_SPAN.get() or trace.get_current_span()
        self.request: trace.SpanContext = current.get_span_context()
        self.span: trace.Span = trace.INVALID_SPAN
        self._open = True

    def cancel(self) -> None:
        """The request left the queue without being batched (e.g. its caller gave up)."""
        if self._open:
            self._open = False
            self._recorder._pending -= 1
            self.span.set_attribute(cv.ERROR_TYPE, "cancelled")
            self.span.end(end_time=self._recorder.clock())


class Batch:
    """A batch being executed (from :meth:`BatchRecorder.start`): a context manager."""

    def __init__(self, recorder: BatchRecorder, tickets: Sequence[Ticket], started_ns: int) -> None:
        self.size = len(tickets)
        self.started_ns = started_ns
        self._recorder = recorder
        self._token: object = None
        links = [trace.Link(t.request) for t in tickets if t.request.is_valid]
        self.span = _TRACER.start_span(
            cv.BATCH_SPAN_NAME,
            context=Context(),
            links=links,
            start_time=started_ns,
            attributes={cv.BATCH_REQUEST_COUNT: self.size, cv.BATCH_SIZE: self.size},
        )
        ctx = self.span.get_span_context()
        self.id = f"{ctx.span_id:016x}" if ctx.is_valid else f"{next(_ids):016x}"
        self.span.set_attribute(cv.BATCH_ID, self.id)
        batch_link = [trace.Link(ctx)] if ctx.is_valid else []
        attrs: dict[str, Any] = {
            cv.STAGE: cv.MODEL_EXECUTE,
            cv.TIME_KIND: cv.default_time_kind(cv.MODEL_EXECUTE),
            cv.BATCH_ID: self.id,
            cv.BATCH_SIZE: self.size,
        }
        self.members = [
            _TRACER.start_span(
                cv.MODEL_EXECUTE,
                context=t.parent,
                links=batch_link,
                start_time=started_ns,
                attributes=attrs,
            )
            for t in tickets
        ]
        self._done = False

    def __enter__(self) -> Batch:
        self._token = attach_span(self.span)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._token is not None:
            detach(self._token)
            self._token = None
        self.finish(exc)

    def finish(
        self,
        error: BaseException | None = None,
        *,
        gpu_time_ns: int | None = None,
        gpu_sync: str | None = None,
        cpu_time_ns: int | None = None,
    ) -> None:
        """End the batch span and every member's ``model_execute`` span (once).

        ``cpu_time_ns`` is the CPU time of the thread that ran the batch, when one thread
        ran all of it: every member is charged the batch's execution, so every member's
        span carries it, which is what lets the analyzer tell hidden wait from compute.
        ``gpu_sync`` is how device time was taken (``tracekit.gpu.sync``); without one the
        spans say ``none``, so no ``model_execute`` span leaves it open.
        """
        if self._done:
            return
        self._done = True
        try:
            end = self._recorder.clock()
            extra: dict[str, Any] = {}
            if cpu_time_ns is not None:
                extra[cv.CPU_TIME_NS] = cpu_time_ns
            if gpu_time_ns is not None:
                extra[cv.GPU_TIME_NS] = gpu_time_ns
            # every model_execute span says how (or whether) device time was taken
            extra[cv.GPU_SYNC] = gpu_sync if gpu_sync is not None else cv.SYNC_NONE
            for span in (self.span, *self.members):
                if extra:
                    span.set_attributes(extra)
                if error is not None:
                    record_error(span, error)
                span.end(end_time=end)
        except Exception as exc:
            _guard.report("batch finish", exc)


class BatchRecorder:
    """Writes a batcher's spans; the hook API for batchers other than :class:`DynamicBatcher`.

    ``clock`` returns epoch nanoseconds (the span clock); tests pass a fake one.
    Its queue counts towards the request span's ``tracekit.queue.depth``.
    """

    def __init__(self, name: str = "batcher", *, clock: Callable[[], int] = time.time_ns) -> None:
        self.name = name
        self.clock = clock
        self._pending = 0
        _state.register_queue(self)

    @property
    def pending(self) -> int:
        """Requests enqueued and not yet started."""
        return self._pending

    def enqueue(self) -> Ticket:
        """A request joins the queue; call it in the request's own context. Never raises."""
        ticket = Ticket(self, self.clock())
        self._pending += 1
        try:
            ticket.span = _TRACER.start_span(
                cv.BATCH_QUEUE,
                start_time=ticket.enqueued_ns,
                attributes={
                    cv.STAGE: cv.BATCH_QUEUE,
                    cv.TIME_KIND: cv.default_time_kind(cv.BATCH_QUEUE),
                },
            )
        except Exception as exc:
            _guard.report("batch enqueue", exc)
        return ticket

    def start(self, tickets: Sequence[Ticket], *, closed_at_ns: int | None = None) -> Batch:
        """A worker starts a batch: close the members' ``batch_queue`` spans, open the batch.

        ``closed_at_ns`` is when the batch stopped taking members (full, or timed out);
        the default is now, which charges every wait to filling.
        """
        now = self.clock()
        closed = now if closed_at_ns is None else min(closed_at_ns, now)
        batch = Batch(self, tickets, now)
        for t in tickets:
            if not t._open:
                continue
            t._open = False
            self._pending -= 1
            waited = max(0, now - t.enqueued_ns)
            fill = min(waited, max(0, closed - t.enqueued_ns))
            try:
                t.span.set_attributes(
                    {
                        cv.BATCH_ID: batch.id,
                        cv.BATCH_SIZE: batch.size,
                        cv.QUEUE_FILL_WAIT_NS: fill,
                        cv.QUEUE_WORKER_WAIT_NS: waited - fill,
                    }
                )
                t.span.end(end_time=now)
            except Exception as exc:
                _guard.report("batch start", exc)
        return batch


class _Member(Generic[T, R]):
    __slots__ = ("item", "future", "ticket")

    def __init__(self, item: T, future: asyncio.Future[R], ticket: Ticket) -> None:
        self.item, self.future, self.ticket = item, future, ticket


class DynamicBatcher(Generic[T, R]):
    """Groups concurrent ``submit()`` calls into batches for ``run_batch`` (asyncio).

    A batch closes when it holds ``max_batch_size`` items or ``max_wait_ms`` after its
    first item arrived, then waits for one of ``workers`` to be free. ``run_batch``
    takes a list of items and returns one result per item, in order; it may be
    ``async`` (awaited on the loop) or plain (run in a thread pool of ``workers``
    threads). If it raises, every member's ``submit()`` raises the same exception.
    """

    def __init__(
        self,
        run_batch: Callable[[list[T]], Awaitable[list[R]]] | Callable[[list[T]], list[R]],
        *,
        max_batch_size: int = 8,
        max_wait_ms: float = 5.0,
        workers: int = 1,
        name: str = "batcher",
        recorder: BatchRecorder | None = None,
    ) -> None:
        if max_batch_size < 1 or workers < 1 or max_wait_ms < 0:
            raise ConfigError(
                "DynamicBatcher: max_batch_size and workers must be >= 1 and max_wait_ms >= 0, "
                f"got {max_batch_size}, {workers}, {max_wait_ms}"
            )
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.max_wait_ns = int(max_wait_ms * 1_000_000)
        self.workers = workers
        self.recorder = recorder or BatchRecorder(name)
        self._is_async = inspect.iscoroutinefunction(run_batch)
        self._executor: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[_Member[T, R]] | None = None
        self._slots: asyncio.Semaphore | None = None
        self._collector: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()

    @property
    def pending(self) -> int:
        """Items submitted and not yet executing."""
        return self.recorder.pending

    def _ensure_started(self) -> asyncio.Queue[_Member[T, R]]:
        loop = asyncio.get_running_loop()
        if (
            self._queue is None
            or self._loop is not loop
            or self._collector is None
            or self._collector.done()
        ):
            # asyncio primitives belong to one loop: a new loop (a new test) gets new ones
            self._loop = loop
            self._queue = asyncio.Queue()
            self._slots = asyncio.Semaphore(self.workers)
            self._collector = loop.create_task(
                self._collect(), name=f"tracekit-{self.recorder.name}"
            )
        return self._queue

    async def submit(self, item: T) -> R:
        """Add ``item`` to the next batch and wait for its result."""
        queue = self._ensure_started()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        queue.put_nowait(_Member(item, future, self.recorder.enqueue()))
        return await future

    async def _next_batch(
        self, queue: asyncio.Queue[_Member[T, R]]
    ) -> tuple[list[_Member[T, R]], int]:
        while True:
            batch, closed = await self._fill(queue)
            live = []
            for m in batch:
                if m.future.done():  # its caller gave up (cancelled) while it waited
                    m.ticket.cancel()
                else:
                    live.append(m)
            if live:
                return live, closed

    async def _fill(self, queue: asyncio.Queue[_Member[T, R]]) -> tuple[list[_Member[T, R]], int]:
        clock = self.recorder.clock
        free_at = clock()  # this loop is free to collect from here on
        batch = [await queue.get()]
        deadline = batch[0].ticket.enqueued_ns + self.max_wait_ns
        while len(batch) < self.max_batch_size:
            try:
                batch.append(queue.get_nowait())
                continue
            except asyncio.QueueEmpty:
                pass
            remaining = (deadline - clock()) / 1e9
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except TimeoutError:
                break
        # When the batch stopped taking members. If it was full or past its deadline
        # before this loop came back from waiting for a worker, that moment (the
        # lateness is worker wait); otherwise now, event-loop lag included.
        now = clock()
        full = len(batch) == self.max_batch_size
        due = batch[-1].ticket.enqueued_ns if full else deadline
        return batch, (due if due < free_at else now)

    async def _collect(self) -> None:
        queue, slots = self._queue, self._slots
        assert queue is not None and slots is not None
        while True:
            members, closed_ns = await self._next_batch(queue)
            await slots.acquire()
            task = asyncio.get_running_loop().create_task(self._execute(members, closed_ns, slots))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _execute(
        self, members: list[_Member[T, R]], closed_ns: int, slots: asyncio.Semaphore
    ) -> None:
        error: BaseException | None = None
        results: list[R] = []
        sink: list[tuple[int | None, str]] = []
        cpu_box: list[int] = []
        try:
            batch = self.recorder.start([m.ticket for m in members], closed_at_ns=closed_ns)
        except Exception as exc:
            _guard.report("batch start", exc)
            batch = None
        sink_token = BATCH_SINK.set(sink)
        ctx_token = attach_span(batch.span) if batch else None
        try:
            items = [m.item for m in members]
            if self._is_async:
                results = await self.run_batch(items)  # type: ignore[misc]
            else:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(
                        self.workers, thread_name_prefix=f"tracekit-{self.recorder.name}"
                    )
                run = contextvars.copy_context().run
                fn: Any = self.run_batch

                def timed(batch_items: list[T]) -> Any:
                    # One worker thread runs the whole batch, so its thread CPU time is
                    # the batch's compute (minus time it spent blocked or descheduled).
                    t0 = time.thread_time_ns()
                    try:
                        return fn(batch_items)
                    finally:
                        cpu_box.append(time.thread_time_ns() - t0)

                results = await asyncio.get_running_loop().run_in_executor(
                    self._executor, run, timed, items
                )
            if len(results) != len(members):
                raise ConfigError(
                    f"DynamicBatcher: run_batch returned {len(results)} results for {len(members)} items; "
                    "it must return one result per item, in order"
                )
        except BaseException as exc:  # cancellation too: every waiting caller must hear of it
            error = exc
        finally:
            if ctx_token is not None:
                detach(ctx_token)
            BATCH_SINK.reset(sink_token)
            slots.release()
        if batch is not None:
            device_ns = [ns for ns, _ in sink if ns is not None]
            batch.finish(
                error,
                gpu_time_ns=sum(device_ns) if device_ns else None,
                gpu_sync=sink[-1][1] if sink else None,
                cpu_time_ns=cpu_box[0] if cpu_box else None,
            )
        # results go out after the spans end, so model_execute ends before the caller resumes
        for i, m in enumerate(members):
            if m.future.done():
                continue
            if isinstance(error, asyncio.CancelledError):
                m.future.cancel()
            elif error is not None:
                m.future.set_exception(error)
            else:
                m.future.set_result(results[i])
        if isinstance(error, asyncio.CancelledError):
            raise error

    async def aclose(self) -> None:
        """Stop collecting, wait for running batches, and close the worker threads."""
        if self._collector is not None:
            self._collector.cancel()
            await asyncio.gather(self._collector, return_exceptions=True)
            self._collector = None
        while self._queue is not None and not self._queue.empty():
            left = self._queue.get_nowait()  # never batched: their callers are cancelled
            left.ticket.cancel()
            left.future.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
