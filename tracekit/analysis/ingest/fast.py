"""The fast path for OTLP JSON lines: msgspec decodes, DuckDB maps.

A Python loop of ``json.loads`` cannot go faster than CPython builds dicts. Here each
line is decoded by msgspec against typed structs (:class:`_Doc`): ids, names, enums
and times become Python values in C, while each span's attribute list stays raw JSON
bytes (``msgspec.Raw``, a slice of the line: no objects are built for it — building
them, and a dict per span, cost more than all the rest of the decoding). A batch of
spans becomes numpy columns, handed to DuckDB without copying row by row, and one
``INSERT … SELECT`` (``sql/ingest_otlp_lines.sql``, run on every DuckDB thread) turns
the raw attribute lists into the stored JSON objects and the stage, time-kind, CPU/GPU
and weight columns, and flags every span it would not decode exactly as the reference
decoder (:mod:`tracekit.analysis.ingest.otlp`).

Why msgspec: it is maintained, typed (a line either fits the OTLP schema or is
handed over whole), several times faster than ``json`` at building exactly the
fields we need, and ``Raw`` defers the rest. A line msgspec rejects (malformed JSON,
enum names instead of numbers, api_v3's ``result`` wrapper, anything odd) and every
line holding a span the SQL flags is decoded again by the reference decoder, so what
is stored never depends on which path read it.

Memory is bounded by :data:`BATCH_SPANS` (plus DuckDB's own buffer, which spills to
disk): the file is streamed line by line, compressed or not.
"""

from __future__ import annotations

import gzip
import importlib.resources
import re
import threading
import zlib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import IO, Any

import msgspec
import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.ingest import staging
from tracekit.analysis.ingest.otlp import attributes
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.ingest.rows import (
    MAX_ATTR_CHARS,
    Malformed,
    Origin,
    Resource,
    dumps,
    threshold_weight,
)
from tracekit.analysis.store import Store

BATCH_SPANS = 100_000
"""Spans decoded before they are handed to DuckDB (bounds the Python side's memory)."""

TRUNCATED_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
"""What Python's gzip raises at a cut or corrupt stream."""


_ABSENT = msgspec.Raw(b"")
"""Default of a nested value (msgspec cannot make ``Raw`` optional)."""
_EMPTY_LIST = msgspec.Raw(b"[]")
"""Default of a span's attribute list."""


class _AnyValue(msgspec.Struct):
    stringValue: str | None = None
    boolValue: bool | None = None
    intValue: int | None = None
    doubleValue: float | None = None
    bytesValue: str | None = None
    # Nested values are only noticed: such a span goes to the reference decoder.
    arrayValue: msgspec.Raw = _ABSENT
    kvlistValue: msgspec.Raw = _ABSENT


class _KeyValue(msgspec.Struct):
    key: str
    value: _AnyValue | None = None


class _Link(msgspec.Struct):
    traceId: str = ""
    spanId: str = ""
    attributes: list[_KeyValue] = []


class _Status(msgspec.Struct):
    code: int = 0


class _Span(msgspec.Struct):
    traceId: str = ""
    spanId: str = ""
    parentSpanId: str = ""
    name: str = ""
    kind: int = 0
    startTimeUnixNano: int = 0
    endTimeUnixNano: int = 0
    traceState: str = ""
    attributes: msgspec.Raw = _EMPTY_LIST
    links: list[_Link] = []
    status: _Status | None = None


class _Scope(msgspec.Struct):
    spans: list[_Span] = []


class _Resource(msgspec.Struct):
    attributes: list[Any] = []


class _ResourceSpans(msgspec.Struct):
    resource: _Resource | None = None
    scopeSpans: list[_Scope] = []


class _Doc(msgspec.Struct):
    resourceSpans: list[_ResourceSpans]


_DECODER = msgspec.json.Decoder(_Doc, strict=False)
"""``strict=False``: int64 fields may be JSON strings (as OTLP/JSON writes them)."""


@cache
def _sections() -> dict[str, list[str]]:
    """The statements of each ``-- name:`` section of ``sql/ingest_otlp_lines.sql``."""
    text = (
        importlib.resources.files("tracekit.analysis.store")
        .joinpath("sql/ingest_otlp_lines.sql")
        .read_text()
    )
    out: dict[str, list[str]] = {}
    for chunk in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = chunk.partition("\n")
        statements = []
        for part in body.split(";\n"):
            code = "\n".join(ln for ln in part.splitlines() if not ln.lstrip().startswith("--"))
            if code.strip():
                statements.append(code.strip())
        out[name.strip()] = statements
    return out


def open_binary(path: Path, gz: bool) -> IO[bytes]:
    if gz:
        return gzip.open(path, "rb")  # type: ignore[return-value]  # a GzipFile is IO[bytes]
    return path.open("rb")


class Batch:
    """Columns of decoded spans, flushed to ``_tk_stage`` every :data:`BATCH_SPANS`."""

    def __init__(self) -> None:
        self._pending: tuple[threading.Thread, list[BaseException]] | None = None
        self.reset()

    def reset(self) -> None:
        self.cols: dict[str, list[Any]] = {k: [] for k in _COLUMNS}
        self.scope_len: list[int] = []
        self.scope_line: list[int] = []
        self.scope_res: list[int] = []
        self.scope_seq0: list[int] = []
        self.res: list[tuple[Any, ...]] = []
        self.scope_file: list[int] = []
        self.files: dict[int, str] = {}
        self.n = 0

    def add_line(self, doc: _Doc, lineno: int, origin: Origin) -> bool:
        """Add one decoded line's spans; False (nothing added) when Python must take it.

        Resource attributes are decoded here by the reference decoder's
        :func:`~tracekit.analysis.ingest.otlp.attributes`; one it finds malformed (or
        that it would log a problem for) sends the whole line to the reference path.
        """
        try:
            resources = [
                Resource.from_attributes(
                    attributes(rs.resource.attributes if rs.resource else None, origin, lineno)
                )
                for rs in doc.resourceSpans
            ]
        except Malformed:
            return False
        if origin.file_no not in self.files:
            self.files[origin.file_no] = origin.display
        c = self.cols
        seq = 0
        for rs, r in zip(doc.resourceSpans, resources, strict=True):
            res_no = len(self.res)
            self.res.append(
                (
                    res_no,
                    r.service_name,
                    r.service_version,
                    r.instance_id,
                    r.host_name,
                    r.attributes_json,
                )
            )
            for ss in rs.scopeSpans:
                sp = ss.spans
                if not sp:
                    continue
                c["trace_id"] += [s.traceId for s in sp]
                c["span_id"] += [s.spanId for s in sp]
                c["parent"] += [s.parentSpanId for s in sp]
                c["name"] += [s.name for s in sp]
                c["kind"] += [s.kind for s in sp]
                c["start_ns"] += [s.startTimeUnixNano for s in sp]
                c["end_ns"] += [s.endTimeUnixNano for s in sp]
                c["status"] += [s.status.code if s.status else 0 for s in sp]
                states = [s.traceState for s in sp]
                c["trace_state"] += states
                c["ts_weight"] += [threshold_weight(t) if t else None for t in states]
                c["attrs"] += [bytes(s.attributes) for s in sp]
                c["links"] += [_links(s.links) if s.links else "[]" for s in sp]
                self.scope_len.append(len(sp))
                self.scope_line.append(lineno)
                self.scope_file.append(origin.file_no)
                self.scope_res.append(res_no)
                self.scope_seq0.append(seq)
                seq += len(sp)
                self.n += len(sp)
        return True

    def flush(self, store: Store, *, wait: bool = True) -> None:
        """Stage the decoded spans; with ``wait=False`` the SQL runs on a thread of its own.

        DuckDB releases the GIL while it maps a batch, so the next batch is decoded in
        the meantime (the two overlap on a second core). Only one batch is staged at a
        time, and every other use of the store waits for it (:meth:`wait`).
        """
        if not self.n:
            if wait:
                self.wait(store)
            return
        frames = self._frames()
        self.reset()
        self.wait(store)
        if wait:
            _stage(store, frames)
            return
        failed: list[BaseException] = []

        def run() -> None:
            try:
                _stage(store, frames)
            except BaseException as exc:  # re-raised by wait() in the reading thread
                failed.append(exc)

        thread = threading.Thread(target=run, name="tracekit-stage", daemon=True)
        thread.start()
        self._pending = (thread, failed)

    def wait(self, store: Store) -> None:
        """Block until a batch staged in the background is in; re-raise its error."""
        if self._pending is None:
            return
        thread, failed = self._pending
        try:
            thread.join()
        except BaseException:
            # Interrupted (Ctrl-C): stop DuckDB's work before anyone else uses the store.
            store.con.interrupt()
            thread.join()
            raise
        finally:
            if not thread.is_alive():
                self._pending = None
        if failed:
            raise failed[0]

    def _frames(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The batch as numpy columns: spans, resources, file names."""
        lens = np.asarray(self.scope_len, dtype=np.int64)
        starts = np.cumsum(lens) - lens
        within = np.arange(self.n, dtype=np.int64) - np.repeat(starts, lens)
        frame: dict[str, Any] = {
            "lineno": np.repeat(np.asarray(self.scope_line, dtype=np.int64), lens),
            "file_no": np.repeat(np.asarray(self.scope_file, dtype=np.int64), lens),
            "res": np.repeat(np.asarray(self.scope_res, dtype=np.int64), lens),
            "seq": np.repeat(np.asarray(self.scope_seq0, dtype=np.int64), lens) + within,
        }
        for name, values in self.cols.items():
            if name == "ts_weight":
                frame[name] = np.asarray(values, dtype=np.float64)  # None reads NaN
            elif name in _INT_COLUMNS:
                try:
                    frame[name] = np.asarray(values, dtype=np.int64)
                except OverflowError:
                    # uint64 times past int64 (garbage): DuckDB gets them as text and
                    # marks the span odd for the reference decoder to report.
                    frame[name] = _objects([str(v) for v in values])
            else:
                frame[name] = _objects(values)
        res_cols = list(zip(*self.res, strict=True))
        resources = {k: _objects(list(v)) for k, v in zip(_RES_COLUMNS, res_cols, strict=True)}
        resources["res"] = np.asarray(res_cols[0], dtype=np.int64)
        files = list(self.files.items())
        names = {
            "file_no": np.asarray([f for f, _ in files], dtype=np.int64),
            "display": _objects([d for _, d in files]),
        }
        return frame, resources, names


def _stage(store: Store, frames: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
    """Run the stage statement over one batch's columns."""
    frame, resources, names = frames
    con = store.con
    con.register("_tk_cols", frame)
    con.register("_tk_res", resources)
    con.register("_tk_files", names)
    try:
        for statement in _sections()["macros"]:
            staging.run(store, statement)
        for statement in _sections()["stage"]:
            staging.run(store, statement, _KEYS)
    finally:
        con.unregister("_tk_cols")
        con.unregister("_tk_res")
        con.unregister("_tk_files")


_COLUMNS = (
    "trace_id",
    "span_id",
    "parent",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "status",
    "trace_state",
    "ts_weight",
    "attrs",
    "links",
)
_INT_COLUMNS = frozenset({"kind", "start_ns", "end_ns", "status"})
_KEYS = {
    "stage_key": cv.STAGE,
    "kind_key": cv.TIME_KIND,
    "cpu_key": cv.CPU_TIME_NS,
    "gpu_key": cv.GPU_TIME_NS,
    "weight_key": cv.SAMPLE_WEIGHT,
}
"""The attributes the stage statement copies into columns of their own."""


def _attribute_dict(kvs: list[_KeyValue]) -> tuple[dict[str, Any], bool]:
    """The reference decoder's ``attributes()`` for flat values; True when it must decide.

    Python's JSON writes floats outside [1e-4, 1e16) with an exponent msgspec spells
    differently, and long strings are truncated with a problem logged: such spans, and
    nested values, are left to the reference decoder. A later duplicate key wins, in
    the first one's place, as in a dict.
    """
    out: dict[str, Any] = {}
    odd = False
    for kv in kvs:
        v = kv.value
        x: Any = None
        if v is not None:
            if (x := v.stringValue) is not None:
                if len(x) > MAX_ATTR_CHARS:
                    odd = True
            elif (x := v.boolValue) is None and (x := v.intValue) is None:
                if (x := v.doubleValue) is not None:
                    if (x != 0.0 and not 1e-4 <= abs(x) < 1e16) or x != x:
                        odd = True
                elif (x := v.bytesValue) is None and (
                    v.arrayValue is not _ABSENT or v.kvlistValue is not _ABSENT
                ):
                    odd = True
        out[kv.key] = x
    return out, odd


def _links(links: list[_Link]) -> str | None:
    """The stored links JSON, or None when the reference decoder must decide (odd ids)."""
    out = []
    for link in links:
        tid, sid = link.traceId.lower(), link.spanId.lower()
        if not (_HEX32.fullmatch(tid) and _HEX16.fullmatch(sid)):
            return None
        attrs, odd = _attribute_dict(link.attributes)
        if odd:
            return None
        out.append({"trace_id": tid, "span_id": sid, "attributes": attrs})
    return dumps(out)


_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEX16 = re.compile(r"[0-9a-f]{16}")
_RES_COLUMNS = ("res", "service_name", "service_version", "instance_id", "host_name", "ra_json")


def _objects(values: list[Any]) -> Any:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def stage_lines(
    store: Store, path: str | Path, *, gzip: bool, file_no: int, display: str
) -> list[int]:
    """Stage the clean spans of one OTLP JSON-lines file; return the lines left to Python."""
    origin = Origin(display, file_no, ProblemLog(strict=False))
    batch = Batch()
    odd, _ = read_lines(store, batch, Path(path), gz=gzip, origin=origin)
    batch.flush(store)
    return sorted(set(odd) | take_odd_lines(store).get(file_no, set()))


def read_lines(
    store: Store, batch: Batch, path: Path, *, gz: bool, origin: Origin
) -> tuple[list[int], int | None]:
    """Decode an OTLP JSON-lines file into ``batch`` (staged whenever it is full).

    Returns the numbers of the lines msgspec could not take (left to the reference
    decoder), and the number of the line in which a compressed stream was cut (None
    when the file is whole): every complete line before the cut has been read. Lines
    holding a span the SQL flags are found later by :func:`take_odd_lines`.
    """
    odd: list[int] = []
    cut: int | None = None
    lineno = 0
    with open_binary(path, gz) as fh:
        lines = _lines(fh)
        while True:
            try:
                line = next(lines)
            except StopIteration:
                break
            except TRUNCATED_ERRORS:
                cut = lineno + 1
                break
            lineno += 1
            if len(line) < 3 and not line.strip():
                continue
            if not _take(store, batch, line, lineno, origin) and line.strip():
                odd.append(lineno)
    return odd, cut


def _take(store: Store, batch: Batch, line: bytes, lineno: int, origin: Origin) -> bool:
    """Decode one line into ``batch`` (staged when full); False when msgspec or the
    batch could not take it (it goes to the reference decoder)."""
    try:
        doc = _DECODER.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return False
    if not batch.add_line(doc, lineno, origin):
        return False
    if batch.n >= BATCH_SPANS:
        batch.flush(store, wait=False)
    return True


def read_memory(store: Store, batch: Batch, lines: list[bytes], origin: Origin) -> list[int]:
    """Decode OTLP JSON lines held in memory into ``batch``, as :func:`read_lines` a file.

    Lines are numbered from 1; returns those msgspec could not take.
    """
    return [
        lineno
        for lineno, line in enumerate(lines, start=1)
        if not _take(store, batch, line, lineno, origin)
    ]


def take_odd_lines(store: Store) -> dict[int, set[int]]:
    """Lines (by file) holding a span the SQL flagged; their rows leave the stage."""
    out: dict[int, set[int]] = {}
    for file_no, lineno in staging.run(store, staging.sql("odd_lines_all")):
        out.setdefault(int(file_no), set()).add(int(lineno))
    if out:
        staging.run(store, staging.sql("drop_odd_lines_all"))
    return out


def staged_counts(store: Store) -> dict[int, int]:
    """Spans in the stage per file (after :func:`take_odd_lines`)."""
    return {
        int(f): int(n)
        for f, n in staging.run(store, "SELECT file_no, count(*) FROM _tk_stage GROUP BY 1")
    }


def _lines(fh: IO[bytes]) -> Iterator[bytes]:
    yield from fh
