"""Ingest: trace files (OTLP JSON/JSONL, Jaeger JSON, gzip, directories) or a running
Jaeger into the store's ``spans`` table.

    report = ingest_paths(store, ["traces/"], version="v2")
    report = ingest_jaeger(store, "http://localhost:16686", "ranker", since="1h")

Formats are recognised from content (:mod:`.detect`). Big OTLP JSON-lines files are
parsed inside DuckDB (:mod:`.fast`); everything else, and every line the fast path
finds odd, by the Python decoders (:mod:`.otlp`, :mod:`.jaeger`); PyTorch-profiler rank
files by :mod:`.kineto`, several at once in worker processes (:mod:`.parallel`). All
stage rows in one temporary table that :func:`.staging.finalize` moves into ``spans``.
Problems are counted and located (:mod:`.problems`); ``strict`` stops at the first that
drops data. Ingest does not rebuild ``requests``: the caller runs ``attribution.refresh``.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tracekit.analysis.ingest import deep, detect, fast, jaeger, kineto, otlp, parallel, staging
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.problems import IngestReport, Problem, ProblemLog
from tracekit.analysis.ingest.rows import Origin
from tracekit.analysis.store import Store
from tracekit.errors import ConfigError, IngestError

__all__ = ["IngestReport", "Problem", "ingest_documents", "ingest_jaeger", "ingest_paths"]


def ingest_paths(
    store: Store,
    paths: Sequence[str | Path],
    *,
    version: str | None = None,
    strict: bool = False,
    progress: Callable[[int, int], None] | Callable[[int, int, str], None] | None = None,
    comm_pattern: str | None = None,
    jobs: int | None = None,
) -> IngestReport:
    """Read trace files and directories (recursively) into ``store``.

    ``version`` labels spans whose resource has no ``service.version`` (and is the run
    label of PyTorch-profiler files); ``progress(bytes_done, bytes_total)`` is called as
    each file is done, ``progress(bytes_done, bytes_total, name)`` when it takes a third
    argument (the CLI draws a bar from it; analysis never prints); ``comm_pattern`` is a
    regular expression for device kernels that are communication besides NCCL's
    (profiler files). ``jobs`` processes parse profiler rank files at once (default: the
    CPU cores this process may use; 1: one after another in this process); what is
    stored, and every problem, is the same either way (:mod:`.parallel`). Raises
    :class:`IngestError` for a path that does not exist, and with ``strict`` at the first
    problem that would drop data (nothing is stored then).
    """
    started = time.perf_counter()
    workers = parallel.resolve_jobs(jobs)
    for raw in paths:
        if not Path(raw).exists():
            raise IngestError(str(raw), "no such file or directory")
    files = list(detect.expand(list(paths)))
    try:
        comm = re.compile(comm_pattern) if comm_pattern else None
    except re.error as exc:
        raise ConfigError(
            f"--comm-pattern {comm_pattern!r} is not a regular expression: {exc}"
        ) from exc

    tick = parallel.FileProgress(progress, [f.display for f in files], [_size(f) for f in files])

    def read(reader: _Reader) -> None:
        with parallel.KinetoPool.start(
            files, workers, version=version, comm_pattern=comm, on_done=tick
        ) as pool:
            reader.pool = pool
            for file_no, item in enumerate(files):
                reader.read_file(item, file_no)
                if file_no not in pool:
                    tick(file_no)
                pool.poll()

    return _stage_and_store(
        store,
        read,
        [f.display for f in files],
        version=version,
        strict=strict,
        started=started,
        comm_pattern=comm,
    )


def ingest_jaeger(
    store: Store,
    url: str,
    service: str,
    *,
    since: str = "1h",
    limit: int | None = None,
    version: str | None = None,
    strict: bool = False,
) -> IngestReport:
    """Pull ``service``'s recent traces from a running Jaeger (api_v3, else legacy API).

    Pages through the ``since`` window until ``limit`` traces came back or the window
    holds no more; ``report.stopped`` says how many came back and why it stopped.
    """
    from tracekit.analysis.ingest import jaeger_api

    started = time.perf_counter()
    cap = jaeger_api.DEFAULT_LIMIT if limit is None else limit
    pull = jaeger_api.pull_traces(url, service, since=since, limit=cap)
    responses = pull.responses

    def read(reader: _Reader) -> None:
        try:
            for file_no, response in enumerate(responses):
                origin = Origin(response.source, file_no, reader.log)
                reader.log.current_file = response.source
                for line, doc in detect.iter_documents(response.text):
                    reader.dispatch(doc, origin, line, whole_file=None)
        except json.JSONDecodeError as exc:
            raise IngestError(f"{url}", f"Jaeger answered with invalid JSON: {exc}") from exc

    report = _stage_and_store(
        store, read, [r.source for r in responses], version=version, strict=strict, started=started
    )
    report.stopped = pull.summary(cap)
    return report


def ingest_documents(
    store: Store,
    documents: Iterable[Any],
    *,
    source: str,
    version: str | None = None,
    strict: bool = False,
) -> IngestReport:
    """Store trace documents like a file of them: OTLP JSON dicts (hex ids) or lines.

    A document given as ``bytes`` is one OTLP JSON line (what ``tracekit collect``
    hands over); when all are, they take the fast path a JSON-lines file takes. The same decoders and staging steps as :func:`ingest_paths`, so a span gives the
    same row either way; the N-th document's spans have ``source`` ``SOURCE:N`` where a
    file's would have ``file:line``. Does not refresh attribution (see
    :func:`tracekit.analysis.attribution.payloads.ingest_otlp_payloads`).
    """
    started = time.perf_counter()
    docs = documents if isinstance(documents, list) else list(documents)

    def read(reader: _Reader) -> None:
        origin = Origin(source, 0, reader.log)
        reader.log.current_file = source
        if docs and all(isinstance(d, bytes) for d in docs):
            reader.memory_lines(docs, origin)
            return
        for number, doc in enumerate(docs, start=1):
            if isinstance(doc, bytes):
                reader.memory_lines_python([doc], origin, {1}, first=number)
            else:
                reader.dispatch(doc, origin, number, whole_file=None)

    return _stage_and_store(store, read, [source], version=version, strict=strict, started=started)


def _stage_and_store(
    store: Store,
    read: Callable[[_Reader], None],
    names: list[str],
    *,
    version: str | None,
    strict: bool,
    started: float,
    comm_pattern: re.Pattern[str] | None = None,
) -> IngestReport:
    """Run ``read`` over a fresh stage, move what it staged into ``spans``, report.

    ``names`` are the inputs by number, as problems and the report name them; the stage
    is dropped whatever happens, and ``report.seconds`` counts from ``started``.
    """
    log = ProblemLog(strict=strict)
    reader = _Reader(store, log, version=version, comm_pattern=comm_pattern)
    report = IngestReport(files=len(names))
    (limit,) = staging.run(store, "SELECT current_setting('memory_limit')")[0]
    # The stage holds the whole input until finalize; with DuckDB's memory capped it
    # spills to disk instead of growing with the file (the Python side streams).
    staging.run(store, f"SET memory_limit = '{INGEST_MEMORY}'")
    staging.create(store)
    try:
        read(reader)
        reader.flush()
        staging.finalize(
            store,
            log,
            report,
            version=version,
            file_names=dict(enumerate(names)),
            file_spans=reader.file_spans,
        )
        kineto.store_figures(store, reader.kineto, version, report)
    finally:
        # A batch still staging on its thread; the error being raised already says
        # what failed.
        with contextlib.suppress(Exception):
            reader.fast_batch.wait(store)
        staging.run(store, staging.sql("drop_stage"))
        staging.run(store, f"SET memory_limit = '{limit}'")
    report.seconds = time.perf_counter() - started
    return report


INGEST_MEMORY = "1GB"
"""DuckDB's memory cap while an ingest runs (what does not fit goes to its temp files)."""


class _Reader:
    """Reads one input after another into the stage, buffering Python-decoded rows."""

    def __init__(
        self,
        store: Store,
        log: ProblemLog,
        *,
        version: str | None = None,
        comm_pattern: re.Pattern[str] | None = None,
    ) -> None:
        self.store = store
        self.log = log
        self.version = version
        self.comm_pattern = comm_pattern
        self.kineto: list[kineto.KinetoResult] = []
        """Profiler files read: their GPU figures are stored after the spans."""
        self.pool: parallel.KinetoPool | None = None
        """Profiler files parsed by worker processes (:mod:`.parallel`)."""
        self.rows: list[tuple[Any, ...]] = []
        self.file_spans: dict[int, int] = {}
        # OTLP JSON-lines files share one batch of decoded columns, so a directory of
        # many small per-rank files costs about what one file of the same spans does;
        # the lines they leave to Python are decoded once all are read (:meth:`flush`).
        self.fast_batch = fast.Batch()
        self.fast_files: dict[int, tuple[detect.InputFile, Origin, bool, list[int]]] = {}
        self.fast_memory: dict[int, tuple[list[bytes], Origin, list[int]]] = {}

    def read_file(self, item: detect.InputFile, file_no: int) -> None:
        self.log.current_file = item.display
        origin = Origin(item.display, file_no, self.log)
        try:
            gz = detect.is_gzip(item.path)
            if kineto.is_kineto(item.path, gz):
                self._kineto(item, origin, gz)
                return
            sniffed = detect.sniff(item.path)
        except OSError as exc:
            self.log.add(
                item.display, f"cannot read: {exc.strerror or exc}", pk.MALFORMED, skipped=1
            )
            return
        if sniffed.layout == detect.EMPTY:
            self.log.add(item.display, "empty file", pk.EMPTY_FILE)
        elif sniffed.layout == detect.NOT_JSON:
            self._unrecognized(
                item, origin.at(sniffed.first_line), f"not JSON (starts with {sniffed.head!r})"
            )
        elif sniffed.layout == detect.LINES and otlp.is_otlp(sniffed.first_doc):
            self._otlp_lines(item, origin, sniffed.gzip)
        elif sniffed.layout == detect.LINES:
            self._python_lines(item, origin, sniffed.gzip, None)
        else:
            self._document(item, origin, sniffed.gzip)

    def _kineto(self, item: detect.InputFile, origin: Origin, gz: bool) -> None:
        if self.pool is not None and origin.file_no in self.pool:
            result = self.pool.take(origin, self.kineto)
        else:
            result = kineto.read_kineto(
                item.path,
                gz,
                origin,
                version=self.version,
                comm_pattern=self.comm_pattern,
                earlier=self.kineto,
            )
        if result is None:
            return
        self.kineto.append(result)
        self.rows.extend(result.rows)
        self.file_spans[origin.file_no] = len(result.rows)
        if len(self.rows) >= staging.BATCH_ROWS:
            self.flush()

    def _otlp_lines(self, item: detect.InputFile, origin: Origin, gz: bool) -> None:
        odd, cut = fast.read_lines(self.store, self.fast_batch, item.path, gz=gz, origin=origin)
        self.fast_files[origin.file_no] = (item, origin, gz, odd)
        if cut is not None:
            self._truncated(origin, cut)

    def memory_lines(self, lines: list[bytes], origin: Origin) -> None:
        """OTLP JSON lines held in memory (a receiver's batch): the fast path, as a file."""
        odd = fast.read_memory(self.store, self.fast_batch, lines, origin)
        self.fast_memory[origin.file_no] = (lines, origin, odd)

    def memory_lines_python(
        self, lines: list[bytes], origin: Origin, wanted: set[int], *, first: int = 1
    ) -> None:
        """Decode the ``wanted`` lines (numbered from ``first``) with the reference decoder."""
        for number in sorted(wanted):
            self._line(lines[number - first].decode(errors="replace"), origin, number)

    def _line(self, text: str, origin: Origin, number: int) -> None:
        """One JSON line through the reference decoder; a line that cannot be read is one
        problem at its number, and one too deep keeps what decodes alone."""
        try:
            doc = json.loads(text.rstrip())
        except json.JSONDecodeError as exc:
            self.log.add(
                origin.at(number),
                f"invalid JSON ({exc.msg} at column {exc.colno}); line skipped",
                pk.MALFORMED,
                skipped=1,
            )
            return
        except RecursionError:
            self._too_deep(text, origin, number)
            return
        self.dispatch(doc, origin, number, whole_file=None)

    def _finish_fast(self) -> None:
        """Stage the shared batch, then decode in Python the lines it could not take."""
        self.fast_batch.flush(self.store)
        files, self.fast_files = self.fast_files, {}
        memory, self.fast_memory = self.fast_memory, {}
        if not files and not memory:
            return
        flagged = fast.take_odd_lines(self.store)
        for file_no, n in fast.staged_counts(self.store).items():
            if file_no in files or file_no in memory:  # others' were counted as decoded
                self.file_spans[file_no] = self.file_spans.get(file_no, 0) + n
        for file_no, (item, origin, gz, odd) in files.items():
            wanted = set(odd) | flagged.get(file_no, set())
            if wanted:
                self.log.current_file = item.display
                self._python_lines(item, origin, gz, wanted, report_cut=False)
        for file_no, (lines, origin, odd) in memory.items():
            wanted = set(odd) | flagged.get(file_no, set())
            if wanted:
                self.log.current_file = origin.display
                self.memory_lines_python(lines, origin, wanted)

    def _too_deep(self, text: str, origin: Origin, number: int) -> None:
        """A line nested past ``json.loads``'s limit: keep the spans that decode alone."""
        doc = deep.split(text, origin, number)
        if doc is None:
            self.log.add(
                origin.at(number),
                f"JSON nested too deep to decode ({len(text):,} characters); line skipped",
                pk.MALFORMED,
                skipped=1,
            )
            return
        self.dispatch(doc, origin, number, whole_file=None)

    def _truncated(self, origin: Origin, line: int) -> None:
        self.log.add(
            origin.at(line),
            "truncated gzip stream; the complete lines before it were kept",
            pk.MALFORMED,
            skipped=1,
        )

    def _python_lines(
        self,
        item: detect.InputFile,
        origin: Origin,
        gz: bool,
        wanted: set[int] | None,
        *,
        report_cut: bool = True,
    ) -> None:
        lines = detect.iter_lines(item.path, gz, wanted)
        for number, line in lines:
            self._line(line, origin, number)
        if lines.cut is not None and report_cut:
            self._truncated(origin, lines.cut)

    def _document(self, item: detect.InputFile, origin: Origin, gz: bool) -> None:
        text, cut = detect.read_text(item.path, gz)
        if cut is not None:
            # What decodes before the cut is kept; the document it breaks is reported
            # below as invalid JSON, and the cut itself here.
            self._truncated(origin, cut)
        decoded = 0
        try:
            for line, doc in detect.iter_documents(text):
                decoded += 1
                self.dispatch(doc, origin, line, whole_file=item)
        except json.JSONDecodeError as exc:
            if decoded == 0 and detect.looks_like_lines(text, _is_trace):
                self._python_lines(item, origin, gz, None)
                return
            kept = f"; the {decoded} document(s) before it were kept" if decoded else ""
            self.log.add(
                origin.at(exc.lineno),
                f"invalid JSON ({exc.msg} at column {exc.colno}); rest of the file skipped{kept}",
                pk.MALFORMED,
                skipped=1,
            )

    def dispatch(
        self, doc: Any, origin: Origin, line: int, *, whole_file: detect.InputFile | None
    ) -> None:
        """Decode one parsed document; ``whole_file`` when it is the whole file's content."""
        if otlp.is_otlp(doc):
            rows = otlp.decode(doc, origin, line)
        elif otlp.is_api_v3_error(doc):
            self.log.add(
                origin.at(line),
                f"Jaeger api_v3 error: {doc['error'].get('message', doc['error'])}",
                pk.SOURCE_ERROR,
                skipped=1,
            )
            return
        elif jaeger.is_jaeger(doc):
            rows = jaeger.decode(doc, origin, line)
        elif whole_file is not None:
            self._unrecognized(whole_file, origin.at(line), f"not a trace document ({_shape(doc)})")
            return
        else:
            self.log.add(
                origin.at(line),
                f"not a trace document ({_shape(doc)}); skipped",
                pk.MALFORMED,
                skipped=1,
            )
            return
        n = 0
        for row in rows:
            self.rows.append(row)
            n += 1
            if len(self.rows) >= staging.BATCH_ROWS:
                self.flush()
        self.file_spans[origin.file_no] = self.file_spans.get(origin.file_no, 0) + n

    def _unrecognized(self, item: detect.InputFile, where: str, reason: str) -> None:
        # A stray file in a directory (a README, a manifest) is worth a warning; a file
        # the user named that holds no traces means the command did not do what was asked.
        self.log.add(where, f"{reason}; file skipped", pk.UNRECOGNIZED, skipped=int(item.explicit))

    def flush(self) -> None:
        self._finish_fast()
        staging.insert_rows(self.store, self.rows)
        self.rows = []


def _is_trace(doc: Any) -> bool:
    return otlp.is_otlp(doc) or jaeger.is_jaeger(doc)


def _shape(doc: Any) -> str:
    if isinstance(doc, dict):
        keys = ", ".join(list(doc)[:4])
        return f"an object with keys {keys}" if keys else "an empty object"
    return f"a JSON {type(doc).__name__}"


def _size(item: detect.InputFile) -> int:
    try:
        return item.path.stat().st_size
    except OSError:
        return 0  # reading it reports the problem
