"""Operations under stages: ``request_operations`` rows, as every reader stores them, and
the store's top-operations reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.attribution.operations import span_failed
from tracekit.analysis.attribution.payloads import ingest_otlp_payloads
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import Store, open_store
from tracekit.analysis.store.operations import top_operations
from tracekit.testing import TraceBuilder

HOTROD = Path(__file__).parents[1] / "data/corpus/traces/otlp"
COLUMNS = "stage, service, operation, critical_ns, calls, calls_on_path, overlapping, errors"


def rows(store: Store, trace_id: str | None = None) -> dict[tuple[str, str], tuple[int, ...]]:
    """(service, operation) -> (path ns, calls, on path, overlapping, errors), one trace."""
    got = store.run(
        f"SELECT {COLUMNS} FROM request_operations WHERE $t IS NULL OR trace_id = $t",
        {"t": trace_id},
    )
    return {(svc, op): tuple(rest) for _, svc, op, *rest in got}


def hotrod(store: Store, which: str) -> dict[tuple[str, str], tuple[int, ...]]:
    ingest_paths(store, [HOTROD / f"jaegerv3_n_plus_one_full_{which}.json"])
    per_request.refresh(store)
    return rows(store)


def test_hotrod_serial_names_the_n_plus_one_and_the_slow_query(store: Store) -> None:
    ops = hotrod(store, "serial")
    path, calls, on_path, overlapping, errors = ops["redis-manual", "GetDriver"]
    assert (calls, on_path, overlapping, errors) == (13, 13, 0, 3)
    assert 200 < path / 1e6 < 210
    assert ops["mysql", "SQL SELECT"][:2] == (311_681_328, 1)
    # frontend's two "HTTP GET" calls are two operations, named by their callees
    assert ops["customer", "GET /customer"][1] == 1
    assert ops["route", "GET /route"][1:4] == (10, 10, 0)
    assert ("frontend", "HTTP GET") not in ops
    # the operations split the request's path exactly
    duration = store.run("SELECT duration_ns FROM requests")[0][0]
    assert sum(v[0] for v in ops.values()) == duration


def test_hotrod_concurrent_route_calls_overlap_and_few_hold_the_path(store: Store) -> None:
    ops = hotrod(store, "concurrent")
    assert ops["mysql", "SQL SELECT"][0] == pytest.approx(282.4e6, rel=1e-3)
    # 3 route workers: 9 of the 10 calls started while an earlier one ran; 4 held the path
    assert ops["route", "GET /route"][1:4] == (10, 4, 9)
    # the driver's redis calls stay one after another at either worker count
    assert ops["redis-manual", "GetDriver"][1:4] == (13, 13, 0)


def test_a_client_call_and_its_server_span_are_one_operation(store: Store) -> None:
    b = TraceBuilder(service="ranker", version="v1", seed=1)
    r = b.request(duration_ms=100)
    r.stage(cv.PREPROCESS, start_ms=0, duration_ms=20)
    call = r.stage(cv.DOWNSTREAM, start_ms=20, duration_ms=60, name="HTTP GET")
    srv = r.span(
        "GET /price/4711",
        start_ms=25,
        duration_ms=50,
        kind="SERVER",
        parent=call,
        service="pricing",
        error=True,
    )
    r.span(
        "SELECT prices",
        start_ms=30,
        duration_ms=30,
        kind="CLIENT",
        parent=srv,
        service="pricing",
        attributes={cv.DB_SYSTEM: "postgresql"},
    )
    b.load(store)
    ops = rows(store)
    # the client's 10 ms of network and the server's own 20 ms: one call, one error
    assert ops["pricing", "GET /price/{id}"] == (30_000_000, 1, 1, 0, 1)
    assert ops["pricing", "SELECT prices"] == (30_000_000, 1, 1, 0, 0)


def test_without_a_server_span_the_address_and_url_template_name_the_call(store: Store) -> None:
    b = TraceBuilder(service="ranker", version="v1", seed=2)
    r = b.request(duration_ms=50)
    for k in range(3):  # three serial calls, then two overlapping ones
        r.stage(
            cv.DOWNSTREAM,
            start_ms=10 * k,
            duration_ms=10,
            name="HTTP GET",
            attributes={
                cv.SERVER_ADDRESS: "features",
                cv.SERVER_PORT: 8080,
                cv.HTTP_REQUEST_METHOD: "GET",
                cv.URL_TEMPLATE: "/f/{id}",
            },
        )
    for k in range(2):
        r.stage(
            cv.DOWNSTREAM,
            start_ms=30 + k,
            duration_ms=15,
            name="HTTP POST",
            attributes={cv.URL_FULL: f"http://cache:6379/keys/{k}99?x=1"},
        )
    b.load(store)
    ops = rows(store)
    assert ops["features:8080", "GET /f/{id}"][1:4] == (3, 3, 0)
    assert ops["cache:6379", "/keys/{id}"][1:4] == (2, 1, 1)


def test_late_spans_reattribute_and_reingest_changes_nothing(store: Store, tmp_path: Path) -> None:
    b = TraceBuilder(service="front", version="v1", seed=3)
    r = b.request(duration_ms=40)
    call = r.stage(
        cv.DOWNSTREAM,
        start_ms=5,
        duration_ms=30,
        name="HTTP GET",
        attributes={cv.SERVER_ADDRESS: "api"},
    )
    doc = b.to_otlp()
    r.span("GET /items", start_ms=6, duration_ms=28, kind="SERVER", parent=call, service="api")
    whole = b.to_otlp()
    ingest_otlp_payloads(store, [doc], source="first")
    assert set(rows(store)) == {("front", "POST /predict"), ("api", "(call)")}
    ingest_otlp_payloads(store, [whole], source="second")  # the server span arrives late
    after = rows(store)
    assert set(after) == {("front", "POST /predict"), ("api", "GET /items")}
    ingest_otlp_payloads(store, [whole], source="again")
    assert rows(store) == after


def test_jaeger_json_files_fill_the_operations(store: Store, corpus_dir: Path) -> None:
    ingest_paths(store, sorted((corpus_dir / "jaeger").glob("*.json")))
    per_request.refresh(store)
    assert (
        store.run("SELECT count(DISTINCT trace_id) FROM request_operations")[0][0]
        == (store.run("SELECT count(*) FROM requests")[0][0])
    )


HOSTILE = 'GET /"; DROP TABLE spans; --\x1b[31m\x00\n' + "é" * 300


def test_hostile_operation_names_are_stored_and_read_back_as_data(tmp_path: Path) -> None:
    b = TraceBuilder(service="svc'\x07", version="v1", seed=5)
    r = b.request(duration_ms=30)
    r.span(HOSTILE, start_ms=0, duration_ms=20, stage=cv.PREPROCESS)
    path = tmp_path / "t.duckdb"
    with open_store(path) as store:
        b.load(store)
    with open_store(path, read_only=True) as store:
        top = top_operations(store, "v1")
        names = {(o.service, o.operation) for o in top.operations}
        assert store.run("SELECT count(*) FROM spans")[0][0] == 2
    op = next(o for s, o in names if s == "svc'\x07" and o.startswith("GET"))
    assert op.startswith('GET /"; DROP TABLE spans; --\x1b[31m\x00 ') and len(op) == 96


def test_top_operations_of_the_tail(store: Store) -> None:
    b = TraceBuilder(service="ranker", version="v2", seed=6)
    for k in range(20):
        slow = k % 5 == 0
        r = b.request(start_ms=k * 500.0, duration_ms=300 if slow else 60)
        for c in range(8 if slow else 2):  # the slow ones: 8 serial cache calls
            r.stage(
                cv.DOWNSTREAM,
                start_ms=10 + 30 * c,
                duration_ms=30,
                name="GET",
                attributes={cv.SERVER_ADDRESS: "redis"},
                error=slow and c == 0,
            )
    b.load(store)
    tail = top_operations(store, "v2", min_duration_ms=300)
    assert (tail.requests, tail.weighted_requests) == (4, 4.0)
    first = tail.operations[0]
    assert (first.stage, first.service, first.operation) == ("downstream", "redis", "(call)")
    assert first.path_ms_per_request == pytest.approx(240.0)
    assert (first.calls_per_request, first.serial_share, first.errors_per_request) == (8, 1, 1)
    assert sum(o.share for o in tail.operations) == pytest.approx(1.0)
    fast = top_operations(store, "v2", max_duration_ms=100)
    assert fast.requests == 16 and fast.operations[0].calls_per_request == 2
    assert top_operations(store, "nope").operations == []
    assert json.dumps([o.operation for o in tail.operations])


@pytest.mark.parametrize(
    ("kind", "status", "code", "failed"),
    [
        ("CLIENT", "ERROR", 200, True),
        ("CLIENT", "UNSET", 404, True),
        ("CLIENT", "UNSET", 399, False),
        ("SERVER", "UNSET", 404, False),
        ("SERVER", "UNSET", 503, True),
        ("SERVER", "OK", 503, False),
        ("INTERNAL", "UNSET", 500, False),
        ("CLIENT", "UNSET", None, False),
    ],
)
def test_a_span_failed_by_status_or_by_the_http_semantic_conventions(
    kind: str, status: str, code: int | None, failed: bool
) -> None:
    assert span_failed(kind, status, code) is failed


def test_http_error_codes_fail_a_call_whose_status_is_unset(store: Store) -> None:
    b = TraceBuilder(service="ranker", version="v1", seed=2)
    r = b.request(duration_ms=100)
    code = cv.HTTP_RESPONSE_STATUS_CODE
    # a 404 answers the client: its call failed, though the server did nothing wrong
    miss = r.span("GET /item", start_ms=0, duration_ms=10, kind="CLIENT", attributes={code: 404})
    r.span("GET /item", start_ms=1, duration_ms=8, kind="SERVER", parent=miss, service="items")
    # a server's 503 fails the call, the client span said nothing
    busy = r.span("GET /stock", start_ms=20, duration_ms=10, kind="CLIENT")
    r.span(
        "GET /stock",
        start_ms=21,
        duration_ms=8,
        kind="SERVER",
        parent=busy,
        service="stock",
        attributes={code: "503"},
    )
    r.span("GET /ok", start_ms=40, duration_ms=10, kind="CLIENT", attributes={code: 200})
    b.load(store)
    ops = rows(store)
    assert [ops[op][-1] for op in [("items", "GET /item"), ("stock", "GET /stock")]] == [1, 1]
    assert ops["ranker", "GET /ok"][-1] == 0
