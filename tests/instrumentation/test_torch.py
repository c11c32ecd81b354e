"""model_execution / instrument_model on CPU torch, and the CUDA paths against a stand-in device."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

import tracekit
from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import torch as tk_torch


class StandInCuda:
    """Stand-in for the CUDA device (none on the test machines): events with a fixed elapsed time.

    It records the calls in order, so the tests can tell which wait each mode uses.
    """

    def __init__(self, elapsed_ms: float = 2.5) -> None:
        self.calls: list[str] = []
        self.elapsed_ms = elapsed_ms
        self.threads: list[int] = []

    def available(self) -> bool:
        return True

    def event(self) -> StandInEvent:
        return StandInEvent(self)

    def synchronize(self) -> None:
        self.calls.append("device.synchronize")
        self.threads.append(threading.get_ident())


class StandInEvent:
    def __init__(self, cuda: StandInCuda) -> None:
        self.cuda = cuda

    def record(self) -> None:
        self.cuda.calls.append("event.record")

    def synchronize(self) -> None:
        self.cuda.calls.append("event.synchronize")
        self.cuda.threads.append(threading.get_ident())

    def elapsed_time(self, end: StandInEvent) -> float:
        return self.cuda.elapsed_ms


@pytest.fixture
def cuda(monkeypatch) -> StandInCuda:
    fake = StandInCuda()
    monkeypatch.setattr(tk_torch, "CUDA", fake)
    return fake


def test_cpu_model_gets_wall_and_cpu_time_and_says_no_sync(spans):
    model = torch.nn.Linear(16, 4)
    with tracekit.model_execution():
        model(torch.ones(32, 16))
    (span,) = spans.named(cv.MODEL_EXECUTE)
    a = span.attributes
    assert a[cv.STAGE] == cv.MODEL_EXECUTE and a[cv.TIME_KIND] == cv.COMPUTE
    assert a[cv.GPU_SYNC] == cv.SYNC_NONE and cv.GPU_TIME_NS not in a
    assert a[cv.CPU_TIME_NS] > 0


def test_event_sync_waits_only_for_its_own_end_event(spans, cuda):
    with tracekit.model_execution():
        cuda.calls.append("work")
    assert cuda.calls == ["event.record", "work", "event.record", "event.synchronize"]
    (span,) = spans.named(cv.MODEL_EXECUTE)
    assert span.attributes[cv.GPU_SYNC] == cv.SYNC_EVENT
    assert span.attributes[cv.GPU_TIME_NS] == 2_500_000


def test_device_sync_synchronizes_before_and_after(spans, cuda):
    with tracekit.model_execution(sync="device"):
        cuda.calls.append("work")
    assert cuda.calls == [
        "device.synchronize",
        "event.record",
        "work",
        "event.record",
        "device.synchronize",
    ]
    assert spans.named(cv.MODEL_EXECUTE)[0].attributes[cv.GPU_SYNC] == cv.SYNC_DEVICE


def test_none_sync_touches_no_device(spans, cuda):
    with tracekit.model_execution(sync="none"):
        pass
    assert cuda.calls == []
    (span,) = spans.named(cv.MODEL_EXECUTE)
    assert span.attributes[cv.GPU_SYNC] == cv.SYNC_NONE and cv.GPU_TIME_NS not in span.attributes


def test_async_form_waits_for_the_device_off_the_event_loop(spans, cuda):
    async def main() -> int:
        async with tracekit.model_execution():
            pass
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert cuda.calls[-1] == "event.synchronize" and cuda.threads[-1] != loop_thread
    assert spans.named(cv.MODEL_EXECUTE)[0].attributes[cv.GPU_TIME_NS] == 2_500_000


def test_batched_members_get_the_device_time_of_their_batch(spans, cuda):
    def run_batch(xs: list[int]) -> list[int]:
        with tracekit.model_execution():
            return [x + 1 for x in xs]

    async def main() -> list[int]:
        batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=3, max_wait_ms=5.0)
        try:
            return await asyncio.gather(*(batcher.submit(x) for x in range(3)))
        finally:
            await batcher.aclose()

    assert asyncio.run(main()) == [1, 2, 3]
    members = [s for s in spans.named(cv.MODEL_EXECUTE) if cv.BATCH_ID in s.attributes]
    assert len(members) == 3
    assert all(m.attributes[cv.GPU_TIME_NS] == 2_500_000 for m in members)
    assert all(m.attributes[cv.GPU_SYNC] == cv.SYNC_EVENT for m in members)


def test_instrument_model_makes_one_span_per_call_even_when_nested(spans):
    inner = torch.nn.Linear(8, 8)
    model = torch.nn.Sequential(inner, torch.nn.ReLU())
    tracekit.instrument_model(inner)
    assert tracekit.instrument_model(model) is model
    tracekit.instrument_model(model)  # twice: still one wrapper
    out = model(torch.ones(2, 8))
    model(torch.ones(2, 8))
    assert out.shape == (2, 8)
    assert len(spans.named(cv.MODEL_EXECUTE)) == 2


def test_model_error_is_recorded_and_reraised(spans):
    model = torch.nn.Linear(4, 4)
    tracekit.instrument_model(model)
    with pytest.raises(RuntimeError):
        model(torch.ones(2, 5))  # shape mismatch
    (span,) = spans.named(cv.MODEL_EXECUTE)
    assert span.attributes[cv.ERROR_TYPE] == "RuntimeError"


def test_bad_sync_mode_and_module():
    with pytest.raises(ConfigError, match="sync"):
        tracekit.model_execution(sync="cuda")
    with pytest.raises(ConfigError, match="forward"):
        tracekit.instrument_model(object())


def test_async_device_sync_waits_off_the_event_loop_on_entry_too(spans, cuda):
    async def main() -> int:
        async with tracekit.model_execution(sync="device"):
            cuda.calls.append("work")
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert cuda.calls == [
        "device.synchronize",
        "event.record",
        "work",
        "event.record",
        "device.synchronize",
    ]
    assert len(cuda.threads) == 2 and loop_thread not in cuda.threads
    assert spans.named(cv.MODEL_EXECUTE)[0].attributes[cv.GPU_SYNC] == cv.SYNC_DEVICE
