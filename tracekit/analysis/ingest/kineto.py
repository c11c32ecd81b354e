"""PyTorch profiler (Kineto) traces: one rank file into step spans and GPU figures.

    result = read_kineto(path, gz, origin, version="8gpu", comm_pattern=None)

A rank file maps onto docs/design.md's "Training steps": each ``ProfilerStep#N`` becomes a
``train_step`` root span (its own trace, ``tracekit.step`` = N); a profile without them
(no ``torch.profiler.schedule``) has as windows its top-level ``record_function``
blocks, else the whole trace, numbered 0, 1, … (``tracekit.step.window`` names the
window; :func:`_windows`). Host annotations become
stage spans under it (``enumerate(DataLoader)#…`` → ``data_wait``, ``Optimizer.*`` →
``optimizer``, annotated forward/backward), and each collective a ``communication``
span under the stage during which it was launched, numbered per process group
(``tracekit.comm.seq``) in launch order, as every rank launches them. The rows go into
``spans`` like any other format's, so attribution builds ``requests`` for steps as for
instrumented ones. The GPU time line (:mod:`.kineto_timeline`) of the rank and of each
step goes into the table ``kineto_gpu`` (``sql/kineto.sql``) under the run label.

Rank and world size come from ``distributedInfo``; a file without it is rank 0 of 1
(with a warning). ``ts`` is absolute µs, or µs after ``baseTimeNanoseconds``.

A file with tracekit's metadata (the top-level ``tracekit`` key, a capture a serving
process wrote on trigger) is no rank: it makes no spans and no ``kineto_gpu`` rows but
one row of ``profiles`` (:mod:`.kineto_profiles`), and any number of them from one
process load.
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
from tracekit.analysis.ingest import kineto_comm as comm
from tracekit.analysis.ingest import kineto_profiles as tp
from tracekit.analysis.ingest import kineto_timeline as tl
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.kineto_events import EventSink, Extent, Interval
from tracekit.analysis.ingest.kineto_stream import KinetoFormatError, KinetoStream
from tracekit.analysis.ingest.rows import Origin, Resource, make_row
from tracekit.analysis.store import Store

NO_RANK = "kineto_no_rank"
"""Problem kind: a profile without ``distributedInfo``, read as rank 0 of 1."""

SERVICE = "pytorch"
"""``service.name`` of spans made from profiles (Kineto does not name the job)."""

RANK_STEP = -1
"""``kineto_gpu.step`` of a rank's whole-profile row (HTA's window)."""

STEP_WINDOW = "tracekit.step.window"
"""Step span of a profile without ``ProfilerStep``: what its window is, the top-level
``record_function`` block's name or :data:`WHOLE_TRACE`."""

WHOLE_TRACE = "whole trace"
""":data:`STEP_WINDOW` of the one step of a profile with no step and no annotation."""

_HEAD = re.compile(r'\s*\{\s*"(schemaVersion|traceEvents|deviceProperties|distributedInfo)"')
_ABSOLUTE_NS = 10**17
"""Times past this (1973 in ns since the epoch) are absolute even with a base time."""


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
    profile: tp.TriggerProfile | None = None
    """A capture on trigger (then no rows, no figures): what its ``profiles`` row holds."""


def read_kineto(
    path: Path,
    gz: bool,
    origin: Origin,
    *,
    version: str | None,
    comm_pattern: re.Pattern[str] | None,
    earlier: list[KinetoResult] | None = None,
) -> KinetoResult | None:
    """Decode one rank file (or capture); problems go to ``origin.log``; None when it was
    unreadable.

    ``earlier``: the files of this ingest read before; a second file of the same rank
    is skipped (one run label, one profile per rank), as is a second copy of a capture.
    """
    sink = EventSink(comm_pattern)
    extent: tuple[int, int] | None = None
    ops: tp.OpTable | None = None
    try:
        with detect.open_text(path, gz) as fh:
            stream = KinetoStream(fh)
            for ev in stream.events():
                # Kineto writes its metadata before the events: a capture is known by then.
                if stream.count == 1 and cv.PROFILE_METADATA_KEY in stream.meta:
                    ops = tp.OpTable()
                sink.add(ev)
                if ops is not None:
                    ops.add(ev)
        meta = _capture_meta(stream.meta, origin)
        if meta is not None and ops is None:  # the key came after the events
            ops = tp.OpTable()
            with detect.open_text(path, gz) as fh:
                for ev in KinetoStream(fh).events():
                    ops.add(ev)
        if meta is None and not sink.steps and not sink.top_level_annotations():
            # The whole trace is the window: a second pass finds its ends, so that the
            # first (every file's) converts no time it does not keep.
            ends = Extent()
            with detect.open_text(path, gz) as fh:
                for ev in KinetoStream(fh).events():
                    ends.add(ev)
            extent = ends.bounds()
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
    if meta is not None and ops is not None:
        profile = tp.build(meta, sink, ops, stream.meta, origin.display, version)
        result = KinetoResult(source=origin.display, profile=profile)
    else:
        result = _build(sink, stream.meta, origin, version, extent)
    return None if rank_again(result, earlier or [], origin) else result


def _capture_meta(meta: dict[str, Any], origin: Origin) -> tp.ProfileMeta | None:
    """The file's tracekit metadata, when it is a capture; a malformed one is a warning
    and the file a plain profile."""
    if cv.PROFILE_METADATA_KEY not in meta:
        return None
    parsed = tp.parse_meta(meta[cv.PROFILE_METADATA_KEY])
    if isinstance(parsed, str):
        origin.log.add(
            origin.display,
            f"tracekit metadata unreadable ({parsed}); read as a plain profile, not a capture",
            tp.BAD_METADATA,
        )
        return None
    return parsed


def rank_again(result: KinetoResult, earlier: list[KinetoResult], origin: Origin) -> bool:
    """One profile per rank per run: whether ``result``'s rank was in a file before
    (then logged, and the file skipped); for a capture, whether the same capture was.
    The parallel ingest applies it in the parent."""
    if result.profile is not None:
        pid = result.profile.meta.profile_id
        for other in earlier:
            if other.profile is not None and other.profile.meta.profile_id == pid:
                origin.log.add(
                    origin.display,
                    f"profile {pid} again (first in {other.source}); kept the first",
                    pk.DUPLICATE,
                )
                return True
        return False
    for other in earlier:
        if other.profile is None and other.rank == result.rank:
            origin.log.add(
                origin.display,
                f"rank {result.rank} again (first in {other.source}): one profile per rank "
                "per run; ingest other runs separately with their own --version; file skipped",
                "malformed",
                skipped=1,
            )
            return True
    return False


def _build(
    sink: EventSink,
    meta: dict[str, Any],
    origin: Origin,
    version: str | None,
    extent: tuple[int, int] | None,
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
    profiled = sorted(sink.steps, key=lambda s: s[1].start)
    steps = profiled or _windows(sink, extent)
    res.steps = len(steps)
    builder = _SpanBuilder(
        origin, resource, identity, offset, steps, rank, world, windows=not profiled
    )
    for stage, iv in sorted(sink.stages, key=lambda s: s[1].start):
        builder.stage(stage, iv)
    for c in comm.collectives(sink, comm.ProcessGroups.from_dist(dist, world)):
        builder.collective(c)
    res.rows = builder.rows
    res.figures = _figures(sink, steps, profiler_steps=len(profiled))
    return res


def _windows(sink: EventSink, extent: tuple[int, int] | None) -> list[tuple[int, Interval]]:
    """Step windows of a profile without ``ProfilerStep``, numbered from 0 by start:
    each top-level ``record_function`` block of the main process, else the whole trace
    (first event start to last end, host or device)."""
    blocks = sink.top_level_annotations()
    if blocks:
        return [(n, Interval(iv.name, iv.start, iv.end)) for n, iv in enumerate(blocks)]
    return [] if extent is None else [(0, Interval(WHOLE_TRACE, *extent))]


# --- spans --------------------------------------------------------------------------


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
        *,
        windows: bool = False,
    ) -> None:
        """``windows``: the steps are :func:`_windows` (their name is the window)."""
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
            attrs: dict[str, Any] = {cv.STEP: n, cv.RANK: rank, cv.WORLD_SIZE: world}
            if windows:
                attrs[STEP_WINDOW] = iv.name
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

    def collective(self, c: comm.Collective) -> None:
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
        if c.group_size is not None:
            attrs[cv.COMM_GROUP_SIZE] = c.group_size
        if c.group_desc is not None:
            attrs[cv.COMM_GROUP_DESC] = c.group_desc
        if c.is_async:
            attrs[cv.COMM_ASYNC] = True
        if c.device_ns is not None:
            attrs[cv.GPU_TIME_NS] = c.device_ns
        iv = Interval(c.op, c.launch, c.end)
        span_id = _hex(f"{self.trace_ids[i]}|comm|{c.group}|{c.seq}", 8)
        self._row(i, span_id, parent, f"{cv.COMM_SPAN_NAME} {c.op}", iv, attrs, bounds)


# --- GPU time line -------------------------------------------------------------------


def _figures(
    sink: EventSink, steps: list[tuple[int, Interval]], *, profiler_steps: int
) -> list[tuple[int, tl.GpuFigures]]:
    if not len(sink.dev_start):
        return []
    start = np.frombuffer(sink.dev_start, dtype=np.int64)
    end = np.frombuffer(sink.dev_end, dtype=np.int64)
    stream = np.frombuffer(sink.dev_stream, dtype=np.int64)
    kind = np.frombuffer(sink.dev_kind, dtype=np.int8)
    launch = sink.launch_times()
    out: list[tuple[int, tl.GpuFigures]] = []
    # HTA's window: with two or more ProfilerSteps, the ops launched before the last
    # one began (it is often cut short when the profiler stops); else every op (HTA
    # knows no other windows).
    keep = launch >= 0
    if profiler_steps >= 2:
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


def store_figures(
    store: Store,
    results: list[KinetoResult],
    version: str | None,
    report: pk.IngestReport | None = None,
) -> int:
    """Write the GPU figures of ``results`` under run label ``version``, and the captures
    among them into ``profiles`` (counted in ``report``); figure rows written."""
    captures = [r.profile for r in results if r.profile is not None]
    stored = tp.store_profiles(store, captures)
    if report is not None:
        report.profiles += len(captures)
        report.profiles_stored += stored
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
