"""Jaeger JSON (the query API's model, as the UI and ``/api/traces`` serve it) → rows.

Accepted shapes: the API envelope ``{"data": [trace, ...], "errors": ...}``, one trace
object ``{"traceID", "spans", "processes"}``, and a bare array of spans that carry
their ``process`` inline (the anonymizer's input).

Rules, from the Jaeger model: times are microseconds (stored as ns); 64-bit trace ids
are 16 hex digits (left-padded to 32) and span ids may lack leading zeros (padded to
16); tags carry a ``type`` (``string``, ``bool``, ``int64``, ``float64``, ``binary``)
and their values may arrive as strings; the service comes from ``processes`` (or the
inline ``process``), whose tags become resource attributes.

References: the first ``CHILD_OF`` within the same trace is the parent. A span with no
such reference but a ``FOLLOWS_FROM`` one takes the first of those as its parent too
(it was caused by that span, and the Jaeger UI draws it there); this keeps it in its
request's tree instead of making it a second root, and the reference is kept as a link
too, so the walk knows the request did not wait for it. Every other reference becomes a
link with ``opentracing.ref_type`` set, as the OpenTelemetry Jaeger translator does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tracekit import conventions as cv
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.rows import (
    SPAN_HEX,
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
    span_times,
    to_int,
    truncate,
)

SPAN_KIND_TAG = "span.kind"
ERROR_TAG = "error"
OTEL_STATUS_TAG = "otel.status_code"
REF_TYPE_ATTR = "opentracing.ref_type"
HOSTNAME_TAG = "hostname"
_KINDS = {
    "server": "SERVER",
    "client": "CLIENT",
    "producer": "PRODUCER",
    "consumer": "CONSUMER",
    "internal": "INTERNAL",
}


def is_jaeger(doc: Any) -> bool:
    if isinstance(doc, list):
        return bool(doc) and all(isinstance(s, dict) and "spanID" in s for s in doc[:3])
    if not isinstance(doc, dict):
        return False
    return "data" in doc or ("spans" in doc and "traceID" in doc)


def tag_value(tag: dict[str, Any], origin: Origin, line: int) -> Any:
    """A tag's value by its ``type``; raises :class:`Malformed` for an array or object.

    Jaeger's tag values are scalars (its model has no nested values).
    """
    key = str(tag.get("key"))
    value = tag.get("value")
    if isinstance(value, (dict, list)):
        raise Malformed(f"tag {key!r} value is {json_type(value)}, not a scalar")
    kind = str(as_scalar(tag.get("type"), f"tag {key!r} type", str) or "string").lower()
    if kind == "bool":
        return value if isinstance(value, bool) else str(value).lower() == "true"
    if kind == "int64":
        n = to_int(value)
        return n if n is not None else value
    if kind == "float64":
        try:
            return float(str(value))
        except ValueError:
            return value
    if isinstance(value, str):
        return truncate(value, key, origin, line)
    return value


def tags(items: Any, origin: Origin, line: int, *, what: str = "tags") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for tag in as_list(items, what):
        if not isinstance(tag, dict):
            raise Malformed(f"an item of {what} is {json_type(tag)}, not an object")
        if tag.get("key") is not None:
            key = as_scalar(tag["key"], f"a key of {what}", str, int, float)
            out[str(key)] = tag_value(tag, origin, line)
    return out


def _resource(process: Any, origin: Origin, line: int) -> Resource:
    """A process as a resource; raises :class:`Malformed` for one of the wrong shape."""
    attrs: dict[str, Any] = {}
    process = as_object(process, "process")
    if process is not None:
        attrs[cv.SERVICE_NAME] = as_scalar(process.get("serviceName"), "serviceName", str)
        attrs.update(tags(process.get("tags"), origin, line, what="process tags"))
        # Jaeger clients report the host as "hostname"; OTel calls it host.name.
        if HOSTNAME_TAG in attrs and cv.HOST_NAME not in attrs:
            attrs[cv.HOST_NAME] = attrs[HOSTNAME_TAG]
    return Resource.from_attributes(attrs)


def decode(doc: Any, origin: Origin, line: int) -> Iterator[tuple[Any, ...]]:
    """Rows of every span in a Jaeger document (envelope, trace or span array)."""
    where = origin.at(line)
    if isinstance(doc, list):
        yield from _trace({"spans": doc}, origin, line, 0)
        return
    if "data" in doc:
        errors = doc.get("errors")
        if errors:
            origin.log.add(where, f"Jaeger reported errors: {errors}", pk.SOURCE_ERROR, skipped=1)
        data = doc.get("data") or []
        if not isinstance(data, list):
            origin.log.add(
                where, "'data' is not a list of traces; skipped", pk.MALFORMED, skipped=1
            )
            return
        seq = 0
        for index, trace in enumerate(data):
            if not isinstance(trace, dict) or not isinstance(trace.get("spans"), list):
                origin.log.add(
                    where, f"data[{index}] is not a trace; skipped", pk.MALFORMED, skipped=1
                )
                continue
            for row in _trace(trace, origin, line, seq):
                seq += 1
                yield row
        return
    if not isinstance(doc.get("spans"), list):
        origin.log.add(where, "'spans' is not a list; trace skipped", pk.MALFORMED, skipped=1)
        return
    yield from _trace(doc, origin, line, 0)


def _trace(trace: dict[str, Any], origin: Origin, line: int, seq: int) -> Iterator[tuple[Any, ...]]:
    processes = trace.get("processes")
    resources: dict[str, Resource | str] = {}
    for pid, p in processes.items() if isinstance(processes, dict) else ():
        try:
            resources[str(pid)] = _resource(p, origin, line)
        except Malformed as exc:
            # Only the spans of this process are lost; each says why.
            resources[str(pid)] = f"its process {pid!r}: {exc}"
    for span in trace["spans"]:
        row = _span(span, trace, resources, origin, line, seq)
        seq += 1
        if row is not None:
            yield row


def _span(
    span: Any,
    trace: dict[str, Any],
    resources: dict[str, Resource | str],
    origin: Origin,
    line: int,
    seq: int,
) -> tuple[Any, ...] | None:
    where = origin.at(line)
    if not isinstance(span, dict):
        origin.log.add(where, "a span is not an object; skipped", pk.MALFORMED, skipped=1)
        return None
    try:
        return _checked_span(span, trace, resources, origin, line, seq)
    except Malformed as exc:
        name = span.get("operationName")
        label = f"span {name!r}" if isinstance(name, str) else "a span"
        origin.log.add(where, f"{label}: {exc}; skipped", pk.MALFORMED, skipped=1)
        return None


def _checked_span(
    span: dict[str, Any],
    trace: dict[str, Any],
    resources: dict[str, Resource | str],
    origin: Origin,
    line: int,
    seq: int,
) -> tuple[Any, ...] | None:
    where = origin.at(line)
    for field in ("traceID", "spanID"):
        as_scalar(span.get(field), field, str)
    for field in ("startTime", "duration"):
        as_scalar(span.get(field), field, str, int, float)
    name = as_scalar(span.get("operationName"), "operationName", str)
    trace_id = normalize_id(span.get("traceID") or trace.get("traceID"), TRACE_HEX, origin, line)
    span_id = normalize_id(span.get("spanID"), SPAN_HEX, origin, line)
    if trace_id is None or span_id is None:
        origin.log.add(
            where, f"span {name!r} has no traceID/spanID; skipped", pk.MALFORMED, skipped=1
        )
        return None
    if "process" in span:
        resource = _resource(span["process"], origin, line)
    else:
        found = resources.get(str(span.get("processID")))
        if isinstance(found, str):
            raise Malformed(found)
        resource = found if found is not None else _resource(None, origin, line)

    parent: str | None = None
    links: list[dict[str, Any]] = []
    refs = as_list(span.get("references"), "references")
    for ref in refs:
        if not isinstance(ref, dict):
            raise Malformed(f"a reference is {json_type(ref)}, not an object")
        as_scalar(ref.get("traceID"), "a reference's traceID", str)
        as_scalar(ref.get("spanID"), "a reference's spanID", str)
    candidates = [r for r in refs if str(r.get("refType", "")).upper() == "CHILD_OF"]
    candidates += [r for r in refs if str(r.get("refType", "")).upper() == "FOLLOWS_FROM"]
    chosen = None
    for ref in candidates:
        ref_trace = normalize_id(ref.get("traceID") or trace_id, TRACE_HEX, origin, line)
        if ref_trace == trace_id:
            chosen = ref
            parent = normalize_id(ref.get("spanID"), SPAN_HEX, origin, line)
            break
    # A FOLLOWS_FROM parent stays a link too (the OpenTelemetry Collector's translation
    # keeps both): attribution leaves such a span off the request's critical path.
    follows = chosen is not None and str(chosen.get("refType", "")).upper() == "FOLLOWS_FROM"
    for ref in refs:
        if ref is chosen and not follows:
            continue
        links.append(
            {
                "trace_id": normalize_id(ref.get("traceID") or trace_id, TRACE_HEX, origin, line),
                "span_id": normalize_id(ref.get("spanID"), SPAN_HEX, origin, line),
                "attributes": {REF_TYPE_ATTR: str(ref.get("refType", "")).lower()},
            }
        )

    attrs = tags(span.get("tags"), origin, line)
    kind = _KINDS.get(str(attrs.get(SPAN_KIND_TAG, "")).lower(), "UNSPECIFIED")
    status = "UNSET"
    otel_status = str(attrs.get(OTEL_STATUS_TAG, "")).upper()
    if otel_status in ("OK", "ERROR"):
        status = otel_status
    if attrs.get(ERROR_TAG) is True or str(attrs.get(ERROR_TAG)).lower() == "true":
        status = "ERROR"

    start_us = to_int(span.get("startTime"))
    duration_us = to_int(span.get("duration"))
    start = start_us * 1000 if start_us else None
    end = start + duration_us * 1000 if start is not None and duration_us is not None else None
    start, end = span_times(start, end, where, origin)
    name = span.get("operationName")
    return make_row(
        trace_id=trace_id,
        span_id=span_id,
        parent=parent,
        name="" if name is None else str(name),
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
    )
