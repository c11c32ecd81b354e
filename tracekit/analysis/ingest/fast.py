"""The fast path for OTLP JSON lines: parse, flatten and map inside DuckDB.

A Python loop of ``json.loads`` cannot go faster than CPython builds dicts, so big
files (the Collector's file exporter writes one export request per line) are read by
DuckDB (``sql/ingest_otlp_lines.sql``): ``read_csv`` yields each line with its number,
``json_transform`` turns it into typed structs, and ``UNNEST`` walks resourceSpans →
scopeSpans → spans into a temporary table, from which one ``INSERT … SELECT`` maps the
spans into ``_tk_stage``. Such a file has few, long lines, which DuckDB would parse on
one thread; an uncompressed file is therefore cut into as many ranges of lines as
DuckDB has threads, parsed side by side. Lines the SQL does not decode exactly as
:mod:`tracekit.analysis.ingest.otlp` would are marked ``odd`` and handed back to the
caller, which decodes (and reports) them in Python.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
from functools import cache

import duckdb

from tracekit.analysis.ingest import staging
from tracekit.analysis.store import Store

_ANY_VALUE = {
    "stringValue": "VARCHAR",
    "boolValue": "BOOLEAN",
    "intValue": "VARCHAR",
    "doubleValue": "DOUBLE",
    "bytesValue": "VARCHAR",
    # Only tested for presence: such lines go to Python, which decodes nesting.
    "arrayValue": "JSON",
    "kvlistValue": "JSON",
}
_KEY_VALUES = [{"key": "VARCHAR", "value": _ANY_VALUE}]
_RESOURCE_SPANS = [
    {
        "resource": {"attributes": _KEY_VALUES},
        "scopeSpans": [
            {
                "spans": [
                    {
                        "traceId": "VARCHAR",
                        "spanId": "VARCHAR",
                        "parentSpanId": "VARCHAR",
                        "name": "VARCHAR",
                        "kind": "VARCHAR",
                        "startTimeUnixNano": "VARCHAR",
                        "endTimeUnixNano": "VARCHAR",
                        "attributes": _KEY_VALUES,
                        "links": [
                            {"traceId": "VARCHAR", "spanId": "VARCHAR", "attributes": _KEY_VALUES}
                        ],
                        "status": {"code": "VARCHAR"},
                    }
                ]
            }
        ],
    }
]
STRUCTURE = json.dumps({"resourceSpans": _RESOURCE_SPANS}, separators=(",", ":"))
"""What ``json_transform`` extracts from a line. Jaeger api_v3's ``{"result": ...}``
wrapper is left to Python: it is rare in line files, and a line without a bare
``resourceSpans`` list is odd."""

_DOC_UNGUARDED = f"json_transform(line, '{STRUCTURE}')"
_DOC_GUARDED = f"CASE WHEN json_valid(line) THEN json_transform(line, '{STRUCTURE}') END"


SPLIT_BYTES = 16 << 20
"""Files smaller than this are parsed as one range of lines (a range costs a file read)."""

MAX_RANGES = 8
"""At most this many ranges: each reads the file from its start to the range's end."""

_LAST_LINE = 2**62
_BLOCK = 1 << 24


@cache
def _sections() -> dict[str, list[str]]:
    """The statements of each ``-- name:`` section of ``sql/ingest_otlp_lines.sql``."""
    text = (
        importlib.resources.files("tracekit.analysis.store")
        .joinpath("sql/ingest_otlp_lines.sql")
        .read_text()
    )
    out: dict[str, list[str]] = {}
    for chunk in re.split(r"^-- name: ", text, flags=re.MULTILINE)[1:]:
        name, _, body = chunk.partition("\n")
        statements = []
        for part in body.split(";\n"):
            code = "\n".join(ln for ln in part.splitlines() if not ln.lstrip().startswith("--"))
            if code.strip():
                statements.append(code.strip())
        out[name.strip()] = statements
    return out


def line_ranges(path: str, parts: int) -> list[tuple[int, int]]:
    """Cut the file into ``parts`` ranges of line numbers holding about as many bytes.

    Any cut is correct (the ranges cover every line once); counting newlines only makes
    the ranges even, so the parsers finish together.
    """
    size = os.path.getsize(path)
    if parts <= 1 or size < SPLIT_BYTES:
        return [(1, _LAST_LINE)]
    ranges = []
    first, newlines, offset = 1, 0, 0
    with open(path, "rb") as fh:
        for k in range(1, parts):
            target = size * k // parts
            while offset < target:
                block = fh.read(min(_BLOCK, target - offset))
                if not block:
                    break
                newlines += block.count(b"\n")
                offset += len(block)
            # The line holding byte `target` is number newlines + 1; it ends this range.
            ranges.append((first, newlines + 1))
            first = newlines + 2
    ranges.append((first, _LAST_LINE))
    return ranges


def stage_lines(store: Store, path: str, *, gzip: bool, file_no: int, display: str) -> list[int]:
    """Stage every clean span of an OTLP JSON-lines file; return the odd line numbers.

    Raises :class:`duckdb.Error` when DuckDB cannot read the file as lines at all (bad
    UTF-8, a control character outside JSON strings); the caller then reads it in Python.
    """
    sql = _sections()
    threads, ordered = staging.run(
        store, "SELECT current_setting('threads'), current_setting('preserve_insertion_order')"
    )[0]
    # A gzip stream cannot be entered in the middle: every range would inflate it all.
    ranges = [(1, _LAST_LINE)] if gzip else line_ranges(path, min(int(threads), MAX_RANGES))
    params: dict[str, object] = {"path": path, "compression": "gzip" if gzip else "none"}
    branches = []
    for k, (first, last) in enumerate(ranges):
        params[f"first_{k}"], params[f"last_{k}"] = first, last
        branches.append(f"SELECT * FROM _tk_spans_of($path, $compression, $first_{k}, $last_{k})")
    (spans,) = sql["spans"]
    spans = spans.replace("{parts}", " UNION ALL ".join(branches))
    (spans_of,) = sql["spans_of"]
    try:
        # Rows carry their line and position; DuckDB runs the branches of a UNION ALL
        # side by side only when it need not keep their order.
        staging.run(store, "SET preserve_insertion_order = false")
        for statement in sql["macros"]:
            staging.run(store, statement)
        staging.run(store, spans_of.replace("{doc}", _DOC_UNGUARDED))
        try:
            staging.run(store, spans, params)
        except duckdb.InvalidInputException:
            # A malformed line: parse again with json_valid in front (two parses a line).
            staging.run(store, spans_of.replace("{doc}", _DOC_GUARDED))
            staging.run(store, spans, params)
        for statement in sql["stage"]:
            staging.run(store, statement, {"file_no": file_no, "display": display})
    finally:
        # The setting is global to the database: put back what the caller had.
        staging.run(store, f"SET preserve_insertion_order = {'true' if ordered else 'false'}")
        for statement in sql["cleanup"]:
            staging.run(store, statement)
    odd = [int(r[0]) for r in staging.run(store, staging.sql("odd_lines"), {"file_no": file_no})]
    if odd:
        staging.run(store, staging.sql("drop_odd_lines"), {"file_no": file_no})
    return odd
