"""Profile on trigger: ``torch.profiler`` over the next few executions of a stage that got slow.

A rule (``configure(profile_on=...)`` or ``TRACEKIT_PROFILE_ON``) watches one stage:
``{"stage": "model_execute", "above": "p99", "window": "5m"}`` compares each execution
with the stage's own running p99 in this process, ``{"stage": "model_execute",
"above_ms": 40}`` with a fixed threshold. When one ends above it, a **capture** is armed:
the next ``steps`` executions of that stage run under ``torch.profiler``, and the Kineto
file lands in ``TRACEKIT_PROFILE_DIR`` with the trace and span ids of the execution that
fired and of those captured, which carry ``tracekit.profile.id`` on their stage spans.
:func:`profile_next` (and SIGUSR2) arms one capture on demand. docs/profiling.md has the
whole story; what this module owns:

- the rules, parsed once, and one :class:`_Watch` per watched stage, called by
  :mod:`.stages` when such a stage ends (the request path: a ring write and a compare);
- the budget: one per process, a capture per ``max_per_hour`` at most, one at a time;
- the capture's life: armed → prepared on the profiling thread (torch imported, the
  profiler built) → started when the next execution of its stage opens, on that
  request's thread → stopped at the end of the ``steps``-th → written, atomically, by
  the profiling thread (the request never waits on the disk).

The profiler records every thread (``profile_all_threads``): executions on other threads
that begin while it runs count towards ``steps`` too, and those it saw only in part
(already running when it started, or begun after its steps were taken) are listed under
``overlapping``. torch is imported by the profiling thread only when a capture is armed
in a process that has not imported it.

A rule measures only executions that tracekit left alone: it is armed once the profiling
thread has warmed up (built one profiler, a few milliseconds, once torch is imported), and
an execution that began before that, or while a capture was in progress (armed → file
written), is neither a sample nor a trigger. While a capture waits or runs, the slow ones
are named in its metadata (``missed``) instead of being dropped in silence.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import importlib
import importlib.util
import json
import math
import os
import queue
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation._spans import FastSpan
from tracekit.units import parse_duration

# --- environment: each variable declared once ----------------------------------
ENV_PROFILE_ON = "TRACEKIT_PROFILE_ON"
"""JSON: one rule object or a list of them, when ``configure(profile_on=...)`` is not given."""
ENV_PROFILE_DIR = "TRACEKIT_PROFILE_DIR"
"""Where capture files go when ``configure(profile_dir=...)`` is not given."""
ENV_PROFILE_SIGNAL = "TRACEKIT_PROFILE_SIGNAL"
"""``1`` installs the SIGUSR2 handler without a rule; ``0`` keeps it out even with one."""

DEFAULT_DIR = "tracekit-profiles"
"""Capture directory, relative to the working directory at ``configure()``."""
DEFAULT_STEPS = 5
"""Executions captured per trigger."""
DEFAULT_MAX_PER_HOUR = 6
"""Captures a process may start per hour (the on-demand budget when no rule says more)."""
DEFAULT_WINDOW = "5m"
"""Sliding time window of a quantile rule."""
MIN_SAMPLES = 100
"""A quantile rule fires only once its window holds this many executions."""
MAX_STEPS = 100
"""The most executions one capture may cover (a profile grows with every op)."""
RING_SIZE = 2048
"""Recent durations a quantile rule keeps per stage (a power of two)."""
REFRESH_S = 1.0
"""How often the profiling thread recomputes the quantile thresholds."""
RUN_TIMEOUT_S = 60.0
"""A capture still running after this long is stopped and written with what ended."""
ARM_TIMEOUT_S = 600.0
"""An armed capture whose stage has not run for this long is given up."""
MAX_MISSED = 100
"""Slow executions a capture names in ``missed`` (``missed_count`` counts them all)."""

SIGNAL = getattr(signal, "SIGUSR2", None)
"""The signal that arms one on-demand capture (POSIX only)."""

EXAMPLE = '{"stage": "model_execute", "above": "p99", "window": "5m"}'
_FIELDS = ("stage", "above", "above_ms", "window", "max_per_hour", "steps")
_QUANTILE = re.compile(r"p(\d{1,2}(?:\.\d+)?)")
_MASK = RING_SIZE - 1
_NEVER = 1 << 62
_HOUR_NS = 3600 * 10**9
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
_UNESCAPED = re.compile(r'["\\\x00-\x1f\x7f]')
"""What a JSON string must escape: Kineto writes metadata with its backslashes turned
into slashes, so an escaped quote would end the string and break the whole file."""


def kineto_json(value: Any) -> str:
    """``value`` as JSON that survives Kineto's metadata writer: in every string, quotes
    become ``'``, backslashes ``/`` and control characters a space (names and labels
    only; ids, numbers and the rule's fields never hold them)."""

    def clean(v: Any) -> Any:
        if isinstance(v, str):
            return _UNESCAPED.sub(lambda m: _SUBSTITUTE.get(m.group(), " "), v)
        if isinstance(v, dict):
            return {clean(k): clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(value), ensure_ascii=False)


_SUBSTITUTE = {'"': "'", "\\": "/"}
_NAME_CHARS = 64
"""Characters of the service name a file name keeps: a long name must not make the name
longer than a file system allows (255 bytes), which would drop every capture."""

PROFILE_ENTER: dict[str, Callable[[trace.Span], None]] = {}
"""Stage name → the armed capture's hook, run when such a stage opens (by :mod:`.stages`).
Empty unless a capture waits for its steps, so entering a stage costs one truth test."""
PROFILE_EXIT: dict[str, Callable[[trace.Span], None]] = {}
"""Stage name → its :class:`_Watch`, run when such a stage ends (by :mod:`.stages`)."""

# capture states
PREPARING, ARMED, RUNNING, STOPPING, WRITING, DONE, DROPPED = (
    "preparing", "armed", "running", "stopping", "writing", "done", "dropped",
)  # fmt: skip


# --- rules ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """One ``profile_on`` rule: which stage, above what, and its budget."""

    stage: str
    above_ms: float | None
    """A fixed threshold in milliseconds (None for a quantile rule)."""
    quantile: float | None
    """The stage's own quantile, 0..1 (``"p99"`` is 0.99); None for a fixed threshold."""
    window_s: float
    max_per_hour: int
    steps: int

    def describe(self) -> dict[str, Any]:
        """The rule as capture files write it (``trigger.rule``)."""
        out: dict[str, Any] = {"stage": self.stage}
        if self.quantile is not None:
            out["above"] = f"p{self.quantile * 100:g}"
            out["window_s"] = self.window_s
        else:
            out["above_ms"] = self.above_ms
        out["max_per_hour"] = self.max_per_hour
        out["steps"] = self.steps
        return out


def parse_rules(raw: object, source: str = "profile_on") -> tuple[Rule, ...]:
    """Rules from a mapping, a list of mappings or JSON text of either; ConfigError names
    the field that is wrong."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{source}: not JSON ({exc.msg}); write one rule or a list, e.g. {EXAMPLE}"
            ) from exc
    single = isinstance(raw, Mapping)
    items = [raw] if single else raw
    if not isinstance(items, Sequence) or isinstance(items, str | bytes):
        raise ConfigError(f"{source}: expected a rule object or a list of them, e.g. {EXAMPLE}")
    rules: list[Rule] = []
    for i, item in enumerate(items):
        rule = _rule(item, source if single else f"{source}[{i}]")
        if any(r.stage == rule.stage for r in rules):
            raise ConfigError(f"{source}: two rules for stage {rule.stage!r}; give one per stage")
        rules.append(rule)
    return tuple(rules)


def _rule(item: object, where: str) -> Rule:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: a rule is an object like {EXAMPLE}, got {item!r}")
    unknown = sorted(str(k) for k in item if k not in _FIELDS)
    if unknown:
        raise ConfigError(f"{where}: unknown field {unknown[0]!r}; a rule has {', '.join(_FIELDS)}")
    stage = item.get("stage")
    if not isinstance(stage, str) or not stage.strip():
        raise ConfigError(
            f"{where}.stage: expected a stage name like 'model_execute', got {stage!r}"
        )
    if ("above" in item) == ("above_ms" in item):
        raise ConfigError(
            f'{where}: give exactly one of above (the stage\'s quantile, e.g. "p99") '
            "or above_ms (a threshold in milliseconds)"
        )
    quantile = above_ms = None
    window_s = 0.0
    if "above" in item:
        quantile = _quantile(item["above"], f"{where}.above")
        window_s = parse_duration(
            item.get("window", DEFAULT_WINDOW), what=f"{where}.window", allow_zero=False
        )
    else:
        if "window" in item:
            raise ConfigError(f'{where}.window: only a quantile rule (above: "p99") has a window')
        above_ms = _number(item["above_ms"], f"{where}.above_ms")
    return Rule(
        stage=stage.strip(),
        above_ms=above_ms,
        quantile=quantile,
        window_s=window_s,
        max_per_hour=_count(
            item.get("max_per_hour", DEFAULT_MAX_PER_HOUR), f"{where}.max_per_hour"
        ),
        steps=_count(item.get("steps", DEFAULT_STEPS), f"{where}.steps", MAX_STEPS),
    )


def _quantile(value: object, what: str) -> float:
    match = _QUANTILE.fullmatch(value.strip().lower()) if isinstance(value, str) else None
    q = float(match.group(1)) if match else 0.0
    if not 0 < q < 100:
        raise ConfigError(f'{what}: expected a quantile like "p99" or "p99.9", got {value!r}')
    return round(q / 100, 10)  # p99.9 is 0.999, not 0.9990000000000001


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"{what}: expected milliseconds, a number >= 0, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(f"{what}: expected a finite number of milliseconds, got {value!r}")
    return float(value)


def _count(value: object, what: str, most: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what}: expected a whole number >= 1, got {value!r}")
    if most is not None and value > most:
        raise ConfigError(f"{what}: at most {most} (a profile grows with every op), got {value}")
    return value


@dataclass(frozen=True)
class Settings:
    """What ``configure()`` decided: the rules, the directory, whether SIGUSR2 arms."""

    rules: tuple[Rule, ...] = ()
    directory: str = os.path.abspath(DEFAULT_DIR)
    signal: bool = False


def settings(
    profile_on: object = None, profile_dir: str | os.PathLike[str] | None = None
) -> Settings:
    """Arguments beat the environment, which beats the defaults; ConfigError when wrong."""
    source = "profile_on"
    if profile_on is None:
        profile_on = os.environ.get(ENV_PROFILE_ON, "").strip() or None
        source = ENV_PROFILE_ON
    rules = parse_rules(profile_on, source)
    if rules and importlib.util.find_spec("torch") is None:
        raise ConfigError(f"{source}: profiling needs torch; pip install 'tracekit[torch]'")
    if profile_dir is None:
        profile_dir = os.environ.get(ENV_PROFILE_DIR, "").strip() or DEFAULT_DIR
    raw = os.environ.get(ENV_PROFILE_SIGNAL, "").strip().lower()
    if raw not in ("", "0", "1", "true", "false", "yes", "no"):
        raise ConfigError(f"{ENV_PROFILE_SIGNAL}={raw!r}: expected 1 or 0")
    sig = raw in ("1", "true", "yes") or (bool(rules) and raw == "")
    return Settings(rules, os.path.abspath(os.fspath(profile_dir)), sig)


# --- the request path ----------------------------------------------------------------


class _Watch:
    """One watched stage: its rule's running threshold, and the capture it feeds."""

    __slots__ = ("stage", "rule", "threshold_ns", "durations", "ends", "next", "capture", "since")

    def __init__(self, stage: str, since: int) -> None:
        self.stage = stage
        self.since = since
        """Unix ns: an execution that began earlier overlapped tracekit's own work (the
        warm-up, a capture, its file); _NEVER while that work goes on."""
        self.rule: Rule | None = None
        self.threshold_ns = _NEVER
        self.durations: list[int] | None = None
        self.ends: list[int] = []
        self.next = 0
        self.capture: _Capture | None = None

    def set_rule(self, rule: Rule | None) -> None:
        if rule == self.rule:
            return
        self.rule = rule
        self.threshold_ns = _NEVER
        self.durations, self.ends, self.next = None, [], 0
        if rule is not None and rule.above_ms is not None:
            self.threshold_ns = int(rule.above_ms * 1_000_000)
        elif rule is not None:
            self.durations, self.ends = [0] * RING_SIZE, [0] * RING_SIZE

    def exit(self, span: trace.Span) -> None:
        """A stage of this name ended (``span`` has ended): count it, or compare it."""
        try:
            cap = self.capture
            if cap is not None and cap.exit(span, self.stage):
                return  # a captured execution: the profiler slowed it, so it is no sample
            if type(span) is not FastSpan:
                return  # unsampled: a trigger must name a trace that exists
            end = span._end or 0
            duration = end - span._start
            if span._start < self.since:
                # tracekit's own work may have slowed it: not what the rule measures
                if duration > self.threshold_ns:
                    PROFILER.missed(self, span, duration)
                return
            durations = self.durations
            if durations is not None:
                # no lock: two threads racing here lose a sample, which a quantile survives
                i = self.next
                durations[i] = duration
                self.ends[i] = end
                self.next = (i + 1) & _MASK
            if duration > self.threshold_ns:
                PROFILER.fire(self, span, duration)
        except Exception as exc:
            _guard.report("profiling: stage end", exc, self.stage)

    def refresh(self, now_ns: int) -> None:
        """Recompute the threshold from the executions in the window (profiling thread)."""
        rule, durations = self.rule, self.durations
        if rule is None or rule.quantile is None or durations is None:
            return
        since = now_ns - int(rule.window_s * 1e9)
        recent = sorted(
            d for d, e in zip(list(durations), list(self.ends), strict=True) if e >= since
        )
        if len(recent) < MIN_SAMPLES:
            self.threshold_ns = _NEVER
            return
        self.threshold_ns = recent[max(0, math.ceil(rule.quantile * len(recent)) - 1)]


def _entry(span: FastSpan, stage: str) -> dict[str, Any]:
    return {
        "trace_id": f"{span._trace[0]:032x}",
        "span_id": f"{span._span_id:016x}",
        "stage": stage,
        "start_ns": span._start,
        "end_ns": span._end,
    }


class _Capture:
    """One capture, from arming to its file."""

    def __init__(
        self,
        reason: str,
        stages: tuple[str, ...],
        steps: int,
        trigger: dict[str, Any] | None,
        number: int,
        directory: str,
    ) -> None:
        self.id = os.urandom(8).hex()
        self.reason, self.stages, self.steps, self.trigger = reason, stages, steps, trigger
        self.number, self.directory, self.pid = number, directory, os.getpid()
        self.state = PREPARING
        self.prof: Any = None
        self.cuda = False
        self.entered = 0
        self.open: dict[trace.Span, int] = {}  # counted executions still running
        self.captured: list[dict[str, Any]] = []
        self.overlapping: list[dict[str, Any]] = []
        self.missed: list[dict[str, Any]] = []  # slow executions it did not capture
        self.missed_count = 0
        self.start_ns = self.end_ns = 0
        self.since = time.monotonic()  # armed at, then started at: for the timeouts
        self.service = "unknown_service"

    def enter(self, span: trace.Span) -> None:
        """An execution of one of the capture's stages opens (the request path)."""
        lock = PROFILER.lock
        try:
            with lock:
                if self.state == ARMED:
                    if _profiler_running():
                        return  # someone's own session: wait for its end, never take it over
                    self.prof.start()  # this request pays the start, outside its stage span
                    self.state, self.start_ns = RUNNING, time.time_ns()
                    self.since = time.monotonic()
                    if type(span) is FastSpan:
                        span._start = self.start_ns
                elif self.state != RUNNING or self.entered >= self.steps:
                    return
                self.entered += 1
                self.open[span] = self.open.get(span, 0) + 1
                if self.entered >= self.steps:
                    for stage in self.stages:
                        PROFILE_ENTER.pop(stage, None)
            span.set_attribute(cv.PROFILE_ID, self.id)
        except Exception as exc:
            PROFILER.drop(self, "profiling: starting a capture", exc)

    def exit(self, span: trace.Span, stage: str) -> bool:
        """An execution of one of its stages ended: True when the capture counted it."""
        if span not in self.open:
            if self.state == RUNNING and type(span) is FastSpan:
                with PROFILER.lock:
                    if self.state == RUNNING:
                        self.overlapping.append(_entry(span, stage))
            return False
        with PROFILER.lock:
            left = self.open.pop(span, 0)
            if left == 0:
                return False
            if left > 1:
                self.open[span] = left - 1
            if type(span) is FastSpan:
                self.captured.append(_entry(span, stage))
            last = self.state == RUNNING and self.entered >= self.steps and not self.open
            if last:
                self.state = STOPPING
        if last:
            PROFILER.finish(self)
        return True


# --- the process's profiler --------------------------------------------------------


def _no_identity() -> Mapping[str, Any]:
    return {}


class _Profiler:
    """The rules, the budget and the capture in progress; one per process."""

    def __init__(self) -> None:
        self.rules: tuple[Rule, ...] = ()
        self.ceiling = DEFAULT_MAX_PER_HOUR
        self.directory = os.path.abspath(DEFAULT_DIR)
        self.identity: Callable[[], Mapping[str, Any]] = _no_identity
        self.watches: dict[str, _Watch] = {}
        self.warm = False  # the profiler built once: the rules may measure
        self.since = _NEVER  # every watch's since (under the lock)
        self._fresh()

    def _fresh(self) -> None:
        """What a forked child starts without: its own budget, numbering and thread."""
        self.lock = threading.Lock()
        self.jobs: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.started: collections.deque[int] = collections.deque()  # monotonic ns, last hour
        self.blocked_until = 0
        self.files = 0
        self.active: _Capture | None = None
        self.idle = threading.Event()
        self.idle.set()
        self.logged: set[str] = set()
        self.dropped = 0

    # --- configuration ------------------------------------------------------------
    def apply(self, s: Settings, identity: Callable[[], Mapping[str, Any]]) -> None:
        by_stage = {r.stage: r for r in s.rules}
        with self.lock:
            self.rules, self.directory, self.identity = s.rules, s.directory, identity
            self.ceiling = max((r.max_per_hour for r in s.rules), default=DEFAULT_MAX_PER_HOUR)
            self.blocked_until = 0
            for stage in set(self.watches) | set(by_stage):
                watch = self._watch(stage)
                watch.set_rule(by_stage.get(stage))
                self._sync(watch)
            self._measure()  # a new rule learns from executions that begin from now
        if s.rules or s.signal:
            self.ensure_thread()
        if s.rules and not self.warm and "torch" in sys.modules:
            # only once the app has imported torch, lest its import race this one; else the
            # profiling thread looks once a second
            self.jobs.put(("warm", None))
        if s.signal:
            _install_signal()
        else:
            _uninstall_signal()

    def _watch(self, stage: str) -> _Watch:
        watch = self.watches.get(stage)
        if watch is None:
            watch = self.watches[stage] = _Watch(stage, self.since)
        return watch

    def _measure(self) -> None:
        """(Under the lock) The rules measure executions that begin from now, once warm and
        while no capture is in progress; none until then."""
        self.since = time.time_ns() if self.warm and self.active is None else _NEVER
        for watch in self.watches.values():
            watch.since = self.since

    def missed(self, watch: _Watch, span: FastSpan, duration_ns: int) -> None:
        """A slow execution that the capture in progress did not capture: named in its file."""
        cap = self.active
        if cap is None or cap.state not in (PREPARING, ARMED, RUNNING):
            return  # its metadata is written already, or nothing is in progress
        entry = _entry(span, watch.stage)
        entry["duration_ms"] = duration_ns / 1e6
        entry["threshold_ms"] = watch.threshold_ns / 1e6
        with self.lock:
            if cap.state in (PREPARING, ARMED, RUNNING):
                cap.missed_count += 1
                if len(cap.missed) < MAX_MISSED:
                    cap.missed.append(entry)

    def _sync(self, watch: _Watch) -> None:
        """Hook the stage's end while a rule or a capture needs it (under the lock)."""
        if watch.rule is not None or watch.capture is not None:
            PROFILE_EXIT[watch.stage] = watch.exit
        else:
            PROFILE_EXIT.pop(watch.stage, None)

    # --- arming, within the budget ------------------------------------------------
    def fire(self, watch: _Watch, span: FastSpan, duration_ns: int) -> None:
        """A rule's stage ended above its threshold (the request path)."""
        rule = watch.rule
        if self.active is not None:
            self.missed(watch, span, duration_ns)  # armed by another thread meanwhile
            return
        if rule is None or time.monotonic_ns() < self.blocked_until:
            return
        trigger = {
            "trace_id": f"{span._trace[0]:032x}",
            "span_id": f"{span._span_id:016x}",
            "stage": watch.stage,
            "duration_ms": duration_ns / 1e6,
            "rule": rule.describe(),
            "threshold_ms": watch.threshold_ns / 1e6,
        }
        self.arm("rule", (watch.stage,), rule.steps, rule.max_per_hour, trigger)

    def arm(
        self,
        reason: str,
        stages: tuple[str, ...],
        steps: int,
        limit: int,
        trigger: dict[str, Any] | None,
    ) -> bool:
        """Arm one capture if none is in progress and the budget allows; never blocks on I/O."""
        with self.lock:
            if self.active is not None:
                return False
            now = time.monotonic_ns()
            started = self.started
            while started and now - started[0] >= _HOUR_NS:
                started.popleft()
            if len(started) >= limit:
                if len(started) >= self.ceiling:
                    self.blocked_until = started[0] + _HOUR_NS  # the request path stops asking
                return False
            started.append(now)
            self.files += 1
            cap = _Capture(reason, stages, steps, trigger, self.files, self.directory)
            self.active = cap
            self.idle.clear()
            self._measure()  # from now until its file is written, no execution is measured
        self.ensure_thread()
        self.jobs.put(("prepare", cap))
        return True

    # --- the profiling thread ------------------------------------------------------
    def ensure_thread(self) -> None:
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.thread = threading.Thread(target=self._run, name="tracekit-profiler", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        next_refresh = 0.0
        while True:
            try:
                job: tuple[str, Any] | None = self.jobs.get(timeout=REFRESH_S)
            except queue.Empty:
                job = None
            try:
                if job is not None:
                    kind, cap = job
                    if kind == "prepare":
                        self._prepare(cap)
                    elif kind == "write":
                        self._write(cap)
                    elif kind == "signal":
                        self._on_signal()
                    elif kind == "warm":
                        self._warm()
                    elif kind == "inherited":
                        with contextlib.suppress(Exception):
                            cap.stop()  # the parent's session, which the fork handed down
                now = time.monotonic()
                if now >= next_refresh:
                    next_refresh = now + REFRESH_S
                    if self.rules and not self.warm and "torch" in sys.modules:
                        self._warm()  # the app imported torch after configure()
                    self.refresh()
                    self._timeouts(now)
            except Exception as exc:  # the thread must outlive any one job
                self._log_once("thread", "tracekit: profiling thread: %r", exc)

    def refresh(self) -> None:
        """Recompute every quantile rule's threshold now."""
        now = time.time_ns()
        for watch in list(self.watches.values()):
            watch.refresh(now)

    def _warm(self) -> None:
        """Build one profiler, which starts nothing, then let the rules measure (profiling
        thread). A few milliseconds: what the first capture would import (the profiler's
        modules), never torch._inductor (see :func:`_new_profile`)."""
        if self.warm:
            return
        try:
            _new_profile(importlib.import_module("torch"))
        except Exception as exc:  # the capture that needs it will say why
            self._log_once("warm", "tracekit: profiler warm-up: %r", exc)
        with self.lock:
            self.warm = True
            self._measure()

    def _prepare(self, cap: _Capture) -> None:
        try:
            self._warm()
            cap.prof, cap.cuda = _new_profile(importlib.import_module("torch"))
        except Exception as exc:
            self._drop_quietly(cap, "prepare", f"cannot build torch.profiler ({exc!r})")
            return
        with self.lock:
            if cap.state != PREPARING or self.active is not cap:
                return
            cap.state, cap.since = ARMED, time.monotonic()
            for stage in cap.stages:
                watch = self._watch(stage)
                watch.capture = cap
                self._sync(watch)
                PROFILE_ENTER[stage] = cap.enter

    def finish(self, cap: _Capture) -> None:
        """Stop the profiler at the end of the last captured execution (its thread)."""
        try:
            for stage in cap.stages:
                PROFILE_ENTER.pop(stage, None)
            if not _profiler_running():
                # the app's own torch.profiler started over ours and has ended: Kineto keeps
                # no results of ours, and saving the empty ones would crash the process
                self._drop_quietly(cap, "taken", "a torch.profiler session of the app's ended it")
                return
            ident = self.identity()
            cap.service = str(ident.get(cv.SERVICE_NAME) or "unknown_service")
            cap.end_ns = time.time_ns()
            meta = {
                "profile_id": cap.id,
                "service": cap.service,
                "service_version": ident.get(cv.SERVICE_VERSION),
                "instance_id": ident.get(cv.SERVICE_INSTANCE_ID),
                "pid": cap.pid,
                "reason": cap.reason,
                "trigger": cap.trigger,
                "captured": cap.captured,
                "overlapping": cap.overlapping,
                cv.PROFILE_MISSED: cap.missed,
                cv.PROFILE_MISSED_COUNT: cap.missed_count,
                "steps": cap.steps,
                "start_ns": cap.start_ns,
                "end_ns": cap.end_ns,
            }
            # Kineto takes metadata only while it runs: added after stop() it is lost
            cap.prof.add_metadata_json(cv.PROFILE_METADATA_KEY, kineto_json(meta))
            if cap.cuda:
                import torch

                torch.cuda.synchronize()  # CUPTI records only kernels that have finished
            cap.prof.stop()
        except Exception as exc:
            self.drop(cap, "profiling: stopping a capture", exc)
            return
        with self.lock:
            if cap.state != STOPPING:
                return
            cap.state = WRITING
            self._unhook(cap)
        self.jobs.put(("write", cap))

    def _write(self, cap: _Capture) -> None:
        name = (
            f"{cv.PROFILE_FILE_PREFIX}{_SAFE.sub('_', cap.service)[:_NAME_CHARS]}-{cap.pid}-"
            f"{cap.number}-"
            f"{cap.id}.pt.trace.json"
        )
        path = os.path.join(cap.directory, name)
        tmp = os.path.join(cap.directory, f".{name}.tmp")
        try:
            _export(cap.prof, tmp, path)
            cap.state = DONE
        except Exception as exc:
            self.dropped += 1
            cap.state = DROPPED
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            self._log_once(
                "write",
                "tracekit: profile %s not written to %s (%s); the capture is dropped. "
                "Further profiles that cannot be written are dropped without a word.",
                cap.id,
                cap.directory,
                exc,
            )
        finally:
            cap.prof = None  # the profile's events can be large
            self._release(cap)

    def _on_signal(self) -> None:
        stages = tuple(r.stage for r in self.rules) or (cv.MODEL_EXECUTE,)
        if self.arm("on_demand", stages, DEFAULT_STEPS, self.ceiling, None):
            _guard.logger.info(
                "tracekit: SIGUSR2: profiling the next %d executions of %s", DEFAULT_STEPS, stages
            )
        else:
            _guard.logger.warning(
                "tracekit: SIGUSR2: no capture armed (one is in progress, or this hour's "
                "budget of %d is spent)",
                self.ceiling,
            )

    def _timeouts(self, now: float) -> None:
        cap = self.active
        if cap is None:
            return
        if cap.state == ARMED and now - cap.since > ARM_TIMEOUT_S:
            self._drop_quietly(cap, "armed", "its stage did not run")
            return
        with self.lock:
            late = cap.state == RUNNING and now - cap.since > RUN_TIMEOUT_S
            if late:
                cap.state = STOPPING
        if late:
            self.finish(cap)  # profile_all_threads: any thread may stop it

    # --- giving up -----------------------------------------------------------------
    def drop(self, cap: _Capture, where: str, exc: BaseException) -> None:
        """A capture failed on the request path: end it, free the slot, report (raised
        under strict, logged once otherwise)."""
        self._end(cap)
        _guard.report(where, exc)

    def _drop_quietly(self, cap: _Capture, key: str, why: str) -> None:
        self._end(cap)
        self._log_once(key, "tracekit: profile %s dropped: %s", cap.id, why)

    def _end(self, cap: _Capture) -> None:
        with self.lock:
            if cap.state in (DONE, DROPPED):
                return
            started = cap.state in (RUNNING, STOPPING)
            cap.state = DROPPED
            self._unhook(cap)
        if started and cap.prof is not None and _profiler_running():
            with contextlib.suppress(Exception):
                cap.prof.stop()
        cap.prof = None
        self._release(cap)

    def _unhook(self, cap: _Capture) -> None:
        for stage in cap.stages:
            if PROFILE_ENTER.get(stage) == cap.enter:
                del PROFILE_ENTER[stage]
            watch = self.watches.get(stage)
            if watch is not None and watch.capture is cap:
                watch.capture = None
                self._sync(watch)

    def _release(self, cap: _Capture) -> None:
        with self.lock:
            if self.active is cap:
                self.active = None
                self._measure()  # executions that began during the capture or its write are not
                self.idle.set()

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self.logged:
            self.logged.add(key)
            _guard.logger.warning(message, *args)

    # --- process life ----------------------------------------------------------------
    def reset(self) -> None:
        """Forget every rule, capture and budget; a capture in progress is dropped."""
        cap = self.active
        if cap is not None:
            self._end(cap)
        with self.lock:
            self.rules, self.ceiling, self.identity = (), DEFAULT_MAX_PER_HOUR, _no_identity
            for watch in self.watches.values():
                watch.capture = None
            self.watches.clear()
            PROFILE_ENTER.clear()
            PROFILE_EXIT.clear()
            self.started.clear()
            self.blocked_until = self.files = self.dropped = 0
            self.logged.clear()
            self._measure()
        _uninstall_signal()

    def after_fork_in_child(self) -> None:
        cap, running = self.active, self.thread is not None
        self._fresh()
        PROFILE_ENTER.clear()
        for watch in self.watches.values():
            watch.capture = None
            self._sync(watch)
        self._measure()
        if cap is not None and cap.state == RUNNING and not cap.cuda:
            # Not stopped here: a lock of the profiler's may be held by a thread the child
            # lacks. The child's profiling thread ends it, before any capture of its own
            # (a CUDA one cannot be: the device is the parent's).
            self.jobs.put(("inherited", cap.prof))
            running = True
        if running:
            self.ensure_thread()

    def wait(self, timeout_s: float = 5.0) -> bool:
        """Until the capture in progress is written or dropped; False on timeout."""
        return self.idle.wait(timeout_s)

    def _at_exit(self) -> None:
        cap = self.active
        if cap is not None and cap.state == WRITING:
            self.idle.wait(5.0)


PROFILER = _Profiler()
"""The process's profiler."""
atexit.register(PROFILER._at_exit)


def _profiler_running() -> bool:
    """Whether a ``torch.profiler`` / ``torch.autograd.profiler`` session runs in this process."""
    module = sys.modules.get("torch.autograd.profiler")
    return bool(getattr(module, "_is_profiler_enabled", False))


def _inductor_loaded() -> bool:
    """Whether the app has imported ``torch._inductor`` (torch.compile, or anything else)."""
    return "torch._inductor" in sys.modules


def _prepare_trace(self: Any) -> None:
    """``prepare_trace`` of :func:`_profile_type`'s class: torch's own once the app has
    imported torch._inductor; before, the same Kineto session without looking it up.

    torch's reads inductor's CUDA-graph setting, and that look-up imports torch._inductor:
    1–3 s holding the GIL, during which every request thread stalls (a 0.3 ms execution
    took 20–40 ms). A process that has not imported it runs no inductor CUDA graphs, which
    is all the setting is for (it stays False, as torch would find it)."""
    import torch

    if _inductor_loaded():
        torch.profiler.profile.prepare_trace(self)
        return

    self.profiler = torch.autograd.profiler.profile(
        use_cpu=True,
        use_device=self.use_device,
        record_shapes=self.record_shapes,
        with_stack=self.with_stack,
        use_kineto=True,
        experimental_config=self.experimental_config,
    )
    self.profiler._prepare_trace()


_PROFILE_TYPE: list[type] = []


def _profile_type(torch: Any) -> type:
    """``torch.profiler.profile`` whose start never imports torch._inductor."""
    if not _PROFILE_TYPE:
        base = torch.profiler.profile
        _PROFILE_TYPE.append(type("_Profile", (base,), {"prepare_trace": _prepare_trace}))
    return _PROFILE_TYPE[0]


def _new_profile(torch: Any) -> tuple[Any, bool]:
    """A ``torch.profiler.profile`` recording every thread, and whether it records CUDA."""
    from torch.profiler import ProfilerActivity

    profile = _profile_type(torch)
    cuda = bool(torch.cuda.is_available())
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    config = None
    make = getattr(torch.profiler, "_ExperimentalConfig", None)
    # profile_all_threads: without it the profiler records only the thread that started
    # it and must be stopped there; trace_only: stop() builds no Python events
    for options in (
        {"profile_all_threads": True, "trace_only": True},
        {"profile_all_threads": True},
    ):
        try:
            config = make(**options) if make is not None else None
            break
        except TypeError:
            continue
    prof = profile(
        activities=activities, record_shapes=False, with_stack=False, experimental_config=config
    )
    return prof, cuda


def _export(prof: Any, tmp: str, path: str) -> None:
    """Write the trace to ``tmp`` and rename it to ``path``; OSError when it could not be."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    # Kineto reports a file it cannot open on stderr and returns: opening it first makes
    # that failure ours to report
    with open(tmp, "wb"):
        pass
    prof.export_chrome_trace(tmp)
    with open(tmp, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 64))
        tail = fh.read().rstrip()
    if not tail.endswith(b"}"):
        raise OSError(f"the trace was written incompletely ({size} bytes; disk full?)")
    os.replace(tmp, path)


# --- on demand -------------------------------------------------------------------


def profile_next(steps: int = DEFAULT_STEPS, stage: str = cv.MODEL_EXECUTE) -> bool:
    """Profile the next ``steps`` executions of ``stage`` in this process, within the budget.

    Returns True when a capture was armed, False when one is in progress or this hour's
    budget is spent (the largest ``max_per_hour`` of the rules, else 6). The file lands
    in the profile directory (reason ``on_demand``). Safe to expose on a loopback admin
    endpoint; it never blocks and never raises for a valid call.
    """
    _count(steps, "profile_next(): steps", MAX_STEPS)
    if not isinstance(stage, str) or not stage:
        raise ConfigError(f"profile_next(): stage must be a stage name, got {stage!r}")
    try:
        return PROFILER.arm("on_demand", (stage,), steps, PROFILER.ceiling, None)
    except Exception as exc:
        _guard.report("profile_next", exc)
        return False


def capture_state() -> str | None:
    """The state of the capture in progress (``preparing``, ``armed``, ``running``,
    ``stopping``, ``writing``), or None."""
    cap = PROFILER.active
    return cap.state if cap is not None else None


def watch_state() -> str | None:
    """Whether the rules measure executions now: ``warming up`` until the profiling thread
    has warmed up (torch not imported yet, or a few milliseconds after), ``paused`` while a
    capture is in progress (armed → written), else ``watching``; None without rules."""
    if not PROFILER.rules:
        return None
    if not PROFILER.warm:
        return "warming up"
    return "paused" if PROFILER.since == _NEVER else "watching"


def apply(s: Settings, identity: Callable[[], Mapping[str, Any]] = _no_identity) -> None:
    """Put ``configure()``'s settings in force; ``identity`` gives the resource attributes
    (service name, version, instance id) at the time a capture is written."""
    PROFILER.apply(s, identity)


# --- SIGUSR2 -------------------------------------------------------------------------

_previous: Any = None


def _on_signal(signum: int, frame: Any) -> None:
    # a signal handler may interrupt the main thread anywhere, even holding our lock:
    # SimpleQueue.put is reentrant, so the profiling thread does the arming
    PROFILER.jobs.put(("signal", None))
    previous = _previous
    if callable(previous):
        previous(signum, frame)


def _install_signal() -> None:
    global _previous
    if SIGNAL is None or signal.getsignal(SIGNAL) is _on_signal:
        return
    if threading.current_thread() is not threading.main_thread():
        PROFILER._log_once(
            "signal",
            "tracekit: SIGUSR2 not installed: configure() ran outside the main thread; "
            "use tracekit.profile_next() instead",
        )
        return
    _previous = signal.getsignal(SIGNAL)
    signal.signal(SIGNAL, _on_signal)


def _uninstall_signal() -> None:
    global _previous
    if SIGNAL is None or signal.getsignal(SIGNAL) is not _on_signal:
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(SIGNAL, _previous if _previous is not None else signal.SIG_DFL)
        _previous = None


def _after_fork_in_child() -> None:
    try:
        PROFILER.after_fork_in_child()
    except Exception as exc:  # pragma: no cover - never break a fork
        _guard.logger.warning("tracekit: profiling after fork: %r", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
