"""The collector's write-ahead log: what is acknowledged is on disk before the answer.

An export request is acknowledged once its clean document is appended here and the file
is synced (``fdatasync``), not once the store is written. The store is written in
batches behind it, as large as what arrived meanwhile, so an exporter waits for one
sync (group commit: one sync covers every append made before it started) and not for a
DuckDB transaction, and the batches stay large whatever the clients do. This is the
OpenTelemetry Collector's persistent sending queue, for one writer.

Layout: a directory beside the store (``STORE.collect-wal/``) holding segments
``NNNNNNNN.wal`` of records ``[length u32][spans u32][crc32 u32][payload]`` (the payload
is the document as one OTLP JSON line), a ``lock`` file (one collector per store), and
``rejected.jsonl`` for documents the store refused for good (appended, never
overwritten). A segment is deleted once every record in it is committed to the store and
a newer one is being written; on start, segments left by a crash, a ``kill -9`` or a
drain that ran out of time are replayed into the store (a record already stored is
deduplicated by its (trace_id, span_id) keys). A record torn by a crash mid-append fails
its checksum and ends the replay of its segment: it was never acknowledged.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tracekit.errors import ConfigError

_HEADER = struct.Struct("<III")
SEGMENT_BYTES = 64 << 20
"""A segment is closed for appends once it holds this much."""


@dataclass(frozen=True)
class Position:
    """Where a record lives: its segment's number."""

    segment: int


def wal_dir_for(db: str | os.PathLike[str]) -> Path:
    return Path(f"{os.fspath(db)}.collect-wal")


class WriteAheadLog:
    """Appends records with group-committed syncs; deletes segments once committed."""

    def __init__(self, directory: Path, *, fsync: bool = True) -> None:
        self.directory = directory
        self.fsync = fsync
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the write-ahead log {directory}: {exc.strerror or exc}"
            ) from exc
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise ConfigError(
                f"another `tracekit collect` writes this store (it holds {directory}/lock); "
                "stop it or give this one another --db"
            ) from None
        self._closed = False
        self._lock = threading.Lock()
        self._sync_cond = threading.Condition(threading.Lock())
        self._syncing = False
        self._appended = 0  # records appended (a sequence number)
        self._synced = 0  # records known to be on disk
        self._outstanding: dict[int, int] = {}
        """Records appended (or replayed) to a segment and not yet committed."""
        existing = sorted(self.segments())
        self._current = (existing[-1] + 1) if existing else 1
        self._fd = self._open_segment(self._current)
        self._size = 0

    # --- files ----------------------------------------------------------------------

    def segments(self) -> list[int]:
        out = []
        for p in self.directory.glob("*.wal"):
            with contextlib.suppress(ValueError):
                out.append(int(p.stem))
        return out

    def _path(self, segment: int) -> Path:
        return self.directory / f"{segment:08d}.wal"

    def _open_segment(self, segment: int) -> int:
        fd = os.open(self._path(segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._outstanding.setdefault(segment, 0)
        if self.fsync:  # the new file's directory entry must survive a crash too
            dfd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return fd

    # --- appending ------------------------------------------------------------------

    def append(self, payload: bytes, spans: int) -> Position:
        """Append one record and return once it is synced (or fails with ``OSError``)."""
        record = _HEADER.pack(len(payload), spans, zlib.crc32(payload)) + payload
        with self._lock:
            if self._closed:
                raise OSError(errno.EBADF, "the write-ahead log is closed")
            self._write_all(record)
            self._size += len(record)
            segment = self._current
            self._outstanding[segment] += 1
            self._appended += 1
            seq = self._appended
            if self._size >= SEGMENT_BYTES:
                self._rotate()
        self._sync_to(seq)
        return Position(segment)

    def _write_all(self, record: bytes) -> None:
        """(Under the append lock.) The whole record or nothing: a short write (a full
        disk) is cut back off, so no later record follows a torn one."""
        view = memoryview(record)
        done = 0
        try:
            while done < len(record):
                done += os.write(self._fd, view[done:])
        except OSError:
            if done:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)
            raise

    def _rotate(self) -> None:
        """(Under the append lock.) A new segment for appends; the old one synced, closed."""
        old, old_fd = self._current, self._fd
        self._fd = self._open_segment(old + 1)  # first: a failure leaves the old one in use
        self._current = old + 1
        self._size = 0
        if self.fsync:
            os.fdatasync(old_fd)
        os.close(old_fd)
        with self._sync_cond:
            self._synced = max(self._synced, self._appended)
            self._sync_cond.notify_all()
        self._drop_if_done(old)

    def _sync_to(self, seq: int) -> None:
        """Group commit: the first waiter syncs for everyone appended before it began."""
        if not self.fsync:
            return
        with self._sync_cond:
            while self._synced < seq:
                if self._syncing:
                    self._sync_cond.wait()
                    continue
                self._syncing = True
                target = self._appended
                fd = self._fd
                self._sync_cond.release()
                synced = False
                try:
                    os.fdatasync(fd)
                    synced = True
                except OSError as exc:
                    if exc.errno != errno.EBADF:  # EBADF: closed by a rotation, synced there
                        raise
                    synced = True
                finally:
                    self._sync_cond.acquire()
                    self._syncing = False
                    if synced:
                        self._synced = max(self._synced, target)
                    self._sync_cond.notify_all()

    # --- committing -----------------------------------------------------------------

    def committed(self, positions: list[Position]) -> None:
        """These records are in the store: segments holding nothing else go away."""
        with self._lock:
            touched = set()
            for p in positions:
                self._outstanding[p.segment] -= 1
                touched.add(p.segment)
            for segment in touched:
                self._drop_if_done(segment)

    def _drop_if_done(self, segment: int) -> None:
        if segment != self._current and self._outstanding.get(segment, 0) <= 0:
            self._outstanding.pop(segment, None)
            with contextlib.suppress(OSError):  # gone already, or not ours to delete: harmless
                self._path(segment).unlink()

    def reject(self, payload: bytes, why: str) -> Path:
        """Keep a document the store refused for good, with the reason (never lost)."""
        path = self.directory / "rejected.jsonl"
        with path.open("ab") as fh:
            fh.write(payload.rstrip(b"\n") + b"\n")
            fh.flush()
            if self.fsync:
                os.fsync(fh.fileno())
        with (self.directory / "rejected.log").open("a", encoding="utf-8") as fh:
            fh.write(why.replace("\n", " ") + "\n")
        return path

    # --- replay ---------------------------------------------------------------------

    def replay(self) -> Iterator[tuple[bytes, int, Position, str]]:
        """Records of the segments a previous run left: (payload, spans, position, note).

        ``note`` is non-empty for the first record after which a segment is unreadable
        (a torn tail); the records before it are yielded.
        """
        for segment in sorted(s for s in self.segments() if s != self._current):
            data = self._path(segment).read_bytes()
            i = 0
            while i + _HEADER.size <= len(data):
                length, spans, crc = _HEADER.unpack_from(data, i)
                payload = data[i + _HEADER.size : i + _HEADER.size + length]
                if len(payload) < length or zlib.crc32(payload) != crc:
                    break
                with self._lock:
                    self._outstanding[segment] = self._outstanding.get(segment, 0) + 1
                yield payload, spans, Position(segment), ""
                i += _HEADER.size + length
            if i < len(data):
                yield (
                    b"",
                    0,
                    Position(segment),
                    (
                        f"{self._path(segment)}: {len(data) - i} bytes after the last whole "
                        "record were not acknowledged (torn by a crash); skipped"
                    ),
                )
            with self._lock:
                self._drop_if_done(segment)

    def close(self) -> None:
        """Close the log; with nothing outstanding the directory is left empty of data."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.fsync:
                with contextlib.suppress(OSError):
                    os.fdatasync(self._fd)
            os.close(self._fd)
            self._fd = -1
            if self._outstanding.get(self._current, 0) <= 0:
                with contextlib.suppress(FileNotFoundError):
                    self._path(self._current).unlink()
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)

    @property
    def outstanding(self) -> int:
        with self._lock:
            return sum(self._outstanding.values())
