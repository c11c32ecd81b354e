"""OTLP JSON (``ExportTraceServiceRequest`` / ``TracesData``) decoded in Python.

Follows the OTLP/JSON rules: ids are hex strings (any case; tracekit stores lower
case), 64-bit integers and nanosecond times may be strings or numbers, enums are
integers (their names are accepted too), ``AnyValue`` is decoded to plain JSON values
(``bytesValue`` stays base64 text). Jaeger's api_v3 ``{"result": {...}}`` wrapper and
its ``{"error": {...}}`` answer are understood here as well.

This is the reference decoder; big OTLP JSON-lines files take the SQL fast path in
:mod:`tracekit.analysis.ingest.fast`, which defers every odd line to this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.rows import (
    MAX_DEPTH,
    SPAN_HEX,
    SPAN_KINDS,
    STATUS_CODES,
    TRACE_HEX,
    Malformed,
    Origin,
    Resource,
    as_list,
    as_object,
    as_scalar,
    json_type,
    make_row,
    normalize_id,
    parent_id,
    span_times,
    to_int,
    truncate,
)


def is_otlp(doc: Any) -> bool:
    """True for an OTLP traces document, bare or in Jaeger api_v3's ``result`` wrapper."""
    if not isinstance(doc, dict):
        return False
    if "resourceSpans" in doc:
        return True
    result = doc.get("result")
    return isinstance(result, dict) and "resourceSpans" in result


def is_api_v3_error(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("error"), dict) and len(doc) == 1


def any_value(value: Any, key: str, origin: Origin, line: int, depth: int = 0) -> Any:
    """Decode an OTLP ``AnyValue``; an empty or unknown value decodes to None.

    Raises :class:`Malformed` for a field of the wrong JSON type (an array where a
    scalar belongs, ``arrayValue.values`` that is not an array) and for values nested
    more than :data:`MAX_DEPTH` levels, so no input can exhaust the stack.
    """
    if not isinstance(value, dict):
        return None  # as the fast path stores it: an empty value
    for field in _SCALAR_FIELDS:
        if isinstance(value.get(field), (dict, list)):
            raise Malformed(f"attribute {key!r} {field} is {json_type(value[field])}")
    if (s := value.get("stringValue")) is not None:
        return truncate(str(s), key, origin, line)
    if (b := value.get("boolValue")) is not None:
        return b if isinstance(b, bool) else str(b).lower() == "true"
    if (i := value.get("intValue")) is not None:
        n = to_int(i)
        return n if n is not None else str(i)
    if (d := value.get("doubleValue")) is not None:
        try:
            f = float(d)
        except (TypeError, ValueError):
            return str(d)
        # NaN and infinities have no JSON number; keep their proto3 JSON spelling.
        return f if f == f and f not in (float("inf"), float("-inf")) else str(d)
    if (raw := value.get("bytesValue")) is not None:
        return str(raw)
    nested = value.get("arrayValue"), value.get("kvlistValue")
    if nested != (None, None) and depth >= MAX_DEPTH:
        raise Malformed(f"attribute {key!r} is nested more than {MAX_DEPTH} levels")
    if (arr := nested[0]) is not None:
        values = as_object(arr, f"attribute {key!r} arrayValue") or {}
        items = as_list(values.get("values"), f"attribute {key!r} arrayValue.values")
        return [any_value(v, key, origin, line, depth + 1) for v in items]
    if (kv := nested[1]) is not None:
        values = as_object(kv, f"attribute {key!r} kvlistValue") or {}
        return attributes(
            values.get("values"),
            origin,
            line,
            depth + 1,
            what=f"attribute {key!r} kvlistValue.values",
        )
    return None


_SCALAR_FIELDS = ("stringValue", "boolValue", "intValue", "doubleValue", "bytesValue")


def attributes(
    items: Any, origin: Origin, line: int, depth: int = 0, *, what: str = "attributes"
) -> dict[str, Any]:
    """``[{"key": .., "value": AnyValue}]`` as a dict (a later duplicate key wins).

    An item without a key is left out; anything not of this shape raises
    :class:`Malformed`.
    """
    out: dict[str, Any] = {}
    for item in as_list(items, what):
        if not isinstance(item, dict):
            raise Malformed(f"an item of {what} is {json_type(item)}, not an object")
        if item.get("key") is not None:
            key = as_scalar(item["key"], f"a key of {what}", str, int, float)
            key = str(key)
            out[key] = any_value(item.get("value"), key, origin, line, depth)
    return out


def _enum(raw: Any, names: tuple[str, ...], prefix: str) -> str | None:
    if raw is None:
        return names[0]
    if isinstance(raw, int) and not isinstance(raw, bool):
        return names[raw] if 0 <= raw < len(names) else None
    text = str(raw).upper().removeprefix(prefix)
    if text.isdigit():
        return _enum(int(text), names, prefix)
    return text if text in names else None


def decode(
    doc: dict[str, Any], origin: Origin, line: int, seq: int = 0
) -> Iterator[tuple[Any, ...]]:
    """Rows of every span in one OTLP document that starts at ``line``.

    A span with a field of the wrong type is skipped and counted; so is a resource
    whose attributes are malformed (with its spans), and a scope that is not one.
    """
    where = origin.at(line)
    if "resourceSpans" not in doc and isinstance(doc.get("result"), dict):
        doc = doc["result"]
    resource_spans = doc.get("resourceSpans")
    if not isinstance(resource_spans, list):
        origin.log.add(
            where, "resourceSpans is not a list; document skipped", pk.MALFORMED, skipped=1
        )
        return
    for r_index, rs in enumerate(resource_spans):
        if not isinstance(rs, dict):
            origin.log.add(
                where,
                f"resourceSpans[{r_index}] is not an object; skipped",
                pk.MALFORMED,
                skipped=1,
            )
            continue
        try:
            res = as_object(rs.get("resource"), "resource") or {}
            resource = Resource.from_attributes(
                attributes(res.get("attributes"), origin, line, what="resource attributes")
            )
            scope_spans = as_list(rs.get("scopeSpans"), "scopeSpans")
        except Malformed as exc:
            origin.log.add(
                where,
                f"resourceSpans[{r_index}]: {exc}; its spans skipped",
                pk.MALFORMED,
                skipped=max(1, _count_spans(rs)),
            )
            continue
        for s_index, ss in enumerate(scope_spans):
            try:
                scope = as_object(ss, "a scopeSpans item") or {}
                spans = as_list(scope.get("spans"), "spans")
            except Malformed as exc:
                origin.log.add(
                    where,
                    f"resourceSpans[{r_index}].scopeSpans[{s_index}]: {exc}; skipped",
                    pk.MALFORMED,
                    skipped=1,
                )
                continue
            for span in spans:
                row = _span(span, resource, origin, line, seq)
                seq += 1
                if row is not None:
                    yield row


def _count_spans(rs: dict[str, Any]) -> int:
    scopes = rs.get("scopeSpans")
    if not isinstance(scopes, list):
        return 0
    return sum(
        len(ss["spans"])
        for ss in scopes
        if isinstance(ss, dict) and isinstance(ss.get("spans"), list)
    )


def _span(
    span: Any, resource: Resource, origin: Origin, line: int, seq: int
) -> tuple[Any, ...] | None:
    where = origin.at(line)
    if not isinstance(span, dict):
        origin.log.add(where, "a span is not an object; skipped", pk.MALFORMED, skipped=1)
        return None
    try:
        return _checked_span(span, resource, origin, line, seq)
    except Malformed as exc:
        name = span.get("name")
        label = f"span {name!r}" if isinstance(name, str) else "a span"
        origin.log.add(where, f"{label}: {exc}; skipped", pk.MALFORMED, skipped=1)
        return None


def _checked_span(
    span: dict[str, Any], resource: Resource, origin: Origin, line: int, seq: int
) -> tuple[Any, ...] | None:
    where = origin.at(line)
    for field in _ID_FIELDS:
        as_scalar(span.get(field), field, str)
    for field in _TIME_FIELDS:
        as_scalar(span.get(field), field, str, int, float)
    name = as_scalar(span.get("name"), "name", str)
    trace_state = as_scalar(span.get("traceState"), "traceState", str)
    kind_raw = as_scalar(span.get("kind"), "kind", str, int)
    status_obj = as_object(span.get("status"), "status") or {}
    code = as_scalar(status_obj.get("code"), "status.code", str, int)
    trace_id = normalize_id(span.get("traceId"), TRACE_HEX, origin, line)
    span_id = normalize_id(span.get("spanId"), SPAN_HEX, origin, line)
    if trace_id is None or span_id is None:
        origin.log.add(
            where, f"span {name!r} has no traceId/spanId; skipped", pk.MALFORMED, skipped=1
        )
        return None
    attrs = attributes(span.get("attributes"), origin, line)
    links = []
    for link in as_list(span.get("links"), "links"):
        if not isinstance(link, dict):
            raise Malformed(f"a link is {json_type(link)}, not an object")
        as_scalar(link.get("traceId"), "a link's traceId", str)
        as_scalar(link.get("spanId"), "a link's spanId", str)
        links.append(
            {
                "trace_id": normalize_id(link.get("traceId"), TRACE_HEX, origin, line),
                "span_id": normalize_id(link.get("spanId"), SPAN_HEX, origin, line),
                "attributes": attributes(
                    link.get("attributes"), origin, line, what="a link's attributes"
                ),
            }
        )
    kind = _enum(kind_raw, SPAN_KINDS, "SPAN_KIND_") or SPAN_KINDS[0]
    status = _enum(code, STATUS_CODES, "STATUS_CODE_") or STATUS_CODES[0]
    start, end = span_times(
        to_int(span.get("startTimeUnixNano")), to_int(span.get("endTimeUnixNano")), where, origin
    )
    return make_row(
        trace_id=trace_id,
        span_id=span_id,
        parent=parent_id(span.get("parentSpanId"), origin, line),
        name="" if name is None else name,
        kind=kind,
        start=start,
        end=end,
        status=status,
        resource=resource,
        attrs=attrs,
        links=links,
        origin=origin,
        line=line,
        seq=seq,
        trace_state=trace_state,
    )


_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
_TIME_FIELDS = ("startTimeUnixNano", "endTimeUnixNano")
