"""Profiles captured on trigger: Kineto files that a serving process wrote when a stage
got slow (or on demand), stored as profiles, not as training ranks (docs/kineto.md,
"Profiles captured on trigger").

A capture is a normal ``export_chrome_trace`` file with one more top-level key,
``tracekit`` (:data:`~tracekit.conventions.PROFILE_METADATA_KEY`): the capture's id,
the process, why it ran (``rule`` or ``on_demand``), the request whose slow stage
triggered it and the stage executions it captured. :func:`parse_meta` reads that object
(or the JSON text of one); :class:`OpTable` takes the file's events as
:class:`~tracekit.analysis.ingest.kineto_events.EventSink` does and keeps what
``tracekit explain`` shows of a profile, computed once here: CPU ops and device kernels
by self time, and the GPU time line (:mod:`.kineto_timeline`, HTA's definitions).
:func:`store_profiles` writes one row per capture into ``profiles`` (``sql/schema.sql``),
keyed by the capture's id, so re-ingesting a file adds nothing.

:func:`arm_capture` is the other direction: it asks a running service for one capture
(SIGUSR2, which tracekit's capture side handles).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.ingest import kineto_timeline as tl
from tracekit.analysis.ingest.kineto_events import DEVICE_CATS, EventSink
from tracekit.analysis.ingest.kineto_stream import us_to_ns
from tracekit.analysis.store import Store
from tracekit.errors import ConfigError

BAD_METADATA = "kineto_profile_metadata"
"""Problem kind (a warning): a ``tracekit`` metadata object that cannot be read; the file
is then read as a plain profile (a training rank)."""

REASONS = ("rule", "on_demand")
"""Why a capture ran: a ``profile_on`` rule fired, or someone asked (``tracekit profile``)."""

TOP = 10
"""Ops and kernels kept per profile, by self time."""

PROFILE_DIR_ENV = "TRACEKIT_PROFILE_DIR"
"""The capture side's environment variable for where it writes its files."""
DEFAULT_DIR = "tracekit-profiles"
"""Where the capture side writes files when :data:`PROFILE_DIR_ENV` is not set (relative to
the service's working directory)."""

ARM_SIGNAL = signal.SIGUSR2 if hasattr(signal, "SIGUSR2") else None
"""The signal that arms one on-demand capture in a service (POSIX only)."""

_TRACE_ID = re.compile(r"[0-9a-f]{32}")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_ABSOLUTE_NS = 10**17
"""As in :mod:`.kineto`: times past this are absolute even with a base time."""


# --- the metadata ---------------------------------------------------------------------


@dataclass(frozen=True)
class Captured:
    """One stage execution that ran under the capture."""

    trace_id: str
    span_id: str
    stage: str | None
    start_ns: int | None
    end_ns: int | None


@dataclass(frozen=True)
class Trigger:
    """The stage execution whose duration fired the rule."""

    trace_id: str
    span_id: str
    stage: str | None
    duration_ms: float | None
    rule: str | None


@dataclass(frozen=True)
class ProfileMeta:
    """The ``tracekit`` object of a capture file."""

    profile_id: str
    service: str | None
    service_version: str | None
    instance_id: str | None
    pid: int | None
    reason: str
    trigger: Trigger | None
    captured: tuple[Captured, ...]
    overlapping: tuple[Captured, ...] = ()
    """Executions the profiler saw only in part (already running when it started, or
    begun after the captured ones were taken)."""


class _Bad(ValueError):
    """What is wrong with a metadata object, in a few words."""


def parse_meta(raw: Any) -> ProfileMeta | str:
    """The metadata of a capture (an object, or JSON text holding one); a one-line
    reason when it cannot be read."""
    try:
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except (json.JSONDecodeError, RecursionError):
                raise _Bad("not a JSON object") from None
        if not isinstance(raw, dict):
            raise _Bad("not a JSON object")
        profile_id = _hex(raw.get("profile_id"), _SPAN_ID, "profile_id (16 hex digits)")
        reason = raw.get("reason")
        if reason not in REASONS:
            raise _Bad(f"reason {reason!r} is neither 'rule' nor 'on_demand'")
        trigger = raw.get("trigger")
        if trigger is not None and not isinstance(trigger, dict):
            raise _Bad("trigger is neither an object nor null")
        captured, overlapping = raw.get("captured", []), raw.get("overlapping", [])
        for key, value in (("captured", captured), ("overlapping", overlapping)):
            if not isinstance(value, list) or not all(isinstance(c, dict) for c in value):
                raise _Bad(f"{key} is not a list of objects")
        return ProfileMeta(
            profile_id=profile_id,
            service=_text(raw, "service"),
            service_version=_text(raw, "service_version"),
            instance_id=_text(raw, "instance_id"),
            pid=_int(raw, "pid"),
            reason=str(reason),
            trigger=None if trigger is None else _trigger(trigger),
            captured=tuple(_captured(c, "captured") for c in captured),
            overlapping=tuple(_captured(c, "overlapping") for c in overlapping),
        )
    except _Bad as exc:
        return str(exc)


def _trigger(raw: dict[str, Any]) -> Trigger:
    rule = raw.get("rule")
    return Trigger(
        trace_id=_hex(raw.get("trace_id"), _TRACE_ID, "trigger.trace_id (32 hex digits)"),
        span_id=_hex(raw.get("span_id"), _SPAN_ID, "trigger.span_id (16 hex digits)"),
        stage=_text(raw, "stage", "trigger."),
        duration_ms=_number(raw.get("duration_ms"), "trigger.duration_ms"),
        rule=rule if rule is None or isinstance(rule, str) else json.dumps(rule, sort_keys=True),
    )


def _captured(raw: dict[str, Any], key: str) -> Captured:
    return Captured(
        trace_id=_hex(raw.get("trace_id"), _TRACE_ID, f"{key}[].trace_id (32 hex digits)"),
        span_id=_hex(raw.get("span_id"), _SPAN_ID, f"{key}[].span_id (16 hex digits)"),
        stage=_text(raw, "stage", f"{key}[]."),
        start_ns=_int(raw, "start_ns", f"{key}[]."),
        end_ns=_int(raw, "end_ns", f"{key}[]."),
    )


def _number(value: Any, what: str) -> float | None:
    """A JSON number; the file's reader keeps fractions as their decimal text."""
    if value is None:
        return None
    if not isinstance(value, bool) and isinstance(value, int | float | str):
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if math.isfinite(number):
            return number
    raise _Bad(f"{what} is not a number")


def _hex(value: Any, pattern: re.Pattern[str], what: str) -> str:
    if isinstance(value, str) and pattern.fullmatch(value.lower()):
        return value.lower()
    raise _Bad(f"{what} missing or not hex: {value!r}"[:160])


def _text(raw: dict[str, Any], key: str, where: str = "") -> str | None:
    value = raw.get(key)
    if value is None or isinstance(value, str):
        return value
    raise _Bad(f"{where}{key} is not a string")


def _int(raw: dict[str, Any], key: str, where: str = "") -> int | None:
    value = raw.get(key)
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise _Bad(f"{where}{key} is not a whole number")


# --- what the profile shows -----------------------------------------------------------


@dataclass(frozen=True)
class OpStat:
    """One op or kernel name: how often it ran and for how long."""

    name: str
    calls: int
    self_ns: int
    """Time in the op itself, not in the ops it called (a kernel's whole duration)."""
    total_ns: int
    """Time from each call's start to its end, summed."""


class OpTable:
    """The CPU ops (``cpu_op``, per thread) and device ops of one capture file."""

    def __init__(self) -> None:
        self._cpu: dict[tuple[Any, Any], list[tuple[int, int, str]]] = {}
        self._kernels: dict[str, list[int]] = {}
        self.first: int | None = None
        self.last: int | None = None

    def add(self, ev: Any) -> None:
        if type(ev) is not dict or ev.get("ph") != "X":
            return
        cat = ev.get("cat")
        if cat != "cpu_op" and cat not in DEVICE_CATS:
            return
        start, dur = us_to_ns(ev.get("ts")), us_to_ns(ev.get("dur", 0))
        name = ev.get("name")
        if start is None or dur is None or not isinstance(name, str):
            return
        end = start + max(dur, 0)
        self.first = start if self.first is None else min(self.first, start)
        self.last = end if self.last is None else max(self.last, end)
        if cat == "cpu_op":
            key = (_scalar(ev.get("pid")), _scalar(ev.get("tid")))
            self._cpu.setdefault(key, []).append((start, end, name))
        else:
            tally = self._kernels.setdefault(name, [0, 0])
            tally[0] += 1
            tally[1] += end - start

    def cpu_ops(self) -> list[OpStat]:
        """Every CPU op name, most self time first. Self time is an op's duration less
        that of the ops nested in it on its thread (clipped to it)."""
        calls: dict[str, list[int]] = {}
        for ops in self._cpu.values():
            stack: list[list[Any]] = []  # [end, name, duration, children's time]
            for start, end, name in sorted(ops, key=lambda o: (o[0], -o[1])):
                while stack and stack[-1][0] <= start:
                    _close(stack.pop(), calls)
                if stack:
                    stack[-1][3] += min(end, stack[-1][0]) - start
                stack.append([end, name, end - start, 0])
            while stack:
                _close(stack.pop(), calls)
        return _ranked(calls)

    def kernels(self) -> list[OpStat]:
        """Every device op name (kernels, memcpy, memset), most time first."""
        return _ranked({name: [c, ns, ns] for name, (c, ns) in self._kernels.items()})


def _close(frame: list[Any], calls: dict[str, list[int]]) -> None:
    end, name, duration, children = frame
    tally = calls.setdefault(name, [0, 0, 0])
    tally[0] += 1
    tally[1] += max(duration - children, 0)
    tally[2] += duration


def _ranked(calls: dict[str, list[int]]) -> list[OpStat]:
    stats = [OpStat(name, c, s, t) for name, (c, s, t) in calls.items()]
    return sorted(stats, key=lambda o: (-o.self_ns, o.name))


def _scalar(value: Any) -> Any:
    return value if isinstance(value, int | float | str) else None


@dataclass
class TriggerProfile:
    """One capture, as its ``profiles`` row holds it (times in ns)."""

    meta: ProfileMeta
    source: str
    service_version: str | None
    start_ns: int | None
    wall_ns: int
    cpu_self_ns: int
    kernel_ns: int
    top_ops: list[OpStat] = field(default_factory=list)
    top_kernels: list[OpStat] = field(default_factory=list)
    gpu: dict[str, int] | None = None
    """The capture's GPU time line (:class:`~.kineto_timeline.GpuFigures` fields)."""


def build(
    meta: ProfileMeta,
    sink: EventSink,
    ops: OpTable,
    file_meta: dict[str, Any],
    source: str,
    version: str | None,
) -> TriggerProfile:
    """The row of one capture from its file's events (``version``: ``--version``, for a
    capture whose metadata names no ``service_version``)."""
    cpu = ops.cpu_ops()
    kernels = ops.kernels()
    base = file_meta.get("baseTimeNanoseconds")
    start = ops.first
    if start is not None and isinstance(base, int) and start < _ABSOLUTE_NS:
        start += base
    return TriggerProfile(
        meta=meta,
        source=source,
        service_version=meta.service_version or version,
        start_ns=start,
        wall_ns=(ops.last or 0) - (ops.first or 0),
        cpu_self_ns=sum(o.self_ns for o in cpu),
        kernel_ns=sum(o.self_ns for o in kernels),
        top_ops=cpu[:TOP],
        top_kernels=kernels[:TOP],
        gpu=_gpu(sink),
    )


def _gpu(sink: EventSink) -> dict[str, int] | None:
    """HTA's figures over every device op of the capture (it has no steps)."""
    if not len(sink.dev_start):
        return None
    figures = tl.figures(
        np.frombuffer(sink.dev_start, dtype=np.int64),
        np.frombuffer(sink.dev_end, dtype=np.int64),
        np.frombuffer(sink.dev_stream, dtype=np.int64),
        np.frombuffer(sink.dev_kind, dtype=np.int8),
        sink.launch_times(),
    )
    return None if figures is None else figures.as_row()


# --- the profiles table ---------------------------------------------------------------

_COLUMNS = (
    "profile_id",
    "source",
    "service",
    "service_version",
    "instance_id",
    "pid",
    "reason",
    "trigger_trace_id",
    "trigger_span_id",
    "stage",
    "trigger_duration_ms",
    "trigger_rule",
    "trace_ids",
    "captured",
    "overlapping",
    "start_ns",
    "wall_ns",
    "cpu_self_ns",
    "kernel_ns",
    "top_ops",
    "top_kernels",
    "gpu",
)
_INSERT = (
    f"INSERT OR IGNORE INTO profiles ({', '.join(_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in _COLUMNS)})"
)


def store_profiles(store: Store, profiles: list[TriggerProfile]) -> int:
    """Write ``profiles`` into ``profiles``; a capture already there is kept as it was.
    Returns how many were new."""
    if not profiles:
        return 0
    (before,) = store.run("SELECT count(*) FROM profiles")[0]
    store.con.executemany(_INSERT, [_row(p) for p in profiles])
    (after,) = store.run("SELECT count(*) FROM profiles")[0]
    return int(after) - int(before)


def _row(p: TriggerProfile) -> list[Any]:
    m = p.meta
    t = m.trigger
    stage = t.stage if t is not None and t.stage else next((c.stage for c in m.captured), None)
    runs = (*m.captured, *m.overlapping)
    traces = list(dict.fromkeys([*([t.trace_id] if t else []), *(c.trace_id for c in runs)]))
    return [
        m.profile_id,
        p.source,
        m.service,
        p.service_version,
        m.instance_id,
        m.pid,
        m.reason,
        t.trace_id if t else None,
        t.span_id if t else None,
        stage,
        t.duration_ms if t else None,
        t.rule if t else None,
        traces,
        json.dumps([c.__dict__ for c in m.captured]),
        json.dumps([c.__dict__ for c in m.overlapping]),
        p.start_ns,
        p.wall_ns,
        p.cpu_self_ns,
        p.kernel_ns,
        json.dumps([o.__dict__ for o in p.top_ops]),
        json.dumps([o.__dict__ for o in p.top_kernels]),
        None if p.gpu is None else json.dumps(p.gpu),
    ]


# --- arming a capture -----------------------------------------------------------------


@dataclass(frozen=True)
class Armed:
    """One on-demand capture asked of a running service."""

    pid: int
    steps: int | None
    """What the caller asked for; a signal carries no number, so the service captures
    its own on-demand default."""
    directory: str
    """Where the files will appear, as far as can be told from outside the process."""

    def lines(self) -> list[str]:
        """What to tell the caller: armed, where to look, what ``steps`` did."""
        lines = [
            f"armed one on-demand capture in process {self.pid}: its next executions of the "
            "profiled stage run under torch.profiler",
            f"look in {self.directory} for {cv.PROFILE_FILE_PREFIX}<service>-{self.pid}-<n>-"
            "<profile_id>.pt.trace.json, then `tracekit ingest` it",
        ]
        if self.steps is not None:
            lines.append(
                f"note: --steps {self.steps} is advisory: a signal carries no number, so the "
                "service captures its on-demand default (in code, profile_next(steps=N) "
                "takes one); it arms none while a capture runs or the hour's budget is spent"
            )
        return lines


def arm_capture(pid: int, steps: int | None = None) -> Armed:
    """Send the arming signal to ``pid``, a process of this user that handles it.

    Raises :class:`~tracekit.errors.ConfigError` (one line) when there is no such
    process, it is another user's, it does not handle the signal (the signal's default
    action would end it), or the platform has no such signal.
    """
    if ARM_SIGNAL is None:
        raise ConfigError("tracekit profile needs POSIX signals (SIGUSR2); this platform has none")
    if pid <= 0 or pid == os.getpid():
        raise ConfigError(f"--pid {pid}: give the process id of the running service")
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps {steps}: give a whole number of executions, 1 or more")
    proc = Path(f"/proc/{pid}")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise ConfigError(
            f"no process {pid}: check the service's pid (e.g. `pgrep -f uvicorn`)"
        ) from None
    except PermissionError:
        raise ConfigError(
            f"process {pid} belongs to another user: run tracekit profile as that user"
        ) from None
    if proc.is_dir():
        if proc.stat().st_uid != os.getuid():
            raise ConfigError(
                f"process {pid} belongs to another user: run tracekit profile as that user"
            )
        if not _handles(proc, ARM_SIGNAL):
            raise ConfigError(
                f"process {pid} does not handle SIGUSR2, so the signal would end it: set up "
                "profiling in the service first (a profile_on rule, or TRACEKIT_PROFILE_SIGNAL=1)"
            )
    try:
        os.kill(pid, ARM_SIGNAL)
    except ProcessLookupError:
        raise ConfigError(f"process {pid} ended before the signal reached it") from None
    return Armed(pid=pid, steps=steps, directory=_profile_dir(proc))


def _handles(proc: Path, sig: int) -> bool:
    """Whether the process catches ``sig`` (Linux: ``SigCgt`` in /proc/PID/status);
    True when that cannot be read."""
    try:
        for line in (proc / "status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        return True
    return True


def _profile_dir(proc: Path) -> str:
    """The service's profile directory as its environment and working directory tell it
    (Linux), else the default relative to wherever the service runs. A directory the
    service set in code is not visible from outside."""
    where = f"the service's profile directory ({PROFILE_DIR_ENV}, default ./{DEFAULT_DIR})"
    if not sys.platform.startswith("linux"):
        return where
    try:
        env = (proc / "environ").read_bytes().split(b"\0")
        cwd = os.readlink(proc / "cwd")
    except OSError:
        return where
    for item in env:
        key, _, value = item.partition(b"=")
        if key == PROFILE_DIR_ENV.encode() and value.strip():
            return str(Path(cwd, os.fsdecode(value.strip())))
    return f"{Path(cwd, DEFAULT_DIR)} (unless the service sets another directory in code)"
