"""Collectives in a Kineto file: one per collective, with op, bytes, group and seq.

On the device (NCCL or ``--comm-pattern`` kernels) each communication kernel is one
collective, launched by the host call with its ``correlation``; its op, bytes and group
come from its args or the enclosing ``record_param_comms``. On the host (gloo, or NCCL
with no kernel in the file) each ``gloo:<op>``/``nccl:<op>`` annotation is one, paired
in order with the ``c10d::<op>`` calls that launched it. ``seq`` numbers them per
process group in launch order, as every rank launches them (docs/kineto.md).

What a bandwidth figure needs comes with each: the bytes in nccl-tests' "size"
convention (:func:`_nbytes`), and the group's size and description, from the args or
else from ``distributedInfo.pg_config`` (:class:`ProcessGroups`).
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
    "uint16": 2, "uint32": 4, "uint64": 8, "complexhalf": 4, "complexfloat": 8,
    "complexdouble": 16, "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2fnuz": 1,
    "float8_e4m3fnuz": 1,
}  # fmt: skip
"""Bytes per element, by the lower-cased ``dtype`` (c10's ScalarType names: ``Float``,
``BFloat16``, ``Long``…) or ``Input type`` (``float``, ``c10::BFloat16``…)."""
_UNDEFINED = "undefined"
"""``pg_desc`` / ``Process Group Description`` of a group created without one."""
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_VARIANT = re.compile(r"(_into)?(_tensor)?(_coalesced)?(_base)?$")
"""Suffixes of ProcessGroup's variants of one collective (``Collective name``)."""
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
    group_size: int | None = None
    group_desc: str | None = None


@dataclass
class ProcessGroups:
    """What ``distributedInfo`` says of the file's process groups."""

    defaults: set[str]
    """Names of the default (world) process group: reported as ``default``."""
    sizes: dict[str, int]
    """``pg_config``: ranks in each group, by ``pg_name``."""
    descs: dict[str, str]
    """``pg_config``: each group's ``pg_desc``, by ``pg_name`` (none when undefined)."""
    world: int

    @classmethod
    def from_dist(cls, dist: Any, world: int) -> ProcessGroups:
        groups = cls({"default_pg"}, {}, {}, world)
        configs = dist.get("pg_config") if isinstance(dist, dict) else None
        for pg in configs if isinstance(configs, list) else []:
            if not isinstance(pg, dict) or pg.get("pg_name") is None:
                continue
            name, desc = str(pg["pg_name"]), pg.get("pg_desc")
            if desc == "default_pg":
                groups.defaults.add(name)
            if isinstance(desc, str) and desc and desc != _UNDEFINED:
                groups.descs[name] = desc
            ranks = pg.get("ranks")
            if (size := _count(pg.get("pg_size"))) is not None:
                groups.sizes[name] = size
            elif isinstance(ranks, list) and ranks:
                groups.sizes[name] = len(ranks)
        return groups

    def group(self, args: dict[str, Any]) -> str:
        """The name that matches a collective across ranks (``default`` for the world)."""
        name = args.get("Process Group Name")
        if (
            name is None
            or str(name) in self.defaults
            or args.get("Process Group Description") == "default_pg"
        ):
            return DEFAULT_GROUP
        return str(name)

    def size(self, args: dict[str, Any], group: str) -> int | None:
        """The ``Group size`` arg, else the group's ``pg_config`` size, else for the
        default group the world size."""
        if (n := _count(args.get("Group size"))) is not None:
            return n
        name = args.get("Process Group Name")
        if name is not None and str(name) in self.sizes:
            return self.sizes[str(name)]
        return self.world if group == DEFAULT_GROUP else None

    def desc(self, args: dict[str, Any]) -> str | None:
        """``Process Group Description`` unless undefined, else the group's ``pg_desc``."""
        desc = args.get("Process Group Description")
        if isinstance(desc, str) and desc and desc != _UNDEFINED:
            return desc
        name = args.get("Process Group Name")
        return self.descs.get(str(name)) if name is not None else None


def _count(value: Any) -> int | None:
    """A positive count written as an int (or its digits)."""
    if type(value) is str and value.isdigit():
        value = int(value)
    return value if type(value) is int and value > 0 else None


def op_name(text: str) -> str:
    """``allreduce``/``all_reduce``/``AllReduce`` → ``all_reduce``; PyTorch's variants of
    one collective (``_allgather_base``, ``allgather_into_tensor_coalesced``,
    ``alltoall_base``) → the collective (``all_gather``, ``all_to_all``)."""
    text = text.strip()
    snake = _VARIANT.sub("", _CAMEL.sub("_", text).lower().strip("_"))
    fixed = {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all"}
    for glued, spaced in fixed.items():
        if snake.startswith(glued):
            return spaced + snake[len(glued) :]
    if snake.startswith("reducescatter"):
        return "reduce_scatter" + snake[len("reducescatter") :]
    return snake.rstrip("_")


def _dtype_size(dtype: Any) -> int | None:
    return _DTYPE_BYTES.get(str(dtype).lower().removeprefix("c10::"))


def _nbytes(args: dict[str, Any], op: str, group_size: int | None) -> int | None:
    """Bytes as nccl-tests' "size": all_gather's whole output, reduce_scatter's whole
    input, else the buffer: the larger of the in and out element counts × dtype size.
    Without element counts, the first input's dims: one rank's part for an all_gather
    (× the group size; unknown without it), the whole buffer otherwise."""
    size = _dtype_size(args.get("dtype"))
    counts = [n for key in _NELEMS if type(n := args.get(key)) is int and n >= 0]
    if size and counts:
        return max(counts) * size
    dims = args.get("Input Dims")
    types = args.get("Input type")
    if isinstance(dims, list) and dims and isinstance(dims[0], list) and isinstance(types, list):
        size = _dtype_size(types[0]) if types else None
        if size and all(isinstance(d, int) for d in dims[0]):
            part = int(np.prod(dims[0], dtype=np.int64)) * size
            if op.startswith("all_gather"):
                return part * group_size if group_size else None
            return part
    return None


def _enclosing(ops: list[Interval], starts: list[int], ts: int) -> Interval | None:
    """The latest-starting op of ``ops`` (sorted by start) that contains ``ts``."""
    i = bisect.bisect_right(starts, ts) - 1
    while i >= 0 and starts[i] > ts - 10**9:  # collectives' host calls are short
        if ops[i].end >= ts:
            return ops[i]
        i -= 1
    return None


def _inside(ops: list[Interval], starts: list[int], outer: Interval) -> Interval | None:
    """The first op of ``ops`` (sorted by start) that runs inside ``outer``, on its thread."""
    i = bisect.bisect_left(starts, outer.start)
    while i < len(ops) and starts[i] <= outer.end:
        if ops[i].tid == outer.tid and ops[i].end <= outer.end:
            return ops[i]
        i += 1
    return None


def _collective(groups: ProcessGroups, args: dict[str, Any], **fields: Any) -> Collective:
    """A collective with what its args (and ``pg_config``) say of bytes and group."""
    group = groups.group(args)
    size = groups.size(args, group)
    return Collective(
        group=group,
        nbytes=_nbytes(args, str(fields.get("op", "")), size),
        group_size=size,
        group_desc=groups.desc(args),
        **fields,
    )


def collectives(sink: EventSink, groups: ProcessGroups) -> list[Collective]:
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
                _collective(
                    groups,
                    args,
                    op=op_name(str(raw_op)),
                    launch=min(at, start),
                    end=end,
                    backend="nccl" if "nccl" in k.name.lower() else "custom",
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
            # The call's own record_param_comms runs inside it (and around NCCL's run).
            host = (call and _inside(meta_ops, meta_starts, call)) or _enclosing(
                meta_ops, meta_starts, call.start if call else run.start
            )
            args = dict(host.args) if host is not None else {}
            args.update(run.args)
            out.append(
                _collective(
                    groups,
                    args,
                    op=op_name(op),
                    launch=min(call.start, run.start) if call else run.start,
                    end=max(run.end, call.end) if call else run.end,
                    backend=backend,
                    is_async=call is not None and call.end < run.end,
                )
            )
    out.sort(key=lambda c: c.launch)
    counters: dict[str, int] = {}
    for c in out:
        c.seq = counters.get(c.group, 0)
        counters[c.group] = c.seq + 1
    return out


_NELEMS = ("In msg nelems", "Out msg nelems")
_COMM_KEYS = frozenset(
    {
        "Collective name",
        *_NELEMS,
        "dtype",
        "Group size",
        "Process Group Name",
        "Process Group Description",
    }
)
"""Args a communication kernel may carry itself; they override ``record_param_comms``'s."""
