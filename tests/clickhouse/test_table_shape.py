"""The exporter's table: its DDL verbatim, shape checks, weights and what is pushed down."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import io

import pytest

from tracekit import conventions as cv
from tracekit.analysis.ingest.clickhouse import INSERT_COLUMNS, as_string
from tracekit.analysis.store.clickhouse import Selection, connect, open_snapshot, traces_table_ddl
from tracekit.analysis.store.url import parse_store_url
from tracekit.cli import main
from tracekit.testing import EPOCH_NS

# sha256 of the exporter's traces_table.sql (opentelemetry-collector-contrib
# f92a5763be13aeb59ecf6f8b47e31d54109191bb) as tracekit keeps it, comment lines aside.
UPSTREAM_SHA256 = "2e79e6d9f9cbe563e51097df33dbbf5b587a6525b4833affb798941a514699d6"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_the_ddl_is_the_exporters_verbatim() -> None:
    text = (
        importlib.resources.files("tracekit.analysis.store")
        .joinpath("sql/clickhouse_traces_table.sql")
        .read_text()
    )
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("--"))
    assert hashlib.sha256(body.encode()).hexdigest() == UPSTREAM_SHA256
    assert body.count("%s") == 5


def _client(url_text: str, table: str):
    url = parse_store_url(url_text, table=table)
    client = connect(url)
    client.command(traces_table_ddl(url.database, table))
    return url, client


def _span(trace: str, span: str, parent: str, *, version: str, state: str = "", attrs=None):
    row = {c: None for c in INSERT_COLUMNS}
    row.update(
        {
            "Timestamp": EPOCH_NS + int(span, 16) % 1000 * 1_000_000,
            "TraceId": trace,
            "SpanId": span,
            "ParentSpanId": parent,
            "TraceState": state,
            "SpanName": "POST /predict" if not parent else "child",
            "SpanKind": "Server" if not parent else "SPAN_KIND_INTERNAL",
            "ServiceName": "ranker",
            "ResourceAttributes": {"service.name": "ranker", "service.version": version},
            "ScopeName": "",
            "ScopeVersion": "",
            "SpanAttributes": attrs or {},
            "Duration": 10_000_000 if not parent else 4_000_000,
            "StatusCode": "Unset",
            "StatusMessage": "",
            "Events.Timestamp": [],
            "Events.Name": [],
            "Events.Attributes": [],
            "Links.TraceId": [],
            "Links.SpanId": [],
            "Links.TraceState": [],
            "Links.Attributes": [],
        }
    )
    return [row[c] for c in INSERT_COLUMNS]


def test_weights_from_the_attribute_then_ot_th_then_one(clickhouse_url: str, table: str) -> None:
    url, client = _client(clickhouse_url, table)
    rows = [
        # ot=th:8 → T = 2^55, adjusted count 2^56 / (2^56 − 2^55) = 2 (OTel probability sampling)
        _span("a" * 32, "1" * 16, "", version="v1", state="ot=th:8;rv:0123456789abcd"),
        _span(
            "b" * 32,
            "2" * 16,
            "",
            version="v1",
            state="vendor=x,ot=th:c",
            attrs={cv.SAMPLE_WEIGHT: "10"},
        ),
        _span("c" * 32, "3" * 16, "", version="v1", state="ot=th:zz"),
        _span("d" * 32, "4" * 16, "", version="v1", state="ot=th:fd70a3d70a3d71"),
    ]
    client.insert(f"`{url.database}`.`{table}`", rows, column_names=list(INSERT_COLUMNS))
    client.close()
    with open_snapshot(url) as store:
        got = dict(store.run("SELECT trace_id[1:1], sample_weight FROM spans"))
    assert got["a"] == pytest.approx(2.0)
    assert got["b"] == pytest.approx(10.0)  # the attribute wins over the threshold
    assert got["c"] == 1.0  # malformed threshold
    t = int("fd70a3d70a3d71", 16)
    assert got["d"] == pytest.approx(2**56 / (2**56 - t))  # ~ 1 in 100


def test_selection_is_pushed_down_and_dedups_retried_rows(clickhouse_url: str, table: str) -> None:
    url, client = _client(clickhouse_url, table)
    rows = []
    for i, version in enumerate(["v1", "v2", "v2"]):
        trace = f"{i + 1:x}" * 32
        rows.append(_span(trace, f"{10 * i + 1:016x}", "", version=version))
        rows.append(_span(trace, f"{10 * i + 2:016x}", f"{10 * i + 1:016x}", version=version))
    rows.append(rows[-1])  # an exporter retry wrote a span twice
    client.insert(f"`{url.database}`.`{table}`", rows, column_names=list(INSERT_COLUMNS))
    client.close()
    with open_snapshot(url, Selection(releases=("v1",))) as store:
        assert store.pulled_rows == 2
        assert store.run("SELECT DISTINCT service_version FROM spans") == [("v1",)]
        assert store.run("SELECT DISTINCT kind FROM spans ORDER BY 1") == [
            ("INTERNAL",),
            ("SERVER",),
        ]
    with open_snapshot(url, Selection(releases=("v2",))) as store:
        assert store.pulled_rows == 4
    with open_snapshot(url, Selection(trace_prefix="2" * 12)) as store:
        assert store.run("SELECT count(DISTINCT trace_id) FROM spans") == [(1,)]


def test_a_table_of_another_shape_is_one_line_and_exit_2(clickhouse_url: str, table: str) -> None:
    url = parse_store_url(clickhouse_url, table=table)
    client = connect(url)
    client.command(
        f"CREATE TABLE `{url.database}`.`{table}` (TraceId String, Duration Float64) "
        "ENGINE = MergeTree ORDER BY TraceId"
    )
    client.close()
    rc, _, err = run("summary", "--store", clickhouse_url, "--table", table)
    assert rc == 2 and err.count("\n") == 1
    assert "not the OpenTelemetry Collector ClickHouse exporter's traces table" in err
    assert "Duration is Float64" in err


def test_a_missing_table_says_how_to_fill_it(clickhouse_url: str) -> None:
    rc, _, err = run("summary", "--store", clickhouse_url, "--table", "no_such_table")
    assert rc == 2 and err.count("\n") == 1 and "tracekit ingest FILES --store" in err


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (3, "3"),
        (0.5, "0.5"),
        (2.0, "2"),
        (1e-7, "0.0000001"),
        ([1, "a"], '[1,"a"]'),
    ],
)
def test_values_are_written_as_the_exporter_writes_them(value: object, text: str) -> None:
    assert as_string(value) == text
