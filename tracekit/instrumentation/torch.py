"""``model_execution()`` and ``instrument_model()``: model spans timed against the device.

CUDA runs asynchronously: ``y = model(x)`` returns as soon as the kernels are queued.
A span closed right there measures the launch, not the work, and the GPU time then
shows up wherever the host next waits for the device — in the ``.cpu()`` or
``.item()`` of postprocessing — so the trace blames the wrong stage. Hence ``sync``:

- ``"event"`` (default on CUDA): CUDA events are recorded around the work on the
  current stream and the span waits for its own end event, not for the whole device,
  and ``tracekit.gpu_time_ns`` is the device time between the events. On the legacy
  default stream (torch's, unless the code picks a stream) the events are ordered
  after work other threads queued there before them, so the wait and the device time
  can include that work too (a stream per worker keeps them apart);
- ``"device"``: ``torch.cuda.synchronize()`` before and after — simplest, but it
  waits for all queued work, on every stream;
- ``"none"``: no device timing and no wait (the span shows launch time only), said so in
  ``tracekit.gpu.sync``. Without CUDA (or without torch) this is what you get, with
  wall and CPU time recorded.

``tracekit.cpu_time_ns`` covers the host work up to the wait, not the spin inside it.
torch is imported only when one of these is used.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import threading
import time
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry import trace

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation.stages import Stage

M = TypeVar("M")
SYNC_MODES = (cv.SYNC_EVENT, cv.SYNC_DEVICE, cv.SYNC_NONE)

_INSIDE: ContextVar[bool] = ContextVar("tracekit_inside_model", default=False)
# open model_execution entries of this task/thread: (owner, state, previous link)
_OPEN: ContextVar[tuple[Any, Any, Any] | None] = ContextVar("tracekit_open_models", default=None)
BATCH_SINK: ContextVar[list[tuple[int | None, str]] | None] = ContextVar(
    "tracekit_batch_sink", default=None
)
"""Set by a batcher around ``run_batch``: each model call inside reports its device time
(None when none was taken) and its ``tracekit.gpu.sync`` mode there."""


class _Cuda:
    """The few CUDA calls tracekit makes; tests substitute a stand-in for the device."""

    def available(self) -> bool:
        # Only a process that imported torch can have queued device work; importing
        # torch here just to find out would cost seconds for nothing.
        torch: Any = sys.modules.get("torch")
        if torch is None:
            return False
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False

    def event(self) -> Any:
        import torch

        return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()


CUDA = _Cuda()


def _resolve(sync: str | None) -> str:
    if sync is not None and sync not in SYNC_MODES:
        raise ConfigError(f"model_execution(): sync must be one of {SYNC_MODES}, got {sync!r}")
    if sync == cv.SYNC_NONE:
        return sync
    # event/device need CUDA; asked for on a CPU-only machine they become "none"
    if not CUDA.available():
        return cv.SYNC_NONE
    return sync or cv.SYNC_EVENT


class ModelExecution:
    """One model call timed against the device; see :func:`model_execution`."""

    def __init__(self, sync: str | None = None, **attributes: Any) -> None:
        _resolve(sync)  # validate now, so a typo fails where it is written
        self._sync = sync
        self._attributes = attributes
        self._stages: dict[str, Stage] = {}  # one per sync mode: built once, not per call

    def _mode(self) -> str:
        try:
            return _resolve(self._sync)
        except Exception as exc:
            _guard.report("model_execution start", exc)
            return cv.SYNC_NONE

    def _enter(self, mode: str) -> tuple[Stage, str, Any, int, int, Any]:
        """Open the span; with ``sync="device"`` the caller has synchronised already."""
        start_evt = None
        st = self._stages.get(mode)
        if st is None:
            st = self._stages[mode] = Stage(
                cv.MODEL_EXECUTE, **{cv.GPU_SYNC: mode, **self._attributes}
            )
        span, token = st._start()
        if mode != cv.SYNC_NONE:
            try:
                start_evt = CUDA.event()
                start_evt.record()
            except Exception as exc:
                _guard.report("model_execution start event", exc)
                mode = cv.SYNC_NONE
        return st, mode, start_evt, time.thread_time_ns(), threading.get_ident(), (span, token)

    def _device_time(self, mode: str, start_evt: Any, wait: Any) -> int | None:
        if mode == cv.SYNC_NONE or start_evt is None:
            return None
        end_evt = CUDA.event()
        end_evt.record()
        wait(end_evt)
        return int(start_evt.elapsed_time(end_evt) * 1_000_000)  # ms -> ns

    def _exit(
        self, state: Any, exc: BaseException | None, gpu_ns: int | None, cpu_ns: int | None
    ) -> None:
        st, mode, _, _, _, (span, token) = state
        try:
            if gpu_ns is not None and span.is_recording():
                span.set_attribute(cv.GPU_TIME_NS, gpu_ns)
            sink = BATCH_SINK.get()
            if sink is not None:  # the mode too when no device time was taken: "none" says so
                sink.append((gpu_ns, mode))
        except Exception as err:
            _guard.report("model_execution end", err)
        st._finish(span, token, exc, cpu_ns)

    def _push(self, state: Any) -> None:
        _OPEN.set((self, state, _OPEN.get()))

    def _pop(self) -> Any:
        link = _OPEN.get()
        if link is None or link[0] is not self:
            _guard.report("model_execution exit", RuntimeError("exit without a matching enter"))
            return None
        _OPEN.set(link[2])
        return link[1]

    def __enter__(self) -> trace.Span:
        mode = self._mode()
        if mode == cv.SYNC_DEVICE:
            try:
                CUDA.synchronize()  # earlier queued work is not this call's
            except Exception as exc:
                _guard.report("model_execution start", exc)
                mode = cv.SYNC_NONE
        state = self._enter(mode)
        self._push(state)
        span: trace.Span = state[-1][0]
        return span

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        state = self._pop()
        if state is None:
            return
        cpu = time.thread_time_ns() - state[3] if state[4] == threading.get_ident() else None
        gpu = None
        try:
            wait = (
                (lambda e: e.synchronize())
                if state[1] == cv.SYNC_EVENT
                else (lambda e: CUDA.synchronize())
            )
            gpu = self._device_time(state[1], state[2], wait)
        except Exception as err:
            _guard.report("model_execution device wait", err)
        self._exit(state, exc, gpu, cpu)

    async def __aenter__(self) -> trace.Span:
        mode = self._mode()
        if mode == cv.SYNC_DEVICE:
            try:
                # as in __aexit__: the event loop keeps serving while the device drains
                await asyncio.to_thread(CUDA.synchronize)
            except Exception as exc:
                _guard.report("model_execution start", exc)
                mode = cv.SYNC_NONE
        state = self._enter(mode)
        self._push(state)
        span: trace.Span = state[-1][0]
        return span

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        state = self._pop()
        if state is None:
            return
        gpu = None
        try:
            if state[1] != cv.SYNC_NONE and state[2] is not None:
                end_evt = CUDA.event()
                end_evt.record()
                # wait in a thread: the event loop keeps serving other requests meanwhile
                waiter = end_evt.synchronize if state[1] == cv.SYNC_EVENT else CUDA.synchronize
                await asyncio.to_thread(waiter)
                gpu = int(state[2].elapsed_time(end_evt) * 1_000_000)
        except Exception as err:
            _guard.report("model_execution device wait", err)
        self._exit(state, exc, gpu, None)


def model_execution(sync: str | None = None, **attributes: Any) -> ModelExecution:
    """A ``model_execute`` span around a model call: ``with model_execution(): y = model(x)``.

    ``sync`` is ``"event"`` (default with CUDA), ``"device"`` or ``"none"`` (default
    without CUDA); see the module documentation for why it matters. ``async with``
    waits for the device in a worker thread instead of blocking the event loop.
    """
    return ModelExecution(sync, **attributes)


def instrument_model(module: M, *, sync: str | None = None, **attributes: Any) -> M:
    """Wrap ``module.forward`` (an ``nn.Module`` or anything with ``forward``) in :func:`model_execution`.

    Nested instrumented modules inside one call make one span, not one per layer.
    Returns ``module``.
    """
    forward = getattr(module, "forward", None)
    if not callable(forward):
        raise ConfigError(f"instrument_model(): {type(module).__name__} has no forward()")
    if getattr(forward, "_tracekit_wrapped", False):
        return module
    timer = ModelExecution(sync, **attributes)

    @functools.wraps(forward)
    def traced_forward(*args: Any, **kwargs: Any) -> Any:
        if _INSIDE.get():
            return forward(*args, **kwargs)
        token = _INSIDE.set(True)
        try:
            with timer:
                return forward(*args, **kwargs)
        finally:
            _INSIDE.reset(token)

    traced_forward._tracekit_wrapped = True  # type: ignore[attr-defined]
    # an instance attribute shadows the class's forward; nn.Module.__call__ finds it
    module.forward = traced_forward  # type: ignore[attr-defined]
    return module
