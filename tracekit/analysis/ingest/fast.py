"""The fast path for OTLP JSON lines: parse, flatten and map inside DuckDB.

A Python loop of ``json.loads`` cannot go faster than CPython builds dicts, so big
files (the Collector's file exporter writes one export request per line) are read by
DuckDB: ``read_csv`` yields each line with its number, ``json_transform`` turns it
into typed structs, and ``UNNEST`` walks resourceSpans → scopeSpans → spans into
``_tk_stage`` (``sql/ingest_otlp_lines.sql``). Lines the SQL does not decode exactly
as :mod:`tracekit.analysis.ingest.otlp` would are marked ``odd`` and handed back to
the caller, which decodes (and reports) them in Python.
"""

from __future__ import annotations

import importlib.resources
import json
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
STRUCTURE = json.dumps(
    {"resourceSpans": _RESOURCE_SPANS, "result": {"resourceSpans": _RESOURCE_SPANS}},
    separators=(",", ":"),
)
"""What ``json_transform`` extracts from a line: OTLP, bare or in api_v3's ``result``."""

_DOC_UNGUARDED = f"json_transform(line, '{STRUCTURE}')"
_DOC_GUARDED = f"CASE WHEN json_valid(line) THEN json_transform(line, '{STRUCTURE}') END"


@cache
def _script() -> tuple[list[str], str]:
    text = (
        importlib.resources.files("tracekit.analysis")
        .joinpath("sql/ingest_otlp_lines.sql")
        .read_text()
    )
    parts = [p.strip() for p in text.split(";\n") if p.strip()]
    body = [p for p in parts if not all(ln.startswith("--") for ln in p.splitlines())]
    return body[:-1], body[-1]


def stage_lines(store: Store, path: str, *, gzip: bool, file_no: int, display: str) -> list[int]:
    """Stage every clean span of an OTLP JSON-lines file; return the odd line numbers.

    Raises :class:`duckdb.Error` when DuckDB cannot read the file as lines at all (bad
    UTF-8, a control character outside JSON strings); the caller then reads it in Python.
    """
    macros, insert = _script()
    for statement in macros:
        staging.run(store, statement)
    params = {
        "path": path,
        "compression": "gzip" if gzip else "none",
        "file_no": file_no,
        "display": display,
    }
    try:
        staging.run(store, insert.replace("{doc}", _DOC_UNGUARDED), params)
    except duckdb.InvalidInputException:
        # A malformed line: parse again with json_valid in front (two parses a line).
        staging.run(store, insert.replace("{doc}", _DOC_GUARDED), params)
    odd = [int(r[0]) for r in staging.run(store, staging.sql("odd_lines"), {"file_no": file_no})]
    if odd:
        staging.run(store, staging.sql("drop_odd_lines"), {"file_no": file_no})
    return odd
