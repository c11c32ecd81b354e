"""``instrument_httpx()``: downstream CLIENT spans, context propagation and retries.

The CLIENT span per attempt, its stable HTTP attributes (``http.request.method``,
``url.full``, ``server.address``, ``http.response.status_code``, ``error.type`` on a
timeout or other transport error) and the W3C ``traceparent`` header come from
opentelemetry-instrumentation-httpx, so a downstream service instrumented with
tracekit joins the caller's trace. tracekit adds ``tracekit.stage`` (``downstream``
unless told otherwise, e.g. ``feature_retrieval`` for a feature-store client) and
``tracekit.time_kind``, and optional retries: each resend is its own CLIENT span
with ``http.request.resend_count`` = 1, 2, …
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

import httpx

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation._tracer import FAST_PROVIDER
from tracekit.instrumentation.setup import use_stable_http_semconv

Client = TypeVar("Client", httpx.Client, httpx.AsyncClient)

_RESEND = "tracekit.resend_count"  # request extension: which attempt this is
RETRY_ON: tuple[type[BaseException], ...] = (httpx.ConnectError, httpx.TimeoutException)
"""Errors retried by default: the connection failed or the answer did not come in time."""


def _replayable(request: httpx.Request) -> bool:
    # a streamed body was consumed by the first attempt and cannot be sent again
    return isinstance(request.stream, httpx.ByteStream)


class _Retries:
    """The retry policy both transports follow; only the waiting and sending differ."""

    def __init__(
        self, inner: Any, retries: int, retry_on: tuple[type[BaseException], ...], backoff_s: float
    ):
        self.inner, self.retries, self.retry_on, self.backoff_s = (
            inner,
            retries,
            retry_on,
            backoff_s,
        )

    @staticmethod
    def _label(request: httpx.Request, attempt: int) -> None:
        # read by the request hook, which puts it on this attempt's span
        if attempt:
            request.extensions = {**request.extensions, _RESEND: attempt}

    def _may_resend(self, request: httpx.Request, attempt: int) -> bool:
        return attempt < self.retries and _replayable(request)

    def _backoff_s(self, attempt: int) -> float:
        """Seconds to wait before resend number ``attempt`` (1, 2, …): doubling each time."""
        return float(self.backoff_s * 2 ** (attempt - 1))


class _AsyncRetries(_Retries, httpx.AsyncBaseTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        attempt = 0
        while True:
            self._label(request, attempt)
            try:
                response: httpx.Response = await self.inner.handle_async_request(request)
                return response
            except self.retry_on:
                if not self._may_resend(request, attempt):
                    raise
            attempt += 1
            if self.backoff_s:
                await asyncio.sleep(self._backoff_s(attempt))

    async def aclose(self) -> None:
        await self.inner.aclose()


class _SyncRetries(_Retries, httpx.BaseTransport):
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        attempt = 0
        while True:
            self._label(request, attempt)
            try:
                response: httpx.Response = self.inner.handle_request(request)
                return response
            except self.retry_on:
                if not self._may_resend(request, attempt):
                    raise
            attempt += 1
            if self.backoff_s:
                time.sleep(self._backoff_s(attempt))

    def close(self) -> None:
        self.inner.close()


def _hook(stage: str) -> tuple[Any, Any]:
    attrs = {cv.STAGE: stage, cv.TIME_KIND: cv.default_time_kind(stage)}

    def on_request(span: Any, request: Any) -> None:
        try:
            if span.is_recording():
                span.set_attributes(attrs)
                resend = (request.extensions or {}).get(_RESEND)
                if resend:
                    span.set_attribute(cv.HTTP_REQUEST_RESEND_COUNT, resend)
        except Exception as exc:
            _guard.report("instrument_httpx request hook", exc)

    async def on_request_async(span: Any, request: Any) -> None:
        on_request(span, request)

    return on_request, on_request_async


def instrument_httpx(
    client: Client,
    *,
    stage: str = cv.DOWNSTREAM,
    retries: int = 0,
    retry_on: tuple[type[BaseException], ...] = RETRY_ON,
    backoff_s: float = 0.0,
) -> Client:
    """Trace every request ``client`` sends (an ``httpx.Client`` or ``AsyncClient``); returns it.

    ``retries`` > 0 resends a request that failed with one of ``retry_on`` (waiting
    ``backoff_s``, doubling each time), each attempt its own span; requests with a
    streamed body are never resent. Instrumenting the same client twice does nothing.
    """
    if not isinstance(client, httpx.Client | httpx.AsyncClient):
        raise ConfigError(
            f"instrument_httpx(): expected an httpx client, got {type(client).__name__}"
        )
    if retries < 0:
        raise ConfigError(f"instrument_httpx(): retries must be >= 0, got {retries!r}")
    if getattr(client, "_tracekit_instrumented", False):
        return client
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    use_stable_http_semconv()
    sync_hook, async_hook = _hook(stage)
    is_async = isinstance(client, httpx.AsyncClient)
    HTTPXClientInstrumentor.instrument_client(
        # FastSpans: the CLIENT span costs the request path a few microseconds
        client,
        tracer_provider=FAST_PROVIDER,
        request_hook=async_hook if is_async else sync_hook,
    )
    if retries:
        # Outside the instrumented transports, so that every attempt gets its own span.
        wrap: Any = _AsyncRetries if is_async else _SyncRetries
        client._transport = wrap(client._transport, retries, retry_on, backoff_s)
        client._mounts = {
            pattern: (wrap(t, retries, retry_on, backoff_s) if t is not None else None)
            for pattern, t in client._mounts.items()
        }
    setattr(client, "_tracekit_instrumented", True)  # noqa: B010 - httpx clients allow new attributes
    return client
