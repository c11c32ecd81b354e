"""The file exporter writes OTLP JSON lines as the Collector's file exporter does."""

from __future__ import annotations

import base64
import json
import re

from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import setup
from tracekit.instrumentation.exporters import encode_otlp_json


def _make_spans() -> None:
    tracer = trace.get_tracer("tests.exporters", "1.2")
    with tracer.start_as_current_span("request", kind=SpanKind.SERVER) as root:
        root.set_attributes(
            {
                cv.HTTP_ROUTE: "/predict",
                cv.INFLIGHT: 3,
                cv.CPU_UTILIZATION: 0.25,
                "tags": ["a", "b"],
            }
        )
        with tracekit.stage(cv.FEATURE_RETRIEVAL, **{cv.CACHE_HIT: True}) as span:
            span.add_event("lookup", {"keys": 4})
        other = trace.get_tracer("other").start_span(
            "batch", context=trace.set_span_in_context(trace.INVALID_SPAN)
        )
        other.end()
        with tracer.start_as_current_span(
            "linked", links=[Link(other.get_span_context(), {"why": "batch"})]
        ):
            pass
        try:
            with tracekit.stage(cv.POSTPROCESS):
                raise ValueError("bad output")
        except ValueError:
            pass
        root.set_status(Status(StatusCode.OK))


def test_file_lines_are_collector_otlp_json(tmp_path):
    path = tmp_path / "out" / "traces.jsonl"
    tracekit.configure(service_name="ranker", service_version="v2", exporter="file", path=path)
    _make_spans()
    tracekit.shutdown()
    lines = path.read_text().splitlines()
    assert lines and all(line.startswith('{"resourceSpans":[') for line in lines)
    docs = [json.loads(line) for line in lines]
    spans = [
        s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]
    assert len(spans) == 5
    res = {a["key"]: a["value"] for a in docs[0]["resourceSpans"][0]["resource"]["attributes"]}
    assert res[cv.SERVICE_NAME] == {"stringValue": "ranker"} and res[cv.SERVICE_VERSION] == {
        "stringValue": "v2"
    }
    by_name = {s["name"]: s for s in spans}
    for s in spans:
        assert re.fullmatch("[0-9a-f]{32}", s["traceId"]) and re.fullmatch(
            "[0-9a-f]{16}", s["spanId"]
        )
        assert re.fullmatch("[0-9]{19}", s["startTimeUnixNano"]) and isinstance(
            s["endTimeUnixNano"], str
        )
    root = by_name["request"]
    assert root["parentSpanId"] == "" and root["kind"] == 2 and root["status"] == {"code": 1}
    attrs = {a["key"]: a["value"] for a in root["attributes"]}
    assert attrs[cv.INFLIGHT] == {"intValue": "3"} and attrs[cv.CPU_UTILIZATION] == {
        "doubleValue": 0.25
    }
    assert attrs["tags"] == {"arrayValue": {"values": [{"stringValue": "a"}, {"stringValue": "b"}]}}
    fr = by_name[cv.FEATURE_RETRIEVAL]
    assert fr["parentSpanId"] == root["spanId"] and fr["kind"] == 1 and fr["status"] == {}
    assert {a["key"]: a["value"] for a in fr["attributes"]}[cv.CACHE_HIT] == {"boolValue": True}
    assert fr["events"][0]["name"] == "lookup"
    post = by_name[cv.POSTPROCESS]
    assert post["status"] == {"message": "ValueError: bad output", "code": 2}
    link = by_name["linked"]["links"][0]
    assert (
        link["spanId"] == by_name["batch"]["spanId"]
        and link["traceId"] == by_name["batch"]["traceId"]
    )


def _hexify(doc):
    """The official protobuf-JSON form with ids turned from base64 into hex, as the Collector writes them."""
    if isinstance(doc, dict):
        out = {}
        for k, v in doc.items():
            if k in ("traceId", "spanId", "parentSpanId"):
                out[k] = base64.b64decode(v).hex()
            else:
                out[k] = _hexify(v)
        return out
    if isinstance(doc, list):
        return [_hexify(x) for x in doc]
    return doc


def _strip(doc, keys=("flags", "parentSpanId")):
    if isinstance(doc, dict):
        return {k: _strip(v, keys) for k, v in doc.items() if k not in keys and v not in ({}, [])}
    if isinstance(doc, list):
        return [_strip(x, keys) for x in doc]
    return doc


def test_encoding_matches_the_official_otlp_encoder():
    """Same content as OTel's protobuf encoder, read through protobuf's own JSON mapping."""
    mem = InMemorySpanExporter()
    tracekit.configure(service_name="ranker", exporter=mem)
    try:
        _make_spans()
        setup.flush()
        finished = mem.get_finished_spans()
    finally:
        tracekit.shutdown()
    ours = encode_otlp_json(finished)
    official = _hexify(
        json_format.MessageToDict(encode_spans(finished), use_integers_for_enums=True)
    )
    assert _strip(ours) == _strip(official)
    # what _strip left out: roots say "" for the parent, flags carry the sampled bit too
    flat = [s for rs in ours["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert sum(s["parentSpanId"] == "" for s in flat) == 2
    # bits 0-7: the W3C trace flags (sampled, random); 0x100: "is_remote is known"
    assert [s["flags"] for s in flat] == [0x100 | int(f.context.trace_flags) for f in finished]
    assert all(s["flags"] & 0x1 for s in flat)
