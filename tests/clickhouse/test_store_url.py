"""--store URLs: parsing, and the one-line errors (exit 2) for bad URLs, tables, servers."""

from __future__ import annotations

import contextlib
import io
import socket

import pytest

from tracekit.analysis.store.url import parse_store_url
from tracekit.cli import main
from tracekit.errors import ConfigError


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, err.getvalue()


def test_a_plain_path_is_a_duckdb_store() -> None:
    url = parse_store_url("perf.duckdb")
    assert (url.kind, url.path, url.is_clickhouse) == ("duckdb", "perf.duckdb", False)


def test_a_clickhouse_url_names_host_port_user_database_and_table() -> None:
    url = parse_store_url("clickhouse://reader:s%40cret@ch.internal:8123/otel", table="spans")
    assert (url.kind, url.host, url.port, url.user, url.password) == (
        "clickhouse",
        "ch.internal",
        8123,
        "reader",
        "s@cret",
    )
    assert (url.database, url.table, url.secure) == ("otel", "spans", False)
    assert "s@cret" not in url.display()


def test_https_by_scheme_or_port() -> None:
    assert parse_store_url("clickhouses://h/otel").port == 8443
    assert parse_store_url("clickhouse://h:8443/otel").secure


def test_a_chdb_url_is_a_directory() -> None:
    url = parse_store_url("chdb:///var/lib/traces?database=otel")
    assert (url.kind, url.path, url.database) == ("chdb", "/var/lib/traces", "otel")


@pytest.mark.parametrize(
    ("text", "table", "says"),
    [
        ("mysql://h/db", "otel_traces", "unknown scheme"),
        ("clickhouse:///otel", "otel_traces", "no host"),
        ("clickhouse://h:9000/otel", "otel_traces", "native TCP"),
        ("clickhouse://h:port/otel", "otel_traces", "port"),
        ("clickhouse://h/otel/x", "otel_traces", "one database"),
        ("clickhouse://h/ot-el", "otel_traces", "not a plain identifier"),
        ("clickhouse://h/otel", "t; DROP TABLE x", "--table"),
        ("chdb://", "otel_traces", "needs a directory"),
        ("chdb:/tmp/x", "otel_traces", "scheme, then ://"),
    ],
)
def test_bad_urls_are_config_errors(text: str, table: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_store_url(text, table=table)


def test_a_password_never_appears_in_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        parse_store_url("clickhouse://u:topsecret@h:9000/otel")
    assert "topsecret" not in str(info.value)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_server_is_one_line_and_exit_2() -> None:
    url = f"clickhouse://default:pw@127.0.0.1:{_closed_port()}/otel"
    rc, err = run("diff", "--before", "v1", "--after", "v2", "--store", url)
    assert rc == 2
    assert err.count("\n") == 1 and "cannot open ClickHouse store" in err
    assert "pw@" not in err


def test_a_bad_url_on_the_command_line_is_exit_2() -> None:
    rc, err = run("summary", "--store", "clickhouse://h:9000/otel")
    assert rc == 2 and err.count("\n") == 1 and "native TCP" in err


def test_since_is_refused_for_a_duckdb_store(tmp_path) -> None:
    rc, err = run("summary", "--db", str(tmp_path / "x.duckdb"), "--since", "2h")
    assert rc == 2 and "ClickHouse store" in err
