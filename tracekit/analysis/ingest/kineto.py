"""PyTorch profiler (Kineto) traces: one rank file into step spans and GPU figures.

    result = read_kineto(path, gz, origin, version="8gpu", comm_pattern=None)

A rank file maps onto DESIGN.md's "Training steps": each ``ProfilerStep#N`` becomes a
``train_step`` root span (its own trace, ``tracekit.step`` = N), host annotations become
stage spans under it (``enumerate(DataLoader)#…`` → ``data_wait``, ``Optimizer.*`` →
``optimizer``, annotated forward/backward), and each collective a ``communication``
span under the stage during which it was launched, numbered per process group
(``tracekit.comm.seq``) in launch order, as every rank launches them. The rows go into
``spans`` like any other format's, so attribution builds ``requests`` for steps as for
instrumented ones. The GPU time line (:mod:`.kineto_timeline`) of the rank and of each
step goes into the table ``kineto_gpu`` (``sql/kineto.sql``) under the run label.

Rank and world size come from ``distributedInfo``; a file without it is rank 0 of 1
(with a warning). ``ts`` is absolute µs, or µs after ``baseTimeNanoseconds``.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.resources
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.ingest import detect
from tracekit.analysis.ingest import kineto_timeline as tl
from tracekit.analysis.ingest.kineto_events import EventSink, Interval
from tracekit.analysis.ingest.kineto_stream import KinetoFormatError, KinetoStream
from tracekit.analysis.ingest.rows import Origin, Resource, make_row
from tracekit.analysis.store import Store

NO_RANK = "kineto_no_rank"
"""Problem kind: a profile without ``distributedInfo``, read as rank 0 of 1."""

SERVICE = "pytorch"
"""``service.name`` of spans made from profiles (Kineto does not name the job)."""

RANK_STEP = -1
"""``kineto_gpu.step`` of a rank's whole-profile row (HTA's window)."""

_HEAD = re.compile(r'\s*\{\s*"(schemaVersion|traceEvents|deviceProperties|distributedInfo)"')
_ABSOLUTE_NS = 10**17
"""Times past this (1973 in ns since the epoch) are absolute even with a base time."""

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "half": 2, "float16": 2,
    "bfloat16": 2, "double": 8, "float64": 8, "long": 8, "int64": 8, "short": 2,
    "int16": 2, "byte": 1, "char": 1, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)


def is_kineto(path: Path, gz: bool) -> bool:
    """A Chrome-trace JSON object that starts like Kineto's (first key)."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return False
    if gz:
        # A partial decompress: a truncated file is still recognised (and then reported).
        try:
            raw = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, 512)
        except zlib.error:
            return False
    head = raw[:512].decode("utf-8", errors="replace").lstrip("\ufeff")
    return bool(_HEAD.match(head))


@dataclass
class KinetoResult:
    """What one rank file gave: span rows, GPU figure rows, its identity."""

    rows: list[tuple[Any, ...]] = field(default_factory=list)
    figures: list[tuple[int, tl.GpuFigures]] = field(default_factory=list)
    """(step or :data:`RANK_STEP`, figures)."""
    rank: int = 0
    world_size: int = 1
    steps: int = 0
    source: str = ""


def read_kineto(
    path: Path,
    gz: bool,
    origin: Origin,
    *,
    version: str | None,
    comm_pattern: re.Pattern[str] | None,
    earlier: list[KinetoResult] | None = None,
) -> KinetoResult | None:
    """Decode one rank file; problems go to ``origin.log``; None when it was unreadable.

    ``earlier``: the files of this ingest read before; a second file of the same rank
    is skipped (one run label, one profile per rank).
    """
    sink = EventSink(comm_pattern)
    try:
        with detect.open_text(path, gz) as fh:
            stream = KinetoStream(fh)
            for ev in stream.events():
                sink.add(ev)
    except KinetoFormatError as exc:
        origin.log.add(
            origin.display,
            f"{exc.reason} after {exc.events:,} events (character {exc.offset:,}); "
            "file skipped, nothing from it stored",
            "malformed",
            skipped=1,
        )
        return None
    except (OSError, EOFError, zlib.error) as exc:  # a gzip stream cut short or damaged
        origin.log.add(
            origin.display,
            f"cannot decompress ({exc}); truncated? file skipped, nothing from it stored",
            "malformed",
            skipped=1,
        )
        return None
    result = _build(sink, stream.meta, origin, version)
    for other in earlier or []:
        if other.rank == result.rank:
            origin.log.add(
                origin.display,
                f"rank {result.rank} again (first in {other.source}): one profile per rank "
                "per run; ingest other runs separately with their own --version; file skipped",
                "malformed",
                skipped=1,
            )
            return None
    return result


def _build(
    sink: EventSink, meta: dict[str, Any], origin: Origin, version: str | None
) -> KinetoResult:
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        rank = int(dist["rank"])
        world = int(dist.get("world_size") or 1)
    else:
        rank, world = 0, 1
        origin.log.add(origin.display, "no distributedInfo: read as rank 0 of 1", NO_RANK)
    base = meta.get("baseTimeNanoseconds")
    offset = 0
    first = sink.first_ns or 0
    if isinstance(base, int) and first < _ABSOLUTE_NS:
        offset = base
    res = KinetoResult(rank=rank, world_size=world, source=origin.display)
    host_name = meta.get("host_name") if isinstance(meta.get("host_name"), str) else None
    resource_attrs: dict[str, Any] = {
        cv.SERVICE_NAME: SERVICE,
        cv.SERVICE_INSTANCE_ID: f"rank-{rank}",
        cv.RANK: rank,
        cv.WORLD_SIZE: world,
    }
    if version is not None:
        resource_attrs[cv.SERVICE_VERSION] = version
    if host_name:
        resource_attrs[cv.HOST_NAME] = host_name
    resource = Resource.from_attributes(resource_attrs)
    identity = f"kineto|{version}|{rank}|{sink.main_pid}|{first + offset}"
    steps = sorted(sink.steps, key=lambda s: s[1].start)
    res.steps = len(steps)
    builder = _SpanBuilder(origin, resource, identity, offset, steps, rank, world)
    for stage, iv in sorted(sink.stages, key=lambda s: s[1].start):
        builder.stage(stage, iv)
    for c in _collectives(sink, _default_groups(dist)):
        builder.comm(c)
    res.rows = builder.rows
    res.figures = _figures(sink, steps)
    return res


# --- spans --------------------------------------------------------------------------


@dataclass
class _Collective:
    op: str
    launch: int
    end: int
    group: str
    backend: str
    nbytes: int | None
    is_async: bool
    device_ns: int | None = None
    seq: int = 0


def _hex(text: str, nbytes: int) -> str:
    return hashlib.blake2b(text.encode(), digest_size=nbytes).hexdigest()


class _SpanBuilder:
    """Span rows of one rank file: a root per step, stages, collectives under them."""

    def __init__(
        self,
        origin: Origin,
        resource: Resource,
        identity: str,
        offset: int,
        steps: list[tuple[int, Interval]],
        rank: int,
        world: int,
    ) -> None:
        self.origin = origin
        self.resource = resource
        self.offset = offset
        self.rows: list[tuple[Any, ...]] = []
        self.steps = steps
        self.starts = [iv.start for _, iv in steps]
        self.trace_ids = [_hex(f"{identity}|{n}|{iv.start}", 16) for n, iv in steps]
        self.stage_spans: list[list[tuple[int, int, str]]] = [[] for _ in steps]
        """Per step: (start, end, span id) of its stage spans."""
        self.seq = 0
        for i, (n, iv) in enumerate(steps):
            attrs = {cv.STEP: n, cv.RANK: rank, cv.WORLD_SIZE: world}
            self._row(i, _hex(self.trace_ids[i] + "root", 8), None, cv.STEP_SPAN_NAME, iv, attrs)

    def _step_at(self, ts: int) -> int | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        if i >= 0 and ts < self.steps[i][1].end:
            return i
        return None

    def _row(
        self,
        i: int,
        span_id: str,
        parent: str | None,
        name: str,
        iv: Interval,
        attrs: dict[str, Any],
        bounds: tuple[int, int] | None = None,
    ) -> str:
        """Append one span row of step ``i``, clipped to ``bounds`` (default: the step)."""
        self.seq += 1
        lo, hi = bounds or (self.steps[i][1].start, self.steps[i][1].end)
        # A device op outlives the host call that launched it; the span keeps the part
        # inside its parent (the full device time is in tracekit.gpu_time_ns), so the
        # store does not read it as clock skew.
        start = max(iv.start, lo)
        end = min(max(iv.end, start), hi)
        self.rows.append(
            make_row(
                trace_id=self.trace_ids[i],
                span_id=span_id,
                parent=parent,
                name=name,
                kind="INTERNAL",
                start=start + self.offset,
                end=end + self.offset,
                status="UNSET",
                resource=self.resource,
                attrs=attrs,
                links=[],
                origin=self.origin,
                line=0,
                seq=self.seq,
            )
        )
        return span_id

    def _root(self, i: int) -> str:
        return _hex(self.trace_ids[i] + "root", 8)

    def stage(self, stage: str, iv: Interval) -> None:
        i = self._step_at(iv.start)
        if i is None:
            return
        attrs = {cv.STAGE: stage, cv.TIME_KIND: cv.default_time_kind(stage)}
        span_id = _hex(f"{self.trace_ids[i]}|{self.seq}", 8)
        sid = self._row(i, span_id, self._root(i), iv.name, iv, attrs)
        self.stage_spans[i].append((iv.start, iv.end, sid))

    def comm(self, c: _Collective) -> None:
        i = self._step_at(c.launch)
        if i is None:
            return
        # Under the innermost stage running at launch (the latest-starting one around it).
        parent = self._root(i)
        bounds = (self.steps[i][1].start, self.steps[i][1].end)
        best = -1
        for s, e, sid in self.stage_spans[i]:
            if s <= c.launch < e and s > best:
                parent, best, bounds = sid, s, (max(s, bounds[0]), min(e, bounds[1]))
        attrs: dict[str, Any] = {
            cv.STAGE: cv.COMMUNICATION,
            cv.TIME_KIND: cv.default_time_kind(cv.COMMUNICATION),
            cv.COMM_OP: c.op,
            cv.COMM_GROUP: c.group,
            cv.COMM_SEQ: c.seq,
            cv.COMM_BACKEND: c.backend,
            cv.STEP: self.steps[i][0],
        }
        if c.nbytes is not None:
            attrs[cv.COMM_BYTES] = c.nbytes
        if c.is_async:
            attrs[cv.COMM_ASYNC] = True
        if c.device_ns is not None:
            attrs[cv.GPU_TIME_NS] = c.device_ns
        iv = Interval(c.op, c.launch, c.end)
        span_id = _hex(f"{self.trace_ids[i]}|comm|{c.group}|{c.seq}", 8)
        self._row(i, span_id, parent, f"{cv.COMM_SPAN_NAME} {c.op}", iv, attrs, bounds)


# --- collectives --------------------------------------------------------------------


def _default_groups(dist: Any) -> set[str]:
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
        return "default"
    return str(name)


def _enclosing(ops: list[Interval], starts: list[int], ts: int) -> Interval | None:
    """The latest-starting op of ``ops`` (sorted by start) that contains ``ts``."""
    i = bisect.bisect_right(starts, ts) - 1
    while i >= 0 and starts[i] > ts - 10**9:  # collectives' host calls are short
        if ops[i].end >= ts:
            return ops[i]
        i -= 1
    return None


def _collectives(sink: EventSink, defaults: set[str]) -> list[_Collective]:
    """One entry per collective, in launch order, numbered per process group."""
    meta_ops = sorted(
        (o for o in sink.launches if o.name == "record_param_comms"), key=lambda o: o.start
    )
    meta_starts = [o.start for o in meta_ops]
    out: list[_Collective] = []
    if sink.comm_kernels:
        launch = _launch_times(sink)
        for k in sink.comm_kernels:
            start, end = sink.dev_start[k.index], sink.dev_end[k.index]
            at = int(launch[k.index]) if launch[k.index] >= 0 else start
            host = _enclosing(meta_ops, meta_starts, at)
            args = dict(host.args) if host is not None else {}
            args.update({key: v for key, v in k.args.items() if key in _COMM_KEYS})
            m = _KERNEL_OP.search(k.name)
            raw_op = args.get("Collective name") or (m.group(1) if m else k.name.split("(")[0])
            out.append(
                _Collective(
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
                _Collective(
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


# --- GPU time line -------------------------------------------------------------------


def _launch_times(sink: EventSink) -> np.ndarray:
    """Host time of the call that launched each device op (-1 when not in the file)."""
    corr = np.frombuffer(sink.dev_corr, dtype=np.int64)
    out = np.full(corr.size, -1, dtype=np.int64)
    if not len(sink.host_corr):
        return out
    hc = np.frombuffer(sink.host_corr, dtype=np.int64)
    ht = np.frombuffer(sink.host_ts, dtype=np.int64)
    order = np.argsort(hc, kind="stable")
    hc, ht = hc[order], ht[order]
    pos = np.clip(np.searchsorted(hc, corr), 0, hc.size - 1)
    hit = (hc[pos] == corr) & (corr >= 0)
    out[hit] = ht[pos[hit]]
    return out


def _figures(sink: EventSink, steps: list[tuple[int, Interval]]) -> list[tuple[int, tl.GpuFigures]]:
    if not len(sink.dev_start):
        return []
    start = np.frombuffer(sink.dev_start, dtype=np.int64)
    end = np.frombuffer(sink.dev_end, dtype=np.int64)
    stream = np.frombuffer(sink.dev_stream, dtype=np.int64)
    kind = np.frombuffer(sink.dev_kind, dtype=np.int8)
    launch = _launch_times(sink)
    out: list[tuple[int, tl.GpuFigures]] = []
    # HTA's window: with two or more steps, the ops launched before the last step began
    # (the last one is often cut short when the profiler stops); else every op.
    keep = launch >= 0
    if len(steps) >= 2:
        keep &= launch < max(iv.start for _, iv in steps)
    else:
        keep = np.ones(start.size, dtype=bool)
    whole = tl.figures(start[keep], end[keep], stream[keep], kind[keep], launch[keep])
    if whole is not None:
        out.append((RANK_STEP, whole))
    for n, iv in steps:
        sel = (launch >= iv.start) & (launch < iv.end)
        fig = tl.figures(start[sel], end[sel], stream[sel], kind[sel], launch[sel])
        if fig is not None:
            out.append((n, fig))
    return out


# --- the kineto_gpu table ------------------------------------------------------------

_FIGURE_COLUMNS = tuple(tl.GpuFigures.__dataclass_fields__)


def ensure_table(store: Store) -> None:
    """Create ``kineto_gpu`` when missing (``sql/kineto.sql``)."""
    ddl = importlib.resources.files("tracekit.analysis.store").joinpath("sql/kineto.sql")
    store.run(ddl.read_text())


def store_figures(store: Store, results: list[KinetoResult], version: str | None) -> int:
    """Write the GPU figures of ``results`` under run label ``version``; rows written."""
    ensure_table(store)
    label = version or ""
    columns = ("run_label", "rank", "step", "world_size", "source", *_FIGURE_COLUMNS)
    rows = [
        (label, r.rank, step, r.world_size, r.source, *(getattr(f, c) for c in _FIGURE_COLUMNS))
        for r in results
        for step, f in r.figures
    ]
    if not rows:
        return 0
    store.register_rows("_tk_kineto", columns, rows)
    try:
        store.run(
            f"INSERT OR REPLACE INTO kineto_gpu ({', '.join(columns)}) "
            f"SELECT {', '.join(columns)} FROM _tk_kineto"
        )
    finally:
        store.con.unregister("_tk_kineto")
    return len(rows)
