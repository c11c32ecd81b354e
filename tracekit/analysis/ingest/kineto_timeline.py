"""One rank's GPU time line, with Holistic Trace Analysis's definitions (docs/kineto.md).

Input: every device event (kernel, memcpy, memset) as integer-nanosecond arrays.
Output: :class:`GpuFigures`, the temporal breakdown (idle / compute / non-compute),
the communication–computation overlap, the exposed communication, the idle time split
by cause and the kernel-type breakdown. Pure numpy, no Python loop over events.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

COMPUTE = 0
COMMUNICATION = 1
MEMORY = 2
OTHER = 3
"""Kernel types, as HTA's ``KernelType`` (COMPUTATION, COMMUNICATION, MEMORY, OTHER)."""

KERNEL_WAIT_NS = 30_000
"""A gap under this between two kernels of one stream that the host had already
launched is launch overhead ("kernel wait"). HTA's ``consecutive_kernel_delay=30``,
documented there as nanoseconds but compared with microsecond timestamps: 30 µs."""


@dataclass(frozen=True)
class GpuFigures:
    """The GPU time line of one rank (or one step of it); times in nanoseconds."""

    kernels: int
    window_ns: int
    """First device event's start to the last one's end (HTA's ``kernel_time``)."""
    busy_ns: int
    """Union of all device events."""
    idle_ns: int
    compute_ns: int
    """Union of compute kernels."""
    non_compute_ns: int
    """Busy but not computing: communication, memory copies and sets, other kernels."""
    comm_ns: int
    """Union of communication kernels."""
    overlap_ns: int
    """Time when a communication and a compute kernel both run."""
    exposed_comm_ns: int
    """Communication while no compute kernel runs (comm_ns - overlap_ns)."""
    host_wait_ns: int
    kernel_wait_ns: int
    other_idle_ns: int
    kernel_compute_ns: int
    """Summed durations by kernel type (the kernel-type breakdown)."""
    kernel_comm_ns: int
    kernel_memory_ns: int
    kernel_other_ns: int

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def union_ns(start: np.ndarray, end: np.ndarray) -> int:
    """Length of the union of intervals [start, end)."""
    if start.size == 0:
        return 0
    order = np.argsort(start, kind="stable")
    s = start[order]
    e = end[order]
    reach = np.maximum.accumulate(e)
    # A new merged group starts where an interval begins after everything before it ended.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    first = s[new]
    last = np.zeros(first.size, dtype=np.int64)
    np.maximum.at(last, group, e)
    return int((last - first).sum())


def idle_split(
    start: np.ndarray, end: np.ndarray, stream: np.ndarray, launch: np.ndarray
) -> tuple[int, int, int]:
    """(host wait, kernel wait, other) idle time, summed over streams, as HTA splits it.

    On each stream, the gap before a kernel is *host wait* when the host launched it
    only after the previous kernel had ended, *kernel wait* when it is shorter than
    :data:`KERNEL_WAIT_NS`, else *other*. ``launch`` is -1 where no launch is known.
    """
    host = kernel = other = 0
    for sid in np.unique(stream):
        on = np.flatnonzero(stream == sid)
        order = on[np.argsort(start[on], kind="stable")]
        if order.size < 2:
            continue
        s = start[order][1:]
        prev_end = end[order][:-1]
        # Ops of one stream overlapping by a few µs (seen in real traces) are no idle time.
        gap = np.maximum(s - prev_end, 0)
        launched = launch[order][1:]
        is_host = (launched >= 0) & (launched > prev_end)
        is_kernel = ~is_host & (gap < KERNEL_WAIT_NS)
        host += int(gap[is_host].sum())
        kernel += int(gap[is_kernel].sum())
        other += int(gap[~is_host & ~is_kernel].sum())
    return host, kernel, other


def figures(
    start: np.ndarray, end: np.ndarray, stream: np.ndarray, kind: np.ndarray, launch: np.ndarray
) -> GpuFigures | None:
    """The figures over the given device events; None when there are none."""
    if start.size == 0:
        return None
    window = int(end.max() - start.min())
    busy = union_ns(start, end)
    comp = kind == COMPUTE
    comm = kind == COMMUNICATION
    compute_ns = union_ns(start[comp], end[comp])
    comm_ns = union_ns(start[comm], end[comm])
    both = comp | comm
    overlap = compute_ns + comm_ns - union_ns(start[both], end[both])
    dur = end - start
    host, kernel, other = idle_split(start, end, stream, launch)
    return GpuFigures(
        kernels=int(start.size),
        window_ns=window,
        busy_ns=busy,
        idle_ns=window - busy,
        compute_ns=compute_ns,
        non_compute_ns=busy - compute_ns,
        comm_ns=comm_ns,
        overlap_ns=overlap,
        exposed_comm_ns=comm_ns - overlap,
        host_wait_ns=host,
        kernel_wait_ns=kernel,
        other_idle_ns=other,
        kernel_compute_ns=int(dur[comp].sum()),
        kernel_comm_ns=int(dur[comm].sum()),
        kernel_memory_ns=int(dur[kind == MEMORY].sum()),
        kernel_other_ns=int(dur[kind == OTHER].sum()),
    )
