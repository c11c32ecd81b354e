"""What one Kineto file holds, sorted into the few things tracekit keeps.

:class:`EventSink` takes the events of one rank file one at a time (from
:class:`~tracekit.analysis.ingest.kineto_stream.KinetoStream`) and keeps only:
``ProfilerStep#N`` and stage annotations, the host side of collectives, the launch
time of every correlated host event, and each device op as a few integers in compact
arrays (about 50 bytes an op, never the event itself); and the host's
``user_annotation`` blocks, the step windows of a profile without ``ProfilerStep``
(:meth:`EventSink.top_level_annotations`). :class:`Extent` finds a file's first start
and last end, for a profile with neither (a second pass, so that this one stays lean).
Timestamps stay as the file wrote them (µs, relative or absolute) converted to integer
ns; the file's ``baseTimeNanoseconds`` comes last, so :mod:`.kineto` adds it at the end.
"""

from __future__ import annotations

import math
import re
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.ingest import kineto_timeline as tl
from tracekit.analysis.ingest.kineto_stream import us_to_ns

DEVICE_CATS = frozenset(
    {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset", "mtia_ccp_events"}
)
"""Device ops that occupy a stream (HTA's kernel categories)."""
_MEMORY_CATS = frozenset({"gpu_memcpy", "Memcpy", "gpu_memset", "Memset"})
_DEVICE_SIDE = DEVICE_CATS | {"gpu_user_annotation", "cuda_sync", "cuda_profiler_range"}
"""Categories that live on the device time line, never on a host thread."""

NCCL = re.compile("nccl", re.IGNORECASE)
"""Communication kernels: ``ncclKernel_*``, ``ncclDevKernel_*`` and any spelling."""
_MEMORY_NAME = re.compile(r"Memcpy|Memset|dma")
_HTA_OTHER = re.compile(r".*Memcpy|Memset|.*Sync")
"""Kernels HTA counts as neither compute nor communication nor memory."""
STEP_NAME = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_HOST_COLLECTIVE = re.compile(r"(gloo|nccl|mpi|ucc):([A-Za-z_]+)")
_NEAR_US = 8.0
"""µs: far more than a float's error on a µs timestamp (0.25 µs at 2e15 µs, 2033)."""


def kernel_kind(name: str, cat: str, comm: re.Pattern[str] | None) -> int:
    """COMPUTE / COMMUNICATION / MEMORY / OTHER for one device op."""
    if NCCL.search(name) or (comm is not None and comm.search(name)):
        return tl.COMMUNICATION
    if cat in _MEMORY_CATS or _MEMORY_NAME.match(name):
        return tl.MEMORY
    if _HTA_OTHER.match(name):
        return tl.OTHER
    return tl.COMPUTE


def stage_of(name: str) -> str | None:
    """The training stage a host annotation names, if any."""
    if name.startswith("enumerate(DataLoader)"):
        return cv.DATA_WAIT
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return cv.OPTIMIZER
    low = name.strip("# ").lower()
    if low == "forward" or low.endswith(".forward"):
        return cv.FORWARD
    if low == "backward" or low.endswith(".backward"):
        return cv.BACKWARD
    return None


@dataclass
class Interval:
    """A host-side event: name, thread, [start, end) in file-relative ns, its args."""

    name: str
    start: int
    end: int
    tid: Any = None
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class CommKernel:
    """A communication op on the device, with what its args say of the collective."""

    index: int
    """Position in the device arrays."""
    name: str
    args: dict[str, Any]


class EventSink:
    """Accumulates one file's events; see the module docstring for what is kept."""

    def __init__(self, comm_pattern: re.Pattern[str] | None) -> None:
        self.comm_pattern = comm_pattern
        self.steps: list[tuple[int, Interval]] = []
        self.stages: list[tuple[str, Interval]] = []
        self.host_collectives: list[Interval] = []
        """``gloo:all_reduce``-style annotations: the collective's own execution."""
        self.launches: list[Interval] = []
        """``c10d::*`` and ``record_param_comms`` ops: where a collective was called."""
        self.comm_kernels: list[CommKernel] = []
        self.dev_start = array("q")
        self.dev_end = array("q")
        self.dev_stream = array("q")
        self.dev_kind = array("b")
        self.dev_corr = array("q")
        self.host_corr = array("q")
        self.host_ts = array("q")
        self.annotations: list[tuple[Any, Interval]] = []
        """(pid, interval) of each host ``user_annotation`` (record_function block) seen
        before the first ``ProfilerStep``."""
        self.pids: dict[Any, int] = {}
        self.first_ns: int | None = None
        self.skipped = 0
        """Events without usable times (metadata and footer events excluded)."""

    def add(self, ev: Any) -> None:
        # Most events are host ops tracekit does not keep: decide from ``cat`` and the
        # name before converting any time (this loop is most of the ingest's cost).
        if type(ev) is not dict or ev.get("ph") != "X":
            return
        cat = ev.get("cat")
        if cat in DEVICE_CATS:
            times = self._times(ev)
            if times is not None:
                self._device(_text(ev.get("name")), cat, times[0], times[1], _args(ev))
            return
        if cat in _DEVICE_SIDE:
            return
        args = _args(ev)
        pid = _id(ev.get("pid"))
        self.pids[pid] = self.pids.get(pid, 0) + 1
        corr = args.get("correlation")
        if type(corr) is int and corr > 0:
            times = self._times(ev)
            if times is not None:
                self.host_corr.append(corr)
                self.host_ts.append(times[0])
        if cat == "cuda_runtime" or cat == "cuda_driver":
            return
        name = ev.get("name")
        if not isinstance(name, str):
            return
        if cat == "cpu_op":
            if not name.startswith(("c10d::", "record_param_comms")):
                return
            kept = "launch"
        elif (m := STEP_NAME.fullmatch(name)) is not None:
            kept = "step"
        elif (stage := stage_of(name)) is not None:
            kept = "stage"
        elif _HOST_COLLECTIVE.match(name):
            kept = "collective"
        elif name.startswith(("c10d::", "record_param_comms")):
            kept = "launch"
        elif cat == "user_annotation" and not self.steps:
            kept = "annotation"
        else:
            return
        times = self._times(ev)
        if times is None:
            return
        iv = Interval(name, times[0], times[1], _id(ev.get("tid")), args)
        # Windows of a profile without ProfilerStep (kept only until one is seen).
        if cat == "user_annotation" and not self.steps:
            self.annotations.append((pid, iv))
            if kept == "annotation":
                return
        if kept == "step":
            self.steps.append((int(m.group(1)), iv))  # type: ignore[union-attr]
        elif kept == "stage":
            self.stages.append((stage, iv))  # type: ignore[arg-type]
        elif kept == "collective":
            self.host_collectives.append(iv)
        else:
            self.launches.append(iv)

    def top_level_annotations(self) -> list[Interval]:
        """The main process's ``user_annotation`` blocks not nested in another of their
        thread, that tracekit reads as nothing else (not a step, stage or collective);
        by start time. Of one thread only — the one whose blocks cover the most time (the
        loop's): blocks of other threads would make windows that overlap it."""
        main = self.main_pid
        by_thread: dict[Any, list[Interval]] = {}
        for pid, iv in self.annotations:
            if pid == main:
                by_thread.setdefault(iv.tid, []).append(iv)
        best: list[Interval] = []
        for ivs in by_thread.values():
            out = []
            reach = -math.inf
            for iv in sorted(ivs, key=lambda iv: (iv.start, -iv.end)):
                if iv.start >= reach and _plain(iv.name):
                    out.append(iv)
                reach = max(reach, iv.end)
            if sum(iv.end - iv.start for iv in out) > sum(iv.end - iv.start for iv in best):
                best = out
        return best

    def _times(self, ev: dict[str, Any]) -> tuple[int, int] | None:
        start = us_to_ns(ev.get("ts"))
        dur = us_to_ns(ev.get("dur", 0))
        if start is None or dur is None:
            self.skipped += 1
            return None
        if self.first_ns is None or start < self.first_ns:
            self.first_ns = start
        return start, start + max(dur, 0)

    def _device(self, name: str, cat: str, start: int, end: int, args: dict[str, Any]) -> None:
        stream = args.get("stream")
        if type(stream) is not int:
            # ROCm writes the runtime's stream as hex text; a device op's is an int.
            try:
                stream = int(str(stream), 0)
            except ValueError:
                stream = -1
        corr = args.get("correlation")
        kind = kernel_kind(name, cat, self.comm_pattern)
        if kind == tl.COMMUNICATION:
            self.comm_kernels.append(CommKernel(len(self.dev_start), name, args))
        self.dev_start.append(start)
        self.dev_end.append(end)
        self.dev_stream.append(stream)
        self.dev_kind.append(kind)
        self.dev_corr.append(corr if type(corr) is int and corr > 0 else -1)

    def launch_times(self) -> np.ndarray:
        """Host time of the call that launched each device op (-1 when not in the file)."""
        corr = np.frombuffer(self.dev_corr, dtype=np.int64)
        out = np.full(corr.size, -1, dtype=np.int64)
        if not len(self.host_corr):
            return out
        hc = np.frombuffer(self.host_corr, dtype=np.int64)
        ht = np.frombuffer(self.host_ts, dtype=np.int64)
        order = np.argsort(hc, kind="stable")
        hc, ht = hc[order], ht[order]
        pos = np.clip(np.searchsorted(hc, corr), 0, hc.size - 1)
        hit = (hc[pos] == corr) & (corr >= 0)
        out[hit] = ht[pos[hit]]
        return out

    @property
    def main_pid(self) -> Any:
        """The host process most events came from."""
        return max(self.pids, key=lambda p: self.pids[p]) if self.pids else None


class Extent:
    """The first start and last end of a file's complete events, host or device (not
    the profiler's own footer span).

    Converting every event's times exactly would cost more than the ingest's whole
    first pass; each is screened with floats instead, and only those within
    :data:`_NEAR_US` of the extreme so far are kept and converted exactly at the end.
    """

    def __init__(self) -> None:
        self._first = _Nearest()
        self._last = _Nearest()

    def add(self, ev: Any) -> None:
        # Kineto's footer span (``cat: Trace``) is the profiler's session, not an event.
        if type(ev) is not dict or ev.get("ph") != "X" or ev.get("cat") == "Trace":
            return
        ts: Any = ev.get("ts")
        dur: Any = ev.get("dur", 0)
        try:
            lo = float(ts)
            hi = lo + abs(float(dur))  # abs: a superset of the candidates
        except (TypeError, ValueError):
            return
        if math.isfinite(hi):
            self._first.offer(-lo, (ts, 0))
            self._last.offer(hi, (ts, dur))

    def bounds(self) -> tuple[int, int] | None:
        """(first start, last end) in file-relative ns, exact; None without events."""
        firsts = [t for t, _ in map(_exact, self._first.raw()) if t is not None]
        lasts = [t + e for t, e in map(_exact, self._last.raw()) if t is not None]
        return (min(firsts), max(lasts)) if firsts and lasts else None


class _Nearest:
    """The values offered within :data:`_NEAR_US` of the largest so far (floats, µs)."""

    def __init__(self) -> None:
        self.best = -math.inf
        self.items: list[tuple[float, tuple[Any, Any]]] = []
        self.limit = 64

    def offer(self, key: float, raw: tuple[Any, Any]) -> None:
        if key > self.best - _NEAR_US:
            self.items.append((key, raw))
            self.best = max(key, self.best)
            if len(self.items) > self.limit:  # drop those the best has left behind
                cut = self.best - _NEAR_US
                self.items = [item for item in self.items if item[0] > cut]
                self.limit = max(64, 2 * len(self.items))

    def raw(self) -> list[tuple[Any, Any]]:
        return [raw for _, raw in self.items]


def _exact(raw: tuple[Any, Any]) -> tuple[int | None, int]:
    """(start, duration) in ns of an event's raw ``ts`` and ``dur``, as ``_times``."""
    start, dur = us_to_ns(raw[0]), us_to_ns(raw[1])
    return (None, 0) if start is None or dur is None else (start, max(dur, 0))


def _plain(name: str) -> bool:
    """An annotation that is no step, stage or collective (a step window's candidate)."""
    return (
        STEP_NAME.fullmatch(name) is None
        and stage_of(name) is None
        and not _HOST_COLLECTIVE.match(name)
        and not name.startswith(("c10d::", "record_param_comms"))
    )


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    args = ev.get("args")
    return args if type(args) is dict else {}


def _id(value: Any) -> Any:
    """A pid/tid as the file wrote it when it is a scalar (they key dicts); else None."""
    return value if isinstance(value, (int, float, str)) else None


def _text(value: Any) -> str:
    # str() of a deeply nested list would recurse; a name is text or a number.
    return str(value) if isinstance(value, (str, int, float)) else ""
