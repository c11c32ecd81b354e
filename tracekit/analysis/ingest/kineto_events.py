"""What one Kineto file holds, sorted into the few things tracekit keeps.

:class:`EventSink` takes the events of one rank file one at a time (from
:class:`~tracekit.analysis.ingest.kineto_stream.KinetoStream`) and keeps only:
``ProfilerStep#N`` and stage annotations, the host side of collectives, the launch
time of every correlated host event, and each device op as a few integers in compact
arrays (about 50 bytes an op, never the event itself). Timestamps stay as the file
wrote them (µs, relative or absolute) converted to integer ns; the file's
``baseTimeNanoseconds`` comes last, so :mod:`.kineto` adds it at the end.
"""

from __future__ import annotations

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
        else:
            return
        times = self._times(ev)
        if times is None:
            return
        iv = Interval(name, times[0], times[1], _id(ev.get("tid")), args)
        if kept == "step":
            self.steps.append((int(m.group(1)), iv))  # type: ignore[union-attr]
        elif kept == "stage":
            self.stages.append((stage, iv))  # type: ignore[arg-type]
        elif kept == "collective":
            self.host_collectives.append(iv)
        else:
            self.launches.append(iv)

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


def _args(ev: dict[str, Any]) -> dict[str, Any]:
    args = ev.get("args")
    return args if type(args) is dict else {}


def _id(value: Any) -> Any:
    """A pid/tid as the file wrote it when it is a scalar (they key dicts); else None."""
    return value if isinstance(value, (int, float, str)) else None


def _text(value: Any) -> str:
    # str() of a deeply nested list would recurse; a name is text or a number.
    return str(value) if isinstance(value, (str, int, float)) else ""
