"""Adjusted counts at ingest (trace_state, sample_weight) and payloads received over HTTP.

The weight is ``tracekit.sample.weight`` when present; else OTel probability sampling's
``ot=th:T`` in the span's traceState (2^56 / (2^56 - T), T right-padded to 14 hex
digits); else 1. Requests inherit their root's. A span ingested from a file and the
same span received as a payload give the same row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.attribution.payloads import ingest_otlp_payloads
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.ingest.rows import threshold_weight
from tracekit.analysis.store import SPAN_COLUMNS, Store, open_store
from tracekit.testing import TraceBuilder


@pytest.mark.parametrize(
    ("trace_state", "weight"),
    [
        ("ot=th:0", 1.0),
        ("ot=th:8", 2.0),
        ("ot=th:c", 4.0),
        ("ot=rv:abcdef01234567;th:8", 2.0),
        ("vendor=x,ot=th:fc", 64.0),
        ("ot=th:80000000000000", 2.0),
        ("ot=th:800000000000000", None),  # 15 digits: not a threshold
        ("ot=th:zz", None),
        ("other=th:8", None),
        ("", None),
    ],
)
def test_threshold_weight_follows_the_otel_definition(trace_state: str, weight: float) -> None:
    assert threshold_weight(trace_state) == weight


def doc_with_states() -> dict[str, Any]:
    b = TraceBuilder(service="ranker", version="v1", seed=11)
    for i in range(4):
        r = b.request(start_ms=i * 100.0, duration_ms=50)
        r.stage(cv.PREPROCESS, start_ms=1, duration_ms=20)
    doc = b.to_otlp()
    spans = [s for rs in doc["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    roots = [s for s in spans if not s.get("parentSpanId")]
    roots[0]["traceState"] = "ot=th:8"
    roots[1]["traceState"] = "ot=th:c"
    roots[2]["traceState"] = "ot=th:c"
    roots[2]["attributes"].append({"key": cv.SAMPLE_WEIGHT, "value": {"doubleValue": 10.0}})
    return doc


def stored_rows(store: Store) -> list[tuple[Any, ...]]:
    cols = [c for c in SPAN_COLUMNS if c != "source"] + ["trace_state"]
    return store.run(f"SELECT {', '.join(cols)} FROM spans ORDER BY trace_id, span_id")


def test_weights_from_trace_state_reach_requests_on_both_paths(tmp_path: Path) -> None:
    doc = doc_with_states()
    lines = tmp_path / "a.jsonl"
    lines.write_text(json.dumps(doc) + "\n")
    pretty = tmp_path / "a.json"
    pretty.write_text(json.dumps(doc, indent=1))
    got = []
    for path in (lines, pretty):
        with open_store(tmp_path / f"{path.suffix}.duckdb") as s:
            report = ingest_paths(s, [path])
            per_request.refresh(s, report.trace_ids)
            weights = sorted(w for (w,) in s.run("SELECT sample_weight FROM requests"))
            assert weights == [1.0, 2.0, 4.0, 10.0]
            assert s.run("SELECT count(*) FROM spans WHERE trace_state = 'ot=th:c'") == [(2,)]
            got.append(stored_rows(s))
    assert got[0] == got[1]


def test_payloads_store_the_rows_a_file_does_and_attribute_only_their_traces(
    tmp_path: Path,
) -> None:
    doc = doc_with_states()
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(doc) + "\n")
    with open_store(tmp_path / "file.duckdb") as a:
        ingest_paths(a, [path])
        from_file = stored_rows(a)

    other = TraceBuilder(service="ranker", version="v0", seed=12)
    other.request(start_ms=0, duration_ms=10).stage(cv.PREPROCESS, start_ms=1, duration_ms=2)
    with open_store(tmp_path / "http.duckdb") as b:
        other.load(b)
        b.run("UPDATE requests SET duration_ns = 1")  # a refresh of it would undo this
        # The two resources arrive as two payloads, as two export calls would send them.
        payloads = [{"resourceSpans": [rs]} for rs in doc["resourceSpans"]]
        report = ingest_otlp_payloads(b, payloads, source="collect")
        assert report.requests_attributed == 4 and report.skipped == 0
        assert b.run("SELECT count(*) FROM requests WHERE duration_ns = 1") == [(1,)]
        rows = [r for r in stored_rows(b) if r[9] != "v0"]
        assert rows == from_file
        assert {s for (s,) in b.run("SELECT source FROM spans WHERE service_version = 'v1'")} <= {
            "collect:1",
            "collect:2",
        }
