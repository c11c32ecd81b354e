"""Decoding in worker processes, so that it runs beside the writer and not under its GIL.

Decoding a request is Python work on every attribute (about 10 µs a span); the writer's
batches are Python and DuckDB work that releases the GIL between statements. In one
process the two take turns on one lock, and the writer, waiting to get it back after each
statement, slows to a crawl (measured: a 23,000-span batch took 2.6 s beside four
decoding threads, 0.8 s alone). So request bodies go to ``workers`` child processes
(``python -m tracekit.collect.pool``, see :mod:`.child`) and come back as one OTLP JSON
line each, with the counts and reasons.

One pool serves every :class:`~tracekit.collect.server.Collector` of the process and
lives until it exits. A worker that dies (killed, out of memory) takes only the request
in hand with it (a retryable refusal); it is replaced for the next one.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
from typing import IO, Any

from tracekit.collect import decode
from tracekit.collect.child import Child, child_main, read_frame, write_frame


class PoolBroken(Exception):  # noqa: N818 - a signal to the receiver, not a failure
    """A decoding worker died with the request: answer 503, the client retries."""


def default_workers() -> int:
    """One per core but one (the store writer's), at most four."""
    return max(1, min(4, (os.cpu_count() or 2) - 1))


_EMPTY = object()
"""An idle slot without a worker (its worker died; a new one starts on next use)."""


class DecodePool:
    """``workers`` worker processes running :func:`tracekit.collect.decode.decode_request`."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._idle: queue.Queue[Child | object | None] = queue.Queue()
        self._all: list[Child] = []
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    def warm(self) -> None:
        """Start the workers now (a first request would otherwise wait for them)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            for _ in range(self.workers):
                self._idle.put(self._spawn())

    def _spawn(self) -> Child:
        worker = Child("tracekit.collect.pool")
        self._all.append(worker)
        return worker

    def decode(
        self,
        body: bytes,
        content_type: str | None,
        encoding: str | None,
        limits: decode.Limits,
        *,
        keep_doc: bool = False,
    ) -> decode.Decoded:
        """Decode in a worker; :class:`decode.BadBody` and :class:`PoolBroken` propagate."""
        self.warm()
        worker = self._idle.get()
        if worker is None:  # closed
            self._idle.put(None)
            raise PoolBroken("the collector is stopping")
        if worker is _EMPTY:  # a slot whose worker died and could not be replaced then
            try:
                with self._lock:
                    worker = self._spawn()
            except OSError as exc:
                self._idle.put(_EMPTY)
                raise PoolBroken(f"cannot start a decoding worker ({exc}); retry") from None
        assert isinstance(worker, Child)
        try:
            kind, value = worker.call((body, content_type, encoding, limits, keep_doc))
        except Exception as exc:  # noqa: BLE001 - the process or the pipe, not the request
            worker.kill()
            with self._lock, contextlib.suppress(ValueError):
                self._all.remove(worker)
            self._idle.put(_EMPTY)
            raise PoolBroken(f"a decoding worker died ({exc}); retry") from None
        self._idle.put(worker)
        if kind == "bad":
            reason, status = value
            raise decode.BadBody(reason, status=status)
        if kind == "error":
            # The decoder failed on this body where it should have refused it: the same
            # body would fail again, so the client must not retry it.
            raise decode.BadBody(f"the body could not be decoded ({value})")
        assert isinstance(value, decode.Decoded)
        return value

    def close(self) -> None:
        with self._lock:
            self._closed = True
            workers, self._all = self._all, []
        self._idle.put(None)
        for worker in workers:
            worker.close()


_SHARED: dict[int, DecodePool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(workers: int) -> DecodePool:
    """The process's pool of ``workers`` workers (started on first use, closed at exit)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(workers)
        if pool is None or pool._closed:
            pool = _SHARED[workers] = DecodePool(workers)
        return pool


@atexit.register
def _close_all() -> None:
    for pool in list(_SHARED.values()):
        pool.close()


def serve(stdin: IO[bytes], stdout: IO[bytes]) -> None:
    """The worker's loop: one request frame in, one answer frame out, until stdin closes."""
    while True:
        try:
            body, content_type, encoding, limits, keep_doc = read_frame(stdin)
        except EOFError:
            return
        try:
            answer: tuple[str, Any] = (
                "ok",
                decode.decode_request(body, content_type, encoding, limits, keep_doc=keep_doc),
            )
        except decode.BadBody as exc:
            answer = ("bad", (exc.reason, exc.status))
        except Exception as exc:  # noqa: BLE001 - reported to the collector, worker lives on
            answer = ("error", f"{type(exc).__name__}: {exc}")
        write_frame(stdout, answer)


if __name__ == "__main__":
    from tracekit.collect import pool

    pool.serve(*child_main())
