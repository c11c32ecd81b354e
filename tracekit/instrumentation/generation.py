"""``generation()``: queue, prefill and decode of a token-streaming request you serve yourself.

A generation is one request to a model that streams tokens. Its phases are marked by
three calls on the object the ``with`` gives (``async with`` works the same)::

    with tracekit.generation(prompt_tokens=len(ids), max_tokens=256, model="tiny") as g:
        await slot.acquire()      # queued
        g.admitted()
        logits = prefill(ids)     # prefill
        g.first_token()
        for tok in decode(logits):
            g.token()             # decode, one call per token after the first
            yield tok

- **queue** (``wait``): from entering the block to ``admitted()``;
- **prefill** (``compute``): from ``admitted()`` to ``first_token()``;
- **decode** (``compute``): from ``first_token()`` to the last token. Exit the block once
  the last token is out; exiting ends the generation.

Out-of-order use is tolerated, never an error. ``token()`` before any ``first_token()``
*is* the first token, so a loop that calls ``token()`` for every token needs no
``first_token()``; a later ``first_token()``, or ``admitted()`` after the first token, is
ignored. Without ``admitted()`` the request was never queued here: when the first token
comes there is no queue span and ``time_in_queue`` is 0 (prefill starts with the
generation); when the block ends before any token, the request never left the queue.

Spans. The ``queue``, ``prefill`` and ``decode`` stage spans are written when the first
token comes and when the block ends; ``token()`` only counts and reads a clock. They are
children of the span that carries the request's ``gen_ai.*`` attributes, so ingest sees
real stages under it and derives none:

- inside a request's SERVER span (``instrument_fastapi``, or any OTel server
  instrumentation) that span is current when the block is entered, and it carries the
  attributes and the three stages;
- anywhere else (a script, a worker, under a stage or a span of your own) a
  ``tracekit.generation`` span is started under the current span for the block and
  carries them.

The attributes are vLLM's names, latencies in seconds: ``gen_ai.latency.time_in_queue``,
``…time_in_model_prefill``, ``…time_in_model_decode`` (the stage spans' durations),
``…time_to_first_token`` and ``…e2e`` (first token and exit, measured from *arrival*: the
start of the span that carries them — the SERVER span's start, so TTFT includes what the
request did before the generation began), ``gen_ai.usage.completion_tokens`` (tokens
marked), ``gen_ai.usage.prompt_tokens``, ``gen_ai.request.max_tokens`` and
``gen_ai.response.model`` when given, and ``tracekit.generation.first_token_ns``.

The block does not change the current span: spans started inside it (a
``model_execution()``, a stage, an httpx call) are children of the span that was current,
beside the three stages. An exception from the block ends the phase it interrupted there
(status ERROR, ``error.type``; decode then ends at the exception, not the last token), and
the generation span too; it propagates unchanged. The request's SERVER span is its own
instrumentation's to mark. tracekit's own failures never reach the caller.
"""

from __future__ import annotations

import operator
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation._otel_internals import SPAN_KEY
from tracekit.instrumentation._spans import FastSpan, current_context
from tracekit.instrumentation._tracer import FAST_PROVIDER
from tracekit.instrumentation.stages import record_error

GENERATION_SPAN_NAME = cv.GENERATION_SPAN_NAME

_TRACER = FAST_PROVIDER.get_tracer("tracekit.generation")
_INTERNAL = SpanKind.INTERNAL
_SERVER = SpanKind.SERVER
_perf = time.perf_counter_ns
_time_ns = time.time_ns
_NS = 1e9

# Stage attributes, shared by every span of a stage (a FastSpan keeps them by reference).
_STAGE_ATTRS = {
    name: {cv.STAGE: name, cv.TIME_KIND: cv.default_time_kind(name)} for name in cv.LLM_STAGES
}

# Where a generation is: made, inside its block, over.
_NEW, _OPEN, _DONE = 0, 1, 2


def _server_start(span: Any) -> int | None:
    """The start (Unix ns) of ``span`` when it is a recording SERVER span, else None."""
    if span is None or not span.is_recording():
        return None
    kind: Any
    start: Any
    if type(span) is FastSpan:
        kind, start = span._kind, span._start
    else:  # the SDK's span, or anyone's that exposes the same
        kind, start = getattr(span, "kind", None), getattr(span, "start_time", None)
    if kind is not _SERVER or not isinstance(start, int):
        return None
    return start


def _count(what: str, value: Any) -> int | None:
    if value is None:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise ConfigError(
            f"generation(): {what} must be a whole number, got {type(value).__name__}"
        ) from None
    if n < 0:
        raise ConfigError(f"generation(): {what} must be >= 0, got {n}")
    return n


class Generation:
    """One token-streaming request's queue, prefill and decode; see :func:`generation`."""

    __slots__ = (
        "_request_attrs", "_phase", "_on", "_n", "_first", "_last", "_admitted",
        "_epoch0", "_perf0", "_arrival", "_carrier", "_own", "_ctx",
    )  # fmt: skip

    def __init__(
        self,
        *,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
    ) -> None:
        if model is not None and not isinstance(model, str):
            raise ConfigError(f"generation(): model must be a string, got {type(model).__name__}")
        attrs: dict[str, Any] = {}
        for key, value in (
            (cv.GEN_AI_USAGE_PROMPT_TOKENS, _count("prompt_tokens", prompt_tokens)),
            (cv.GEN_AI_REQUEST_MAX_TOKENS, _count("max_tokens", max_tokens)),
            (cv.GEN_AI_RESPONSE_MODEL, model),
        ):
            if value is not None:
                attrs[key] = value
        self._request_attrs = attrs
        self._phase = _NEW
        self._on = False  # whether anything records: without tracing every mark is a count
        self._n = 0  # tokens marked, the first one included
        self._first = self._last = 0  # perf_counter_ns of the first and the latest token
        self._admitted: int | None = None
        self._epoch0 = self._perf0 = self._arrival = 0
        self._carrier: trace.Span = trace.INVALID_SPAN
        self._own: trace.Span | None = None
        self._ctx: Context | None = None

    # --- the marks ------------------------------------------------------------------
    def admitted(self) -> None:
        """The request left the queue: prefill starts now (ignored after the first token)."""
        if self._admitted is None and not self._n and self._phase == _OPEN:
            self._admitted = _perf()

    def first_token(self) -> None:
        """The first output token is out: prefill ends, decode starts (ignored if one was)."""
        if not self._n:
            self._mark_first(_perf())

    def token(self) -> None:
        """One more output token. Costs a count and a clock read; the first call of a
        generation without :meth:`first_token` marks the first token."""
        if self._n:
            self._last = _perf()
            self._n += 1
        else:
            self._mark_first(_perf())

    @property
    def completion_tokens(self) -> int:
        """Tokens marked so far (``first_token()`` and each ``token()``)."""
        return self._n

    def _mark_first(self, t: int) -> None:
        if self._phase != _OPEN:
            return
        self._first = self._last = t
        self._n = 1
        if self._on:
            try:
                self._write_first(t)
            except Exception as exc:
                _guard.report("generation first token", exc)

    # --- with / async with ----------------------------------------------------------------
    def __enter__(self) -> Generation:
        if self._phase != _NEW:
            _guard.report(
                "generation enter",
                RuntimeError("a generation() is entered once; make one per request"),
            )
            return self
        self._phase = _OPEN
        self._epoch0, self._perf0 = _time_ns(), _perf()
        try:
            self._open()
        except Exception as exc:
            self._on = False
            _guard.report("generation start", exc)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self._phase != _OPEN:
            return
        t = _perf()
        self._phase = _DONE
        if not self._on:
            return
        try:
            self._write_end(t, exc)
        except Exception as err:
            _guard.report("generation end", err)

    async def __aenter__(self) -> Generation:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    # --- spans: on entry, at the first token, at exit ---------------------------------------
    def _open(self) -> None:
        ctx = current_context()
        current: Any = ctx.get(SPAN_KEY)
        arrival = _server_start(current)
        if arrival is not None:
            self._carrier, self._arrival, self._ctx = current, arrival, ctx
        else:
            own = _TRACER.start_span(GENERATION_SPAN_NAME, ctx, _INTERNAL, None, None, self._epoch0)
            self._carrier = self._own = own
            self._arrival = self._epoch0
            self._ctx = trace.set_span_in_context(own, ctx)
        self._on = self._carrier.is_recording()

    def _ns(self, perf: int) -> int:
        """A perf_counter_ns reading of this generation as Unix ns."""
        return self._epoch0 + (perf - self._perf0)

    def _stage(self, name: str, start: int, end: int, exc: BaseException | None = None) -> bool:
        """Write one stage span; whether tracekit's tracer recorded it."""
        span = _TRACER.start_span(name, self._ctx, _INTERNAL, _STAGE_ATTRS[name], None, start)
        if exc is not None:
            record_error(span, exc)
        span.end(end)
        return not isinstance(span, trace.NonRecordingSpan)  # INVALID_SPAN is one too

    def _admitted_ns(self) -> int:
        return self._epoch0 if self._admitted is None else self._ns(self._admitted)

    def _write_first(self, t: int) -> None:
        start, admitted, first = self._epoch0, self._admitted_ns(), self._ns(t)
        if self._admitted is not None:
            self._stage(cv.QUEUE, start, admitted)
        recorded = self._stage(cv.PREFILL, admitted, first)
        if self._carrier.is_recording():  # a SERVER span may end first (client gone)
            attrs: dict[str, Any] = {
                cv.GEN_AI_LATENCY_TIME_IN_QUEUE: (admitted - start) / _NS,
                cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL: (first - admitted) / _NS,
                cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: (first - self._arrival) / _NS,
            }
            # The mark says "real stage spans are under this span": only when they were
            # recorded (a SERVER span of another provider, tracekit not configured: ingest
            # then derives the stages from these attributes, as it does for vLLM).
            if recorded:
                attrs[cv.GENERATION_FIRST_TOKEN_NS] = first
            self._carrier.set_attributes(attrs)

    def _write_end(self, t: int, exc: BaseException | None) -> None:
        start, end = self._epoch0, self._ns(t)
        attrs: dict[str, Any] = {}
        if self._n:
            first = self._ns(self._first)
            # the last token ends decode, as vLLM counts it; a failure ends it where it struck
            decode_end = end if exc is not None else self._ns(self._last)
            self._stage(cv.DECODE, first, decode_end, exc)
            attrs[cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] = (decode_end - first) / _NS
        elif self._admitted is None:  # never admitted: it ended in the queue
            self._stage(cv.QUEUE, start, end, exc)
            attrs[cv.GEN_AI_LATENCY_TIME_IN_QUEUE] = (end - start) / _NS
        else:  # admitted, no token: it ended in prefill
            admitted = self._ns(self._admitted)
            self._stage(cv.QUEUE, start, admitted)
            self._stage(cv.PREFILL, admitted, end, exc)
            attrs[cv.GEN_AI_LATENCY_TIME_IN_QUEUE] = (admitted - start) / _NS
            attrs[cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL] = (end - admitted) / _NS
        attrs[cv.GEN_AI_LATENCY_E2E] = (end - self._arrival) / _NS
        attrs[cv.GEN_AI_USAGE_COMPLETION_TOKENS] = self._n
        attrs.update(self._request_attrs)
        if self._carrier.is_recording():
            self._carrier.set_attributes(attrs)
        own = self._own
        if own is not None:
            if exc is not None:
                record_error(own, exc)
            own.end(end)


def generation(
    *,
    prompt_tokens: int | None = None,
    max_tokens: int | None = None,
    model: str | None = None,
) -> Generation:
    """Trace one token-streaming request: ``with generation(...) as g:`` (or ``async with``).

    Mark ``g.admitted()`` when the request leaves your queue, ``g.first_token()`` when
    the first token is out and ``g.token()`` for each token after it (or ``g.token()``
    for every token, the first included). ``queue``, ``prefill`` and ``decode`` stage
    spans and vLLM's ``gen_ai.*`` latency attributes (seconds) are written on the
    request's SERVER span, or on a span of the generation's own outside one; see the
    module documentation. ``prompt_tokens``, ``max_tokens`` and ``model`` are recorded
    as given; a value of the wrong type is a ``ConfigError`` here, where it is written (as
    ``stage()``'s are). Make one per request.
    """
    return Generation(prompt_tokens=prompt_tokens, max_tokens=max_tokens, model=model)
