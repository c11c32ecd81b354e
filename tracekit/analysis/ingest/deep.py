"""OTLP JSON lines nested too deep for ``json.loads``, split into spans without recursion.

A 20 KB line can nest past the decoder's recursion limit, and then Python cannot build
any of it. An OTLP document is shallow above its spans, though: :func:`split` walks
``resourceSpans → scopeSpans → spans`` with an iterative scanner (it matches strings
and brackets and builds no objects), decodes each span on its own, and reports only
the spans (or resources) that are too deep themselves; the rest of the line is kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.rows import Origin

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_WS = re.compile(r"[ \t\r\n]*")
_PLAIN = re.compile(r'[^"\[\]{}]+')
_SCALAR = re.compile(r"[^,\]}\s]+")


class _NotShaped(ValueError):
    """The text is not a JSON object of the expected shape."""


def split(text: str, origin: Origin, line: int) -> dict[str, Any] | None:
    """The OTLP document in ``text`` without the parts nested too deep to decode.

    Each span (or resource) that does not decode is one ``malformed`` problem at
    ``file:line``. None when ``text`` is not a bare ``{"resourceSpans": [...]}``
    document (the caller reports the whole line then).
    """
    try:
        top = _members(text, _ws(text, 0))
        if "resourceSpans" not in top:
            return None
        resource_spans = []
        for rs_start, _ in _items(text, top["resourceSpans"][0]):
            rs = _members(text, rs_start)
            if (r := rs.get("resource")) is not None:
                resource = _decode(text[r[0] : r[1]])
                if resource is None:
                    origin.log.add(
                        origin.at(line),
                        "a resource is nested too deep to decode; its spans skipped",
                        pk.MALFORMED,
                        skipped=1,
                    )
                    continue
            else:
                resource = None
            scopes = []
            if (ss_range := rs.get("scopeSpans")) is not None:
                for ss_start, _ in _items(text, ss_range[0]):
                    scope = _members(text, ss_start)
                    spans = []
                    if (sp := scope.get("spans")) is not None:
                        for s_start, s_end in _items(text, sp[0]):
                            span = _decode(text[s_start:s_end])
                            if span is None:
                                origin.log.add(
                                    origin.at(line),
                                    "a span is nested too deep to decode; skipped",
                                    pk.MALFORMED,
                                    skipped=1,
                                )
                            else:
                                spans.append(span)
                    scopes.append({"spans": spans})
            resource_spans.append({"resource": resource, "scopeSpans": scopes})
    except _NotShaped:
        return None
    return {"resourceSpans": resource_spans}


def _decode(text: str) -> Any:
    """``json.loads``, or None when the value is nested too deep (or is not JSON)."""
    try:
        return json.loads(text)
    except (RecursionError, json.JSONDecodeError):
        return None


def _ws(text: str, pos: int) -> int:
    return _WS.match(text, pos).end()  # type: ignore[union-attr]  # matches the empty string


def _members(text: str, pos: int) -> dict[str, tuple[int, int]]:
    """An object's keys and the (start, end) of each value (a later key wins)."""
    if not text.startswith("{", pos):
        raise _NotShaped("not an object")
    out: dict[str, tuple[int, int]] = {}
    pos = _ws(text, pos + 1)
    if text.startswith("}", pos):
        return out
    while True:
        m = _STRING.match(text, pos)
        if m is None:
            raise _NotShaped("expected a key")
        key = json.loads(m.group())
        pos = _ws(text, m.end())
        if not text.startswith(":", pos):
            raise _NotShaped("expected ':'")
        start = _ws(text, pos + 1)
        end = _value_end(text, start)
        out[key] = (start, end)
        pos = _ws(text, end)
        if text.startswith("}", pos):
            return out
        if not text.startswith(",", pos):
            raise _NotShaped("expected ',' or '}'")
        pos = _ws(text, pos + 1)


def _items(text: str, pos: int) -> list[tuple[int, int]]:
    """The (start, end) of each value of the array at ``pos``."""
    if not text.startswith("[", pos):
        raise _NotShaped("not an array")
    out: list[tuple[int, int]] = []
    pos = _ws(text, pos + 1)
    if text.startswith("]", pos):
        return out
    while True:
        end = _value_end(text, pos)
        out.append((pos, end))
        pos = _ws(text, end)
        if text.startswith("]", pos):
            return out
        if not text.startswith(",", pos):
            raise _NotShaped("expected ',' or ']'")
        pos = _ws(text, pos + 1)


def _value_end(text: str, pos: int) -> int:
    """Where the JSON value at ``pos`` ends, found without recursion.

    Only strings and brackets are matched; whether the value is valid JSON is left to
    whoever decodes it.
    """
    if pos >= len(text):
        raise _NotShaped("a value is missing")
    if text[pos] not in '"[{':
        m = _SCALAR.match(text, pos)
        if m is None:
            raise _NotShaped("a value is missing")
        return m.end()
    depth = 0
    n = len(text)
    while pos < n:
        c = text[pos]
        if c == '"':
            m = _STRING.match(text, pos)
            if m is None:
                raise _NotShaped("unterminated string")
            pos = m.end()
        elif c in "[{":
            depth += 1
            pos += 1
        elif c in "]}":
            depth -= 1
            pos += 1
        else:
            pos = _PLAIN.match(text, pos).end()  # type: ignore[union-attr]  # c is plain
        if depth == 0:
            return pos
    raise _NotShaped("unterminated value")
