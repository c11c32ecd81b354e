"""Process-wide serving state the instrumentations share.

In-flight request count (written by the FastAPI wrapper), the current request span
(so a batcher can link to it), and the registry of batch queues whose length is the
request span's ``tracekit.queue.depth``. Kept apart so that :mod:`.fastapi` and
:mod:`.batching` need not import each other. A forked worker starts counting from zero:
its parent's requests are not its own.
"""

from __future__ import annotations

import os
import threading
import weakref
from contextvars import ContextVar
from typing import Protocol

from opentelemetry.trace import Span

REQUEST_SPAN: ContextVar[Span | None] = ContextVar("tracekit_request_span", default=None)
"""The SERVER span of the request this task serves (set by the FastAPI hook)."""


class _Queue(Protocol):
    @property
    def pending(self) -> int: ...


class _Inflight:
    """A thread-safe counter of requests being served by this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def enter(self) -> int:
        with self._lock:
            self.value += 1
            return self.value

    def leave(self) -> None:
        with self._lock:
            self.value -= 1

    def _after_fork_in_child(self) -> None:
        # reset in place (others hold this object); a thread of the parent may have held the lock
        self._lock = threading.Lock()
        self.value = 0


INFLIGHT = _Inflight()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=INFLIGHT._after_fork_in_child)

_queues: weakref.WeakSet[_Queue] = weakref.WeakSet()


def register_queue(queue: _Queue) -> None:
    """Count ``queue.pending`` in :func:`queue_depth` for as long as ``queue`` lives."""
    _queues.add(queue)


def queue_depth() -> int:
    """Requests waiting in any batch queue of this process, not yet executing."""
    # list(): the set may shrink under us when a batcher is collected.
    return sum(q.pending for q in list(_queues))
