"""Background sampler of process CPU and GPU utilisation for the request span.

One daemon thread wakes every ``interval_s`` and stores two floats; the FastAPI hook
only reads them, so a request costs no system call and takes no lock for these
attributes. CPU is the process's CPU time over the window divided by the CPU it is
granted (see :func:`cpu_capacity`): the CPU request when the user states one
(``TRACEKIT_CPU_REQUEST`` or ``instrument_fastapi(cpu_request=...)``), as a
Kubernetes HPA divides by the pod's request; else the cores it may run on, the
fewer of its affinity mask and its cgroup CPU quota. GPU utilisation is read only
when torch is already imported, CUDA is up and NVML answers
(``torch.cuda.utilization``); otherwise it stays ``None`` and the attribute is absent.
A worker forked while the sampler runs gets a thread of its own and a fresh window.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard

ENV_CPU_REQUEST = "TRACEKIT_CPU_REQUEST"
"""CPU this process is granted, in cores (``0.5``) or millicores (``500m``): the divisor
of ``tracekit.cpu.utilization``; set it to the pod's CPU request to match an HPA."""

CGROUP_ROOT = Path("/sys/fs/cgroup")

_ORIGIN = (time.monotonic(), time.process_time())
"""When this module was imported (the service's start-up): the first window's start."""


def parse_cpu_quantity(text: str, *, source: str = ENV_CPU_REQUEST) -> float:
    """Cores from a Kubernetes CPU quantity: ``"0.5"``, ``"2"`` or ``"500m"``."""
    raw = text.strip()
    try:
        cores = float(raw[:-1]) / 1000.0 if raw.endswith("m") else float(raw)
    except ValueError:
        cores = math.nan
    return _positive(cores, source, text)


def _positive(cores: float, source: str, shown: object) -> float:
    if not (cores > 0 and math.isfinite(cores)):
        raise ConfigError(
            f"{source}: {shown!r} is not a CPU quantity; write cores (0.5) or millicores (500m)"
        )
    return cores


def parse_cpu_max(text: str) -> float | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` (``"<quota> <period>"``); None for ``max``."""
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100_000
    quota = int(fields[0])
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_limit(root: Path = CGROUP_ROOT) -> float | None:
    """Cores this cgroup's CPU quota allows, or None without a quota (or a cgroup).

    cgroup v2 keeps it in ``cpu.max``; v1 in ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``
    (-1: no quota) under the ``cpu`` controller's directory.
    """
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            return parse_cpu_max(v2.read_text())
        for controller in (root / "cpu", root / "cpu,cpuacct", root):
            quota_file = controller / "cpu.cfs_quota_us"
            if quota_file.is_file():
                quota = int(quota_file.read_text().strip())
                period = int((controller / "cpu.cfs_period_us").read_text().strip())
                return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        pass  # unreadable or odd: no quota known, the affinity mask decides
    return None


def _affinity_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_capacity(root: Path = CGROUP_ROOT) -> float:
    """Cores this process may use: its affinity mask, capped by its cgroup quota."""
    limit = cgroup_cpu_limit(root)
    cores = float(_affinity_cores())
    return min(cores, limit) if limit is not None else cores


def cpu_request(explicit: float | str | None = None) -> float | None:
    """The stated CPU request in cores: ``explicit``, else ``TRACEKIT_CPU_REQUEST``, else None."""
    if explicit is not None:
        if isinstance(explicit, str):
            return parse_cpu_quantity(explicit, source="cpu_request")
        return _positive(float(explicit), "cpu_request", explicit)
    raw = os.environ.get(ENV_CPU_REQUEST, "").strip()
    return parse_cpu_quantity(raw) if raw else None


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
    """Keeps ``cpu`` and ``gpu`` (fractions, or None before the first window) up to date.

    ``cpu`` is CPU time over wall time divided by ``request`` when one is stated, else
    by ``cores`` (the capacity, read once here when not given). It is 0..1 of the
    capacity; of a stated request it may exceed 1 (a pod bursting above its request,
    as an HPA reports more than 100%), up to capacity / request.
    """

    def __init__(
        self,
        interval_s: float = 1.0,
        *,
        wall: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
        cores: float | None = None,
        request: float | None = None,
        gpu: Callable[[], float] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.cpu: float | None = None
        self.gpu: float | None = None
        self._wall, self._cpu_clock = wall, cpu_clock
        self.capacity = cores or cpu_capacity()
        self.request = request
        self._gpu = gpu
        self._last = (wall(), cpu_clock())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """Close one window: utilisation since the previous call."""
        now = (self._wall(), self._cpu_clock())
        dwall = now[0] - self._last[0]
        if dwall > 0:
            divisor = self.request or self.capacity
            used = (now[1] - self._last[1]) / dwall  # cores busy over the window
            self.cpu = min(self.capacity / divisor, max(0.0, used / divisor))
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

    def first_reading(self) -> None:
        """Utilisation since start-up, so requests before the first window closes carry one too.

        Only with the real clocks (the window starts at this module's import); a sampler
        with fake clocks waits for its first :meth:`sample`, as tests expect.
        """
        if self.cpu is not None:
            return
        if self._wall is time.monotonic and self._cpu_clock is time.process_time:
            last, self._last = self._last, _ORIGIN
            self.sample()
            if self.cpu is None:  # no time passed at all: keep the window as it was
                self._last = last

    def start(self) -> None:
        if self._thread is None:
            self.first_reading()
            self._thread = threading.Thread(target=self._run, name="tracekit-sampler", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def _after_fork_in_child(self) -> None:
        """A forked worker: the parent's thread is gone and its CPU time is not this process's.

        The window restarts now, and the utilisations stay unset until it closes: a
        first reading over a window of microseconds would be noise.
        """
        running = self._thread is not None
        self._stop, self._thread = threading.Event(), None
        self.cpu = self.gpu = None
        self._last = (self._wall(), self._cpu_clock())
        if running:
            self._thread = threading.Thread(target=self._run, name="tracekit-sampler", daemon=True)
            self._thread.start()


_SAMPLER: ResourceSampler | None = None
_LOCK = threading.Lock()


def start(
    interval_s: float | None = None, *, request: float | str | None = None
) -> ResourceSampler:
    """Start the process's sampler, or adjust the running one; returns it.

    Called at set-up and app start-up, never per request. ``interval_s`` shortens the
    window of a running sampler (the shortest asked wins); ``request`` (cores or a
    quantity like ``"500m"``; default ``TRACEKIT_CPU_REQUEST``) becomes the CPU divisor.
    """
    global _SAMPLER
    stated = cpu_request(request)
    with _LOCK:
        if _SAMPLER is None:
            _SAMPLER = ResourceSampler(interval_s or 1.0, request=stated)
            _SAMPLER.start()
        else:
            if interval_s is not None and interval_s < _SAMPLER.interval_s:
                _SAMPLER.interval_s = interval_s
            if stated is not None:
                _SAMPLER.request = stated
        return _SAMPLER


def current() -> ResourceSampler | None:
    """The running sampler, if any: the request path reads it without a lock, never starts one."""
    return _SAMPLER


def _after_fork_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()
    sampler = _SAMPLER
    if sampler is not None:
        try:
            sampler._after_fork_in_child()
        except Exception as exc:  # pragma: no cover - never break a fork
            _guard.logger.warning("tracekit: resource sampler after fork: %r", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def stop() -> None:
    """Stop the sampler thread (``tracekit.shutdown()`` calls this)."""
    global _SAMPLER
    with _LOCK:
        sampler, _SAMPLER = _SAMPLER, None
    if sampler is not None:
        sampler.stop()
