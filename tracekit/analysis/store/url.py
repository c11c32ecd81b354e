"""Where a store lives: parsing ``--store URL`` into a :class:`StoreURL`.

Three kinds share one option:

* a DuckDB file path (``tracekit.duckdb``, ``:memory:``) — tracekit's own store;
* ``clickhouse://user:password@host:8123/database`` — a ClickHouse server over its HTTP
  interface (``clickhouses://`` or port 8443/443 for HTTPS), holding the table the
  OpenTelemetry Collector's ClickHouse exporter writes (``otel_traces`` by default);
* ``chdb:///path/to/dir`` — the same engine embedded in this process (chDB), the same SQL.

Parsing never connects; a malformed URL is a :class:`~tracekit.errors.ConfigError` of one
line. Database and table names are identifiers from an allow-list pattern, because they
are the only parts of the ClickHouse SQL that cannot be bound parameters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from tracekit.errors import ConfigError

DEFAULT_TABLE = "otel_traces"
"""The OpenTelemetry Collector ClickHouse exporter's default traces table."""
DEFAULT_DATABASE = "default"
DEFAULT_HTTP_PORT = 8123

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

StoreKind = Literal["duckdb", "clickhouse", "chdb"]


@dataclass(frozen=True)
class StoreURL:
    """A parsed ``--store`` value; ``path`` for DuckDB and chDB, host fields for a server."""

    kind: StoreKind
    path: str = ""
    host: str = ""
    port: int = DEFAULT_HTTP_PORT
    user: str = "default"
    password: str = ""
    database: str = DEFAULT_DATABASE
    secure: bool = False
    table: str = DEFAULT_TABLE

    @property
    def is_clickhouse(self) -> bool:
        """ClickHouse engine behind it (a server or chDB), read through the exporter schema."""
        return self.kind != "duckdb"

    def display(self) -> str:
        """The URL as it may be printed: never with the password."""
        if self.kind == "duckdb":
            return self.path
        if self.kind == "chdb":
            return f"chdb://{self.path} ({self.database}.{self.table})"
        scheme = "clickhouses" if self.secure else "clickhouse"
        who = f"{self.user}@" if self.user else ""
        return f"{scheme}://{who}{self.host}:{self.port}/{self.database} ({self.table})"


def check_identifier(name: str, what: str) -> str:
    """``name`` when it is a plain ClickHouse identifier, else a ConfigError naming ``what``."""
    if not _IDENTIFIER.fullmatch(name):
        raise ConfigError(
            f"{what} {name!r} is not a plain identifier (letters, digits, underscore; "
            "not starting with a digit)"
        )
    return name


def parse_store_url(text: str, *, table: str = DEFAULT_TABLE) -> StoreURL:
    """Parse ``--store`` (and ``--table``) into a :class:`StoreURL`; raises ConfigError."""
    raw = text.strip()
    if not raw:
        raise ConfigError("--store is empty: give a DuckDB file, clickhouse://… or chdb:///…")
    scheme, sep, _ = raw.partition("://")
    if not sep:
        # No scheme: a DuckDB file. Reject "chdb:/x" style typos instead of creating
        # a DuckDB file named like a URL.
        if re.match(r"^(clickhouses?|chdb|https?):", raw):
            raise ConfigError(
                f"--store {raw!r}: expected clickhouse://host:8123/db or chdb:///path "
                "(scheme, then ://)"
            )
        return StoreURL(kind="duckdb", path=raw)
    scheme = scheme.lower()
    check_identifier(table, "--table")
    if scheme == "chdb":
        return _parse_chdb(raw, table)
    if scheme in ("clickhouse", "clickhouses"):
        return _parse_server(raw, scheme == "clickhouses", table)
    raise ConfigError(
        f"--store {_redact(raw)!r}: unknown scheme {scheme!r}; use a DuckDB file path, "
        "clickhouse://user:password@host:8123/database or chdb:///path"
    )


def _parse_chdb(raw: str, table: str) -> StoreURL:
    parts = urlsplit(raw)
    # chdb:///abs/dir (empty netloc) or chdb://rel/dir: the location is everything after //.
    path = unquote(parts.netloc + parts.path)
    if not path or path in ("/", "memory", ":memory:"):
        raise ConfigError(
            f"--store {raw!r}: chDB needs a directory, e.g. chdb:///var/lib/traces "
            "(an in-memory engine would be empty)"
        )
    query = parse_qs(parts.query)
    database = query.get("database", [DEFAULT_DATABASE])[0]
    check_identifier(database, f"--store {raw!r}: database")
    return StoreURL(kind="chdb", path=path, database=database, table=table)


def _parse_server(raw: str, secure: bool, table: str) -> StoreURL:
    parts = urlsplit(raw)
    shown = _redact(raw)
    if not parts.hostname:
        raise ConfigError(
            f"--store {shown!r}: no host; expected clickhouse://user:password@host:8123/database"
        )
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"--store {shown!r}: the port is not a number in 1–65535") from None
    if port is None:
        port = 8443 if secure else DEFAULT_HTTP_PORT
    if port == 9000 or port == 9440:
        raise ConfigError(
            f"--store {shown!r}: port {port} is ClickHouse's native TCP protocol; tracekit "
            "speaks HTTP (usually 8123, or 8443 with TLS)"
        )
    segments = [s for s in parts.path.split("/") if s]
    if len(segments) > 1:
        raise ConfigError(f"--store {shown!r}: the path names one database, e.g. /otel")
    database = unquote(segments[0]) if segments else DEFAULT_DATABASE
    check_identifier(database, f"--store {shown!r}: database")
    return StoreURL(
        kind="clickhouse",
        host=parts.hostname,
        port=port,
        user=unquote(parts.username) if parts.username else "default",
        password=unquote(parts.password) if parts.password else "",
        database=database,
        secure=secure or port in (443, 8443),
        table=table,
    )


def _redact(raw: str) -> str:
    """The URL with any password replaced, for error messages."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", raw)
