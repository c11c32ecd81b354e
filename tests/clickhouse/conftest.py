"""A real ClickHouse engine for the ClickHouse-store tests.

By default that is chDB (ClickHouse embedded in this process) in one directory per test
session: chDB allows one engine path per process, so every test gets its own *table* in
it instead of its own directory. With ``TRACEKIT_TEST_CLICKHOUSE_URL`` set (for example
``clickhouse://default:@127.0.0.1:8123/default``) the same tests run against that server;
the user needs CREATE/INSERT/DROP on the database for the fixtures, while the analysis
under test only reads.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("clickhouse_connect", reason="the clickhouse extra is not installed")

SERVER_URL = os.environ.get("TRACEKIT_TEST_CLICKHOUSE_URL", "")


@pytest.fixture(scope="session")
def clickhouse_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The store URL every test in this folder writes to and reads from."""
    if SERVER_URL:
        return SERVER_URL
    pytest.importorskip("chdb", reason="chdb is not installed (the clickhouse extra)")
    path: Path = tmp_path_factory.mktemp("chdb")
    return f"chdb://{path}"


@pytest.fixture
def table(clickhouse_url: str) -> Iterator[str]:
    """A fresh table name, dropped after the test."""
    from tracekit.analysis.store.clickhouse import connect
    from tracekit.analysis.store.url import parse_store_url

    name = f"otel_traces_{uuid.uuid4().hex[:10]}"
    yield name
    url = parse_store_url(clickhouse_url, table=name)
    client = connect(url)
    try:
        client.command(f"DROP TABLE IF EXISTS `{url.database}`.`{name}`")
    finally:
        client.close()


@pytest.fixture(scope="module", autouse=True)
def engine(clickhouse_url: str) -> Iterator[None]:
    """A client held open for the module: chDB then keeps its engine up between the
    commands' own connections, each of which would otherwise start it again (~0.2 s)."""
    from tracekit.analysis.store.clickhouse import connect
    from tracekit.analysis.store.url import parse_store_url

    client = connect(parse_store_url(clickhouse_url))
    yield
    client.close()
