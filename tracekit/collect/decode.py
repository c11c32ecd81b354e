"""Export request bodies → clean OTLP JSON documents, with every limit applied while decoding.

A body is an ``ExportTraceServiceRequest`` in protobuf (OTLP/gRPC, and OTLP/HTTP with
``application/x-protobuf``) or in OTLP/JSON (``application/json``), possibly compressed.
Both come out as one :class:`Decoded`: a document in exactly the shape
:mod:`tracekit.analysis.ingest` reads from a JSON-lines file (hex ids in lower case,
``kind`` and status codes as numbers, times as integers, ``intValue`` as a decimal
string), so a span received over the network becomes the same row as the same span read
from a file, and the writer hands it to ingest's fast path.

Validation is per record. The request as a whole is refused (:class:`BadBody`, HTTP 400
or ``INVALID_ARGUMENT``) only when it cannot be read at all or breaks a request-wide
limit; a span that is malformed (a bad id, a field of the wrong type, too many
attributes, a value too long or nested too deep) is **rejected alone**, counted with its
reason and place, and every other span of the request is kept (OTLP ``partial_success``).

Limits (:class:`Limits`) bound the work a request can cause. Protobuf is walked at the
wire level down to the spans (:func:`_walk`) before anything is parsed: a request of
millions of empty messages is refused after ``max_resource_spans`` of them, and a span
whose bytes hold more attributes, events or links than allowed is rejected without being
parsed. Each span is then parsed on its own by protobuf's C parser. JSON is counted
before it is parsed: a body with more objects than its size can honestly hold
(:data:`JSON_BYTES_PER_OBJECT`) is refused, so a request's decoded objects stay a small
multiple of its bytes; JSON nested past Python's limit is a 400, not a crash.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tracekit.errors import IngestError

_encode = msgspec.json.Encoder().encode

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

JSON_BYTES_PER_OBJECT = 8
"""A JSON body may hold one ``{``/``[`` per this many bytes (plus 4,096): real OTLP/JSON
holds one per 20-60 bytes; a body of bare ``{}`` (one per 3) is refused unparsed."""

BIG_SPAN_BYTES = 16 << 10
"""A protobuf span larger than this has its fields counted before it is parsed."""

SPAN_KINDS = 6
STATUS_CODES = 3
_KIND_NAMES = {
    name: i
    for i, name in enumerate(
        ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
    )
}
_STATUS_NAMES = {name: i for i, name in enumerate(("UNSET", "OK", "ERROR"))}


@dataclass(frozen=True)
class Limits:
    """What one export request may hold (``tracekit collect --help`` lists them)."""

    max_body_bytes: int = 20 << 20
    """Body bytes, read and after decompression (the OTel Collector's default, 20 MiB)."""
    max_resource_spans: int = 10_000
    max_scope_spans: int = 10_000
    """ScopeSpans in the whole request."""
    max_spans: int = 100_000
    """Spans in the whole request (an SDK sends 512 a batch, a Collector up to 8,192)."""
    max_attributes: int = 1_024
    """Attributes of one span, resource, scope or link, and entries of one array/kvlist."""
    max_values: int = 10_000
    """Attribute values of one span counted with everything nested in them."""
    max_events: int = 10_000
    max_links: int = 1_024
    max_value_bytes: int = 1 << 20
    """Bytes of one string or bytes value, and of a span name or trace state."""
    max_depth: int = 32
    """Nesting of ``arrayValue``/``kvlistValue`` inside one attribute."""


class BadBody(IngestError):
    """A body that cannot be taken: HTTP 400 / gRPC ``INVALID_ARGUMENT``, not retryable."""

    def __init__(self, reason: str, *, status: int = 400) -> None:
        super().__init__("request body", reason)
        self.reason = reason
        self.status = status


@dataclass
class Decoded:
    """One request, decoded: the clean document and what was rejected, with reasons.

    :func:`decode_request` hands it over as ``line`` (the document as one OTLP JSON
    line, what the writer stores) and drops ``doc`` unless asked to keep it.
    """

    doc: dict[str, Any] | None
    accepted: int = 0
    rejected: int = 0
    reasons: dict[str, tuple[int, str]] = field(default_factory=dict)
    """reason → (spans, place of the first)."""
    line: bytes = b""

    @property
    def message(self) -> str:
        """The ``partial_success.error_message``: each reason, its count and first place."""
        return "; ".join(
            f"{n} span(s) rejected: {why} (first at {where})"
            for why, (n, where) in self.reasons.items()
        )

    def reject(self, why: str, where: str, n: int = 1) -> None:
        self.rejected += n
        count, first = self.reasons.get(why, (0, where))
        self.reasons[why] = (count + n, first)


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
    if enc not in ("gzip", "deflate", "x-gzip"):
        raise BadBody(f"unsupported Content-Encoding {enc!r} (gzip, deflate or none)", status=415)
    # Inflate incrementally so a small gzip bomb cannot take the process's memory;
    # "deflate" is zlib-wrapped per RFC 9110, but some clients send it raw.
    tries = [16 + zlib.MAX_WBITS] if enc != "deflate" else [zlib.MAX_WBITS, -zlib.MAX_WBITS]
    for i, wbits in enumerate(tries):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(body, limit + 1)
        except zlib.error as exc:
            if i + 1 < len(tries):
                continue
            raise BadBody(f"body is not valid {enc}: {exc}") from exc
        if len(out) > limit or inflater.unconsumed_tail:
            raise BadBody(f"body inflates past {limit:,} bytes", status=413)
        if not inflater.eof:
            raise BadBody(f"body is a truncated {enc} stream")
        return out
    raise AssertionError("unreachable")


def decode_request(
    body: bytes,
    content_type: str | None,
    encoding: str | None,
    limits: Limits,
    *,
    keep_doc: bool = False,
) -> Decoded:
    """Decompress and decode one request; the clean document comes back as ``line``.

    What a decoding worker process runs (:mod:`tracekit.collect.pool`): only bytes and
    small values cross the process boundary.
    """
    raw = decompress(body, encoding, limit=limits.max_body_bytes)
    decoded = decode_body(raw, content_type, limits)
    if decoded.accepted:
        decoded.line = _encode(decoded.doc)
    if not keep_doc:
        decoded.doc = None
    return decoded


def decode_body(body: bytes, content_type: str | None, limits: Limits) -> Decoded:
    """The clean document of one export request; :class:`BadBody` when it cannot be taken."""
    kind = media_type(content_type)
    if kind == JSON:
        return decode_json(body, limits)
    if kind == PROTOBUF:
        return decode_protobuf(body, limits)
    raise BadBody(f"unsupported Content-Type {kind!r} ({PROTOBUF} or {JSON})", status=415)


# --- JSON -------------------------------------------------------------------------------


_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_HEX = {32: re.compile(r"[0-9a-fA-F]{32}"), 16: re.compile(r"[0-9a-fA-F]{16}")}


def decode_json(body: bytes, limits: Limits) -> Decoded:
    allowed = len(body) // JSON_BYTES_PER_OBJECT + 4096
    objects = body.count(b"{") + body.count(b"[")
    if objects > allowed:
        # Brackets inside strings (an attribute holding JSON text) are not objects: count
        # again without the strings' contents before refusing.
        bare = _JSON_STRING.sub(b'""', body)
        objects = bare.count(b"{") + bare.count(b"[")
    if objects > allowed:
        raise BadBody(
            f"{objects:,} JSON objects/arrays in {len(body):,} bytes is more than an "
            "export request holds; refused unparsed"
        )
    try:
        doc = json.loads(body)
    except RecursionError:
        raise BadBody("JSON nested too deep to decode") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int too long
        raise BadBody(f"invalid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadBody("the JSON body is not an ExportTraceServiceRequest object")
    resource_spans = doc.get("resourceSpans", [])
    if not isinstance(resource_spans, list):
        raise BadBody("resourceSpans is not a list")
    _check_count("resourceSpans", len(resource_spans), limits.max_resource_spans)
    kept_rs: list[dict[str, Any]] = []
    out = Decoded({"resourceSpans": kept_rs})
    scopes = spans_seen = 0
    for r, rs in enumerate(resource_spans):
        where_r = f"resourceSpans[{r}]"
        if not isinstance(rs, dict):
            out.reject("a resourceSpans entry is not an object", where_r, 0)
            continue
        scope_spans = rs.get("scopeSpans", [])
        if not isinstance(scope_spans, list):
            out.reject("scopeSpans is not a list", where_r, 0)
            continue
        scopes += len(scope_spans)
        _check_count("scopeSpans", scopes, limits.max_scope_spans)
        n_spans = 0
        for ss in scope_spans:
            if isinstance(ss, dict) and isinstance(ss.get("spans"), list):
                n_spans += len(ss["spans"])
        spans_seen += n_spans
        _check_count("spans", spans_seen, limits.max_spans)
        resource, why = _json_resource(rs.get("resource"), limits)
        if why:
            out.reject(f"resource: {why}", where_r, n_spans)
            continue
        clean_scopes = []
        for s, ss in enumerate(scope_spans):
            where_s = f"{where_r}.scopeSpans[{s}]"
            if not isinstance(ss, dict):
                out.reject("a scopeSpans entry is not an object", where_s, 0)
                continue
            spans = ss.get("spans", [])
            if not isinstance(spans, list):
                out.reject("spans is not a list", where_s, 0)
                continue
            scope, why = _json_scope(ss.get("scope"), limits)
            if why:
                out.reject(f"scope: {why}", where_s, len(spans))
                continue
            kept = []
            for i, span in enumerate(spans):
                clean, why = _json_span(span, limits)
                if clean is None:
                    out.reject(why, f"{where_s}.spans[{i}]")
                else:
                    kept.append(clean)
            if kept:
                clean_scopes.append({"scope": scope, "spans": kept})
                out.accepted += len(kept)
        if clean_scopes:
            kept_rs.append({"resource": resource, "scopeSpans": clean_scopes})
    return out


def _check_count(what: str, n: int, limit: int) -> None:
    if n > limit:
        raise BadBody(f"the request holds more than {limit:,} {what} (the limit); split it")


def _json_resource(res: Any, limits: Limits) -> tuple[dict[str, Any], str]:
    if res is None:
        return {"attributes": []}, ""
    if not isinstance(res, dict):
        return {}, "not an object"
    attrs, why = _json_attributes(res.get("attributes"), limits, _Budget(limits.max_values))
    return {"attributes": attrs}, why


def _json_scope(scope: Any, limits: Limits) -> tuple[dict[str, Any], str]:
    if scope is None:
        return {}, ""
    if not isinstance(scope, dict):
        return {}, "not an object"
    out: dict[str, Any] = {}
    for key in ("name", "version"):
        value = scope.get(key)
        if value is not None:
            if not isinstance(value, str):
                return {}, f"{key} is not a string"
            out[key] = value
    return out, ""


class _Budget:
    """Values one span may still decode (``max_values``), nested ones included."""

    __slots__ = ("left",)

    def __init__(self, n: int) -> None:
        self.left = n


def _json_id(value: Any, width: int, name: str) -> tuple[str, str]:
    if not isinstance(value, str) or not _HEX[width].fullmatch(value):
        return "", f"{name} is not {width} hex digits"
    if value.count("0") == width:
        return "", f"{name} is all zeros (invalid per W3C Trace Context)"
    return value.lower(), ""


def _json_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        return int(value)
    return None


def _json_enum(value: Any, names: dict[str, int], prefix: str, size: int) -> int | None:
    if value is None:
        return 0
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < size else None
    if isinstance(value, str):
        return names.get(value.upper().removeprefix(prefix))
    return None


def _json_span(span: Any, limits: Limits) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(span, dict):
        return None, "a span is not an object"
    trace_id, why = _json_id(span.get("traceId"), 32, "traceId")
    if why:
        return None, why
    span_id, why = _json_id(span.get("spanId"), 16, "spanId")
    if why:
        return None, why
    out: dict[str, Any] = {"traceId": trace_id, "spanId": span_id}
    parent = span.get("parentSpanId")
    if parent not in (None, ""):
        out["parentSpanId"], why = _json_id(parent, 16, "parentSpanId")
        if why:
            return None, why
    name = span.get("name", "")
    if not isinstance(name, str):
        return None, "name is not a string"
    if len(name) > limits.max_value_bytes:
        return None, f"name longer than {limits.max_value_bytes:,} characters"
    out["name"] = name
    kind = _json_enum(span.get("kind"), _KIND_NAMES, "SPAN_KIND_", SPAN_KINDS)
    if kind is None:
        return None, "kind is not a SpanKind"
    out["kind"] = kind
    for key in ("startTimeUnixNano", "endTimeUnixNano"):
        t = _json_int(span.get(key, 0))
        if t is None or t >= 1 << 64:
            return None, f"{key} is not an unsigned 64-bit integer"
        out[key] = t
    state = span.get("traceState")
    if state not in (None, ""):
        if not isinstance(state, str) or len(state) > limits.max_value_bytes:
            return None, "traceState is not a string"
        out["traceState"] = state
    budget = _Budget(limits.max_values)
    out["attributes"], why = _json_attributes(span.get("attributes"), limits, budget)
    if why:
        return None, why
    events = span.get("events")
    if events is not None:
        if not isinstance(events, list):
            return None, "events is not a list"
        if len(events) > limits.max_events:
            return None, f"more than {limits.max_events:,} events"
    links = span.get("links")
    if links is not None:
        if not isinstance(links, list):
            return None, "links is not a list"
        if len(links) > limits.max_links:
            return None, f"more than {limits.max_links:,} links"
        clean_links = []
        for link in links:
            if not isinstance(link, dict):
                return None, "a link is not an object"
            lt, why = _json_id(link.get("traceId"), 32, "link traceId")
            if why:
                return None, why
            ls, why = _json_id(link.get("spanId"), 16, "link spanId")
            if why:
                return None, why
            attrs, why = _json_attributes(link.get("attributes"), limits, budget)
            if why:
                return None, f"link {why}"
            clean_links.append({"traceId": lt, "spanId": ls, "attributes": attrs})
        if clean_links:
            out["links"] = clean_links
    status = span.get("status")
    if status is not None:
        if not isinstance(status, dict):
            return None, "status is not an object"
        code = _json_enum(status.get("code"), _STATUS_NAMES, "STATUS_CODE_", STATUS_CODES)
        if code is None:
            return None, "status.code is not a StatusCode"
        out["status"] = {"code": code}
    return out, ""


def _json_attributes(
    items: Any, limits: Limits, budget: _Budget, depth: int = 0
) -> tuple[list[Any], str]:
    if items is None:
        return [], ""
    if not isinstance(items, list):
        return [], "attributes is not a list"
    if len(items) > limits.max_attributes:
        return [], f"more than {limits.max_attributes:,} attributes"
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            return [], "an attribute is not a {key, value} object"
        value, why = _json_value(item.get("value"), limits, budget, depth)
        if why:
            return [], f"attribute {item['key'][:100]!r}: {why}"
        out.append({"key": item["key"], "value": value})
    return out, ""


def _json_value(value: Any, limits: Limits, budget: _Budget, depth: int) -> tuple[Any, str]:
    budget.left -= 1
    if budget.left < 0:
        return None, f"more than {limits.max_values:,} attribute values in one span"
    if value is None:
        return {}, ""
    if not isinstance(value, dict):
        return None, "value is not an AnyValue object"
    if (s := value.get("stringValue")) is not None:
        if not isinstance(s, str):
            return None, "stringValue is not a string"
        if len(s) > limits.max_value_bytes:
            return None, f"value longer than {limits.max_value_bytes:,} characters"
        return {"stringValue": s}, ""
    if (b := value.get("boolValue")) is not None:
        if not isinstance(b, bool):
            return None, "boolValue is not a boolean"
        return {"boolValue": b}, ""
    if (i := value.get("intValue")) is not None:
        n = i if isinstance(i, int) and not isinstance(i, bool) else None
        if isinstance(i, str):
            text = i.strip()
            digits = text[1:] if text[:1] in "+-" else text
            n = int(text) if digits.isascii() and digits.isdigit() and len(digits) <= 20 else None
        if n is None or not -(1 << 63) <= n < 1 << 63:
            return None, "intValue is not a 64-bit integer"
        return {"intValue": str(n)}, ""
    if (d := value.get("doubleValue")) is not None:
        if isinstance(d, bool) or not isinstance(d, int | float | str):
            return None, "doubleValue is not a number"
        try:
            f = float(d) if not isinstance(d, str) or d.isascii() else float("x")
        except (ValueError, OverflowError):
            return None, "doubleValue is not a number"
        return {"doubleValue": _double(f)}, ""
    if (raw := value.get("bytesValue")) is not None:
        if not isinstance(raw, str) or len(raw) > limits.max_value_bytes * 4 // 3 + 4:
            return None, "bytesValue is not a base64 string within the size limit"
        return {"bytesValue": raw}, ""
    if depth >= limits.max_depth:
        if "arrayValue" in value or "kvlistValue" in value:
            return None, f"nested more than {limits.max_depth} levels"
        return {}, ""
    if (arr := value.get("arrayValue")) is not None:
        values = arr.get("values", []) if isinstance(arr, dict) else None
        if not isinstance(values, list):
            return None, "arrayValue.values is not a list"
        if len(values) > limits.max_attributes:
            return None, f"an array of more than {limits.max_attributes:,} values"
        clean = []
        for v in values:
            cv, why = _json_value(v, limits, budget, depth + 1)
            if why:
                return None, why
            clean.append(cv)
        return {"arrayValue": {"values": clean}}, ""
    if (kv := value.get("kvlistValue")) is not None:
        items = kv.get("values", []) if isinstance(kv, dict) else None
        if not isinstance(items, list):
            return None, "kvlistValue.values is not a list"
        attrs, why = _json_attributes(items, limits, budget, depth + 1)
        if why:
            return None, why
        return {"kvlistValue": {"values": attrs}}, ""
    return {}, ""


def _double(f: float) -> float | str:
    """A JSON number, or proto3 JSON's spelling of NaN and the infinities."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return f


# --- protobuf ---------------------------------------------------------------------------

_LEN = 2


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise BadBody("invalid protobuf: a varint longer than 10 bytes")


def _walk(
    buf: bytes,
    start: int,
    end: int,
    budget: _Budget,
    cap: tuple[int, int, int, str] | None = None,
) -> list[tuple[int, int, int]]:
    """The length-delimited fields of one message: (field number, value start, value end).

    Every field walked, kept or not, costs one unit of ``budget`` (a request's walk is
    bounded whatever fields it holds); ``cap`` = (field, occurrences allowed, what)
    refuses the request as soon as that field occurs once too often, before the rest of
    the message is read.
    """
    out = []
    i = start
    capped, allowed, limit, what = cap if cap is not None else (0, 0, 0, "")
    seen = 0
    try:
        while i < end:
            budget.left -= 1
            if budget.left < 0:
                raise BadBody("more fields than an export request within the limits holds")
            tag, i = _varint(buf, i)
            number, wire = tag >> 3, tag & 7
            if wire == 0:
                _, j = _varint(buf, i)
            elif wire == 1:
                j = i + 8
            elif wire == _LEN:
                n, i = _varint(buf, i)
                j = i + n
            elif wire == 5:
                j = i + 4
            else:
                raise BadBody(f"invalid protobuf: wire type {wire} (field {number})")
            if j > end or number == 0:
                raise BadBody("invalid protobuf: a field runs past its message (truncated?)")
            if wire == _LEN:
                if number == capped:
                    seen += 1
                    if seen > allowed:
                        raise BadBody(
                            f"the request holds more than {limit:,} {what} (the limit); split it"
                        )
                out.append((number, i, j))
            i = j
    except IndexError:
        raise BadBody("invalid protobuf: the body ends inside a field (truncated?)") from None
    return out


def _count(buf: bytes, start: int, end: int, fields: dict[int, int]) -> str:
    """'' when each numbered field occurs at most its limit times in the message, else why."""
    seen = dict.fromkeys(fields, 0)
    i = start
    try:
        while i < end:
            tag, i = _varint(buf, i)
            number, wire = tag >> 3, tag & 7
            if number in seen:
                seen[number] += 1
                if seen[number] > fields[number]:
                    return f"field {number} repeated more than {fields[number]:,} times"
            if wire == 0:
                _, i = _varint(buf, i)
            elif wire == 1:
                i += 8
            elif wire == _LEN:
                n, i = _varint(buf, i)
                i += n
            elif wire == 5:
                i += 4
            else:
                return f"invalid protobuf wire type {wire}"
    except (IndexError, BadBody):
        return "invalid protobuf"
    return ""


_SPAN_FIELD_NAMES = {9: "attributes", 11: "events", 13: "links"}


def decode_protobuf(body: bytes, limits: Limits) -> Decoded:
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
    from opentelemetry.proto.resource.v1.resource_pb2 import Resource
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    kept_rs: list[dict[str, Any]] = []
    out = Decoded({"resourceSpans": kept_rs})
    # Counting first: nothing is parsed until the request's shape is within its limits,
    # and the walk stops at the first count over one.
    walk = _Budget(limits.max_resource_spans + limits.max_scope_spans + limits.max_spans + 4096)
    top = _walk(
        body,
        0,
        len(body),
        walk,
        (1, limits.max_resource_spans, limits.max_resource_spans, "resourceSpans"),
    )
    shaped = []
    scopes = spans_seen = 0
    for n, a, b in top:
        if n != 1:
            continue
        fields = _walk(
            body,
            a,
            b,
            walk,
            (2, limits.max_scope_spans - scopes, limits.max_scope_spans, "scopeSpans"),
        )
        res = [(x, y) for m, x, y in fields if m == 1]
        scope_spans = []
        for m, x, y in fields:
            if m == 2:
                scopes += 1
                inner = _walk(
                    body, x, y, walk, (2, limits.max_spans - spans_seen, limits.max_spans, "spans")
                )
                spans = [(p, q) for k, p, q in inner if k == 2]
                spans_seen += len(spans)
                scope_slices = [(p, q) for k, p, q in inner if k == 1]
                scope_spans.append((scope_slices, spans))
        shaped.append((res, scope_spans))
    span_limits = {9: limits.max_attributes, 11: limits.max_events, 13: limits.max_links}
    for r, (res, scope_spans) in enumerate(shaped):
        where_r = f"resourceSpans[{r}]"
        n_spans = sum(len(spans) for _, spans in scope_spans)
        resource = None
        try:
            raw = b"".join(body[x:y] for x, y in res)  # a repeated singular field merges
            why = _count(raw, 0, len(raw), {1: limits.max_attributes})
            resource = Resource.FromString(raw) if not why else None
        except DecodeError as exc:
            why = f"invalid protobuf Resource: {exc}"
        if resource is None or why:
            out.reject(f"resource: {why}", where_r, n_spans)
            continue
        budget = _Budget(limits.max_values)
        res_attrs, why = _pb_attributes(resource.attributes, limits, budget, 0)
        if why:
            out.reject(f"resource: {why}", where_r, n_spans)
            continue
        clean_scopes = []
        for s, (slices, spans) in enumerate(scope_spans):
            where_s = f"{where_r}.scopeSpans[{s}]"
            try:
                scope_msg = InstrumentationScope.FromString(b"".join(body[x:y] for x, y in slices))
            except DecodeError as exc:
                out.reject(f"scope: invalid protobuf ({exc})", where_s, len(spans))
                continue
            scope: dict[str, Any] = {}
            if scope_msg.name:
                scope["name"] = scope_msg.name
            if scope_msg.version:
                scope["version"] = scope_msg.version
            kept = []
            for i, (x, y) in enumerate(spans):
                where = f"{where_s}.spans[{i}]"
                if y - x > BIG_SPAN_BYTES:
                    why = _count(body, x, y, span_limits)
                    if why:
                        number = int(why.split()[1])
                        name = _SPAN_FIELD_NAMES.get(number, why)
                        out.reject(f"more than {span_limits.get(number, 0):,} {name}", where)
                        continue
                try:
                    span = Span.FromString(body[x:y])
                except DecodeError as exc:
                    out.reject(f"invalid protobuf Span ({exc})", where)
                    continue
                clean, why = _pb_span(span, limits)
                if clean is None:
                    out.reject(why, where)
                else:
                    kept.append(clean)
            if kept:
                clean_scopes.append({"scope": scope, "spans": kept})
                out.accepted += len(kept)
        if clean_scopes:
            kept_rs.append({"resource": {"attributes": res_attrs}, "scopeSpans": clean_scopes})
    return out


def _pb_id(raw: bytes, width: int, name: str) -> tuple[str, str]:
    if len(raw) != width:
        return "", f"{name} is not {width} bytes"
    if not any(raw):
        return "", f"{name} is all zeros (invalid per W3C Trace Context)"
    return raw.hex(), ""


def _pb_span(span: Any, limits: Limits) -> tuple[dict[str, Any] | None, str]:
    trace_id, why = _pb_id(span.trace_id, 16, "traceId")
    if why:
        return None, why
    span_id, why = _pb_id(span.span_id, 8, "spanId")
    if why:
        return None, why
    out: dict[str, Any] = {"traceId": trace_id, "spanId": span_id}
    if span.parent_span_id:
        out["parentSpanId"], why = _pb_id(span.parent_span_id, 8, "parentSpanId")
        if why:
            return None, why
    if len(span.name) > limits.max_value_bytes:
        return None, f"name longer than {limits.max_value_bytes:,} characters"
    out["name"] = span.name
    if not 0 <= span.kind < SPAN_KINDS:
        return None, "kind is not a SpanKind"
    out["kind"] = span.kind
    out["startTimeUnixNano"] = span.start_time_unix_nano
    out["endTimeUnixNano"] = span.end_time_unix_nano
    if span.trace_state:
        if len(span.trace_state) > limits.max_value_bytes:
            return None, "traceState too long"
        out["traceState"] = span.trace_state
    budget = _Budget(limits.max_values)
    if len(span.attributes) > limits.max_attributes:
        return None, f"more than {limits.max_attributes:,} attributes"
    out["attributes"], why = _pb_attributes(span.attributes, limits, budget, 0)
    if why:
        return None, why
    if len(span.events) > limits.max_events:
        return None, f"more than {limits.max_events:,} events"
    if span.links:
        if len(span.links) > limits.max_links:
            return None, f"more than {limits.max_links:,} links"
        links = []
        for link in span.links:
            lt, why = _pb_id(link.trace_id, 16, "link traceId")
            if why:
                return None, why
            ls, why = _pb_id(link.span_id, 8, "link spanId")
            if why:
                return None, why
            attrs, why = _pb_attributes(link.attributes, limits, budget, 0)
            if why:
                return None, f"link {why}"
            links.append({"traceId": lt, "spanId": ls, "attributes": attrs})
        out["links"] = links
    if span.HasField("status"):
        if not 0 <= span.status.code < STATUS_CODES:
            return None, "status.code is not a StatusCode"
        out["status"] = {"code": span.status.code}
    return out, ""


def _pb_attributes(
    items: Any, limits: Limits, budget: _Budget, depth: int
) -> tuple[list[Any], str]:
    if len(items) > limits.max_attributes:
        return [], f"more than {limits.max_attributes:,} attributes"
    budget.left -= len(items)
    if budget.left < 0:
        return [], f"more than {limits.max_values:,} attribute values in one span"
    out = []
    longest = limits.max_value_bytes
    # The scalar cases inline: this loop is most of a span's decoding.
    for item in items:
        v = item.value
        which = v.WhichOneof("value")
        if which == "string_value":
            s = v.string_value
            if len(s) > longest:
                return [], f"attribute {item.key[:100]!r}: value longer than {longest:,} characters"
            out.append({"key": item.key, "value": {"stringValue": s}})
        elif which == "int_value":
            out.append({"key": item.key, "value": {"intValue": str(v.int_value)}})
        elif which == "bool_value":
            out.append({"key": item.key, "value": {"boolValue": v.bool_value}})
        else:
            value, why = _pb_value(v, limits, budget, depth, which)
            if why:
                return [], f"attribute {item.key[:100]!r}: {why}"
            out.append({"key": item.key, "value": value})
    return out, ""


def _pb_value(
    value: Any, limits: Limits, budget: _Budget, depth: int, which: str | None
) -> tuple[Any, str]:
    """One AnyValue (``which``: its oneof); the caller has counted it in ``budget``."""
    if which == "string_value":
        s = value.string_value
        if len(s) > limits.max_value_bytes:
            return None, f"value longer than {limits.max_value_bytes:,} characters"
        return {"stringValue": s}, ""
    if which == "int_value":
        return {"intValue": str(value.int_value)}, ""
    if which == "bool_value":
        return {"boolValue": value.bool_value}, ""
    if which == "double_value":
        return {"doubleValue": _double(value.double_value)}, ""
    if which == "bytes_value":
        raw = value.bytes_value
        if len(raw) > limits.max_value_bytes:
            return None, f"value longer than {limits.max_value_bytes:,} bytes"
        return {"bytesValue": base64.b64encode(raw).decode("ascii")}, ""
    if which in ("array_value", "kvlist_value") and depth >= limits.max_depth:
        return None, f"nested more than {limits.max_depth} levels"
    if which == "array_value":
        values = value.array_value.values
        if len(values) > limits.max_attributes:
            return None, f"an array of more than {limits.max_attributes:,} values"
        budget.left -= len(values)
        if budget.left < 0:
            return None, f"more than {limits.max_values:,} attribute values in one span"
        clean = []
        for v in values:
            cv, why = _pb_value(v, limits, budget, depth + 1, v.WhichOneof("value"))
            if why:
                return None, why
            clean.append(cv)
        return {"arrayValue": {"values": clean}}, ""
    if which == "kvlist_value":
        attrs, why = _pb_attributes(value.kvlist_value.values, limits, budget, depth + 1)
        if why:
            return None, why
        return {"kvlistValue": {"values": attrs}}, ""
    return {}, ""


def b64_hex(value: str) -> str:
    """Hex of a base64 id (tests read protobuf JSON mappings with it)."""
    try:
        return base64.b64decode(value).hex()
    except (binascii.Error, ValueError):
        return ""


def gzip_bytes(data: bytes) -> bytes:
    """gzip ``data`` (tests and the demo send compressed bodies with it)."""
    return gzip.compress(data)
