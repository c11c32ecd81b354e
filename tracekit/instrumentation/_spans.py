"""Spans that cost the request path a few microseconds: :class:`FastSpan`.

An OpenTelemetry SDK span costs tens of microseconds to start and end (locks, bounded
attribute maps, processor calls, a ``ReadableSpan`` copy at the end). A ``FastSpan``
takes ids and times and keeps references to what it is given; calls made on it while
it is open (attributes, events, status) are noted in order. When it ends it goes to
the :mod:`._recorder` buffer, whose thread replays it into a real SDK span of the
provider that was current when it started: same ids, times, parent, links,
attributes, events and status, through every ``SpanProcessor`` and exporter.

It interoperates with plain OpenTelemetry both ways because it *is* a span in the OTel
context while open: ``trace.get_current_span()`` returns it, its
``get_span_context()`` carries its real ids (built on first use), so ``traceparent``
injection and SDK spans started inside it name it as parent; and a ``FastSpan``
started under anyone's span takes that span as its parent. Sampling follows the
provider's sampler: a parent-based one (tracekit's always is) decides from the
parent's flag without a call; any other sampler is asked, as the SDK would.

They are started by :mod:`._tracer`; this module also holds the fast OTel-context
helpers the stage context managers share.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Tracer as SdkTracer
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, Sampler
from opentelemetry.semconv.attributes.exception_attributes import (
    EXCEPTION_ESCAPED,
    EXCEPTION_MESSAGE,
    EXCEPTION_STACKTRACE,
    EXCEPTION_TYPE,
)
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from tracekit.instrumentation._otel_internals import (
    CONTEXT_VAR,
    SPAN_KEY,
    new_sdk_span,
    parent_based_delegates,
)
from tracekit.instrumentation._recorder import RECORDER

_time_ns = time.time_ns
_QUEUE = RECORDER.queue  # the same deque for the life of the process (cleared at fork)

# --- the OTel context, without the API's indirections ------------------------------
# The API's attach/detach go through two layers of calls and a try/except each; with
# the default contextvars runtime the same thing is one ContextVar set/reset.
if CONTEXT_VAR is not None:
    _VAR = CONTEXT_VAR
    current_context: Callable[[], Context] = _VAR.get

    def attach_span(span: trace.Span) -> object:
        """Make ``span`` current; returns the token for :func:`detach`."""
        return _VAR.set(Context({**_VAR.get(), SPAN_KEY: span}))

    def detach(token: Any) -> None:
        """Undo :func:`attach_span` (a token from another context is logged, as OTel does)."""
        try:
            _VAR.reset(token)
        except Exception:
            otel_context.detach(token)

else:  # pragma: no cover - a custom OTEL_PYTHON_CONTEXT runtime
    current_context = otel_context.get_current

    def attach_span(span: trace.Span) -> object:
        return otel_context.attach(trace.set_span_in_context(span))

    def detach(token: Any) -> None:
        otel_context.detach(token)


def _follows_parent(sampler: Sampler) -> bool:
    """ParentBased with its default delegates: a child's decision is its parent's flag."""
    if not isinstance(sampler, ParentBased):
        return False
    d = parent_based_delegates(sampler)
    return (
        d.local_sampled is ALWAYS_ON
        and d.remote_sampled is ALWAYS_ON
        and d.local_not_sampled is ALWAYS_OFF
        and d.remote_not_sampled is ALWAYS_OFF
    )


class _Sink:
    """The SDK tracer of one instrumentation scope in one ``configure()`` generation."""

    __slots__ = ("tracer", "follows_parent", "random_ids")

    def __init__(self, tracer: SdkTracer) -> None:
        self.tracer = tracer
        self.follows_parent = _follows_parent(tracer.sampler)
        self.random_ids = type(tracer.id_generator) is RandomIdGenerator


class FastSpan(trace.Span):
    """A span recorded as plain fields and built into an SDK span after it ends.

    ``_trace`` is ``(trace_id, trace flags, trace state)``, shared with its children.
    The ``_owner`` … ``_cpu0`` slots belong to the ``stage()`` context manager that
    opened it (see :mod:`.stages`), so that an open stage needs no second object.
    """

    __slots__ = (
        "_sink", "_name", "_kind", "_span_id", "_trace", "_parent", "_pctx", "_attrs",
        "_links", "_start", "_end", "_sets", "_exc_opts", "_owner", "_token", "_tid", "_cpu0",
    )  # fmt: skip
    _token: object
    _tid: int | None
    _cpu0: int
    # Rarely set, so class-level defaults (in the instance dict once set) rather than
    # slots that every span would have to fill on the request path.
    _ctx: SpanContext | None = None
    _events: list[tuple[str, Any, int]] | None = None
    _status: list[tuple[Any, str | None]] | None = None
    _more_links: list[tuple[SpanContext, Any]] | None = None
    _rename: str | None = None

    def __init__(
        self,
        sink: _Sink,
        name: str,
        kind: SpanKind,
        span_id: int,
        trace_: tuple[int, int, Any],
        parent: FastSpan | SpanContext | None,
        pctx: Context | None,
        attributes: Mapping[str, Any] | None,
        links: Sequence[trace.Link] | None,
        start_time: int | None,
        exc_opts: tuple[bool, bool],
    ) -> None:
        self._sink, self._name, self._kind, self._span_id = sink, name, kind, span_id
        self._trace, self._parent, self._pctx = trace_, parent, pctx
        self._attrs, self._links, self._exc_opts = attributes, links, exc_opts
        self._start = start_time if start_time is not None else _time_ns()
        self._end: int | None = None
        self._sets: list[tuple[str, Any]] | None = None
        self._owner: object = None

    def __repr__(self) -> str:
        return f"FastSpan(name={self._name!r}, span_id={self._span_id:016x})"

    # --- the trace.Span interface -------------------------------------------------
    def get_span_context(self) -> SpanContext:
        ctx = self._ctx
        if ctx is None:
            trace_id, flags, state = self._trace
            ctx = self._ctx = SpanContext(
                trace_id,
                self._span_id,
                is_remote=False,
                trace_flags=TraceFlags(flags),
                trace_state=state,
            )
        return ctx

    def is_recording(self) -> bool:
        return self._end is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self._end is None:
            if self._sets is None:
                self._sets = [(key, value)]
            else:
                self._sets.append((key, value))

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if self._end is None:
            if self._sets is None:
                self._sets = list(attributes.items())
            else:
                self._sets.extend(attributes.items())

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if self._end is None:
            event = (name, dict(attributes) if attributes else None, timestamp or _time_ns())
            if self._events is None:
                self._events = [event]
            else:
                self._events.append(event)

    def add_link(self, context: SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if self._end is None:
            if self._more_links is None:
                self._more_links = []
            self._more_links.append((context, dict(attributes) if attributes else None))

    def update_name(self, name: str) -> None:
        if self._end is None:
            self._rename = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self._end is None:
            if self._status is None:
                self._status = []
            self._status.append((status, description))

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        # formatted now, as the SDK does: holding the exception until the build
        # would keep its frames (and their tensors) alive
        cls = type(exception)
        module, qualname = cls.__module__, cls.__qualname__
        attrs: dict[str, Any] = {
            EXCEPTION_TYPE: f"{module}.{qualname}" if module and module != "builtins" else qualname,
            EXCEPTION_MESSAGE: str(exception),
            EXCEPTION_STACKTRACE: "".join(traceback.format_exception(exception)),
            EXCEPTION_ESCAPED: str(escaped),
        }
        if attributes:
            attrs.update(attributes)
        self.add_event("exception", attrs, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._end is None:
            self._end = end_time if end_time is not None else _time_ns()
            # RECORDER.put, inlined: this is every span's last step on the request path
            if len(_QUEUE) < RECORDER.capacity:
                _QUEUE.append(self)
            else:
                RECORDER.drop()

    # --- off the request path ----------------------------------------------------------
    def _build(self) -> None:
        """Replay this span into an SDK span of its provider (the recorder's thread calls this)."""
        t = self._sink.tracer
        parent = self._parent
        if isinstance(parent, FastSpan):
            parent = parent.get_span_context()
        record_exception, set_status_on_exception = self._exc_opts
        span = new_sdk_span(
            t,
            self._name,
            self.get_span_context(),
            parent=parent,
            attributes=self._attrs,
            kind=self._kind,
            links=self._links or (),
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        )
        span.start(start_time=self._start, parent_context=self._pctx)
        for key, value in self._sets or ():
            span.set_attribute(key, value)
        for name, attrs, ts in self._events or ():
            span.add_event(name, attrs, ts)
        for ctx, attrs in self._more_links or ():
            span.add_link(ctx, attrs)
        for status, description in self._status or ():
            span.set_status(status, description)
        if self._rename is not None:
            span.update_name(self._rename)
        self._parent = self._pctx = None  # a child's reference must not keep contexts alive
        span.end(end_time=self._end)
