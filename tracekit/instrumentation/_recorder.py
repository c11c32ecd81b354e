"""The buffer between the request path and span export, and the thread that drains it.

A tracekit span (see :mod:`._spans`) costs the request path a few microseconds: when
it ends it is appended here and nothing else happens. The drainer thread wakes every
:data:`DRAIN_INTERVAL_S` (sooner when the buffer fills up), takes what has ended and
builds each into a real OpenTelemetry SDK span that it hands to the configured
``SpanProcessor``\\ s — so exporters still receive ordinary ``ReadableSpan``\\ s, just
from this thread instead of the request's.

The buffer is bounded (:data:`MAX_BUFFERED`): a request never waits for export, so when
the drainer cannot keep up spans are dropped and counted (one log line, and the total
at shutdown). ``flush()`` and ``shutdown()`` drain synchronously first. A process
forked after ``configure()`` (gunicorn, ``uvicorn --workers``) starts with an empty
buffer and its own drainer: its parent's spans are its parent's to export.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from tracekit.instrumentation import _guard

MAX_BUFFERED = 65_536
"""Ended spans waiting to be built; past this they are dropped and counted."""
DRAIN_INTERVAL_S = 0.05
"""How often the drainer builds what has ended, at most."""
CHUNK = 256
"""Spans built between looks at the exporters' queues."""
MAX_PACE_S = 1.0
"""The longest one drain waits for exporters' queues to make room."""


class Buildable(Protocol):
    """An ended span that knows how to become an SDK span (:class:`._spans.FastSpan`)."""

    def _build(self) -> None: ...


class Recorder:
    """A bounded buffer of ended spans and the daemon thread that builds them."""

    def __init__(self, capacity: int = MAX_BUFFERED, interval_s: float = DRAIN_INTERVAL_S) -> None:
        self.capacity = capacity
        self.interval_s = interval_s
        self.dropped = 0
        self.backlog: Callable[[], float] | None = None
        """How full the exporters' queues are (0..1); set by ``configure()``."""
        self._reset()

    def _reset(self) -> None:
        # deque.append and popleft are atomic: the request path takes no lock. The
        # same deque object always (FastSpan.end appends to it directly).
        if not hasattr(self, "queue"):
            self.queue: collections.deque[Buildable] = collections.deque()
        self.queue.clear()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one builder at a time keeps export order = end order
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._warned = False

    # --- request path -----------------------------------------------------------
    def put(self, span: Buildable) -> None:
        """Hand over an ended span; never blocks, never raises.

        The drainer is not woken: at one look every :data:`DRAIN_INTERVAL_S` the
        buffer holds more than a second of any Python service's spans.
        """
        if len(self.queue) < self.capacity:
            self.queue.append(span)
        else:
            self.drop()

    def drop(self) -> None:
        """Count one span that found the buffer full (the first one is logged)."""
        self.dropped += 1  # racy under threads by design: a count, not a ledger
        if not self._warned:
            self._warned = True
            _guard.logger.warning(
                "tracekit: %d ended spans are waiting to be exported; further spans are "
                "dropped (and counted) until the exporter thread catches up. Requests are "
                "not slowed.",
                self.capacity,
            )

    # --- drainer ----------------------------------------------------------------
    def start(self) -> None:
        """Start the drainer thread if it is not running (idempotent)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            # A wake left set by the last stop() would make the new thread spin.
            self._wake.clear()
            self._thread = threading.Thread(
                target=self._run, name="tracekit-span-builder", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval_s)  # set only to stop
            self.drain()

    def drain(self, max_wait_s: float = MAX_PACE_S) -> int:
        """Build every span ended so far, in end order; returns how many.

        Built spans go into the exporters' batch queues, which are much smaller than
        this buffer; between chunks the drain waits (up to :data:`MAX_PACE_S`) for a
        queue that is more than half full, so a burst — or the drain at shutdown —
        is exported rather than dropped there.
        """
        done = 0
        deadline = 0.0
        with self._lock:
            queue = self.queue
            while queue:
                for _ in range(CHUNK):
                    try:
                        span = queue.popleft()
                    except IndexError:
                        break
                    try:
                        span._build()
                    except Exception as exc:  # one bad span must not stop the others
                        if self._error is None:
                            self._error = exc
                        _guard.logger.debug("tracekit: building a span failed: %r", exc)
                    done += 1
                if queue and self.backlog is not None and self.backlog() > 0.5:
                    deadline = deadline or time.monotonic() + max_wait_s
                    while self.backlog() > 0.25 and time.monotonic() < deadline:
                        time.sleep(0.002)  # lets the exporters' threads run
        return done

    def check(self) -> None:
        """Report the first build failure (raised under strict, as every internal failure is)."""
        error, self._error = self._error, None
        if error is not None:
            _guard.report("span export (building spans)", error)

    def stop(self, max_wait_s: float = MAX_PACE_S) -> None:
        """Drain what is left and stop the thread (``shutdown()``)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._thread = None
        self.drain(max_wait_s)

    @property
    def pending(self) -> int:
        """Spans ended and not yet built."""
        return len(self.queue)

    def _after_fork_in_child(self) -> None:
        running = self._thread is not None
        self._reset()  # the parent's spans and its thread stay the parent's
        self.dropped = 0
        if running:
            self.start()


RECORDER = Recorder()
"""The process's recorder: every tracekit span ends up here."""


def _after_fork() -> None:
    try:
        RECORDER._after_fork_in_child()
    except Exception as exc:  # pragma: no cover - never break a fork
        _guard.logger.warning("tracekit: span recorder after fork: %r", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def stats() -> dict[str, Any]:
    """Buffered and dropped counts, for tests and the benchmark."""
    return {"pending": RECORDER.pending, "dropped": RECORDER.dropped}
