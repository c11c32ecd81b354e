"""The store's writer in a process of its own, so that receiving never slows writing.

Writing a batch is ingest's fast path and the attribution of the touched requests:
Python between DuckDB statements. In the receiving process those Python steps wait for
the GIL after every statement while HTTP, gRPC and log appends run (measured: the whole
collect ran at half the rate of a file ingest of the same spans). Here the batch's lines
go to ``python -m tracekit.collect.store_worker DB`` (:mod:`.child`), which opens the
store, ingests, refreshes, closes, and answers with the figures the status line shows, or
with why it failed and whether a retry may succeed (the file held by a reader, the disk).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import IO, Any

from tracekit.collect.child import Child, child_main, read_frame, write_frame

LOCK_WAIT_S = 10.0
"""How long one write waits for a reader to let go of the file before failing (retried)."""


@dataclass
class FlushStats:
    """What one written batch did, and the store's totals after it (for the status line)."""

    spans: int
    spans_new: int
    requests_refreshed: int
    seconds: float
    requests_total: int
    releases: list[str]
    lock_waits: int = 0


class StoreFailed(Exception):
    """A batch was not written; ``passing``: the same batch may succeed later."""

    def __init__(self, message: str, *, passing: bool) -> None:
        super().__init__(message)
        self.passing = passing


class StoreProcess:
    """The parent's handle on the store worker (started on first use, restarted if it dies)."""

    def __init__(self, db: str) -> None:
        self.db = db
        self._child: Child | None = None
        self._lock = threading.Lock()

    def _call(self, request: tuple[Any, ...]) -> Any:
        with self._lock:
            if self._child is None:
                self._child = Child("tracekit.collect.store_worker", self.db)
            try:
                kind, value = self._child.call(request)
            except Exception as exc:  # noqa: BLE001 - the process or the pipe, not the data
                self._child.kill()
                self._child = None
                raise StoreFailed(
                    f"the store writer process failed ({type(exc).__name__}: {exc})", passing=True
                ) from None
        if kind == "error":
            message, passing = value
            raise StoreFailed(message, passing=passing)
        return value

    def prepare(self) -> list[str]:
        """Create the schema if needed; the releases already stored."""
        releases: list[str] = self._call(("prepare",))
        return releases

    def write(
        self, lines: list[bytes], spans: int, *, source: str, version: str | None, releases: bool
    ) -> FlushStats:
        stats: FlushStats = self._call(("write", lines, spans, source, version, releases))
        return stats

    def close(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.close(timeout=30.0)

    def kill(self) -> None:
        """End the worker now, whatever it is doing (a drain out of time); the batch it
        held stays in the write-ahead log. Takes no lock: a call may be in progress."""
        child = self._child
        if child is not None:
            child.kill()


# --- the worker process ---------------------------------------------------------------


def _passing(exc: BaseException) -> bool:
    """The file held, the disk full, an I/O error, memory: a later try may not meet it.
    Anything else (a conversion, a constraint, ingest's own errors) is the data's."""
    from tracekit.analysis.store import is_transient_error

    cause = exc.__cause__
    return is_transient_error(exc) or (cause is not None and is_transient_error(cause))


def _with_store(db: str, work: Any) -> tuple[Any, int]:
    """``work(store)`` on the store opened for writing, waiting out readers; (result, waits)."""
    from tracekit.analysis.store import is_lock_error, open_store
    from tracekit.errors import QueryError

    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.01
    waits = 0
    while True:
        try:
            store = open_store(db)
        except QueryError as exc:
            cause = exc.__cause__
            if cause is None or not is_lock_error(cause) or time.monotonic() > deadline:
                raise
            waits += 1
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            continue
        try:
            return work(store), waits
        finally:
            store.close()


def _releases(store: Any) -> list[str]:
    rows = store.run("SELECT DISTINCT release FROM requests WHERE release IS NOT NULL")
    return sorted(str(r[0]) for r in rows)


def _batch_work(
    lines: list[bytes], source: str, version: str | None, want_releases: bool, known: list[str]
) -> Any:
    """What one batch does with the open store: ingest, attribute, count."""
    from tracekit.analysis.attribution.payloads import ingest_otlp_payloads

    def work(store: Any) -> tuple[int, int, int, list[str]]:
        # The same decoders and staging as `tracekit ingest` (its fast path for JSON
        # lines), so a span gives the same row whichever way it arrived; only the
        # touched traces are re-attributed.
        report = ingest_otlp_payloads(store, lines, source=source, version=version)
        total = int(store.run("SELECT count(*) FROM requests")[0][0])
        found = _releases(store) if want_releases else known
        return report.spans_stored, report.requests_attributed, total, found

    return work


def serve(db: str, stdin: IO[bytes], stdout: IO[bytes]) -> None:
    releases: list[str] = []
    while True:
        try:
            request = read_frame(stdin)
        except EOFError:
            return
        started = time.perf_counter()
        try:
            if request[0] == "prepare":
                releases, _ = _with_store(db, _releases)
                answer: tuple[str, Any] = ("ok", releases)
            else:
                _, lines, spans, source, version, want_releases = request
                work = _batch_work(lines, source, version, want_releases, releases)
                (new, refreshed, total, releases), waits = _with_store(db, work)
                answer = (
                    "ok",
                    FlushStats(
                        spans=spans,
                        spans_new=new,
                        requests_refreshed=refreshed,
                        seconds=time.perf_counter() - started,
                        requests_total=total,
                        releases=releases,
                        lock_waits=waits,
                    ),
                )
        except Exception as exc:  # noqa: BLE001 - reported to the collector, which decides
            answer = ("error", (f"{type(exc).__name__}: {exc}", _passing(exc)))
        write_frame(stdout, answer)


if __name__ == "__main__":
    # Through the module's own name, so what is pickled names tracekit's classes, not
    # __main__'s.
    from tracekit.collect import store_worker

    store_worker.serve(sys.argv[1], *child_main())
