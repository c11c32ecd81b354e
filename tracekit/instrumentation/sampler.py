"""Background sampler of process CPU and GPU utilisation for the request span.

One daemon thread wakes every ``interval_s`` and stores two floats; the FastAPI hook
only reads them, so a request costs no system call for these attributes. CPU is the
process's CPU time over the window divided by the cores it may run on (0..1). GPU
utilisation is read only when torch is already imported, CUDA is up and NVML answers
(``torch.cuda.utilization``); otherwise it stays ``None`` and the attribute is absent.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from tracekit.instrumentation import _guard


def _cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _gpu_reader() -> Callable[[], float] | None:
    torch = sys.modules.get("torch")  # never import torch for this
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        torch.cuda.utilization()  # raises without NVML: then there is no reading
    except Exception:
        return None
    return lambda: float(torch.cuda.utilization()) / 100.0


class ResourceSampler:
    """Keeps ``cpu`` and ``gpu`` (0..1, or None before the first window) up to date."""

    def __init__(
        self,
        interval_s: float = 1.0,
        *,
        wall: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
        cores: int | None = None,
        gpu: Callable[[], float] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.cpu: float | None = None
        self.gpu: float | None = None
        self._wall, self._cpu_clock = wall, cpu_clock
        self._cores = cores or _cores()
        self._gpu = gpu
        self._last = (wall(), cpu_clock())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Close one window: utilisation since the previous call."""
        now = (self._wall(), self._cpu_clock())
        dwall = now[0] - self._last[0]
        if dwall > 0:
            self.cpu = min(1.0, max(0.0, (now[1] - self._last[1]) / (dwall * self._cores)))
        self._last = now
        if self._gpu is not None:
            try:
                self.gpu = min(1.0, max(0.0, self._gpu()))
            except Exception as exc:
                self._gpu, self.gpu = None, None
                _guard.logger.info("tracekit: GPU utilisation sampling stopped: %s", exc)

    def _run(self) -> None:
        if self._gpu is None:
            self._gpu = _gpu_reader()
        while not self._stop.wait(self.interval_s):
            try:
                self.sample()
            except Exception as exc:  # a sampler bug must not end the thread silently
                _guard.logger.warning("tracekit: resource sampler failed: %s", exc)
                return

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tracekit-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None


_SAMPLER: ResourceSampler | None = None
_LOCK = threading.Lock()


def get(interval_s: float | None = None) -> ResourceSampler:
    """The process's running sampler, started on first use.

    ``interval_s`` shortens the window of a running sampler (the shortest asked wins).
    """
    global _SAMPLER
    with _LOCK:
        if _SAMPLER is None:
            _SAMPLER = ResourceSampler(interval_s or 1.0)
            _SAMPLER.start()
        elif interval_s is not None and interval_s < _SAMPLER.interval_s:
            _SAMPLER.interval_s = interval_s
        return _SAMPLER


def current() -> ResourceSampler | None:
    """The running sampler, if any (the request hook never starts one)."""
    return _SAMPLER


def stop() -> None:
    """Stop the sampler thread (``tracekit.shutdown()`` calls this)."""
    global _SAMPLER
    with _LOCK:
        sampler, _SAMPLER = _SAMPLER, None
    if sampler is not None:
        sampler.stop()
