"""OTLP/HTTP request bodies → OTLP JSON documents, and the span checks done on arrival.

A body is an ``ExportTraceServiceRequest`` in protobuf (``application/x-protobuf``) or
in JSON (``application/json``), optionally gzip-compressed (``Content-Encoding: gzip``),
as the OTLP/HTTP specification says. Both come out as the OTLP JSON document that
:mod:`tracekit.analysis.ingest.otlp` reads from files, so a span received by
``tracekit collect`` becomes the same row as the same span read from a file: protobuf
``bytes`` ids become lower-case hex, enums their names, 64-bit integers strings, exactly
what the OTLP JSON encoding prescribes.

Spans without a valid trace or span id cannot be stored (the store is keyed by them);
:func:`screen` takes them out before the body is acknowledged, so the response can say
how many were rejected and why (OTLP ``partial_success``).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import zlib
from dataclasses import dataclass
from typing import Any

from tracekit.errors import IngestError

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

_TRACE_HEX = 32
_SPAN_HEX = 16


class BadBody(IngestError):
    """A body that cannot be decoded: the receiver answers 400 and the client must not retry."""

    def __init__(self, reason: str) -> None:
        super().__init__("request body", reason)


def media_type(content_type: str | None) -> str:
    """``application/json`` from ``application/json; charset=utf-8``; protobuf by default."""
    if not content_type:
        return PROTOBUF
    return content_type.split(";", 1)[0].strip().lower()


def decompress(body: bytes, encoding: str | None, *, limit: int) -> bytes:
    """Undo ``Content-Encoding`` (gzip, deflate or none), refusing more than ``limit`` bytes."""
    enc = (encoding or "identity").strip().lower()
    if enc in ("identity", ""):
        return body
    if enc not in ("gzip", "deflate"):
        raise BadBody(f"unsupported Content-Encoding {enc!r} (gzip, deflate or none)")
    # Decompress incrementally so a small gzip bomb cannot take the process's memory.
    wbits = 16 + zlib.MAX_WBITS if enc == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadBody(f"body is not valid {enc}: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise BadBody(f"body inflates past {limit:,} bytes")
    return out


def decode_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The OTLP JSON document of one export request; :class:`BadBody` when undecodable."""
    kind = media_type(content_type)
    if kind == JSON:
        try:
            doc = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadBody(f"invalid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise BadBody("the JSON body is not an ExportTraceServiceRequest object")
        if "resourceSpans" not in doc:
            doc = doc or {"resourceSpans": []}
        if not isinstance(doc.get("resourceSpans"), list):
            raise BadBody("the JSON body has no resourceSpans list")
        return doc
    if kind == PROTOBUF:
        return _protobuf_to_json(body)
    raise BadBody(f"unsupported Content-Type {kind!r} ({PROTOBUF} or {JSON})")


def _protobuf_to_json(body: bytes) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except DecodeError as exc:
        raise BadBody(f"invalid protobuf ExportTraceServiceRequest: {exc}") from exc
    doc: dict[str, Any] = MessageToDict(request)
    # The protobuf JSON mapping writes bytes as base64; OTLP/JSON wants trace and span
    # ids as hex (and only ids: an AnyValue bytesValue stays base64).
    for rs in doc.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _b64_hex(span[key])
                for link in span.get("links", ()):
                    for key in ("traceId", "spanId"):
                        if key in link:
                            link[key] = _b64_hex(link[key])
    doc.setdefault("resourceSpans", [])
    return doc


def _b64_hex(value: str) -> str:
    try:
        return base64.b64decode(value).hex()
    except (binascii.Error, ValueError):
        return ""


@dataclass
class Screened:
    """What :func:`screen` kept of one request: the document, its spans and traces."""

    doc: dict[str, Any]
    accepted: int
    rejected: int
    message: str
    trace_ids: set[str]


def screen(doc: dict[str, Any]) -> Screened:
    """Drop spans the store cannot key (bad trace/span id), counting them with a reason.

    Also lower-cases ids, so a trace split over requests with different case is one.
    """
    accepted = rejected = 0
    reasons: dict[str, int] = {}
    trace_ids: set[str] = set()
    for rs in doc.get("resourceSpans") or ():
        if not isinstance(rs, dict):
            rejected += 1
            reasons["a resourceSpans entry is not an object"] = 1
            continue
        for ss in rs.get("scopeSpans") or ():
            if not isinstance(ss, dict):
                continue
            kept = []
            for span in ss.get("spans") or ():
                why = _invalid(span)
                if why:
                    rejected += 1
                    reasons[why] = reasons.get(why, 0) + 1
                    continue
                span["traceId"] = span["traceId"].lower()
                span["spanId"] = span["spanId"].lower()
                trace_ids.add(span["traceId"])
                kept.append(span)
            ss["spans"] = kept
            accepted += len(kept)
    message = "; ".join(f"{n} span(s): {why}" for why, n in reasons.items())
    return Screened(doc, accepted, rejected, message, trace_ids)


def _invalid(span: Any) -> str:
    if not isinstance(span, dict):
        return "not an object"
    for key, width in (("traceId", _TRACE_HEX), ("spanId", _SPAN_HEX)):
        value = span.get(key)
        if not isinstance(value, str) or len(value) != width:
            return f"{key} is not {width} hex digits"
        try:
            if int(value, 16) == 0:
                return f"{key} is all zeros (invalid per W3C Trace Context)"
        except ValueError:
            return f"{key} is not {width} hex digits"
    return ""


def gzip_bytes(data: bytes) -> bytes:
    """gzip ``data`` (tests and the demo send compressed bodies with it)."""
    return gzip.compress(data)
