"""Collective bandwidth and communication per process group, from matched collectives.

Bandwidth follows nccl-tests (``doc/PERFORMANCE.md`` there): the **algorithm bandwidth**
is the collective's size ÷ its time; the **bus bandwidth** multiplies it by a factor of
the op and the group's size ``n`` that makes it comparable with the link's rate
whatever the algorithm: all_reduce 2(n−1)/n, all_gather and reduce_scatter (n−1)/n,
all_to_all (n−1)/n, broadcast and reduce 1. Sizes are nccl-tests' too: all_gather's
total output, reduce_scatter's total input, the buffer otherwise. GB/s are 10⁹ bytes/s.

Only **transfer** time counts. A collective cannot move data before its last rank has
arrived, nor before the group's previous collective has left the communication
stream (NCCL runs a group's collectives one after another; a DDP bucket launched while
the previous one still runs is queued, not transferring). So on each rank the
transfer runs from the later of the last rank's arrival (after clock alignment) and
the end of this rank's previous collective of the same group, to the collective's
end; a collective's time is the median over its ranks. Peer wait is left out: it is
the straggler's cost, not the network's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tracekit.analysis.training.model import CollectiveBandwidth, GroupComm

NS = 1_000_000.0
GB = 1e9

CONCURRENT = frozenset({"gloo"})
"""Backends whose collectives of one group run at the same time, not one after another."""

INTRA = "intra-node"
INTER = "inter-node"
UNKNOWN = "unknown"


_BASE_OPS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send",
    "recv",
)  # fmt: skip
_FACTORS: dict[str, tuple[float, float]] = {
    # factor = a·(n−1)/n + b, as nccl-tests: all_reduce 2(n−1)/n, broadcast/reduce 1
    "all_reduce": (2.0, 0.0),
    "all_gather": (1.0, 0.0),
    "reduce_scatter": (1.0, 0.0),
    "all_to_all": (1.0, 0.0),
    "broadcast": (0.0, 1.0),
    "reduce": (0.0, 1.0),
    "send": (0.0, 1.0),
    "recv": (0.0, 1.0),
}


def base_op(op: str) -> str:
    """``all_gather_into_tensor_coalesced`` → ``all_gather``; unknown ops unchanged."""
    for base in _BASE_OPS:  # reduce_scatter before reduce
        if op.startswith(base):
            return base
    return op


def bus_factor(op: str, n: int) -> float | None:
    """nccl-tests' bus bandwidth factor of ``op`` on ``n`` ranks (None: no known factor)."""
    f = _FACTORS.get(base_op(op))
    if f is None or n < 1:
        return None
    return f[0] * (n - 1) / n + f[1]


@dataclass(frozen=True, slots=True)
class CommAttrs:
    """What a communication span says of its collective."""

    group: str
    seq: int
    op: str
    nbytes: int | None
    group_size: int | None
    group_desc: str | None
    backend: str | None = None
    """``gloo`` runs a group's collectives at once (worker threads), never queued."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CommInstance(CommAttrs):
    """One collective on one rank, times on the aligned clock (ns)."""

    rank: int
    host: str | None
    step: int
    start: int
    end: int
    stage: str
    """The stage it was launched under."""
    exposed_ns: int
    """Its time on the step's critical path."""


def transfer_times(instances: list[CommInstance]) -> dict[tuple[str, int], list[int]]:
    """Per collective (group, seq): each rank's transfer time in ns (module docstring)."""
    last: dict[tuple[str, int], int] = {}
    for c in instances:
        key = (c.group, c.seq)
        last[key] = max(last.get(key, c.start), c.start)
    by_rank: dict[tuple[int, str], list[CommInstance]] = defaultdict(list)
    for c in instances:
        by_rank[(c.rank, c.group)].append(c)
    out: dict[tuple[str, int], list[int]] = defaultdict(list)
    for mine in by_rank.values():
        mine.sort(key=lambda c: c.seq)
        prev_end: int | None = None
        for c in mine:
            begin = last[(c.group, c.seq)]
            # Queued behind the previous one: NCCL runs a group's collectives in order on
            # its stream; gloo runs them on several worker threads at once (no queue).
            if prev_end is not None and c.backend not in CONCURRENT and prev_end < c.end:
                begin = max(begin, prev_end)
            if c.end > begin:
                out[(c.group, c.seq)].append(c.end - begin)
            prev_end = c.end if prev_end is None else max(prev_end, c.end)
    return out


def _size_class(nbytes: float) -> int:
    """Power-of-two size class (bytes ≥ 1)."""
    return int(np.floor(np.log2(max(nbytes, 1.0))))


def _scope(hosts: set[str | None]) -> str:
    if None in hosts or not hosts:
        return UNKNOWN
    return INTER if len(hosts) > 1 else INTRA


def collective_table(
    instances: list[CommInstance], world: int, link_gbps: float | None
) -> list[CollectiveBandwidth]:
    """Bandwidth per (op, group, size class) over collectives that carry a size."""
    times = transfer_times(instances)
    per_coll: dict[tuple[str, int], list[CommInstance]] = defaultdict(list)
    for c in instances:
        per_coll[(c.group, c.seq)].append(c)
    group_hosts: dict[str, set[str | None]] = defaultdict(set)
    group_n: dict[str, int] = {}
    for (group, _seq), ranks in per_coll.items():
        group_hosts[group] |= {c.host for c in ranks}
        sizes = [c.group_size for c in ranks if c.group_size]
        n = group_size(group, sizes, len(ranks), world)
        group_n[group] = max(group_n.get(group, 0), n)
    rows: dict[tuple[str, str, int], list[tuple[float, float]]] = defaultdict(list)
    descs: dict[str, str | None] = {}
    for key, ranks in per_coll.items():
        sizes = [c.nbytes for c in ranks if c.nbytes]
        t = times.get(key)
        if not sizes or not t:
            continue
        c0 = ranks[0]
        nbytes = float(np.median(sizes))
        rows[(c0.op, c0.group, _size_class(nbytes))].append((nbytes, float(np.median(t))))
        if not descs.get(c0.group):
            descs[c0.group] = next((c.group_desc for c in ranks if c.group_desc), None)
    peak = link_gbps / 8.0 if link_gbps else None
    out = []
    for (op, group, _cls), vals in sorted(
        rows.items(), key=lambda kv: (kv[0][1], kv[0][0], kv[0][2])
    ):
        total_bytes = sum(b for b, _ in vals)
        total_ns = sum(t for _, t in vals)
        algbw = total_bytes / (total_ns / 1e9) / GB
        n = group_n[group]
        factor = bus_factor(op, n)
        # no factor (gather, scatter, a custom op): no bus bandwidth rather than a guess
        busbw = algbw * factor if factor is not None else None
        scope = _scope(group_hosts[group])
        out.append(
            CollectiveBandwidth(
                op=op,
                group=group,
                group_size=n,
                bytes=total_bytes / len(vals),
                count=len(vals),
                time_ms=total_ns / len(vals) / NS,
                algbw_gb_s=algbw,
                busbw_gb_s=busbw,
                scope=scope,
                group_desc=descs.get(group),
                link_fraction=busbw / peak
                if busbw is not None and peak and scope != INTRA
                else None,
            )
        )
    return out


# --- process groups -----------------------------------------------------------------

_ROLES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("fsdp", re.compile(r"fsdp|shard|zero", re.IGNORECASE)),
    ("tensor", re.compile(r"(^|[^a-z])(tp|tensor|mp|model)([^a-z]|$)", re.IGNORECASE)),
    ("pipeline", re.compile(r"(^|[^a-z])(pp|pipe|pipeline|stage)([^a-z]|$)", re.IGNORECASE)),
    ("expert", re.compile(r"(^|[^a-z])(ep|expert|moe)([^a-z]|$)", re.IGNORECASE)),
    ("data_parallel", re.compile(r"(^|[^a-z])(dp|ddp|data|replicate)([^a-z]|$)", re.I)),
)
_OP_ROLES = {
    "all_gather": "fsdp",
    "reduce_scatter": "fsdp",
    "all_reduce": "data_parallel",
    "send": "pipeline",
    "recv": "pipeline",
    "all_to_all": "expert",
}


def group_role(group: str, desc: str | None, ops: list[str]) -> str:
    """What a process group is for: from its description or name, else from its ops.

    By ops: all-gathers and reduce-scatters are sharded data parallelism (FSDP/ZeRO),
    all-reduces data parallelism (DDP), send/recv pipeline stages, all-to-all experts.
    """
    for text in (desc, group):
        # the world group's names say nothing of its use (FSDP(model) shards over it)
        if not text or text in ("default", "default_pg"):
            continue
        for role, pattern in _ROLES:
            if pattern.search(text):
                return role
    for op in ops:
        if base_op(op) in _OP_ROLES:
            return _OP_ROLES[base_op(op)]
    return "other"


def group_size(group: str, sizes: list[int], ranks_seen: int, world: int) -> int:
    """A group's ``n``: as its spans say, else the world for ``default``, else the ranks seen."""
    if sizes:
        return max(sizes)
    return world if group == "default" else ranks_seen


def group_table(instances: list[CommInstance], steps: int, world: int) -> list[GroupComm]:
    """Communication per process group, per rank of the group and step (``steps`` kept)."""
    per: dict[str, list[CommInstance]] = defaultdict(list)
    for c in instances:
        per[c.group].append(c)
    out = []
    for group, mine in per.items():
        ops = sorted({c.op for c in mine})
        desc = next((c.group_desc for c in mine if c.group_desc), None)
        sizes = [c.group_size for c in mine if c.group_size]
        ranks = {c.rank for c in mine}
        under: dict[str, int] = defaultdict(int)
        for c in mine:
            under[c.stage] += c.end - c.start
        denom = max(len(ranks) * steps, 1)
        out.append(
            GroupComm(
                group=group,
                group_desc=desc,
                group_size=group_size(group, sizes, len(ranks), world),
                role=group_role(group, desc, ops),
                ops=ops,
                launched_under=max(under, key=lambda k: under[k]),
                per_step=len(mine) / denom,
                wall_ms=sum(c.end - c.start for c in mine) / denom / NS,
                exposed_ms=sum(c.exposed_ns for c in mine) / denom / NS,
            )
        )
    out.sort(key=lambda g: -g.wall_ms)
    return out
