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
    SPAN_HEX,
    SPAN_KINDS,
    STATUS_CODES,
    TRACE_HEX,
    Origin,
    Resource,
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


def any_value(value: Any, key: str, origin: Origin, line: int) -> Any:
    """Decode an OTLP ``AnyValue``; an empty or unknown value decodes to None."""
    if not isinstance(value, dict):
        return None
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
    if (arr := value.get("arrayValue")) is not None:
        values = arr.get("values") if isinstance(arr, dict) else None
        return [any_value(v, key, origin, line) for v in values or ()]
    if (kv := value.get("kvlistValue")) is not None:
        values = kv.get("values") if isinstance(kv, dict) else None
        return attributes(values, origin, line)
    return None


def attributes(items: Any, origin: Origin, line: int) -> dict[str, Any]:
    """``[{"key": .., "value": AnyValue}]`` as a dict (a later duplicate key wins)."""
    out: dict[str, Any] = {}
    if not isinstance(items, list):
        return out
    for item in items:
        if isinstance(item, dict) and item.get("key") is not None:
            key = str(item["key"])
            out[key] = any_value(item.get("value"), key, origin, line)
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
    """Rows of every span in one OTLP document that starts at ``line``."""
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
        res = rs.get("resource")
        resource = Resource.from_attributes(
            attributes(res.get("attributes") if isinstance(res, dict) else None, origin, line)
        )
        scope_spans = rs.get("scopeSpans")
        for ss in scope_spans if isinstance(scope_spans, list) else ():
            spans = ss.get("spans") if isinstance(ss, dict) else None
            for span in spans if isinstance(spans, list) else ():
                row = _span(span, resource, origin, line, seq)
                seq += 1
                if row is not None:
                    yield row


def _span(
    span: Any, resource: Resource, origin: Origin, line: int, seq: int
) -> tuple[Any, ...] | None:
    where = origin.at(line)
    if not isinstance(span, dict):
        origin.log.add(where, "a span is not an object; skipped", pk.MALFORMED, skipped=1)
        return None
    trace_id = normalize_id(span.get("traceId"), TRACE_HEX, origin, line)
    span_id = normalize_id(span.get("spanId"), SPAN_HEX, origin, line)
    if trace_id is None or span_id is None:
        name = span.get("name")
        origin.log.add(
            where, f"span {name!r} has no traceId/spanId; skipped", pk.MALFORMED, skipped=1
        )
        return None
    kind = _enum(span.get("kind"), SPAN_KINDS, "SPAN_KIND_") or SPAN_KINDS[0]
    status_obj = span.get("status")
    code = status_obj.get("code") if isinstance(status_obj, dict) else None
    status = _enum(code, STATUS_CODES, "STATUS_CODE_") or STATUS_CODES[0]
    start, end = span_times(
        to_int(span.get("startTimeUnixNano")), to_int(span.get("endTimeUnixNano")), where, origin
    )
    links = []
    for link in span.get("links") or ():
        if not isinstance(link, dict):
            continue
        links.append(
            {
                "trace_id": normalize_id(link.get("traceId"), TRACE_HEX, origin, line),
                "span_id": normalize_id(link.get("spanId"), SPAN_HEX, origin, line),
                "attributes": attributes(link.get("attributes"), origin, line),
            }
        )
    name = span.get("name")
    trace_state = span.get("traceState")
    return make_row(
        trace_id=trace_id,
        span_id=span_id,
        parent=parent_id(span.get("parentSpanId"), origin, line),
        name="" if name is None else str(name),
        kind=kind,
        start=start,
        end=end,
        status=status,
        resource=resource,
        attrs=attributes(span.get("attributes"), origin, line),
        links=links,
        origin=origin,
        line=line,
        seq=seq,
        trace_state=trace_state if isinstance(trace_state, str) else None,
    )
