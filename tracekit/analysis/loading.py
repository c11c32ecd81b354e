"""Traces into a store, then attribution: what ``tracekit ingest`` does, as one call.

:func:`ingest` reads trace files (or pulls from a running Jaeger) into a DuckDB file,
or through an in-memory staging store into a ClickHouse table (the OTel Collector
exporter's schema, docs/clickhouse.md), and attributes every touched request. It
returns one :class:`IngestOutcome`, which the renderers print.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import IngestReport, ingest_jaeger, ingest_paths
from tracekit.analysis.ingest.jaeger_api import DEFAULT_LIMIT
from tracekit.analysis.store import open_store
from tracekit.analysis.store.url import DEFAULT_TABLE, StoreURL, parse_store_url
from tracekit.errors import ConfigError

JAEGER_LIMIT = DEFAULT_LIMIT
"""Traces pulled from Jaeger when no limit is given."""


@dataclass
class IngestOutcome:
    """One ingest: what the readers found and what was done with it."""

    report: IngestReport
    store: str
    """Where the spans went (a DuckDB path or a ClickHouse URL without its password)."""
    requests_attributed: int
    version: str | None = None
    """The release label given for spans without one; a warning says when it could not
    apply."""
    jaeger_limit: int | None = None
    """The limit of a Jaeger pull, None for files."""
    written: int | None = None
    """ClickHouse only: spans written to the exporter's table."""
    already_present: int | None = None
    created_table: bool = False
    notes: list[str] = field(default_factory=list)
    store_discarded: bool = False
    """The DuckDB file this ingest would have created was removed: the input failed and
    nothing was stored."""
    exit_code: int | None = None
    """The process exit code of ``tracekit ingest``: set by the CLI, which owns exit
    codes (None from the library)."""

    @property
    def version_not_applied(self) -> bool:
        r = self.report
        return bool(self.version and r.releases and self.version not in r.releases)

    @property
    def limit_reached(self) -> bool:
        return self.jaeger_limit is not None and self.report.traces >= self.jaeger_limit


def ingest(
    paths: Sequence[str | Path] = (),
    *,
    store: str | Path = "tracekit.duckdb",
    table: str = DEFAULT_TABLE,
    version: str | None = None,
    strict: bool = False,
    comm_pattern: str | None = None,
    jaeger: str | None = None,
    service: str | None = None,
    since: str = "1h",
    limit: int = JAEGER_LIMIT,
    progress: Callable[[int, int], None] | Callable[[int, int, str], None] | None = None,
    jobs: int | None = None,
) -> IngestOutcome:
    """Read ``paths`` (files or directories), or pull ``service``'s traces from the Jaeger
    query service at ``jaeger``, into ``store``; then attribute the touched requests.

    Ingesting the same file twice stores nothing new. A problem that would skip input
    is counted in the report (``strict``: raised at the first one). ``progress`` is told
    after each file (:func:`~tracekit.analysis.ingest.ingest_paths`). ``jobs``: processes
    that parse PyTorch-profiler rank files at once (default: the CPU cores this process
    may use; 1: one after another, no process started); the store ends up the same
    either way. They are started with multiprocessing's ``forkserver`` method, so a
    script that calls this with more than one job needs the usual
    ``if __name__ == "__main__":`` guard.
    """
    target = parse_store_url(str(store), table=table)
    if jaeger and not service:
        raise ConfigError("--jaeger needs --service NAME (the service whose traces to pull)")
    if not jaeger and not paths:
        raise ConfigError("give trace files or directories, or --jaeger URL --service NAME")
    new_file = None if target.is_clickhouse else Path(target.path)
    if new_file is not None and (str(new_file) == ":memory:" or new_file.exists()):
        new_file = None
    try:
        outcome = _ingest_into(
            target, store, paths, version, strict, comm_pattern, jaeger, service, since,
            limit, progress, jobs,
        )  # fmt: skip
    except BaseException:
        _discard(new_file)
        raise
    if new_file is not None and outcome.report.skipped and not _stored_anything(outcome.report):
        _discard(new_file)  # a failed ingest into a new path leaves no empty store behind
        outcome.store_discarded = True
    return outcome


def _stored_anything(report: IngestReport) -> bool:
    return bool(report.spans_stored or report.profiles_stored)


def _discard(path: Path | None) -> None:
    """Remove a store file this call created (and DuckDB's write-ahead log beside it)."""
    if path is None:
        return
    for p in (path, path.with_name(path.name + ".wal")):
        p.unlink(missing_ok=True)


def _ingest_into(
    target: StoreURL,
    store: str | Path,
    paths: Sequence[str | Path],
    version: str | None,
    strict: bool,
    comm_pattern: str | None,
    jaeger: str | None,
    service: str | None,
    since: str,
    limit: int,
    progress: Callable[[int, int], None] | Callable[[int, int, str], None] | None,
    jobs: int | None,
) -> IngestOutcome:
    written = None
    # A ClickHouse store is written through an in-memory staging store: the same readers
    # and problem log, then the spans go to the exporter's table (docs/clickhouse.md).
    with open_store(":memory:" if target.is_clickhouse else target.path) as staging:
        if jaeger and service:
            report = ingest_jaeger(
                staging, jaeger, service, since=since, limit=limit, version=version, strict=strict
            )
        else:
            report = ingest_paths(
                staging,
                paths,
                version=version,
                strict=strict,
                progress=progress,
                comm_pattern=comm_pattern,
                jobs=jobs,
            )
        touched = None if report.every_trace else report.trace_ids
        requests = int(per_request.refresh(staging, touched).requests)
        if target.is_clickhouse:
            from tracekit.analysis.ingest.clickhouse import write_spans

            written = write_spans(staging, target)
    return IngestOutcome(
        report=report,
        store=target.display() if target.is_clickhouse else str(store),
        requests_attributed=requests,
        version=version,
        jaeger_limit=limit if jaeger else None,
        written=written.written if written is not None else None,
        already_present=written.already_present if written is not None else None,
        created_table=bool(written is not None and written.created_table),
    )
