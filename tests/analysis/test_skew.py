"""Which children outside their parent ingest reports, and as what (tracekit.analysis.ingest.skew)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution.payloads import ingest_otlp_payloads
from tracekit.analysis.ingest import IngestReport, ingest_paths, skew
from tracekit.analysis.store import Store, open_store
from tracekit.testing import TraceBuilder


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(tmp_path / "t.duckdb")


def calls(overlap_ms: float, *, server_host: str | None = None, n: int = 1) -> TraceBuilder:
    """``n`` requests whose pricing server span ends ``overlap_ms`` after the client call."""
    b = TraceBuilder(service="ranker", host="host-a", seed=7)
    for i in range(n):
        r = b.request(start_ms=i * 200, duration_ms=100)
        call = r.stage(cv.DOWNSTREAM, start_ms=40, duration_ms=20)
        r.span(
            "GET /price",
            start_ms=41,
            duration_ms=19 + overlap_ms,
            kind="SERVER",
            parent=call,
            service="pricing",
            host=server_host,
        )
    return b


def ingest(store: Store, b: TraceBuilder, tmp_path: Path) -> IngestReport:
    return ingest_paths(store, [b.write_jsonl(tmp_path / "t.jsonl")])


def test_a_sub_millisecond_overlap_on_one_host_is_no_problem(store: Store, tmp_path: Path) -> None:
    report = ingest(store, calls(0.2), tmp_path)
    assert report.counts == {}
    assert report.problems == []


def test_the_same_overlap_across_two_hosts_is_skew_with_its_size(
    store: Store, tmp_path: Path
) -> None:
    b = calls(0.2, server_host="host-b")
    report = ingest(store, b, tmp_path)
    assert report.counts == {"skew": 1}
    (problem,) = report.problems
    server = b.spans[-1]
    assert problem.kind == "skew"
    assert "t.jsonl:" in problem.where
    assert f"span {server.span_id} (pricing on host-b)" in problem.reason
    assert f"of trace {server.trace_id}" in problem.reason
    assert f"its parent {server.parent_span_id} (ranker on host-a)" in problem.reason
    assert "ends 0.200 ms after" in problem.reason
    assert problem.reason.startswith("1 span outside their parent on another host")


def test_a_long_overrun_on_one_host_is_reported_but_not_as_skew(
    store: Store, tmp_path: Path
) -> None:
    report = ingest(store, calls(50), tmp_path)
    assert report.counts == {"overrun": 1}
    (problem,) = report.problems
    assert "ends 50.000 ms after" in problem.reason
    assert "server span outliving its client call" in problem.reason
    assert "both on host-a" in problem.reason
    assert "skew" not in problem.kind


def test_one_problem_per_kind_names_the_largest_overlap_and_counts_all(
    store: Store, tmp_path: Path
) -> None:
    b = TraceBuilder(service="ranker", host="host-a", seed=3)
    sizes = [2.0, 30.0, 0.5, 7.0]  # the 0.5 ms one is within the tolerance
    for i, late in enumerate(sizes):
        r = b.request(start_ms=i * 200, duration_ms=100)
        call = r.stage(cv.DOWNSTREAM, start_ms=40, duration_ms=20)
        r.span("GET /price", start_ms=41, duration_ms=19 + late, kind="SERVER", parent=call)
    report = ingest(store, b, tmp_path)
    assert report.counts == {"overrun": 3}
    (problem,) = report.problems
    assert problem.reason.startswith("3 spans outside their parent by over 1 ms on one host")
    assert "ends 30.000 ms after" in problem.reason
    log = store.run("SELECT problems FROM ingest_log")
    assert log == [(3,)]


def test_the_tolerance_is_a_boundary(store: Store, tmp_path: Path) -> None:
    at = ingest(store, calls(skew.TOLERANCE_NS / 1e6), tmp_path)
    assert at.counts == {}
    store2 = open_store(tmp_path / "u.duckdb")
    past = ingest(store2, calls(skew.TOLERANCE_NS / 1e6 + 0.001), tmp_path)
    assert past.counts == {"overrun": 1}


def test_a_child_starting_early_on_another_host_is_skew(store: Store, tmp_path: Path) -> None:
    b = TraceBuilder(service="ranker", host="host-a", seed=5)
    r = b.request(start_ms=0, duration_ms=100)
    call = r.stage(cv.DOWNSTREAM, start_ms=40, duration_ms=20)
    r.span("GET /price", start_ms=39.5, duration_ms=10, kind="SERVER", parent=call, host="host-b")
    report = ingest(store, b, tmp_path)
    assert report.counts == {"skew": 1}
    assert "starts 0.500 ms before" in report.problems[0].reason


@pytest.mark.parametrize(
    ("client", "server", "counts"),
    [
        # host.name decides when both carry it, whatever the instances
        ({"host.name": "h", "service.instance.id": "a"}, {"host.name": "h"}, {}),
        ({"host.name": "h"}, {"host.name": "g"}, {"skew": 1}),
        # else the instance, when both carry one
        ({"host.name": "h", "service.instance.id": "a"}, {"service.instance.id": "a"}, {}),
        ({"service.instance.id": "a"}, {"service.instance.id": "b"}, {"skew": 1}),
        # else the service
        ({}, {}, {}),
        ({}, {"service.name": "pricing"}, {"skew": 1}),
    ],
)
def test_the_host_is_the_most_precise_attribute_both_spans_carry(
    store: Store, client: dict[str, str], server: dict[str, str], counts: dict[str, int]
) -> None:
    def resource_spans(attrs: dict[str, str], span: dict[str, object]) -> dict[str, object]:
        kv = [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]
        return {"resource": {"attributes": kv}, "scopeSpans": [{"spans": [span]}]}

    trace = "0af7651916cd43dd8448eb211c80319c"
    t0 = 1_767_225_600_000_000_000
    root = {
        "traceId": trace,
        "spanId": "b7ad6b7169203331",
        "name": "GET /",
        "kind": 3,
        "startTimeUnixNano": str(t0),
        "endTimeUnixNano": str(t0 + 10_000_000),
    }
    child = {
        "traceId": trace,
        "spanId": "00f067aa0ba902b7",
        "parentSpanId": "b7ad6b7169203331",
        "name": "GET /",
        "kind": 2,
        "startTimeUnixNano": str(t0 + 1_000_000),
        "endTimeUnixNano": str(t0 + 10_200_000),
    }
    payload = {
        "resourceSpans": [
            resource_spans({"service.name": "ranker", **client}, root),
            resource_spans({"service.name": "ranker", **server}, child),
        ]
    }
    # The collect receiver's path: the same definition as files.
    report = ingest_otlp_payloads(store, [payload], source="collect")
    assert report.counts == counts
