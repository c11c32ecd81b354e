"""Span rows: ids, attribute values and the columns every format decodes into.

The OTLP and Jaeger decoders share these helpers so that the same span gives the same
row whichever format carried it. A row is a tuple in :data:`STAGE_COLUMNS` order: the
store's :data:`~tracekit.analysis.store.SPAN_COLUMNS` followed by where it came from
(file number, line, position), which decides which of two duplicates is kept.

The SQL fast path (``sql/ingest_otlp_lines.sql``) implements the same rules for the
clean cases and hands every other line to these functions, so they are the reference.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from tracekit import conventions as cv
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.store import SPAN_COLUMNS

STAGE_COLUMNS: tuple[str, ...] = (*SPAN_COLUMNS, "trace_state", "file_no", "lineno", "seq")
"""A staged row: the span columns, the span's W3C tracestate, then its origin (file
number, line, position)."""

MAX_ATTR_CHARS = 4096
"""String attribute values longer than this are truncated (and counted as huge)."""

MAX_DEPTH = 32
"""Nesting of ``arrayValue``/``kvlistValue`` (or Jaeger tag values) inside one attribute;
deeper is malformed, as the receiver's ``tracekit.collect.decode.Limits.max_depth``."""

TRACE_HEX = 32
SPAN_HEX = 16
_HEX = re.compile(r"[0-9a-f]+")
_ZERO_SPAN = "0" * SPAN_HEX

SPAN_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
"""OTLP ``Span.SpanKind`` by enum number."""
STATUS_CODES = ("UNSET", "OK", "ERROR")
"""OTLP ``Status.StatusCode`` by enum number."""


class Malformed(ValueError):
    """A field of the wrong JSON type, or nested too deep: the span holding it is skipped.

    Raised by the field checks below and caught where one span (or one resource) is
    decoded, so a hostile field costs that span, never the file.
    """


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type, for problem reasons."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def as_list(value: Any, what: str) -> list[Any]:
    """``value`` when it is a JSON array, ``[]`` when absent; else :class:`Malformed`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Malformed(f"{what} is {json_type(value)}, not an array")
    return value


def as_object(value: Any, what: str) -> dict[str, Any] | None:
    """``value`` when it is a JSON object, None when absent; else :class:`Malformed`."""
    if value is None or isinstance(value, dict):
        return value
    raise Malformed(f"{what} is {json_type(value)}, not an object")


def as_scalar(value: Any, what: str, *types: type) -> Any:
    """``value`` when absent or of one of ``types``; else :class:`Malformed`."""
    if value is None or (
        isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    ):
        return value
    raise Malformed(f"{what} is {json_type(value)}")


@dataclass(frozen=True)
class Origin:
    """Where decoded rows come from: ``display`` is the path as the user wrote it."""

    display: str
    file_no: int
    log: ProblemLog

    def at(self, line: int) -> str:
        return f"{self.display}:{line}"


@dataclass(frozen=True)
class Resource:
    """The resource columns shared by every span of one resource (or Jaeger process)."""

    service_name: str | None
    service_version: str | None
    instance_id: str | None
    host_name: str | None
    attributes_json: str

    @classmethod
    def from_attributes(cls, attrs: dict[str, Any]) -> Resource:
        return cls(
            service_name=_str_or_none(attrs.get(cv.SERVICE_NAME)),
            service_version=_str_or_none(attrs.get(cv.SERVICE_VERSION)),
            instance_id=_str_or_none(attrs.get(cv.SERVICE_INSTANCE_ID)),
            host_name=_str_or_none(attrs.get(cv.HOST_NAME)),
            attributes_json=dumps(attrs),
        )


def dumps(value: Any) -> str:
    """Compact JSON, as DuckDB writes it (so both paths store the same text)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _str_or_none(v: Any) -> str | None:
    return v if isinstance(v, str) else None


def _int_or_none(v: Any) -> int | None:
    # Only real integers count: a stage's CPU nanoseconds are never fractional or text.
    if isinstance(v, int) and not isinstance(v, bool) and -(2**63) <= v < 2**63:
        return v
    return None


_OT_ENTRY = re.compile(r"(?:^|,)[ \t]*ot=([^,]*)")
_TH = re.compile(r"(?:^|;)th:([0-9a-f]{1,14})(?:;|$)")
_TWO_56 = float(1 << 56)


def threshold_weight(trace_state: str | None) -> float | None:
    """Adjusted count from OTel probability sampling's ``ot=th:T`` in a W3C tracestate.

    T is hex, right-padded with zeros to 14 digits (56 bits); a span kept when its
    randomness is at least T stands for 2^56 / (2^56 - T) spans: ``th:0`` -> 1,
    ``th:8`` -> 2, ``th:c`` -> 4. None when the tracestate has no valid threshold.
    """
    if not trace_state or "th:" not in trace_state:
        return None
    entry = _OT_ENTRY.search(trace_state)
    th = _TH.search(entry.group(1)) if entry else None
    if th is None:
        return None
    return _TWO_56 / (_TWO_56 - int(th.group(1).ljust(14, "0"), 16))


def sample_weight(v: Any, trace_state: str | None) -> float:
    """``tracekit.sample.weight`` when it is a number; else the tracestate's threshold; else 1."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return threshold_weight(trace_state) or 1.0


def normalize_id(raw: Any, width: int, origin: Origin, line: int) -> str | None:
    """Lower-case hex of ``width`` digits, or None when absent.

    Shorter hex is left-padded (Jaeger's 64-bit trace ids, span ids printed without
    leading zeros). Base64 of the right byte length (protobuf's default JSON mapping)
    is decoded. Anything else (``trace-123``) is hashed to hex deterministically, so
    references to it still match, and counted as ``non_hex_id``.
    """
    if raw is None or raw == "":
        return None
    text = str(raw)
    low = text.lower()
    if len(low) <= width and _HEX.fullmatch(low):
        return low.rjust(width, "0")
    nbytes = width // 2
    if len(text) == 4 * math.ceil(nbytes / 3):
        try:
            decoded = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            decoded = b""
        if len(decoded) == nbytes:
            if origin.log.first_time(pk.NON_HEX_ID, text):
                origin.log.add(
                    origin.at(line), f"id {text!r} is base64; decoded to hex", pk.NON_HEX_ID
                )
            return decoded.hex()
    mapped = hashlib.blake2b(text.encode(), digest_size=nbytes).hexdigest()
    # Counted once per distinct id: every reference to it maps the same way.
    if origin.log.first_time(pk.NON_HEX_ID, text):
        origin.log.add(
            origin.at(line), f"id {text!r} is not hex; mapped to {mapped}", pk.NON_HEX_ID
        )
    return mapped


def parent_id(raw: Any, origin: Origin, line: int) -> str | None:
    """A parent span id; empty and all-zero ids mean "no parent" (a root)."""
    pid = normalize_id(raw, SPAN_HEX, origin, line)
    return None if pid is None or pid == _ZERO_SPAN else pid


def truncate(value: str, key: str, origin: Origin, line: int) -> str:
    if len(value) <= MAX_ATTR_CHARS:
        return value
    origin.log.add(
        origin.at(line),
        f"attribute {key!r} has {len(value):,} characters; kept the first {MAX_ATTR_CHARS:,}",
        pk.HUGE_ATTRIBUTE,
    )
    return value[:MAX_ATTR_CHARS]


def to_int(raw: Any) -> int | None:
    """int64/uint64 fields: a JSON number or a decimal string."""
    if isinstance(raw, bool) or raw is None:
        return None
    if isinstance(raw, int):
        return raw
    if isinstance(raw, float):
        return int(raw) if raw.is_integer() else None
    if isinstance(raw, str):
        try:
            return int(raw.strip())
        except ValueError:
            return None
    return None


def span_times(
    start: int | None, end: int | None, where: str, origin: Origin
) -> tuple[int | None, int | None]:
    """Start/end nanoseconds: zero means unset; end before start is clamped to start."""
    # Zero is OTLP's "unset"; a value past int64 cannot be a real time either.
    start = start if start and 0 < start < 2**63 else None
    end = end if end and 0 < end < 2**63 else None
    if start is None or end is None:
        origin.log.add(where, "span has no start and/or end time; stored without", pk.NO_TIMESTAMPS)
    elif end < start:
        origin.log.add(
            where,
            f"span ends {start - end:,} ns before it starts; end set to start",
            pk.NEGATIVE_DURATION,
        )
        end = start
    return start, end


def make_row(
    *,
    trace_id: str,
    span_id: str,
    parent: str | None,
    name: str,
    kind: str,
    start: int | None,
    end: int | None,
    status: str,
    resource: Resource,
    attrs: dict[str, Any],
    links: list[dict[str, Any]],
    origin: Origin,
    line: int,
    seq: int,
    trace_state: str | None = None,
) -> tuple[Any, ...]:
    """One staged row (see :data:`STAGE_COLUMNS`)."""
    return (
        trace_id,
        span_id,
        parent,
        name,
        kind,
        start,
        end,
        status,
        resource.service_name,
        resource.service_version,
        resource.instance_id,
        resource.host_name,
        _str_or_none(attrs.get(cv.STAGE)),
        _str_or_none(attrs.get(cv.TIME_KIND)),
        _int_or_none(attrs.get(cv.CPU_TIME_NS)),
        _int_or_none(attrs.get(cv.GPU_TIME_NS)),
        sample_weight(attrs.get(cv.SAMPLE_WEIGHT), trace_state),
        dumps(attrs),
        resource.attributes_json,
        dumps(links),
        origin.at(line),
        trace_state or None,
        origin.file_no,
        line,
        seq,
    )
