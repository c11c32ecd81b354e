"""The DuckDB store: opening it, its schema, and the few writes every module shares.

The schema lives in ``sql/schema.sql``. Spans are keyed by (trace_id, span_id), so
re-ingesting a file changes nothing. Derived tables (``requests``, ``request_stages``)
are rebuilt by :func:`tracekit.analysis.attribution.per_request.refresh`; ``profiles``
(captures on trigger, keyed by their id) is written at ingest. A store written before a
table existed gains it when next opened for writing; read-only, ask :meth:`Store.has_table`.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tracekit.errors import QueryError

try:
    import duckdb
    import numpy as np
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("tracekit analysis needs duckdb: pip install 'tracekit[analysis]'") from exc

DEFAULT_DB = "tracekit.duckdb"

DatabaseError = duckdb.Error
"""What the database raises; the only name outside this package that stands for it, so
callers translate it (``raise QueryError(...) from exc``) without importing duckdb."""


def is_lock_error(exc: BaseException) -> bool:
    """True when the database refused the file because another process holds it."""
    return isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower()


def is_transient_error(exc: BaseException) -> bool:
    """True for a failure of the file, the disk or memory (held by another process, no
    space left, an I/O error, out of memory): the same work may succeed later."""
    return isinstance(exc, duckdb.IOException | duckdb.OutOfMemoryException | OSError)


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

_NON_VARCHAR = {
    "start_ns": "BIGINT",
    "end_ns": "BIGINT",
    "cpu_time_ns": "BIGINT",
    "gpu_time_ns": "BIGINT",
    "sample_weight": "DOUBLE",
    "attributes": "JSON",
    "resource_attributes": "JSON",
    "links": "JSON",
}
SPAN_TYPES: dict[str, str] = {c: _NON_VARCHAR.get(c, "VARCHAR") for c in SPAN_COLUMNS}
"""DuckDB type of each ``spans`` column (as written in ``sql/schema.sql``)."""


@functools.cache
def named_statements(filename: str) -> dict[str, str]:
    """The statements of ``sql/FILENAME``, each following a ``-- name: NAME`` line, by
    name; whole-line ``--`` comments inside a statement are dropped."""
    text = importlib.resources.files("tracekit.analysis.store").joinpath(f"sql/{filename}")
    out: dict[str, str] = {}
    for chunk in text.read_text().split("-- name: ")[1:]:
        name, _, body = chunk.partition("\n")
        lines = [line for line in body.splitlines() if not line.lstrip().startswith("--")]
        out[name.strip()] = "\n".join(lines).strip()
    return out


def schema_sql() -> str:
    """The DDL that creates every table (idempotent)."""
    return (
        importlib.resources.files("tracekit.analysis.store").joinpath("sql/schema.sql").read_text()
    )


def _unkeyed_table(table: str) -> tuple[str, str]:
    """(``CREATE TABLE`` of ``table`` from schema.sql without its key, the key's columns)."""
    ddl = re.search(
        rf"CREATE TABLE IF NOT EXISTS {table} \((.*?)\n\);", schema_sql(), flags=re.DOTALL
    )
    if ddl is None:
        raise ValueError(f"schema.sql has no table {table}")
    lines = [ln.split("--")[0].rstrip() for ln in ddl.group(1).splitlines()]
    lines = [ln for ln in lines if ln.strip()]
    key = ""
    kept = []
    for ln in lines:
        if m := re.fullmatch(r"\s*PRIMARY KEY \((.*)\),?", ln):
            key = m.group(1)
        elif m := re.fullmatch(r"(\s*(\w+)\s.*?) PRIMARY KEY(,?)", ln):
            key = m.group(2)
            kept.append(m.group(1) + m.group(3))
        else:
            kept.append(ln)
    if not key:
        raise ValueError(f"table {table} has no primary key")
    body = ",\n".join(ln.rstrip(",") for ln in kept)
    return f"CREATE TABLE {table} (\n{body}\n)", key


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

        Returns the number of rows newly stored. The rows reach DuckDB as numpy columns
        (``executemany`` manages about a thousand rows a second).
        """
        if not rows:
            return 0
        before = self.span_count()
        self.run("BEGIN")
        try:
            self.register_rows("_tk_insert", SPAN_COLUMNS, rows)
            try:
                select = ", ".join(f"CAST({c} AS {SPAN_TYPES[c]})" for c in SPAN_COLUMNS)
                self.run(
                    f"INSERT OR IGNORE INTO spans ({', '.join(SPAN_COLUMNS)}) "
                    f"SELECT {select} FROM _tk_insert"
                )
            finally:
                self.con.unregister("_tk_insert")
            self.run("COMMIT")
        except duckdb.Error:
            self.run("ROLLBACK")
            raise
        return self.span_count() - before

    def rollback(self) -> None:
        """Undo the open transaction; nothing to do when a failed COMMIT already ended it."""
        try:
            self.con.execute("ROLLBACK")
        except duckdb.TransactionException as exc:
            if "no transaction is active" not in str(exc):
                raise

    def insert_keyed(self, table: str, insert_sql: str, params: Any = None) -> None:
        """Run ``insert_sql`` (an ``INSERT INTO table …``) inside the caller's transaction.

        Into an empty table the primary key is built after the rows are in: DuckDB then
        builds its index in one pass instead of probing it for each row (320k spans:
        1.2 s of CPU instead of 1.5 s). A repeated key still fails the statement.
        """
        got = self.con.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {table})").fetchone()
        if not (got and got[0]):
            self.con.execute(insert_sql, params if params is not None else [])
            return
        ddl, key = _unkeyed_table(table)
        self.con.execute(f"DROP TABLE {table}")
        self.con.execute(ddl)
        self.con.execute(insert_sql, params if params is not None else [])
        self.con.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({key})")

    def run(self, sql: str, params: Any = None) -> list[Any]:
        """Execute and fetch everything: DuckDB refuses new work while a result is pending."""
        return self.con.execute(sql, params if params is not None else []).fetchall()

    def register_rows(
        self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Expose ``rows`` (tuples in ``columns`` order) as the view ``name``; unregister after."""
        frame: dict[str, np.ndarray] = {}
        for column, values in zip(columns, zip(*rows, strict=True), strict=True):
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            frame[column] = arr
        self.con.register(name, frame)

    def has_table(self, name: str) -> bool:
        """Whether the table exists (a store written by an older tracekit may lack one)."""
        rows = self.run(
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_schema = 'main' AND table_name = $name",
            {"name": name},
        )
        return bool(rows and rows[0][0])

    def span_count(self) -> int:
        rows = self.run("SELECT count(*) FROM spans")
        return int(rows[0][0]) if rows else 0

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


def open_store(
    path: str | Path = DEFAULT_DB,
    *,
    read_only: bool = False,
    table: str = "otel_traces",
    selection: Any = None,
) -> Store:
    """Open (creating when needed) the store at ``path``; ``:memory:`` works too.

    A ``clickhouse://`` or ``chdb://`` URL (read-only) pulls the ``selection``
    (:class:`~tracekit.analysis.store.clickhouse.Selection`) of ``table`` into an
    in-memory store whose ``requests`` still need attribution (see store/clickhouse.py).
    """
    p = str(path)
    if "://" in p:
        from tracekit.analysis.store.clickhouse import open_url

        return open_url(p, table=table, selection=selection, read_only=read_only)
    if read_only and p != ":memory:" and not Path(p).exists():
        raise QueryError(f"no tracekit store at {p}: run `tracekit ingest FILE --db {p}` first")
    con = _connect(p, read_only=read_only)
    if p != ":memory:" and not _file_backed(con):
        con.close()
        raise QueryError(
            f"{p} is not a DuckDB database but a data file (DuckDB would read it in memory "
            "and keep nothing written to it): give the store its own path, e.g. --db "
            "tracekit.duckdb"
        )
    if not read_only:
        con.execute(schema_sql()).fetchall()
        return Store(con, p)
    tables = {
        str(r[0])
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'"
        ).fetchall()
    }
    missing = sorted({"spans", "requests", "request_stages"} - tables)
    if missing:
        con.close()
        raise QueryError(
            f"{p} is not a tracekit store (no table {', '.join(missing)}): "
            f"run `tracekit ingest FILE --db {p}` first, or pass the store with --db"
        )
    return Store(con, p)


LOCK_WAIT_S = 30.0
"""How long opening waits while another process (``tracekit collect`` writing a batch,
another command) holds the file: DuckDB allows one writer process and no reader beside it."""


def _file_backed(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's database is a file. DuckDB opens an existing JSON, CSV or
    Parquet file given as a database path as an in-memory database over that file."""
    row = con.execute(
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()"
    ).fetchone()
    return row is not None and row[0] is not None


def _connect(path: str, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """Connect, backing off while another process holds the file's lock."""
    import time

    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.01
    while True:
        try:
            return duckdb.connect(path, read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise QueryError(f"cannot open store {path}: {exc}") from exc
        except duckdb.Error as exc:
            raise QueryError(f"cannot open store {path}: {exc}") from exc
        time.sleep(delay)
        delay = min(delay * 2, 0.25)


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
