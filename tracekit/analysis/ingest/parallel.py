"""Profiler rank files parsed in worker processes, handed to the reader in file order.

    with KinetoPool.start(files, jobs, version="64gpu", comm_pattern=None, on_done=tick) as pool:
        result = pool.take(origin, earlier)   # the reader, when it reaches a file

Parsing a Kineto file (:func:`.kineto.read_kineto`) is CPU-bound Python, so a directory
of rank files is parsed in ``jobs`` processes at once. Everything that decides what is
stored stays in the parent and in input order: a worker records the problems its file
had instead of logging them; the parent replays them into the ingest's log when the
reader reaches that file, then applies the one-profile-per-rank rule against the files
before it. The store, the problems and the exit code are those of a serial ingest. A
worker that dies loses only the file it was reading (reported as not read); the files
queued behind it go to a fresh worker.
"""

from __future__ import annotations

import inspect
import multiprocessing
import os
import re
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from tracekit.analysis.ingest import detect, kineto
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.ingest.rows import Origin
from tracekit.errors import ConfigError, IngestError

QUEUED_PER_WORKER = 2
"""Files handed to a worker at a time: the next is there when one ends (the parent may be
busy writing), and a worker reads its files in order, so when it dies the first of them
not finished is the one it was reading."""

WORKER_DIED = (
    "not read: the worker process parsing it died (killed, or out of memory?); "
    "file skipped, nothing from it stored"
)


def default_jobs() -> int:
    """The CPU cores this process may run on (its affinity mask, not the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def resolve_jobs(jobs: int | None) -> int:
    """``jobs`` checked, or :func:`default_jobs` for None."""
    if jobs is None:
        return default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(
            f"--jobs {jobs!r}: give a whole number of processes, 1 or more "
            "(1 reads the files one after another)"
        )
    return jobs


# --- the worker's side -----------------------------------------------------------------


@dataclass
class Parsed:
    """What a worker hands back for one file."""

    result: kineto.KinetoResult | None
    problems: list[tuple[str, str, str, int, int]]
    """The file's ``ProblemLog.add`` calls in order: (where, reason, kind, skipped, n)."""


class _Recorder(ProblemLog):
    """A worker's problem log: keeps each call for the parent to replay. Never raises:
    ``strict`` is the parent's to apply, in file order."""

    def __init__(self, display: str) -> None:
        super().__init__(strict=False)
        self.current_file = display
        self.calls: list[tuple[str, str, str, int, int]] = []

    def add(self, where: str, reason: str, kind: str, *, skipped: int = 0, n: int = 1) -> None:
        self.calls.append((where, reason, kind, skipped, n))


def parse(
    path: Path,
    display: str,
    file_no: int,
    gz: bool,
    version: str | None,
    comm_pattern: re.Pattern[str] | None,
) -> Parsed:
    """One rank file read in a worker, as the serial path reads it but without ``earlier``."""
    log = _Recorder(display)
    origin = Origin(display, file_no, log)
    result = kineto.read_kineto(path, gz, origin, version=version, comm_pattern=comm_pattern)
    return Parsed(result, log.calls)


# --- the parent's side -----------------------------------------------------------------


@dataclass(frozen=True)
class _Task:
    file_no: int
    path: Path
    display: str
    gz: bool


def _started() -> bool:
    return True


class _Worker:
    """One worker process (an executor of one): files run one after another, in order.

    Its first task does nothing: when that fails, the process died while starting, not
    on a file.
    """

    def __init__(self, context: multiprocessing.context.BaseContext) -> None:
        self.context = context
        self.queued: deque[tuple[_Task, Future[Parsed]]] = deque()
        self._start()

    def _start(self) -> None:
        self.executor = ProcessPoolExecutor(max_workers=1, mp_context=self.context)
        self.started = self.executor.submit(_started)

    def restart(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.queued.clear()
        self._start()

    def check_started(self) -> None:
        if self.started.done() and isinstance(self.started.exception(), BrokenProcessPool):
            raise IngestError(
                "--jobs",
                "a worker process died while starting: a script that calls tracekit's "
                'ingest with jobs above 1 needs `if __name__ == "__main__":` around that '
                "call (multiprocessing re-imports the script in each worker); or use --jobs 1",
            )


def _context() -> multiprocessing.context.BaseContext:
    # Not "fork": the parent holds an open DuckDB connection (its threads and their
    # locks) and maybe a progress bar's refresh thread, and a child forked from a
    # threaded process can inherit a lock some thread held and hang on it. "forkserver"
    # forks each worker from a small single-threaded server started once, with the
    # parsing modules already imported there (so a worker starts in milliseconds;
    # "spawn" starts a fresh interpreter and re-imports them, ~0.4 s per worker). Where
    # there is no forkserver (Windows), "spawn".
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    # Takes effect when this process's forkserver starts (not if it already runs).
    context.set_forkserver_preload([__name__])
    return context


def _sniff(path: Path) -> bool | None:
    """Whether the file is gzip when it is a Kineto file, else None (the reader reports
    files that cannot be read)."""
    try:
        gz = detect.is_gzip(path)
    except OSError:
        return None
    return gz if kineto.is_kineto(path, gz) else None


class KinetoPool:
    """The Kineto files of one ingest, parsed ahead by worker processes.

    Holds no process when there is nothing to share out (``jobs`` 1, fewer than two
    Kineto files): then ``file_no in pool`` is always False and the reader parses in
    this process.
    """

    def __init__(
        self,
        tasks: list[_Task],
        jobs: int,
        *,
        version: str | None,
        comm_pattern: re.Pattern[str] | None,
        on_done: Callable[[int], None],
    ) -> None:
        self._queue = deque(tasks)
        self._members = {t.file_no for t in tasks}
        self._options = (version, comm_pattern)
        self._on_done = on_done
        self._finished: dict[int, Parsed | BaseException] = {}
        context = _context() if tasks else None
        self._workers = [_Worker(context) for _ in range(min(jobs, len(tasks)))] if context else []

    @classmethod
    def start(
        cls,
        files: Sequence[detect.InputFile],
        jobs: int,
        *,
        version: str | None,
        comm_pattern: re.Pattern[str] | None,
        on_done: Callable[[int], None],
    ) -> KinetoPool:
        """Find the Kineto files among ``files`` and start parsing them (in input order)."""
        tasks: list[_Task] = []
        if jobs > 1 and len(files) > 1:
            for file_no, item in enumerate(files):
                gz = _sniff(item.path)
                if gz is not None:
                    tasks.append(_Task(file_no, item.path, item.display, gz))
        if len(tasks) < 2:
            tasks = []
        pool = cls(tasks, jobs, version=version, comm_pattern=comm_pattern, on_done=on_done)
        pool.poll()
        return pool

    def __contains__(self, file_no: object) -> bool:
        return file_no in self._members

    def take(
        self, origin: Origin, earlier: list[kineto.KinetoResult]
    ) -> kineto.KinetoResult | None:
        """The file's result once parsed, its problems now in ``origin.log``; None when it
        was unreadable or is a second file of a rank in ``earlier`` (as ``read_kineto``)."""
        file_no = origin.file_no
        if file_no not in self._members:
            raise KeyError(file_no)
        while file_no not in self._finished:
            self._fill()
            wait([f for w in self._workers for _, f in w.queued], return_when=FIRST_COMPLETED)
            self._collect()
        parsed = self._finished.pop(file_no)
        if isinstance(parsed, BaseException):
            raise parsed  # what the serial path would have raised on this file
        for where, reason, kind, skipped, n in parsed.problems:
            origin.log.add(where, reason, kind, skipped=skipped, n=n)
        if parsed.result is None or kineto.rank_again(parsed.result, earlier, origin):
            return None
        return parsed.result

    def poll(self) -> None:
        """Collect what finished and hand out more, without waiting."""
        self._collect()
        self._fill()

    def close(self, *, cancel: bool = False) -> None:
        for worker in self._workers:
            worker.executor.shutdown(wait=not cancel, cancel_futures=True)
        self._workers = []

    def __enter__(self) -> KinetoPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # On an error (a strict ingest's first problem) the files still being parsed
        # are abandoned, not waited for.
        self.close(cancel=exc_type is not None)

    def _fill(self) -> None:
        version, comm_pattern = self._options
        for worker in self._workers:
            while self._queue and len(worker.queued) < QUEUED_PER_WORKER:
                t = self._queue.popleft()
                future = worker.executor.submit(
                    parse, t.path, t.display, t.file_no, t.gz, version, comm_pattern
                )
                worker.queued.append((t, future))

    def _collect(self) -> None:
        for worker in self._workers:
            worker.check_started()
            while worker.queued and worker.queued[0][1].done():
                task, future = worker.queued.popleft()
                error = future.exception()
                if isinstance(error, BrokenProcessPool):
                    # It died reading this file; those queued behind it never started.
                    self._finish(task.file_no, Parsed(None, [_died(task)]))
                    self._queue.extendleft(reversed([t for t, _ in worker.queued]))
                    worker.restart()
                    break
                self._finish(task.file_no, error if error is not None else future.result())

    def _finish(self, file_no: int, outcome: Parsed | BaseException) -> None:
        self._finished[file_no] = outcome
        self._on_done(file_no)


def _died(task: _Task) -> tuple[str, str, str, int, int]:
    return (task.display, WORKER_DIED, pk.MALFORMED, 1, 1)


class FileProgress:
    """Tells ``progress`` after each input file, in the order files finish: bytes done
    of all, and the file's name when the callback takes a third argument."""

    def __init__(
        self,
        progress: Callable[..., None] | None,
        names: Sequence[str],
        sizes: Sequence[int],
    ) -> None:
        self._progress = progress
        self._names = names
        self._sizes = sizes
        self._total = sum(sizes)
        self._done = 0
        self._told: set[int] = set()
        self._named = progress is not None and _takes_name(progress)

    def __call__(self, file_no: int) -> None:
        if self._progress is None or file_no in self._told:
            return
        self._told.add(file_no)
        self._done += self._sizes[file_no]
        if self._named:
            self._progress(self._done, self._total, self._names[file_no])
        else:
            self._progress(self._done, self._total)


def _takes_name(progress: Callable[..., Any]) -> bool:
    try:
        inspect.signature(progress).bind(0, 0, "")
    except (TypeError, ValueError):  # two arguments only, or no signature to read
        return False
    return True
