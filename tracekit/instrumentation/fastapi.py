"""``instrument_fastapi()``: the request (SERVER) span and its load attributes.

The SERVER span itself comes from opentelemetry-instrumentation-fastapi (route,
method, status code in the stable HTTP semantic conventions). tracekit adds, when the
request arrives:

- ``tracekit.inflight``: requests this process is serving, this one included, counted
  by a thin ASGI layer outside everything else;
- ``tracekit.queue.depth``: requests waiting in this process's batch queues;
- ``tracekit.cpu.utilization`` / ``tracekit.gpu.utilization``: the latest window of a
  background sampler (see :mod:`.sampler`), so no request pays a system call or a
  lock for them. ``instrument_fastapi()`` and the app's start-up start the sampler; a
  request only reads it, so after ``tracekit.shutdown()`` none restarts it.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard, _state, sampler
from tracekit.instrumentation.setup import PROVIDER, flush, use_stable_http_semconv

App = TypeVar("App")


def _on_request(span: Any, scope: dict[str, Any]) -> None:
    """OTel's server_request_hook: runs in the request's task as the SERVER span starts."""
    try:
        if not span.is_recording():
            return
        attrs: dict[str, Any] = {
            cv.INFLIGHT: _state.INFLIGHT.value,
            cv.QUEUE_DEPTH: _state.queue_depth(),
        }
        # current(): no lock, and no thread started here (after shutdown() it stays down)
        s = sampler.current()
        if s is not None:
            if s.cpu is not None:
                attrs[cv.CPU_UTILIZATION] = s.cpu
            if s.gpu is not None:
                attrs[cv.GPU_UTILIZATION] = s.gpu
        span.set_attributes(attrs)
        # Reset by _InflightCounter when the request ends (same task, same context).
        _state.REQUEST_SPAN.set(span)
    except Exception as exc:
        _guard.report("instrument_fastapi request hook", exc)


class _InflightCounter:
    """Outermost ASGI layer: counts requests in flight, scopes the request-span variable."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        _state.INFLIGHT.enter()
        token = _state.REQUEST_SPAN.set(None)
        try:
            await self.app(scope, receive, send)
        finally:
            _state.REQUEST_SPAN.reset(token)
            _state.INFLIGHT.leave()


def _hook_lifespan(app: Any, start_sampler: Callable[[], object]) -> None:
    """Start the sampler when the app starts; export what is buffered when it ends.

    Starting at app start-up (too) means a server that forks workers after import
    still has a sampler thread in each. uvicorn re-raises SIGTERM/SIGINT after its
    graceful shutdown, so the process dies from the signal and ``atexit`` handlers
    never run; the lifespan end is the last reliable moment to flush.
    """
    router: Any = getattr(app, "router", None)
    inner = getattr(router, "lifespan_context", None)
    if inner is None:
        return

    @contextlib.asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        try:
            start_sampler()
        except Exception as exc:
            _guard.report("sampler start at app start-up", exc)
        async with inner(app_) as state:
            yield state
        try:
            flush()
        except Exception as exc:
            _guard.report("flush at app shutdown", exc)

    router.lifespan_context = lifespan


def instrument_fastapi(
    app: App,
    *,
    excluded_urls: str | None = None,
    sample_interval_s: float = 1.0,
    cpu_request: float | str | None = None,
) -> App:
    """Trace every request of a FastAPI ``app``: one SERVER span with tracekit's load attributes.

    Call it once, before the app serves; calling it again does nothing.
    ``excluded_urls`` is a comma-separated list of regexes (health checks, metrics)
    that get no span. ``cpu_request`` is the pod's CPU request in cores (``0.5``) or
    millicores (``"500m"``), default ``TRACEKIT_CPU_REQUEST``: with it,
    ``tracekit.cpu.utilization`` is CPU use over the request, as an HPA computes it.
    Returns ``app``.
    """
    try:
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    except ImportError as exc:  # pragma: no cover - a dependency of tracekit
        raise ConfigError(
            "instrument_fastapi needs opentelemetry-instrumentation-fastapi: pip install 'tracekit[demo]'"
        ) from exc
    if not hasattr(app, "build_middleware_stack"):
        raise ConfigError(f"instrument_fastapi(): expected a FastAPI app, got {type(app).__name__}")
    if getattr(app, "_tracekit_instrumented", False):
        return app
    if sample_interval_s <= 0:
        raise ConfigError(
            f"instrument_fastapi(): sample_interval_s must be > 0, got {sample_interval_s!r}"
        )
    request = sampler.cpu_request(cpu_request)  # a bad value fails here, not at start-up
    use_stable_http_semconv()
    FastAPIInstrumentor.instrument_app(
        app,  # type: ignore[arg-type]
        tracer_provider=PROVIDER,
        server_request_hook=_on_request,
        excluded_urls=excluded_urls,
        # the ASGI send/receive spans would only add noise (and cost) under every request
        exclude_spans=["receive", "send"],
    )
    build = app.build_middleware_stack

    @functools.wraps(build)
    def build_middleware_stack(self: Any) -> Any:
        return _InflightCounter(build())

    app.build_middleware_stack = types.MethodType(build_middleware_stack, app)
    if getattr(app, "middleware_stack", None) is not None:
        app.middleware_stack = app.build_middleware_stack()  # type: ignore[attr-defined]
    start_sampler = functools.partial(sampler.start, sample_interval_s, request=request)
    _hook_lifespan(app, start_sampler)
    app._tracekit_instrumented = True  # type: ignore[attr-defined]
    start_sampler()
    return app
