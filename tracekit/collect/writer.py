"""The batching writer: accepted OTLP documents → the write-ahead log → the DuckDB store.

One writer serves both receivers (OTLP/HTTP and OTLP/gRPC); the store itself is
written by a process of its own (:mod:`.store_worker`). Documents arrive clean
(:mod:`tracekit.collect.decode`) and are kept as OTLP JSON lines. :meth:`BatchWriter.submit`
appends each to the write-ahead log (:mod:`.wal`) and returns once it is synced: that is
when the receiver acknowledges. Behind it a thread writes the store in batches with the
fast path a JSON-lines file takes through ingest (``ingest_documents`` with bytes), and
refreshes the touched requests; a batch is everything queued once the oldest document
has waited ``flush_interval`` (sooner when ``batch_spans`` wait), so under load a batch
grows to what arrived while the last one was written, and its fixed cost (opening the
file, staging, attribution) is shared by all of it.

DuckDB lets one process hold a database file for writing, and while it does no other
process can open the file at all. So the writer holds the store **only while it writes
a batch**. Between batches ``tracekit summary``/``diff``/``gate`` open the file
read-only; when one of them holds it the writer backs off and retries, and accepted
documents wait, in memory and in the log, bounded by ``max_pending_spans`` and
``max_pending_bytes``: past them :meth:`BatchWriter.submit` raises :class:`Backpressure`
and the receiver answers 429 / ``RESOURCE_EXHAUSTED`` instead of growing.

Nothing acknowledged is lost: a batch that fails for a passing reason (the file held,
the disk full) is retried until it is written; a batch that fails otherwise is written
again one document at a time, so a document the store refuses for good fails alone — it
is kept in the log's ``rejected.jsonl`` with the reason — and never the requests that
shared its batch. Whatever is still unwritten at exit (a ``kill -9``, a drain out of
time) is replayed from the log at the next start. The store is keyed by
(trace_id, span_id), which makes a replay, or a client's retry, harmless.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tracekit.collect.store_worker import FlushStats, StoreFailed, StoreProcess
from tracekit.collect.wal import Position, WriteAheadLog


class Backpressure(Exception):  # noqa: N818 - a signal to the receiver, not a failure
    """The writer holds its bound already: answer 429, the client retries later."""


class Unavailable(Exception):  # noqa: N818 - a signal to the receiver, not a failure
    """The document could not be made durable (stopping, the log unwritable): answer 503."""


_ENCODE = msgspec.json.Encoder().encode

RETRY_S = 1.0
"""Wait before retrying a batch that failed for a passing reason."""


@dataclass
class Ticket:
    """One accepted document: its line, spans and place in the log."""

    line: bytes
    spans: int
    position: Position
    submitted: float = field(default_factory=time.monotonic)


class BatchWriter:
    """Owns the log, the pending documents and the thread that writes them in batches."""

    def __init__(
        self,
        db: str,
        wal: WriteAheadLog,
        *,
        source: str = "collect",
        version: str | None = None,
        max_pending_spans: int = 200_000,
        max_pending_bytes: int = 256 << 20,
        batch_spans: int = 100_000,
        flush_interval: float = 0.2,
        on_flush: Callable[[FlushStats], None] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.db = db
        self.wal = wal
        self.source = source
        self.version = version
        self.max_pending_spans = max_pending_spans
        self.max_pending_bytes = max_pending_bytes
        self.batch_spans = batch_spans
        self.flush_interval = flush_interval
        self.on_flush = on_flush
        self.on_error = on_error
        self._cond = threading.Condition()
        self._queue: list[Ticket] = []
        self._pending_spans = 0
        """Spans accepted and not yet written (queued plus the batch being written)."""
        self._pending_bytes = 0
        self._stopping = False
        self._abandon = False
        self._batches = 0
        self._releases_at = 0.0
        self.store = StoreProcess(db)
        self._thread = threading.Thread(
            target=self._run, name="tracekit-collect-writer", daemon=True
        )
        self.lock_waits = 0
        """Times a flush found the file held by a reader and backed off."""
        self.replayed_spans = 0
        """Spans read back from the log at start (left by an earlier run)."""
        self.rejected_documents = 0
        """Documents the store refused for good (kept in the log's rejected.jsonl)."""

    @property
    def pending_spans(self) -> int:
        return self._pending_spans

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def start(self) -> None:
        """Create the schema, queue what an earlier run left in the log, start writing."""
        self.store.prepare()
        for line, spans, position, note in self.wal.replay():
            if note:
                self._report(note)
                continue
            self._enqueue(Ticket(line, spans, position))
            self.replayed_spans += spans
        if self.replayed_spans:
            self._report(
                f"replaying {self.replayed_spans:,} spans an earlier run accepted and had "
                f"not written (from {self.wal.directory})"
            )
        self._thread.start()

    def submit(self, doc: dict[str, Any], spans: int, *, force: bool = False) -> Ticket:
        """:meth:`submit_line` of the document as one OTLP JSON line."""
        return self.submit_line(_ENCODE(doc), spans, force=force)

    def submit_line(self, line: bytes, spans: int, *, force: bool = False) -> Ticket:
        """Accept ``line`` (``spans`` spans): returns once it is in the log, synced.

        :class:`Backpressure` when memory is at its bound, :class:`Unavailable` when
        stopping or the log cannot be written; nothing is accepted then. ``force`` skips
        the bound: the tail sampler hands over documents it has already acknowledged.
        """
        size = len(line)
        with self._cond:
            if self._stopping:
                raise Unavailable("shutting down")
            over = (
                self._pending_spans + spans > self.max_pending_spans
                or self._pending_bytes + size > self.max_pending_bytes
            )
            if over and self._pending_spans > 0 and not force:
                raise Backpressure(
                    f"{self._pending_spans:,} spans ({self._pending_bytes:,} bytes) "
                    "waiting to be written"
                )
            self._pending_spans += spans
            self._pending_bytes += size
        try:
            position = self.wal.append(line, spans)
        except OSError as exc:
            with self._cond:
                self._pending_spans -= spans
                self._pending_bytes -= size
            raise Unavailable(f"cannot write the log: {exc.strerror or exc}") from exc
        ticket = Ticket(line, spans, position)
        with self._cond:
            self._queue.append(ticket)
            self._cond.notify_all()
        return ticket

    def _enqueue(self, ticket: Ticket) -> None:
        with self._cond:
            self._queue.append(ticket)
            self._pending_spans += ticket.spans
            self._pending_bytes += len(ticket.line)
            self._cond.notify_all()

    def close(self, timeout: float = 60.0) -> bool:
        """Write everything accepted, then stop; False when ``timeout`` ran out first.

        What is not written by then stays in the log, for the next start.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        done = not self._thread.is_alive()
        if not done:
            with self._cond:
                self._abandon = True
                self._cond.notify_all()
            self.store.kill()
            self._thread.join(5.0)
        with self._cond:
            done = done and not self._queue
        self.wal.close()
        self.store.close()
        return done

    def _take(self) -> list[Ticket]:
        with self._cond:
            while True:
                if self._abandon:
                    return []
                if self._queue:
                    age = time.monotonic() - self._queue[0].submitted
                    queued = sum(t.spans for t in self._queue)
                    if self._stopping or queued >= self.batch_spans or age >= self.flush_interval:
                        batch, self._queue = self._queue, []
                        return batch
                    self._cond.wait(self.flush_interval - age)
                elif self._stopping:
                    return []
                else:
                    self._cond.wait()

    def _run(self) -> None:
        while batch := self._take():
            try:
                written = self._write_all(batch)
                if written is None:
                    return  # abandoned at exit: the log keeps the rest
                self.wal.committed([t.position for t in batch])
            except Exception as exc:  # noqa: BLE001 - this thread must not die: retry later
                self._report(f"writer: {type(exc).__name__}: {exc}; retrying the batch")
                with self._cond:
                    self._queue[:0] = batch
                    self._cond.wait(RETRY_S)
                continue
            with self._cond:
                self._pending_spans -= sum(t.spans for t in batch)
                self._pending_bytes -= sum(len(t.line) for t in batch)

    def _write_all(self, batch: list[Ticket]) -> bool | None:
        """Write ``batch``, retrying passing failures; None when abandoned at exit."""
        reported = 0.0
        while True:
            try:
                self._write(batch)
                return True
            except Exception as exc:  # noqa: BLE001 - retried or isolated, never dropped
                if not _passing(exc) and len(batch) > 1:
                    return True if self._one_by_one(batch) else None
                if not _passing(exc):
                    self._keep_aside(batch[0], exc)
                    return True
                if time.monotonic() - reported > 60.0:
                    reported = time.monotonic()
                    self._report(
                        f"could not write {len(batch)} request(s), retrying: "
                        f"{type(exc).__name__}: {exc}"
                    )
            with self._cond:
                if self._abandon:
                    return None
                self._cond.wait(RETRY_S)
                if self._abandon:
                    return None

    def _one_by_one(self, batch: list[Ticket]) -> bool:
        """After a batch failed on its data: each document alone, so only a bad one fails.

        False when abandoned at exit before all were written (the log keeps them all:
        writing a document twice is harmless, losing one is not)."""
        for ticket in batch:
            while True:
                try:
                    self._write([ticket])
                    break
                except Exception as exc:  # noqa: BLE001 - that document's own failure
                    if not _passing(exc):
                        self._keep_aside(ticket, exc)
                        break
                    with self._cond:
                        if self._abandon:
                            return False
                        self._cond.wait(RETRY_S)
        return True

    def _keep_aside(self, ticket: Ticket, exc: BaseException) -> None:
        why = f"{type(exc).__name__}: {exc}"
        path = self.wal.reject(ticket.line, why)
        self.rejected_documents += 1
        self._report(
            f"the store refused a request of {ticket.spans} span(s) ({why}); it is kept in {path}"
        )

    def _report(self, message: str) -> None:
        if self.on_error:
            with contextlib.suppress(Exception):  # a caller's handler must not stop the writer
                self.on_error(message)

    def _write(self, batch: list[Ticket]) -> None:
        self._batches += 1
        want_releases = self._stopping or time.monotonic() - self._releases_at > 1.0
        stats = self.store.write(
            [t.line for t in batch],
            sum(t.spans for t in batch),
            source=f"{self.source}#{self._batches}",
            version=self.version,
            releases=want_releases,
        )
        if want_releases:
            self._releases_at = time.monotonic()
        self.lock_waits += stats.lock_waits
        if self.on_flush:
            self.on_flush(stats)


def _passing(exc: BaseException) -> bool:
    """A failure that a later try may not meet: the file held, the disk, the OS.

    Anything else is taken to be the data's: the batch is split, and a document that
    fails alone is kept in ``rejected.jsonl`` (an OTLP JSON-lines file ``tracekit
    ingest`` reads) instead of stalling every request behind it.
    """
    return isinstance(exc, StoreFailed) and exc.passing
