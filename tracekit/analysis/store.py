"""The DuckDB store: opening it, its schema, and the few writes every module shares.

The schema lives in ``sql/schema.sql``. Spans are keyed by (trace_id, span_id), so
re-ingesting a file changes nothing. Derived tables (``requests``, ``request_stages``)
are rebuilt by :func:`tracekit.analysis.attribution.refresh`.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tracekit.errors import QueryError

try:
    import duckdb
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "tracekit analysis needs duckdb: pip install 'tracekit[analysis]'"
    ) from exc

DEFAULT_DB = "tracekit.duckdb"

SPAN_COLUMNS: tuple[str, ...] = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_ns",
    "end_ns",
    "status_code",
    "service_name",
    "service_version",
    "instance_id",
    "host_name",
    "stage",
    "time_kind",
    "cpu_time_ns",
    "gpu_time_ns",
    "sample_weight",
    "attributes",
    "resource_attributes",
    "links",
    "source",
)
"""Column order of ``spans``; a span row is a tuple in this order."""


def schema_sql() -> str:
    """The DDL that creates every table (idempotent)."""
    return importlib.resources.files("tracekit.analysis").joinpath("sql/schema.sql").read_text()


class Store:
    """An open tracekit DuckDB database."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str) -> None:
        self.con = con
        self.path = path

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def insert_spans(self, rows: Sequence[Sequence[Any]]) -> int:
        """Insert span rows (tuples in :data:`SPAN_COLUMNS` order); existing keys are kept.

        Returns the number of rows newly stored.
        """
        if not rows:
            return 0
        before = self.span_count()
        cols = ", ".join(SPAN_COLUMNS)
        marks = ", ".join("?" for _ in SPAN_COLUMNS)
        self.con.execute("BEGIN")
        try:
            self.con.executemany(
                f"INSERT OR IGNORE INTO spans ({cols}) VALUES ({marks})", [list(r) for r in rows]
            )
            self.con.execute("COMMIT")
        except Exception:
            self.con.execute("ROLLBACK")
            raise
        return self.span_count() - before

    def span_count(self) -> int:
        row = self.con.execute("SELECT count(*) FROM spans").fetchone()
        return int(row[0]) if row else 0

    def releases(self) -> list[tuple[str, int]]:
        """(release label, request count), most requests first."""
        rows = self.con.execute(
            "SELECT coalesce(release, ''), count(*) FROM requests GROUP BY 1 ORDER BY 2 DESC, 1"
        ).fetchall()
        return [(str(r[0]), int(r[1])) for r in rows]

    def require_release(self, release: str) -> None:
        """Raise :class:`QueryError` naming the releases present when ``release`` is absent."""
        known = self.releases()
        if not any(label == release for label, _ in known):
            present = ", ".join(f"{label or '(none)'} ({n})" for label, n in known) or "none"
            raise QueryError(
                f"no requests for release {release!r} in {self.path}; releases present: {present}. "
                "Ingest its traces first (tracekit ingest FILE --version LABEL sets a label)."
            )


def open_store(path: str | Path = DEFAULT_DB, *, read_only: bool = False) -> Store:
    """Open (creating when needed) the store at ``path``; ``:memory:`` works too."""
    p = str(path)
    if read_only and p != ":memory:" and not Path(p).exists():
        raise QueryError(f"no tracekit store at {p}: run `tracekit ingest FILE --db {p}` first")
    try:
        con = duckdb.connect(p, read_only=read_only)
    except duckdb.Error as exc:
        raise QueryError(f"cannot open store {p}: {exc}") from exc
    if not read_only:
        con.execute(schema_sql())
    return Store(con, p)


def iter_chunks(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    """Yield lists of at most ``size`` items."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
