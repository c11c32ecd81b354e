"""The trace builder: rows for the store, OTLP JSON as the Collector writes it, JSONL."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tracekit import conventions as cv
from tracekit.analysis.store import SPAN_COLUMNS
from tracekit.testing import EPOCH_NS, TraceBuilder, worked_example


def _build() -> TraceBuilder:
    b = TraceBuilder(service="ranker", version="v1", instance_id="ranker-0", host="host-a", seed=7)
    r = b.request(start_ms=5, duration_ms=100, attributes={cv.INFLIGHT: 3}, weight=10)
    r.stage(cv.FEATURE_RETRIEVAL, start_ms=0, duration_ms=15, attributes={cv.CACHE_HIT: False})
    call = r.stage(cv.DOWNSTREAM, start_ms=60, duration_ms=40)
    r.span("GET /price", start_ms=61, duration_ms=38, kind="SERVER", parent=call, service="pricing")
    b.batch([r], start_ms=30, duration_ms=10)
    return b


def test_same_seed_builds_same_ids_and_times() -> None:
    assert _build().rows() == _build().rows()
    other = TraceBuilder(seed=8)
    other.request()
    assert other.rows()[0][0] != _build().rows()[0][0]


def test_rows_follow_span_columns_and_offsets() -> None:
    rows = [dict(zip(SPAN_COLUMNS, r, strict=True)) for r in _build().rows()]
    root, feat, call, server, batch = rows
    assert root["parent_span_id"] is None and root["kind"] == "SERVER"
    assert root["start_ns"] == EPOCH_NS + 5_000_000
    assert root["end_ns"] - root["start_ns"] == 100_000_000
    assert root["sample_weight"] == 10.0
    assert json.loads(root["attributes"])[cv.INFLIGHT] == 3
    # stage offsets count from the request start
    assert feat["start_ns"] == root["start_ns"] and feat["stage"] == cv.FEATURE_RETRIEVAL
    assert feat["time_kind"] == cv.WAIT  # default for feature_retrieval
    assert call["kind"] == "CLIENT" and call["parent_span_id"] == root["span_id"]
    assert server["parent_span_id"] == call["span_id"]
    assert server["service_name"] == "pricing" and server["service_version"] is None
    assert batch["name"] == cv.BATCH_SPAN_NAME and batch["trace_id"] != root["trace_id"]
    assert json.loads(batch["links"]) == [
        {"trace_id": root["trace_id"], "span_id": root["span_id"], "attributes": {}}
    ]
    for r in rows:
        assert re.fullmatch("[0-9a-f]{32}", r["trace_id"])
        assert re.fullmatch("[0-9a-f]{16}", r["span_id"])


def test_to_otlp_has_the_collector_file_exporter_shape() -> None:
    doc = _build().to_otlp()
    services = []
    spans = []
    for rs in doc["resourceSpans"]:
        attrs = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
        services.append(attrs[cv.SERVICE_NAME]["stringValue"])
        for ss in rs["scopeSpans"]:
            spans.extend(ss["spans"])
    assert services == ["ranker", "pricing"]
    root = spans[0]
    assert set(root) >= {
        "traceId",
        "spanId",
        "name",
        "kind",
        "startTimeUnixNano",
        "endTimeUnixNano",
    }
    assert "parentSpanId" not in root
    assert root["kind"] == 2  # SERVER as the integer enum
    assert isinstance(root["startTimeUnixNano"], str) and int(root["startTimeUnixNano"]) > 0
    values = {a["key"]: a["value"] for a in root["attributes"]}
    assert values[cv.INFLIGHT] == {"intValue": "3"}  # 64-bit ints are strings in OTLP/JSON
    assert values[cv.SAMPLE_WEIGHT] == {"intValue": "10"}
    feat = {a["key"]: a["value"] for a in spans[1]["attributes"]}
    assert feat[cv.CACHE_HIT] == {"boolValue": False}
    batch = next(s for s in spans if s["name"] == cv.BATCH_SPAN_NAME)
    assert batch["links"] == [{"traceId": root["traceId"], "spanId": root["spanId"]}]


def test_error_request_sets_status_and_http_code() -> None:
    b = TraceBuilder(seed=1)
    b.request(error=True)
    span = b.to_otlp()["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["status"] == {"code": 2}
    assert {"key": cv.HTTP_RESPONSE_STATUS_CODE, "value": {"intValue": "500"}} in span["attributes"]


def test_write_jsonl_writes_one_document_per_line(tmp_path: Path) -> None:
    b = _build()
    path = b.write_jsonl(tmp_path / "t.jsonl", spans_per_line=2)
    lines = path.read_text().splitlines()
    docs = [json.loads(line) for line in lines]
    assert all(len(d["resourceSpans"]) == 1 for d in docs)
    count = sum(len(ss["spans"]) for d in docs for ss in d["resourceSpans"][0]["scopeSpans"])
    assert count == len(b.rows()) and len(lines) == 3  # ranker 4 spans in 2 lines, pricing 1


def test_worked_example_is_the_seed_request() -> None:
    r = worked_example()
    assert r.root.duration_ms == 160
    stages = [s.attributes.get(cv.STAGE) for s in r.builder.spans]
    assert stages.count(cv.DOWNSTREAM) == 1 and cv.BATCH_QUEUE in stages
