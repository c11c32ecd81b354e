"""Collectives in a Kineto file: one per collective, with op, bytes, group and seq.

On the device (NCCL or ``--comm-pattern`` kernels) each communication kernel is one
collective, launched by the host call with its ``correlation``; its op, bytes and group
come from its args or the enclosing ``record_param_comms``. On the host (gloo, or NCCL
with no kernel in the file) each ``gloo:<op>``/``nccl:<op>`` annotation is one, paired
in order with the ``c10d::<op>`` calls that launched it. ``seq`` numbers them per
process group in launch order, as every rank launches them (docs/kineto.md).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.analysis.ingest.kineto_events import EventSink, Interval

DEFAULT_GROUP = "default"
"""The world process group, named as ``tracekit.instrumentation`` names it."""

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "half": 2, "float16": 2,
    "bfloat16": 2, "double": 8, "float64": 8, "long": 8, "int64": 8, "short": 2,
    "int16": 2, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)


@dataclass
class Collective:
    """One collective on one rank; times in file-relative ns."""

    op: str
    launch: int
    end: int
    group: str
    backend: str
    nbytes: int | None
    is_async: bool
    device_ns: int | None = None
    seq: int = 0


def default_groups(dist: Any) -> set[str]:
    """Names of the default (world) process group: reported as ``default``."""
    names = {"default_pg"}
    if isinstance(dist, dict):
        for pg in dist.get("pg_config") or []:
            if isinstance(pg, dict) and pg.get("pg_desc") == "default_pg":
                names.add(str(pg.get("pg_name")))
    return names


def op_name(text: str) -> str:
    """``allreduce``/``all_reduce``/``AllReduce`` → ``all_reduce``."""
    text = text.strip()
    snake = _CAMEL.sub("_", text).lower()
    fixed = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all"}
    for glued, spaced in fixed.items():
        if snake.startswith(glued):
            return spaced + snake[len(glued) :]
    if snake.startswith("reducescatter"):
        return "reduce_scatter" + snake[len("reducescatter") :]
    return snake.rstrip("_")


def _nbytes(args: dict[str, Any]) -> int | None:
    size = _DTYPE_BYTES.get(str(args.get("dtype", "")).lower())
    n = args.get("In msg nelems")
    if size and isinstance(n, int):
        return n * size
    dims = args.get("Input Dims")
    types = args.get("Input type")
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and isinstance(types, list):
        size = _DTYPE_BYTES.get(str(types[0]).lower()) if types else None
        if size and all(isinstance(d, int) for d in dims[0]):
            return int(np.prod(dims[0], dtype=np.int64)) * size
    return None


def _group(args: dict[str, Any], defaults: set[str]) -> str:
    name = args.get("Process Group Name")
    if (
        name is None
        or str(name) in defaults
        or args.get("Process Group Description") == "default_pg"
    ):
        return DEFAULT_GROUP
    return str(name)


def _enclosing(ops: list[Interval], starts: list[int], ts: int) -> Interval | None:
    """The latest-starting op of ``ops`` (sorted by start) that contains ``ts``."""
    i = bisect.bisect_right(starts, ts) - 1
    while i >= 0 and starts[i] > ts - 10**9:  # collectives' host calls are short
        if ops[i].end >= ts:
            return ops[i]
        i -= 1
    return None


def collectives(sink: EventSink, defaults: set[str]) -> list[Collective]:
    """One entry per collective, in launch order, numbered per process group."""
    meta_ops = sorted(
        (o for o in sink.launches if o.name == "record_param_comms"), key=lambda o: o.start
    )
    meta_starts = [o.start for o in meta_ops]
    out: list[Collective] = []
    if sink.comm_kernels:
        launch = sink.launch_times()
        for k in sink.comm_kernels:
            start, end = sink.dev_start[k.index], sink.dev_end[k.index]
            at = int(launch[k.index]) if launch[k.index] >= 0 else start
            host = _enclosing(meta_ops, meta_starts, at)
            args = dict(host.args) if host is not None else {}
            args.update({key: v for key, v in k.args.items() if key in _COMM_KEYS})
            m = _KERNEL_OP.search(k.name)
            raw_op = args.get("Collective name") or (m.group(1) if m else k.name.split("(")[0])
            out.append(
                Collective(
                    op=op_name(str(raw_op)),
                    launch=min(at, start),
                    end=end,
                    group=_group(args, defaults),
                    backend="nccl" if "nccl" in k.name.lower() else "custom",
                    nbytes=_nbytes(args),
                    is_async=True,
                    device_ns=end - start,
                )
            )
    else:
        calls = sorted(
            (o for o in sink.launches if o.name.startswith("c10d::") and "wait" not in o.name),
            key=lambda o: o.start,
        )
        runs = sorted(sink.host_collectives, key=lambda o: o.start)
        # Gloo runs each collective on its own worker thread, in the order the caller
        # issued them: the n-th call launched the n-th run. The collective holds its
        # caller from the call until the later of its end and the call's return (a
        # busy host can return after the worker finished; DDP's hook sees the same).
        paired = len(calls) == len(runs)
        for n, run in enumerate(runs):
            backend, _, op = run.name.partition(":")
            call = calls[n] if paired else None
            host = _enclosing(meta_ops, meta_starts, call.start if call else run.start)
            args = dict(host.args) if host is not None else {}
            args.update(run.args)
            out.append(
                Collective(
                    op=op_name(op),
                    launch=min(call.start, run.start) if call else run.start,
                    end=max(run.end, call.end) if call else run.end,
                    group=_group(args, defaults),
                    backend=backend,
                    nbytes=_nbytes(args),
                    is_async=call is not None and call.end < run.end,
                )
            )
    out.sort(key=lambda c: c.launch)
    counters: dict[str, int] = {}
    for c in out:
        c.seq = counters.get(c.group, 0)
        counters[c.group] = c.seq + 1
    return out


_COMM_KEYS = frozenset(
    {"Collective name", "In msg nelems", "dtype", "Process Group Name", "Process Group Description"}
)
