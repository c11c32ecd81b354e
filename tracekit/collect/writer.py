"""The batching writer: accepted OTLP documents → the DuckDB store, a batch at a time.

One writer serves both receivers (OTLP/HTTP and OTLP/gRPC). Documents arrive clean
(:mod:`tracekit.collect.decode`) and are kept as OTLP JSON lines, so a batch takes the
same fast path through ingest as a JSON-lines file (``ingest_documents`` with bytes).
Batches form by group commit: when the writer is free it takes everything queued once the
oldest document has waited ``flush_interval`` (or at once when ``batch_spans`` wait), so
under load a batch grows to what arrived while the last one was written.

DuckDB lets one process hold a database file for writing, and while it does no other
process can open the file at all. So the writer holds the store **only while it writes
a batch**: every ``flush_interval`` (or sooner when ``batch_spans`` are waiting) it
opens the file, ingests the batch with the same decoder and staging steps that
``tracekit ingest`` uses, refreshes the touched requests, and closes it again. Between
batches ``tracekit summary``/``diff``/``gate`` open the file read-only; when one of them
holds it at flush time the writer backs off and retries, and the accepted documents wait
in memory, bounded by ``max_pending_spans``: past that :meth:`BatchWriter.submit` raises
:class:`Backpressure` and the receiver answers 429 with ``Retry-After`` instead of
growing. (Analysis commands retry the other way round, see
:func:`tracekit.analysis.store.open_store`.)

Every submitted document has a :class:`Ticket`; it is set once the batch holding it is
committed (or has failed), so the receiver acknowledges a request only when its spans are
in the file. The store is keyed by (trace_id, span_id), which makes a client's retry of a
request that timed out on its side harmless. A batch that fails for a reason other than
the file being busy is written again one document at a time, so a document that cannot
be stored fails alone (``Ticket.permanent``) and never the requests that shared its batch.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tracekit.analysis.attribution.payloads import ingest_otlp_payloads
from tracekit.analysis.store import Store, open_store
from tracekit.analysis.store import is_lock_error as store_lock_error
from tracekit.errors import IngestError, QueryError


class Backpressure(Exception):  # noqa: N818 - a signal to the receiver, not a failure
    """The writer holds ``max_pending_spans`` already: answer 429, the client retries later."""


_ENCODE = msgspec.json.Encoder().encode

_DATA_ERRORS = (IngestError, TypeError, ValueError, KeyError, RecursionError, msgspec.MsgspecError)
"""A document that fails alone with one of these would fail again: not retryable."""


@dataclass
class Ticket:
    """One submitted document; ``done`` is set when it is written or has failed."""

    line: bytes
    spans: int
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    permanent: bool = False
    """The document itself could not be stored (a retry would fail the same way)."""
    submitted: float = field(default_factory=time.monotonic)
    _callbacks: list[Callable[[Ticket], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_done(self, callback: Callable[[Ticket], None]) -> None:
        """Call ``callback(ticket)`` once it is done (at once when it already is)."""
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def finish(self, error: str | None = None, *, permanent: bool = False) -> None:
        with self._lock:
            self.error = error
            self.permanent = permanent
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            with contextlib.suppress(Exception):  # a waiter's failure is not the writer's
                callback(self)


@dataclass
class FlushStats:
    """What one written batch did, and the store's totals after it (for the status line)."""

    spans: int
    spans_new: int
    requests_refreshed: int
    seconds: float
    requests_total: int
    releases: list[str]


def is_lock_error(exc: BaseException) -> bool:
    """True when DuckDB refused the file because another process holds it."""
    cause = exc.__cause__ if isinstance(exc, QueryError) else exc
    return cause is not None and store_lock_error(cause)


class BatchWriter:
    """Owns the pending documents and the thread that writes them in batches."""

    def __init__(
        self,
        db: str,
        *,
        source: str = "collect",
        version: str | None = None,
        max_pending_spans: int = 200_000,
        max_pending_bytes: int = 256 << 20,
        batch_spans: int = 20_000,
        flush_interval: float = 0.05,
        on_flush: Callable[[FlushStats], None] | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.db = db
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
        """Spans submitted and not yet written (queued plus the batch being written)."""
        self._pending_bytes = 0
        self._stopping = False
        self._batches = 0
        self._releases: set[str] = set()
        self._releases_at = 0.0
        self._thread = threading.Thread(
            target=self._run, name="tracekit-collect-writer", daemon=True
        )
        self.lock_waits = 0
        """Times a flush found the file held by a reader and backed off."""

    @property
    def pending_spans(self) -> int:
        return self._pending_spans

    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    def start(self) -> None:
        # Create the schema now, so analysis commands find a store from the first second.
        self._with_store(self._read_releases, deadline=time.monotonic() + 30.0)
        self._thread.start()

    def submit(self, doc: dict[str, Any], spans: int, *, force: bool = False) -> Ticket:
        """Queue ``doc`` (``spans`` spans); :class:`Backpressure` when memory is at its bound.

        ``force`` skips the bound: the tail sampler hands over documents it has already
        acknowledged, which must not be dropped (it stops acknowledging instead).
        """
        ticket = Ticket(_ENCODE(doc), spans)
        size = len(ticket.line)
        with self._cond:
            if self._stopping:
                raise Backpressure("shutting down")
            over = (
                self._pending_spans + spans > self.max_pending_spans
                or self._pending_bytes + size > self.max_pending_bytes
            )
            if over and self._pending_spans > 0 and not force:
                raise Backpressure(
                    f"{self._pending_spans:,} spans ({self._pending_bytes:,} bytes) "
                    "waiting to be written"
                )
            self._queue.append(ticket)
            self._pending_spans += spans
            self._pending_bytes += size
            self._cond.notify_all()
        return ticket

    def close(self, timeout: float = 60.0) -> None:
        """Write everything accepted, then stop the thread (SIGTERM/SIGINT come here)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _take(self) -> list[Ticket]:
        with self._cond:
            while True:
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
                self._write(batch)
                outcomes: list[tuple[Ticket, str | None, bool]] = [(t, None, False) for t in batch]
            except Exception as exc:  # noqa: BLE001 - reported per ticket, the loop goes on
                outcomes = self._one_by_one(batch, exc)
            with self._cond:
                self._pending_spans -= sum(t.spans for t in batch)
                self._pending_bytes -= sum(len(t.line) for t in batch)
            for ticket, error, permanent in outcomes:
                ticket.finish(error, permanent=permanent)

    def _one_by_one(
        self, batch: list[Ticket], exc: Exception
    ) -> list[tuple[Ticket, str | None, bool]]:
        """After a failed batch: each document again alone, so only a bad one fails."""
        error = f"{type(exc).__name__}: {exc}"
        if len(batch) == 1 or is_lock_error(exc) or isinstance(exc, OSError):
            permanent = len(batch) == 1 and isinstance(exc, _DATA_ERRORS)
            self._report(f"could not write {len(batch)} request(s): {error}")
            return [(t, error, permanent) for t in batch]
        out: list[tuple[Ticket, str | None, bool]] = []
        for ticket in batch:
            try:
                self._write([ticket])
                out.append((ticket, None, False))
            except Exception as alone:  # noqa: BLE001 - that document's own failure
                why = f"{type(alone).__name__}: {alone}"
                self._report(f"could not write a request of {ticket.spans} span(s): {why}")
                out.append((ticket, why, isinstance(alone, _DATA_ERRORS)))
        return out

    def _report(self, message: str) -> None:
        if self.on_error:
            self.on_error(message)

    def _write(self, batch: list[Ticket]) -> None:
        started = time.perf_counter()
        self._batches += 1
        lines = [t.line for t in batch]
        spans = sum(t.spans for t in batch)

        def work(store: Store) -> FlushStats:
            # The same decoders and staging as `tracekit ingest` (its fast path for
            # JSON lines), so a span gives the same row whichever way it arrived; only the
            # touched traces are re-attributed.
            report = ingest_otlp_payloads(
                store, lines, source=f"{self.source}#{self._batches}", version=self.version
            )
            total = int(store.run("SELECT count(*) FROM requests")[0][0])
            if time.monotonic() - self._releases_at > 1.0:
                self._read_releases(store)
            return FlushStats(
                spans=spans,
                spans_new=report.spans_stored,
                requests_refreshed=report.requests_attributed,
                seconds=time.perf_counter() - started,
                requests_total=total,
                releases=sorted(self._releases),
            )

        # While stopping, a reader holding the file still gets a while to finish; the
        # deadline only keeps a stuck reader from holding the process forever.
        stats = self._with_store(work, deadline=None)
        if self.on_flush:
            self.on_flush(stats)

    def _read_releases(self, store: Store) -> None:
        """The releases in the store (a scan of ``requests``: done at most once a second)."""
        rows = store.run("SELECT DISTINCT release FROM requests WHERE release IS NOT NULL")
        self._releases = {str(r[0]) for r in rows}
        self._releases_at = time.monotonic()

    def _with_store(self, work: Callable[[Store], Any], *, deadline: float | None) -> Any:
        delay = 0.01
        while True:
            try:
                store = open_store(self.db)
            except QueryError as exc:
                if not is_lock_error(exc):
                    raise
                self.lock_waits += 1
                if deadline is not None and time.monotonic() > deadline:
                    raise
                with self._cond:
                    stop_by = self._stopping
                if stop_by and deadline is None:
                    deadline = time.monotonic() + 60.0
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
                continue
            try:
                return work(store)
            finally:
                store.close()
