"""Ingest of Jaeger JSON written to its documented model (the query API's ``/api/traces``).

Times are microseconds, 64-bit trace ids are 16 hex digits, tags carry a ``type``,
``references`` hold CHILD_OF / FOLLOWS_FROM and the service comes from ``processes``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tracekit import conventions as cv
from tracekit.analysis.ingest import ingest_paths

TRACE64 = "7a3f0c5e9b1d2468"


def jaeger_trace() -> dict[str, Any]:
    def span(
        span_id: str,
        name: str,
        start_us: int,
        duration_us: int,
        refs: list[dict[str, str]],
        tags: list[dict[str, Any]],
        pid: str = "p1",
    ) -> dict[str, Any]:
        return {
            "traceID": TRACE64,
            "spanID": span_id,
            "operationName": name,
            "references": refs,
            "startTime": start_us,
            "duration": duration_us,
            "tags": tags,
            "logs": [],
            "processID": pid,
            "warnings": None,
            "flags": 1,
        }

    child_of = [{"refType": "CHILD_OF", "traceID": TRACE64, "spanID": "00000000000000a1"}]
    return {
        "traceID": TRACE64,
        "spans": [
            span(
                "00000000000000a1",
                "POST /predict",
                1_000_000,
                100_000,
                [],
                [{"key": "span.kind", "type": "string", "value": "server"}],
            ),
            span(
                "b2",
                "model",
                1_010_000,
                50_000,
                child_of,
                [
                    {"key": cv.STAGE, "type": "string", "value": cv.MODEL_EXECUTE},
                    {"key": cv.CPU_TIME_NS, "type": "int64", "value": "20000000"},
                    {"key": "tracekit.sample.weight", "type": "float64", "value": 4},
                ],
            ),
            span(
                "00000000000000c3",
                "GET /price",
                1_060_000,
                40_000,
                child_of,
                [
                    {"key": "span.kind", "type": "string", "value": "client"},
                    {"key": "error", "type": "bool", "value": "true"},
                ],
                pid="p2",
            ),
            span(
                "00000000000000d4",
                "audit",
                1_110_000,
                5_000,
                [
                    {"refType": "FOLLOWS_FROM", "traceID": TRACE64, "spanID": "00000000000000a1"},
                    {
                        "refType": "CHILD_OF",
                        "traceID": "ffffffffffffffff",
                        "spanID": "00000000000000ee",
                    },
                ],
                [],
            ),
        ],
        "processes": {
            "p1": {
                "serviceName": "ranker",
                "tags": [
                    {"key": "hostname", "type": "string", "value": "node-1"},
                    {"key": cv.SERVICE_VERSION, "type": "string", "value": "v3"},
                ],
            },
            "p2": {"serviceName": "pricing", "tags": []},
        },
        "warnings": None,
    }


def test_jaeger_api_envelope_maps_ids_times_tags_references(store, tmp_path: Path) -> None:
    path = tmp_path / "traces.json"
    path.write_text(
        json.dumps({"data": [jaeger_trace()], "total": 0, "limit": 0, "offset": 0, "errors": None})
    )
    report = ingest_paths(store, [path])
    assert (report.spans_stored, report.traces, report.releases, report.skipped) == (
        4,
        1,
        ["v3"],
        0,
    )
    got = {
        r[0]: r[1:]
        for r in store.con.execute(
            "SELECT name, trace_id, span_id, parent_span_id, kind, start_ns, end_ns, status_code, "
            "service_name, host_name, cpu_time_ns, sample_weight, links FROM spans"
        ).fetchall()
    }
    root = got["POST /predict"]
    assert root[:7] == (
        "0" * 16 + TRACE64,
        "00000000000000a1",
        None,
        "SERVER",
        1_000_000_000,
        1_100_000_000,
        "UNSET",
    )
    model = got["model"]
    assert model[1] == "00000000000000b2" and model[2] == "00000000000000a1"  # padded span id
    assert model[9:11] == (20_000_000, 4.0) and model[8] == "node-1"
    client = got["GET /price"]
    assert client[3] == "CLIENT" and client[6] == "ERROR" and client[7] == "pricing"
    audit = got["audit"]
    # FOLLOWS_FROM in the same trace is the parent and stays a link too (so attribution
    # leaves the span off the request's path); the cross-trace CHILD_OF is a link
    assert audit[2] == "00000000000000a1"
    assert json.loads(audit[11]) == [
        {
            "trace_id": "0" * 16 + TRACE64,
            "span_id": "00000000000000a1",
            "attributes": {"opentracing.ref_type": "follows_from"},
        },
        {
            "trace_id": "0" * 16 + "f" * 16,
            "span_id": "00000000000000ee",
            "attributes": {"opentracing.ref_type": "child_of"},
        },
    ]
    # the audit span ends 15 ms after its parent in the same process: one clock, so
    # not skew, but past the tolerance: an overrun, kept and counted
    assert report.counts == {"overrun": 1}
    # The request did not wait for what FOLLOWS_FROM it: off the path, so never clipped
    # into the request (a child would have been, as a span overflowing its parent).
    from tracekit.analysis.attribution import per_request

    per_request.refresh(store, None)
    assert store.con.execute("SELECT skewed_spans FROM requests").fetchall() == [(0,)]


def test_single_trace_object_and_span_array_shapes(store, tmp_path: Path) -> None:
    trace = jaeger_trace()
    (tmp_path / "one.json").write_text(json.dumps(trace))
    spans = [dict(s, process=trace["processes"][s["processID"]]) for s in trace["spans"]]
    for s in spans:
        s["traceID"] = "1" * 32
        del s["processID"]
    (tmp_path / "array.json").write_text(json.dumps(spans))
    report = ingest_paths(store, [tmp_path])
    assert report.spans_stored == 8 and report.traces == 2 and report.skipped == 0
    services = store.con.execute(
        "SELECT DISTINCT service_name FROM spans WHERE trace_id = ? ORDER BY 1", ["1" * 32]
    ).fetchall()
    assert services == [("pricing",), ("ranker",)]


def test_a_broken_trace_in_the_envelope_is_skipped_and_reported(store, tmp_path: Path) -> None:
    path = tmp_path / "traces.json"
    path.write_text(json.dumps({"data": ["nonsense", jaeger_trace()], "errors": None}))
    report = ingest_paths(store, [path])
    assert report.spans_stored == 4 and report.skipped == 1
    (problem,) = report.skipping_problems
    assert problem.where == f"{path}:1" and "data[0]" in problem.reason
