"""Training steps as traces: ``train_steps()``, ``communication()`` and the job's identity.

A step plays the part of a request (docs/design.md, "Training steps"): each iteration of
:func:`train_steps` is one trace whose root span is ``train_step`` (``tracekit.step``,
``tracekit.step.samples``, the rank), with a ``data_wait`` stage span for the time the
loop was blocked on the loader. The user's ``tracekit.stage("forward")`` etc. open inside
it. Collectives are ``communication`` stage spans (:func:`communication` around a
hand-called collective; :mod:`tracekit.instrumentation.ddp` for DDP buckets) numbered
per process group by :class:`SeqCounter`, so the same collective has the same
``tracekit.comm.seq`` on every rank.

The step's spans are started after the loader answered, with the start time taken
before the fetch: the fetch that finds the loader exhausted is not a step and leaves no
span behind. Only OTel's API and ``tracekit.stage`` are used, and every failure of
tracekit's own code goes to :mod:`._guard` (logged once; raised under pytest), never into
the training loop.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation.job import (
    ENV_LOCAL_RANK,
    ENV_RANK,
    ENV_WORLD_SIZE,
    JobIdentity,
    job_identity,
    resource_attributes,
)
from tracekit.instrumentation.setup import PROVIDER
from tracekit.instrumentation.stages import record_error

T = TypeVar("T")

__all__ = [
    "ENV_LOCAL_RANK",
    "ENV_RANK",
    "ENV_WORLD_SIZE",
    "SEQ",
    "JobIdentity",
    "active_step",
    "communication",
    "job_identity",
    "resource_attributes",
    "train_steps",
]

DEFAULT_GROUP = "default"
"""``tracekit.comm.group`` of the default (world) process group."""

_TRACER = PROVIDER.get_tracer("tracekit.training")
_thread_time = time.thread_time_ns


# --- collective numbering ---------------------------------------------------------------


class SeqCounter:
    """Numbers collectives per process group; thread-safe (DDP hooks run off the loop thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}

    def take(self, group: str) -> int:
        with self._lock:
            n = self._next.get(group, 0)
            self._next[group] = n + 1
            return n

    def reset(self) -> None:
        with self._lock:
            self._next.clear()


SEQ = SeqCounter()
"""The process-wide collective counter shared by :func:`communication` and DDP buckets."""


def group_name(group: Any = None) -> str:
    """A stable name for a process group: ``default`` for the world group."""
    if group is None:
        return DEFAULT_GROUP
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is not None and group is dist.group.WORLD:
            return DEFAULT_GROUP
        name = getattr(group, "group_name", None)
        return str(name) if name else DEFAULT_GROUP
    except Exception:  # a group without a name is still one group
        return DEFAULT_GROUP


def group_info(group: Any = None) -> tuple[int | None, str | None]:
    """(size, description) of a process group, where torch knows them (None: unknown).

    The size is the ``n`` of the bus bandwidth factors; the description is what
    ``new_group(group_desc=...)`` named it (``default_pg`` for the world group).
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None, None
    try:
        if not dist.is_initialized():
            return None, None
        pg = dist.group.WORLD if group is None else group
        size = int(dist.get_world_size(pg))
        desc = getattr(pg, "group_desc", None)
        return size, str(desc) if desc and desc != "undefined" else None
    except Exception:  # a custom or torn-down group: its collectives still get spans
        return None, None


# --- device-timed collectives (NCCL), finished at the step's end -----------------------

PENDING_DEVICE: list[tuple[trace.Span, int, Any, Any]] = []
"""(span, launch ns, start event, end event) of collectives timed with CUDA events."""
PENDING_LOCK = threading.Lock()


def settle_pending() -> None:
    """End the device-timed collective spans still open: launch + elapsed device time."""
    with PENDING_LOCK:
        pending = list(PENDING_DEVICE)
        PENDING_DEVICE.clear()
    for span, launch_ns, start_ev, end_ev in pending:
        try:
            end_ev.synchronize()
            span.end(end_time=launch_ns + int(start_ev.elapsed_time(end_ev) * 1e6))
        except Exception as exc:
            _guard.report("training: device timing", exc)
            span.end()


# --- the step that is running now -------------------------------------------------------


class _Step:
    """The open step: its span and the loop thread, for spans made on other threads."""

    __slots__ = ("span", "index", "thread", "identity")

    def __init__(self, span: trace.Span, index: int, identity: JobIdentity) -> None:
        self.span = span
        self.index = index
        self.thread = threading.get_ident()
        self.identity = identity


_ACTIVE: _Step | None = None


def active_step() -> _Step | None:
    """The step :func:`train_steps` has open, if any (read by the DDP hook)."""
    return _ACTIVE


def launch_parent() -> trace.Span:
    """The span a collective launched now belongs under.

    On the loop's thread (and on the thread a CPU backward runs on, which is the
    caller's) that is the current span: the open stage. Elsewhere — a CUDA autograd
    thread does not see the loop's context — the open step's span, so the collective at
    least stays in its step.
    """
    current = trace.get_current_span()
    if current.get_span_context().is_valid:
        return current
    step = _ACTIVE
    return step.span if step is not None else current


def start_comm_span(
    op: str,
    *,
    nbytes: int | None,
    group: str,
    parent: trace.Span,
    start_ns: int,
    is_async: bool,
    backend: str | None,
    group_size: int | None = None,
    group_desc: str | None = None,
) -> trace.Span:
    """A ``communication`` stage span under ``parent``, numbered in ``group``."""
    attrs: dict[str, Any] = {
        cv.STAGE: cv.COMMUNICATION,
        cv.TIME_KIND: cv.default_time_kind(cv.COMMUNICATION),
        cv.COMM_OP: op,
        cv.COMM_GROUP: group,
        cv.COMM_SEQ: SEQ.take(group),
    }
    if nbytes is not None:
        attrs[cv.COMM_BYTES] = int(nbytes)
    if is_async:
        attrs[cv.COMM_ASYNC] = True
    if backend:
        attrs[cv.COMM_BACKEND] = backend
    if group_size is not None:
        attrs[cv.COMM_GROUP_SIZE] = group_size
    if group_desc:
        attrs[cv.COMM_GROUP_DESC] = group_desc
    step = _ACTIVE
    if step is not None:
        attrs[cv.STEP] = step.index
    ctx = trace.set_span_in_context(parent) if parent.get_span_context().is_valid else None
    return _TRACER.start_span(
        f"{cv.COMM_SPAN_NAME} {op}", context=ctx, start_time=start_ns, attributes=attrs
    )


@contextmanager
def communication(
    op: str, *, bytes: int | None = None, group: Any = None, backend: str | None = None
) -> Iterator[trace.Span]:
    """A ``communication`` span around a collective you call by hand.

    ``with tracekit.communication("all_reduce", bytes=t.numel() * t.element_size()):
    dist.all_reduce(t)``. ``group`` is the process group (default: the world group);
    the span gets the group's next ``tracekit.comm.seq``, so call it on every rank for
    the same collectives in the same order, as the collectives themselves require. The
    thread is inside the call throughout, so all of it can be exposed time.
    """
    span: trace.Span = trace.INVALID_SPAN
    token: object = None
    try:
        size, desc = group_info(group)
        span = start_comm_span(
            op,
            nbytes=bytes,
            group=group_name(group),
            parent=trace.get_current_span(),
            start_ns=time.time_ns(),
            is_async=False,
            backend=backend,
            group_size=size,
            group_desc=desc,
        )
        token = otel_context.attach(trace.set_span_in_context(span))
    except Exception as exc:
        _guard.report("training: communication start", exc, op)
    try:
        yield span
    except BaseException as exc:
        _end(span, token, exc)
        raise
    _end(span, token, None)


def _end(span: trace.Span, token: object, exc: BaseException | None) -> None:
    try:
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
        if exc is not None:
            record_error(span, exc)
        span.end()
    except Exception as err:
        _guard.report("training: communication end", err)


# --- the step loop -----------------------------------------------------------------------


def _samples_of(samples: int | Callable[[Any], int] | None, item: Any) -> int | None:
    if samples is None:
        return None
    if callable(samples):
        try:
            return int(samples(item))
        except Exception as exc:
            _guard.report("training: samples()", exc)
            return None
    return int(samples)


def train_steps(
    iterable: Iterable[T],
    samples: int | Callable[[T], int] | None = None,
    start: int = 0,
    tokens: int | Callable[[T], int] | None = None,
) -> Iterator[T]:
    """Iterate ``iterable`` (a DataLoader) with one ``train_step`` trace per item.

    The step span opens before the next item is fetched, so the time blocked in the
    loader is the step's ``data_wait`` stage; it ends when the next iteration begins or
    the loop ends (``break`` and exceptions included). ``samples`` (and ``tokens``) is a
    count or a function of the item, written as ``tracekit.step.samples``; ``start`` is
    the index of the first step (resume from a checkpoint with ``start=global_step``)::

        for x, y in tracekit.train_steps(loader, samples=lambda b: len(b[0])):
            with tracekit.stage("forward"): loss = loss_fn(ddp(x), y)
            with tracekit.stage("backward"): loss.backward()
            with tracekit.stage("optimizer"): opt.step(); opt.zero_grad()
    """
    if samples is not None and not callable(samples) and not isinstance(samples, int):
        raise ConfigError(f"train_steps(): samples must be an int or a function, got {samples!r}")
    return _steps(iter(iterable), samples, tokens, int(start))


def _steps(
    it: Iterator[T],
    samples: int | Callable[[T], int] | None,
    tokens: int | Callable[[T], int] | None,
    index: int,
) -> Iterator[T]:
    global _ACTIVE
    identity = job_identity()
    t0 = time.time_ns()
    while True:
        cpu0 = _thread_time()
        try:
            item = next(it)
        except StopIteration:
            return
        t1, cpu1 = time.time_ns(), _thread_time()
        step = _open_step(item, index, identity, samples, tokens, t0, t1, cpu1 - cpu0)
        token = _attach(step)
        if step is not None:
            _ACTIVE = step
        try:
            yield item
        finally:
            # next iteration, break (generator closed) or an exception in the body
            t0 = time.time_ns()
            if step is not None and _ACTIVE is step:
                _ACTIVE = None
            _close_step(step, token, t0)
        index += 1


def _open_step(
    item: Any,
    index: int,
    identity: JobIdentity,
    samples: Any,
    tokens: Any,
    t0: int,
    t1: int,
    fetch_cpu_ns: int,
) -> _Step | None:
    try:
        attrs: dict[str, Any] = {cv.STEP: index, **identity.attributes()}
        n = _samples_of(samples, item)
        if n is not None:
            attrs[cv.STEP_SAMPLES] = n
        k = _samples_of(tokens, item)
        if k is not None:
            attrs[cv.STEP_TOKENS] = k
        # An empty context: every step is its own trace, whatever span encloses the loop.
        span = _TRACER.start_span(
            cv.STEP_SPAN_NAME, context=Context(), start_time=t0, attributes=attrs
        )
        wait = _TRACER.start_span(
            cv.DATA_WAIT,
            context=trace.set_span_in_context(span),
            start_time=t0,
            attributes={
                cv.STAGE: cv.DATA_WAIT,
                cv.TIME_KIND: cv.default_time_kind(cv.DATA_WAIT),
                cv.CPU_TIME_NS: fetch_cpu_ns,
            },
        )
        wait.end(end_time=t1)
        return _Step(span, index, identity)
    except Exception as exc:
        _guard.report("training: step start", exc)
        return None


def _attach(step: _Step | None) -> object:
    if step is None:
        return None
    try:
        return otel_context.attach(trace.set_span_in_context(step.span))
    except Exception as exc:
        _guard.report("training: step attach", exc)
        return None


def _close_step(step: _Step | None, token: object, end_ns: int) -> None:
    if step is None:
        return
    try:
        if token is not None:
            otel_context.detach(token)  # type: ignore[arg-type]
        settle_pending()  # device-timed buckets of this step get their times now
        step.span.end(end_time=end_ns)
    except Exception as exc:
        _guard.report("training: step end", exc)
