"""The tracer side of recorded spans: :class:`FastTracer`, :data:`FAST_PROVIDER`, :func:`start_child`.

A :class:`FastTracer` has the ``trace.Tracer`` interface and starts
:class:`~._spans.FastSpan`\\ s in the configuration that is current (no-op spans before
``configure()``, as the proxy tracer's). It decides sampling as the SDK would: under
a parent-based sampler (tracekit's always is) a child follows its parent's flag
without a call; a root, or any span under another kind of sampler, asks the sampler.
OTel instrumentations given :data:`FAST_PROVIDER` (tracekit's httpx client spans)
record their spans this way too.
"""

from __future__ import annotations

import functools
import inspect
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from tracekit.instrumentation import setup
from tracekit.instrumentation._otel_internals import SPAN_KEY
from tracekit.instrumentation._spans import (
    FastSpan,
    _Sink,
    attach_span,
    current_context,
    detach,
)

_INTERNAL = SpanKind.INTERNAL
_SAMPLED = int(TraceFlags.SAMPLED)
_RANDOM = int(TraceFlags.RANDOM_TRACE_ID)
_INVALID = trace.INVALID_SPAN
_STATE = setup._STATE  # mutated by configure(), never replaced
_bits = random.getrandbits
_new = object.__new__
_time_ns = time.time_ns
_DEFAULT_OPTS = (True, True)  # (record_exception, set_status_on_exception)
F = TypeVar("F", bound=Callable[..., Any])


def _new_span_id() -> int:
    return _bits(64) or _bits(64) or 1


def _span_id(sink: _Sink) -> int:
    return int(sink.tracer.id_generator.generate_span_id())


class _AsCurrent:
    """``start_as_current_span``'s result: a context manager, as ``trace.use_span`` behaves,
    and a decorator, as the OTel API's is (sync and ``async def`` functions).

    The span starts on entering, not when this object is made — as the SDK's, whose
    generator runs on ``__enter__`` — so that a decorator made once at import starts
    a new span on every call of the function it wraps.
    """

    __slots__ = ("tracer", "args", "end_on_exit", "span", "token")

    def __init__(self, tracer: FastTracer, args: tuple[Any, ...], end_on_exit: bool) -> None:
        # args: FastTracer.start_span's positional arguments, in its order
        self.tracer, self.args, self.end_on_exit = tracer, args, end_on_exit
        self.token: object = None

    def __enter__(self) -> trace.Span:
        span = self.span = self.tracer.start_span(*self.args)
        self.token = attach_span(span)
        return span

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        span = self.span
        detach(self.token)
        # like use_span: only Exception subclasses (not GeneratorExit, cancellation) are errors
        if isinstance(exc, Exception) and span.is_recording():
            if self.args[6]:  # record_exception
                span.record_exception(exc)
            if self.args[7]:  # set_status_on_exception
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        if self.end_on_exit:
            span.end()

    def __call__(self, func: F) -> F:
        """Decorate ``func``: each call runs in a span of its own (an ``async def``'s
        span covers its whole run, not just the creation of its coroutine)."""
        tracer, args, end_on_exit = self.tracer, self.args, self.end_on_exit
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*a: Any, **kw: Any) -> Any:
                with _AsCurrent(tracer, args, end_on_exit):
                    return await func(*a, **kw)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*a: Any, **kw: Any) -> Any:
            with _AsCurrent(tracer, args, end_on_exit):
                return func(*a, **kw)

        return wrapper  # type: ignore[return-value]


class FastTracer(trace.Tracer):
    """A ``trace.Tracer`` whose spans are :class:`FastSpan`\\ s of the current configuration.

    Before ``configure()`` (and after ``shutdown()``) its spans are no-ops, as the
    proxy tracer's are.
    """

    def __init__(
        self,
        name: str,
        version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> None:
        self._scope = (name, version, schema_url, attributes)
        self._generation = -1
        self._sink: _Sink | None = None

    def _refresh(self) -> _Sink | None:
        state = setup._STATE
        provider = state.provider
        tracer = provider.get_tracer(*self._scope) if provider is not None else None
        self._sink = _Sink(tracer) if isinstance(tracer, SdkTracer) else None
        self._generation = state.generation
        return self._sink

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = _INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        sink = self._sink if self._generation == _STATE.generation else self._refresh()
        if sink is None:
            return _INVALID
        ctx = current_context() if context is None else context
        parent: Any = ctx.get(SPAN_KEY)
        opts = _DEFAULT_OPTS if record_exception and set_status_on_exception else (
            record_exception, set_status_on_exception)  # fmt: skip
        if sink.follows_parent and parent is not None:
            if type(parent) is FastSpan:
                trace_ = parent._trace
                sampled = trace_[1] & _SAMPLED
            else:
                # SpanContext is a tuple: (trace_id, span_id, is_remote, flags, state, is_valid);
                # indexing it skips five property calls on the hot path
                psc: Any = parent.get_span_context()
                flags = psc[3]
                sampled = psc[5] and flags & _SAMPLED
                if psc[5] and not sampled:
                    # parent not sampled: neither is this, and nothing is recorded
                    return NonRecordingSpan(
                        SpanContext(psc[0], _span_id(sink), False, TraceFlags(flags & _RANDOM), psc[4])
                    )  # fmt: skip
                trace_ = (psc[0], _SAMPLED | (flags & _RANDOM), psc[4])
            if sampled:
                if type(parent) is not FastSpan:
                    parent = psc  # the build needs its SpanContext, not the span
                # FastSpan.__init__ written out: the call costs as much as the stores
                span = _new(FastSpan)
                span._sink, span._name, span._kind = sink, name, kind
                span._span_id = (_bits(64) or _new_span_id()) if sink.random_ids else _span_id(sink)
                span._trace, span._parent, span._pctx, span._attrs = trace_, parent, ctx, attributes
                span._links, span._exc_opts, span._end, span._sets = links, opts, None, None
                span._start = start_time if start_time is not None else _time_ns()
                span._owner = None
                return span
        return self._ask_sampler(
            sink, name, context, ctx, parent, kind, attributes, links, start_time, opts
        )

    def _ask_sampler(
        self,
        sink: _Sink,
        name: str,
        context: Context | None,
        ctx: Context,
        parent: Any,
        kind: SpanKind,
        attributes: Mapping[str, Any] | None,
        links: Sequence[trace.Link] | None,
        start_time: int | None,
        exc_opts: tuple[bool, bool],
    ) -> trace.Span:
        """A root span, or any span under a sampler that is not parent-based: as the SDK does."""
        t = sink.tracer
        psc = parent.get_span_context() if parent is not None else None
        if psc is None or not psc.is_valid:
            psc = None
            trace_id = t.id_generator.generate_trace_id()
            random_id = t.id_generator.is_trace_id_random()
        else:
            trace_id = psc.trace_id
            random_id = psc.trace_flags.random_trace_id
        result = t.sampler.should_sample(context, trace_id, name, kind, attributes, links)
        decision: Any = result.decision
        flags = (_SAMPLED if decision.is_sampled() else 0) | (_RANDOM if random_id else 0)
        span_id = t.id_generator.generate_span_id()
        if not decision.is_recording():
            return NonRecordingSpan(
                SpanContext(trace_id, span_id, False, TraceFlags(flags), result.trace_state)
            )
        if type(parent) is not FastSpan:
            parent = psc
        return FastSpan(
            sink, name, kind, span_id, (trace_id, flags, result.trace_state), parent, ctx,
            result.attributes, links, start_time, exc_opts,
        )  # fmt: skip

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = _INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        links: Sequence[trace.Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> _AsCurrent:
        """A span made current for a ``with`` block, or around each call of a decorated function."""
        args = (
            name, context, kind, attributes, links, start_time, record_exception,
            set_status_on_exception,
        )  # fmt: skip
        return _AsCurrent(self, args, end_on_exit)


class FastTracerProvider(trace.TracerProvider):
    """Hands out :class:`FastTracer`\\ s; give it to OTel instrumentations to make their spans cheap."""

    def __init__(self) -> None:
        self._tracers: dict[tuple[Any, ...], FastTracer] = {}

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        key = (instrumenting_module_name, instrumenting_library_version, schema_url)
        if attributes:  # attributes are a mapping, not hashable: such tracers are not shared
            return FastTracer(*key, attributes)
        tracer = self._tracers.get(key)
        if tracer is None:
            tracer = self._tracers[key] = FastTracer(*key)
        return tracer


FAST_PROVIDER = FastTracerProvider()
"""Passed to the OTel instrumentations tracekit wraps (httpx): their spans become FastSpans."""


def start_child(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    kind: SpanKind = _INTERNAL,
    links: Sequence[trace.Link] | None = None,
    start_time: int | None = None,
    scope: str = "tracekit",
    context: Context | None = None,
) -> trace.Span:
    """Start a span under the current one (a stage, a request, anyone's OTel span).

    The span is *not* made current; end it with ``span.end(end_time=...)`` (epoch ns,
    default now) — from any thread, later. ``attributes`` is kept by reference, so
    don't mutate it afterwards. ``scope`` is the instrumentation scope the exporter
    shows (e.g. ``"tracekit.training"``). Before ``configure()`` it returns a
    non-recording span. Costs a few microseconds; never raises for a valid call.
    """
    return FAST_PROVIDER.get_tracer(scope).start_span(
        name, context, kind, attributes, links, start_time
    )
