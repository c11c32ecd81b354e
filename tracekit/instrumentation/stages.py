"""``stage()``: one span per serving stage, as decorator or context manager.

A stage span carries ``tracekit.stage`` and ``tracekit.time_kind`` (default per stage
from :mod:`tracekit.conventions`) plus any attributes given. It records
``tracekit.cpu_time_ns`` where one thread ran the whole stage and nothing else ran
in its place:

- ``with stage(...)`` and a decorated sync function: the thread's CPU time from
  enter to exit (don't ``await`` inside a plain ``with``: other tasks would run on
  the thread and be charged; use ``async with`` there);
- a decorated ``async def``: the CPU time of the coroutine's own steps only, measured
  around each resumption, so other requests served meanwhile are not charged;
- ``async with stage(...)``: no CPU time — the body's awaits let other tasks run on the
  same thread, and no per-task clock exists to separate them.

An exception from user code is recorded on the span (status ERROR, ``error.type``)
and re-raised unchanged; tracekit's own failures never reach the caller.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from contextvars import ContextVar
from typing import Any, TypeVar, cast

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation._otel_internals import SPAN_KEY
from tracekit.instrumentation._spans import FastSpan, attach_span, current_context, detach
from tracekit.instrumentation._tracer import FAST_PROVIDER
from tracekit.instrumentation.profiling import PROFILE_ENTER, PROFILE_EXIT

F = TypeVar("F", bound=Callable[..., Any])

# FastSpans: a few microseconds on the request path, built into SDK spans later
_TRACER = FAST_PROVIDER.get_tracer("tracekit.stages")
_INVALID = trace.INVALID_SPAN
_thread_time = time.thread_time_ns
_get_ident = threading.get_ident
_CPU_TIME_NS = cv.CPU_TIME_NS
_INTERNAL = trace.SpanKind.INTERNAL


def record_error(span: trace.Span, exc: BaseException) -> None:
    """Mark ``span`` as failed by ``exc`` (status ERROR, ``error.type``, exception event)."""
    if not span.is_recording():
        return
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    span.set_attribute(cv.ERROR_TYPE, type(exc).__qualname__)


def _profile(hooks: dict[str, Callable[[trace.Span], None]], name: str, span: trace.Span) -> None:
    """Run the profiling hook of stage ``name`` (:mod:`.profiling`; it guards itself)."""
    hook = hooks.get(name)
    if hook is not None:
        hook(span)


class _Entry:
    __slots__ = ("owner", "span", "token", "cpu0", "tid", "prev")

    def __init__(
        self, owner: Stage, span: trace.Span, token: object, cpu0: int, prev: _Entry | None
    ):
        self.owner, self.span, self.token, self.cpu0, self.prev = owner, span, token, cpu0, prev
        self.tid = _get_ident()


# Open context-manager entries of this task/thread, innermost first. A ContextVar
# (not an attribute) so that one Stage object may be entered by many tasks at once.
_OPEN: ContextVar[_Entry | None] = ContextVar("tracekit_open_stages", default=None)


class _CpuTimed:
    """Awaits a coroutine while summing the thread CPU time of its own steps."""

    __slots__ = ("_coro", "cpu_ns")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self.cpu_ns = 0

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, clock = self._coro, _thread_time
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                self.cpu_ns += clock() - t0
                return stop.value
            except BaseException:
                self.cpu_ns += clock() - t0
                raise
            self.cpu_ns += clock() - t0
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # cancellation and friends go to the coroutine
                value, error = None, exc


class Stage:
    """A stage span factory; see :func:`stage`."""

    __slots__ = ("name", "time_kind", "attributes")

    def __init__(self, name: str, time_kind: str | None = None, **attributes: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"stage(): name must be a non-empty string, got {name!r}")
        kind = time_kind if time_kind is not None else cv.default_time_kind(name)
        if kind not in cv.TIME_KINDS:
            raise ConfigError(
                f"stage({name!r}): time_kind must be one of {cv.TIME_KINDS}, got {kind!r}"
            )
        self.name = name
        self.time_kind = kind
        self.attributes: dict[str, Any] = {cv.STAGE: name, cv.TIME_KIND: kind, **attributes}

    # --- span plumbing shared by every form -------------------------------------
    def _start(self) -> tuple[trace.Span, object]:
        try:
            span = _TRACER.start_span(self.name, attributes=self.attributes)
            token = attach_span(span)
        except Exception as exc:
            _guard.report("stage start", exc, self.name)
            return _INVALID, None
        if PROFILE_ENTER:  # a capture is armed (rarely): it may start here
            _profile(PROFILE_ENTER, self.name, span)
        return span, token

    def _finish(
        self, span: trace.Span, token: object, exc: BaseException | None, cpu_ns: int | None
    ) -> None:
        try:
            if token is not None:
                detach(token)
            # no is_recording() check: a non-recording span ignores these anyway
            if cpu_ns is not None:
                span.set_attribute(cv.CPU_TIME_NS, cpu_ns)
            if exc is not None:
                record_error(span, exc)
            span.end()
        except Exception as err:
            _guard.report("stage end", err, self.name)
        if PROFILE_EXIT:  # a profile_on rule or a capture watches some stage
            _profile(PROFILE_EXIT, self.name, span)

    # --- with / async with ---------------------------------------------------------
    # The with-form is the hot one, so it is written out rather than shared. A stage
    # that records is a FastSpan, current in the OTel context until exit: its own slots
    # hold what exit needs, and exit finds it as the current span. Anything else (not
    # configured, parent not sampled) keeps an _Entry on the _OPEN stack instead.
    def __enter__(self) -> trace.Span:
        try:
            span = _TRACER.start_span(self.name, None, _INTERNAL, self.attributes)
            token: object = attach_span(span)
        except Exception as exc:
            _guard.report("stage start", exc, self.name)
            span, token = _INVALID, None
        if PROFILE_ENTER:  # before the CPU clock is read: a starting capture is not the stage's
            _profile(PROFILE_ENTER, self.name, span)
        if type(span) is FastSpan:
            span._owner, span._token, span._tid = self, token, _get_ident()
            span._cpu0 = _thread_time()
        else:
            _OPEN.set(_Entry(self, span, token, _thread_time(), _OPEN.get()))
        return span

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        span = current_context().get(SPAN_KEY)
        if type(span) is FastSpan and span._owner is self:
            cpu = _thread_time() - span._cpu0
            try:
                span._owner = None
                detach(span._token)
                span._token = None  # the buffer must not keep the context alive
                if span._tid == _get_ident():  # set_attribute, inlined
                    if span._sets is None:
                        span._sets = [(_CPU_TIME_NS, cpu)]
                    else:
                        span._sets.append((_CPU_TIME_NS, cpu))
                if exc is not None:
                    record_error(span, exc)
                span.end()
            except Exception as err:
                _guard.report("stage end", err, self.name)
            if PROFILE_EXIT:
                _profile(PROFILE_EXIT, self.name, span)
            return
        entry = self._pop()
        if entry is None:
            return
        entry_cpu = _thread_time() - entry.cpu0 if entry.tid == _get_ident() else None
        self._finish(entry.span, entry.token, exc, entry_cpu)

    def _pop(self) -> _Entry | None:
        """This stage's open entry, taken off the stack; None (reported) if it is not on top."""
        entry = _OPEN.get()
        if entry is None or entry.owner is not self:
            _guard.report(
                f"stage({self.name!r}) exit", RuntimeError("exit without a matching enter")
            )
            return None
        _OPEN.set(entry.prev)
        return entry

    async def __aenter__(self) -> trace.Span:
        span, token = self._start()
        if type(span) is FastSpan:
            span._owner, span._token, span._tid = self, token, None  # no CPU time: see above
        else:
            _OPEN.set(_Entry(self, span, token, -1, _OPEN.get()))
        return span

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        span = current_context().get(SPAN_KEY)
        if type(span) is FastSpan and span._owner is self:
            span._owner = None
            token, span._token = span._token, None
            self._finish(span, token, exc, None)
            return
        entry = self._pop()
        if entry is None:
            return
        self._finish(entry.span, entry.token, exc, None)

    # --- decorator -----------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise ConfigError(
                f"stage({self.name!r}) cannot decorate generator {fn.__qualname__}; "
                "use `with stage(...)` around the loop instead"
            )
        if inspect.iscoroutinefunction(fn):
            return cast(F, self._wrap_async(fn))

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            span, token = self._start()
            cpu0 = _thread_time()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                self._finish(span, token, exc, _thread_time() - cpu0)
                raise
            self._finish(span, token, None, _thread_time() - cpu0)
            return result

        return cast(F, sync_wrapper)

    def _wrap_async(self, fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            span, token = self._start()
            timed = _CpuTimed(cast(Coroutine[Any, Any, Any], fn(*args, **kwargs)))
            try:
                result = await timed
            except BaseException as exc:
                self._finish(span, token, exc, timed.cpu_ns)
                raise
            self._finish(span, token, None, timed.cpu_ns)
            return result

        return async_wrapper


def stage(name: str, time_kind: str | None = None, **attributes: Any) -> Stage:
    """A span for one serving stage: ``@stage("x")``, ``with stage("x")``, ``async with stage("x")``.

    ``name`` is a built-in stage (``feature_retrieval``, ``preprocess``, ``batch_queue``,
    ``model_execute``, ``postprocess``, ``downstream``) or your own; ``time_kind`` is
    ``"wait"`` or ``"compute"`` (default: per stage, ``compute`` for your own names);
    ``attributes`` are added to the span, e.g. ``stage("feature_retrieval",
    **{tracekit.conventions.CACHE_HIT: True})``. The context-manager forms give the span,
    so attributes known only later can be set on it.
    """
    return Stage(name, time_kind, **attributes)
