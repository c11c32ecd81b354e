"""The receivers' decoder on its own: each malformed record rejected alone with its
reason and place, request-wide limits refused early, nothing raised that is not a
BadBody (a stray exception would become a retryable 503 and a retry loop)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from tracekit.collect.decode import BadBody, Limits, decode_json, decode_protobuf

L = Limits()


def _span(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "traceId": f"{i + 1:032x}",
        "spanId": f"{i + 1:016x}",
        "name": f"s{i}",
        "kind": 2,
        "startTimeUnixNano": "1000",
        "endTimeUnixNano": "2000",
        **extra,
    }


def _doc(*spans: dict[str, Any], resource: Any = None) -> bytes:
    rs: dict[str, Any] = {"scopeSpans": [{"scope": {}, "spans": list(spans)}]}
    if resource is not None:
        rs["resource"] = resource
    return json.dumps({"resourceSpans": [rs]}).encode()


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"startTimeUnixNano": "²"}, "startTimeUnixNano is not an unsigned 64-bit integer"),
        ({"traceId": "+" + "1" * 31}, "traceId is not 32 hex digits"),
        ({"spanId": "1_23456789abcdef"}, "spanId is not 16 hex digits"),
        ({"traceId": "0" * 32}, "traceId is all zeros"),
        ({"links": 5}, "links is not a list"),
        ({"kind": "SPAN_KIND_NONSENSE"}, "kind is not a SpanKind"),
        (
            {"attributes": [{"key": "a", "value": {"arrayValue": {"values": True}}}]},
            "values is not a list",
        ),
        ({"attributes": [{"key": "a", "value": {"intValue": "1" * 40}}]}, "not a 64-bit integer"),
        (
            {"attributes": [{"key": "a", "value": {"doubleValue": "٣"}}]},
            "doubleValue is not a number",
        ),
    ],
)
def test_a_malformed_span_is_rejected_alone_with_its_reason_and_place(
    bad: dict[str, Any], why: str
) -> None:
    out = decode_json(_doc(_span(0), _span(1, **bad), _span(2)), L)
    assert (out.accepted, out.rejected) == (2, 1)
    assert why in out.message
    assert "resourceSpans[0].scopeSpans[0].spans[1]" in out.message


def test_an_integer_python_refuses_to_parse_is_a_bad_body_not_a_crash() -> None:
    body = b'{"resourceSpans": [], "x": ' + b"9" * 5000 + b"}"
    with pytest.raises(BadBody, match="invalid JSON"):
        decode_json(body, L)


def test_json_text_inside_attributes_does_not_count_as_objects() -> None:
    text = "{[" * 30_000  # e.g. a captured body or a query: brackets, but in a string
    body = _doc(_span(0, attributes=[{"key": "db.statement", "value": {"stringValue": text}}]))
    assert body.count(b"{") + body.count(b"[") > len(body) // 8 + 4096
    out = decode_json(body, L)
    assert out.accepted == 1


def test_millions_of_empty_objects_are_refused_unparsed() -> None:
    body = b'{"resourceSpans":[' + b",".join([b"{}"] * 2_000_000) + b"]}"
    with pytest.raises(BadBody, match="objects/arrays"):
        decode_json(body, L)


def _pb(resource: Resource, *spans: Span) -> bytes:
    request = ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[ScopeSpans(spans=spans)])]
    )
    return bytes(request.SerializeToString())


def _pb_span(i: int, **kw: Any) -> Span:
    return Span(
        trace_id=(i + 1).to_bytes(16, "big"),
        span_id=(i + 1).to_bytes(8, "big"),
        name=f"s{i}",
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=1000,
        end_time_unix_nano=2000,
        **kw,
    )


def test_a_resource_that_is_not_valid_protobuf_rejects_its_spans_alone() -> None:
    good = _pb(Resource(), _pb_span(0))
    # A resource attribute whose string is not UTF-8: the Resource cannot be parsed.
    bad_resource = Resource(attributes=[KeyValue(key="k", value=AnyValue(string_value="x"))])
    bad = _pb(bad_resource, _pb_span(1), _pb_span(2)).replace(b"\x0a\x01x", b"\x0a\x01\xff")
    # Two ResourceSpans (a repeated field's encodings concatenate): one good, one whose
    # resource cannot be parsed.
    out = decode_protobuf(good + bad, L)
    assert (out.accepted, out.rejected) == (1, 2)
    assert "resource:" in out.message


def test_a_protobuf_span_with_a_short_id_is_rejected_alone() -> None:
    spans = [_pb_span(0), _pb_span(1), _pb_span(2)]
    spans[1].trace_id = b"\x01\x02\x03"
    out = decode_protobuf(_pb(Resource(), *spans), L)
    assert (out.accepted, out.rejected) == (2, 1)
    assert "traceId is not 16 bytes" in out.message
