"""Hostile input: deep nesting, wrong JSON types and parent cycles are one problem each.

A malformed span is skipped and counted at ``file:line``; every other span of the
input is kept, whichever reader (fast path, reference decoder, Jaeger) met it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.store import Store
from tracekit.errors import IngestError
from tracekit.testing import TraceBuilder

DEPTH = 2_000
TRACE = "7a3f0c5e9b1d24687a3f0c5e9b1d2468"


def good_lines(n_requests: int = 10) -> list[str]:
    """OTLP JSON lines of ``n_requests`` requests of four spans each, one span a line."""
    b = TraceBuilder(seed=7)
    for i in range(n_requests):
        r = b.request(start_ms=i * 1000, duration_ms=100)
        r.stage(cv.FEATURE_RETRIEVAL, start_ms=1, duration_ms=10)
        r.stage(cv.MODEL_EXECUTE, start_ms=20, duration_ms=50)
        r.stage(cv.POSTPROCESS, start_ms=80, duration_ms=10)
    lines = []
    for rs in b.to_otlp()["resourceSpans"]:
        for scope in rs["scopeSpans"]:
            for span in scope["spans"]:
                one = {"resource": rs["resource"], "scopeSpans": [{"spans": [span]}]}
                lines.append(json.dumps({"resourceSpans": [one]}, separators=(",", ":")))
    assert len(lines) == 4 * n_requests
    return lines


def span(span_id: str, **fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": TRACE,
        "spanId": span_id,
        "name": f"op-{span_id[-2:]}",
        "kind": 1,
        "startTimeUnixNano": "1767225600000000000",
        "endTimeUnixNano": "1767225600100000000",
    }
    out.update(fields)
    return out


def line_of(*spans: dict[str, Any]) -> str:
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": list(spans)}]}]}
    return json.dumps(doc, separators=(",", ":"))


def nested_array(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"stringValue": "bottom"}
    for _ in range(depth):
        value = {"arrayValue": {"values": [value]}}
    return value


def deep_attribute(kind: str, depth: int) -> str:
    """The JSON text of an AnyValue nested ``depth`` levels (too deep for ``json.dumps``)."""
    if kind == "array":
        return '{"arrayValue":{"values":[' * depth + '{"stringValue":"x"}' + "]}}" * depth
    return (
        '{"kvlistValue":{"values":[{"key":"k","value":' * depth
        + '{"intValue":"1"}'
        + "}]}}" * depth
    )


DEEP = "__DEEP__"


def with_deep(text: str, kind: str, depth: int = DEPTH) -> str:
    return text.replace(f'"{DEEP}"', deep_attribute(kind, depth))


def deep_json(depth: int) -> str:
    """One line of JSON nested ``depth`` levels: past what ``json.loads`` can recurse."""
    return '{"resourceSpans":' + "[" * depth + "]" * depth + "}"


def write(tmp_path: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def stored(store: Store) -> set[str]:
    return {r[0] for r in store.run("SELECT span_id FROM spans")}


def skipping(report: Any) -> list[Any]:
    return [p for p in report.problems if p.skipped]


@pytest.mark.parametrize("position", [0, 20, 40])
def test_a_line_nested_too_deep_is_one_problem_and_the_other_spans_are_kept(
    store: Store, tmp_path: Path, position: int
) -> None:
    lines = good_lines()
    lines.insert(position, deep_json(DEPTH))
    path = write(tmp_path, lines)
    report = ingest_paths(store, [path])
    assert report.spans_read == 40
    assert store.span_count() == 40
    (problem,) = skipping(report)
    assert problem.kind == pk.MALFORMED
    assert problem.where == f"{path}:{position + 1}"
    assert report.skipped == 1


def test_a_whole_document_nested_too_deep_is_one_problem(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * DEPTH + "]" * DEPTH)
    report = ingest_paths(store, [path])
    assert store.span_count() == 0
    assert report.skipped == 1
    assert {p.kind for p in skipping(report)} <= {pk.MALFORMED, pk.UNRECOGNIZED}


@pytest.mark.parametrize("kind", ["array", "kvlist"])
def test_an_attribute_nested_too_deep_skips_only_its_span(
    store: Store, tmp_path: Path, kind: str
) -> None:
    lines = good_lines()
    bad = span("00000000000000b1", attributes=[{"key": "deep", "value": DEEP}])
    neighbour = span("00000000000000b2")
    lines.insert(5, with_deep(line_of(neighbour, bad), kind))
    path = write(tmp_path, lines)
    report = ingest_paths(store, [path])
    assert store.span_count() == 41
    assert "00000000000000b2" in stored(store)
    assert "00000000000000b1" not in stored(store)
    (problem,) = skipping(report)
    assert problem.kind == pk.MALFORMED
    assert problem.where == f"{path}:6"
    assert "deep" in problem.reason


@pytest.mark.parametrize("kind", ["array", "kvlist"])
def test_an_attribute_nested_past_the_limit_but_parseable_skips_only_its_span(
    store: Store, tmp_path: Path, kind: str
) -> None:
    """100 levels: ``json.loads`` takes the line; the decoder's own limit refuses the value."""
    lines = good_lines()
    bad = span("00000000000000b1", attributes=[{"key": "deep", "value": DEEP}])
    lines.insert(5, with_deep(line_of(span("00000000000000b2"), bad), kind, 100))
    path = write(tmp_path, lines)
    report = ingest_paths(store, [path])
    assert store.span_count() == 41
    assert "00000000000000b1" not in stored(store)
    (problem,) = skipping(report)
    assert "nested more than 32 levels" in problem.reason


def test_an_attribute_nested_within_the_limit_is_kept(store: Store, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        [line_of(span("00000000000000c1", attributes=[{"key": "a", "value": nested_array(8)}]))],
    )
    report = ingest_paths(store, [path])
    assert report.skipped == 0
    (attrs,) = store.run("SELECT attributes FROM spans")[0]
    value = json.loads(attrs)["a"]
    for _ in range(8):
        (value,) = value
    assert value == "bottom"


WRONG_TYPES = {
    "links_number": {"links": 5},
    "links_string": {"links": "x"},
    "link_attributes_number": {"links": [{"traceId": TRACE, "spanId": "1" * 16, "attributes": 7}]},
    "array_values_bool": {"attributes": [{"key": "a", "value": {"arrayValue": {"values": True}}}]},
    "kvlist_values_number": {"attributes": [{"key": "a", "value": {"kvlistValue": {"values": 2}}}]},
    "attributes_string": {"attributes": "x"},
    "attribute_item_string": {"attributes": ["x"]},
    "status_number": {"status": 3},
    "status_code_list": {"status": {"code": [1]}},
    "name_object": {"name": {"a": 1}},
    "start_list": {"startTimeUnixNano": [1]},
    "trace_id_number": {"traceId": 5},
    "kind_object": {"kind": {"x": 1}},
}


@pytest.mark.parametrize("fields", list(WRONG_TYPES.values()), ids=list(WRONG_TYPES))
def test_a_field_of_the_wrong_type_costs_only_its_span(
    store: Store, tmp_path: Path, fields: dict[str, Any]
) -> None:
    lines = good_lines()
    lines.insert(3, line_of(span("00000000000000b2"), span("00000000000000b1", **fields)))
    path = write(tmp_path, lines)
    report = ingest_paths(store, [path])
    ids = stored(store)
    assert "00000000000000b2" in ids
    assert len(ids - {"00000000000000b1"}) == 41
    # Either the span is skipped, or the field is dropped with a problem saying so.
    assert report.skipped == (0 if "00000000000000b1" in ids else 1)
    located = [p for p in report.problems if p.where == f"{path}:4"]
    assert located, report.problems


def test_wrong_types_in_a_python_read_document_cost_only_their_span(
    store: Store, tmp_path: Path
) -> None:
    """An OTLP JSON document (not lines) goes through the reference decoder alone."""
    spans = [span(f"00000000000000a{i}") for i in range(3)]
    spans.insert(1, span("00000000000000b1", links=5))
    spans.insert(2, span("00000000000000b3", attributes=[{"key": "d", "value": nested_array(40)}]))
    doc = {"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": spans}]}]}
    path = tmp_path / "doc.json"
    # One member a line, so the file is read as one document, not as JSON lines.
    path.write_text(json.dumps(doc).replace('{"resourceSpans"', '{\n"resourceSpans"', 1))
    report = ingest_paths(store, [path])
    assert {f"00000000000000a{i}" for i in range(3)} <= stored(store)
    assert not {"00000000000000b1", "00000000000000b3"} & stored(store)
    assert report.skipped == 2


def jaeger_doc(**bad: Any) -> dict[str, Any]:
    def jspan(span_id: str, **fields: Any) -> dict[str, Any]:
        out = {
            "traceID": TRACE[:16],
            "spanID": span_id,
            "operationName": f"op-{span_id}",
            "references": [],
            "startTime": 1_767_225_600_000_000,
            "duration": 1000,
            "tags": [],
            "processID": "p1",
        }
        out.update(fields)
        return out

    spans = [jspan("a1"), jspan("a2", **bad), jspan("a3")]
    return {
        "data": [
            {
                "traceID": TRACE[:16],
                "spans": spans,
                "processes": {"p1": {"serviceName": "svc", "tags": []}},
            }
        ]
    }


JAEGER_WRONG = {
    "references_float": {"references": 1.5},
    "references_string": {"references": "CHILD_OF"},
    "tags_number": {"tags": 3},
    "tag_value_object": {"tags": [{"key": "k", "type": "float64", "value": {"a": 1}}]},
    "start_list": {"startTime": [1]},
    "process_string": {"process": "p"},
}


@pytest.mark.parametrize("fields", list(JAEGER_WRONG.values()), ids=list(JAEGER_WRONG))
def test_a_jaeger_span_of_the_wrong_shape_costs_only_itself(
    store: Store, tmp_path: Path, fields: dict[str, Any]
) -> None:
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(jaeger_doc(**fields)))
    report = ingest_paths(store, [path])
    ids = stored(store)
    assert {"00000000000000a1", "00000000000000a3"} <= ids
    assert report.skipped == (0 if "00000000000000a2" in ids else 1)
    assert report.problems, "the odd span is named"


def test_a_jaeger_references_float_skips_that_span(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "jaeger.json"
    path.write_text(json.dumps(jaeger_doc(references=1.5)))
    report = ingest_paths(store, [path])
    assert stored(store) == {"00000000000000a1", "00000000000000a3"}
    (problem,) = skipping(report)
    assert problem.kind == pk.MALFORMED
    assert problem.where == f"{path}:1"
    assert "references" in problem.reason


def test_a_jaeger_tag_nested_past_the_limit_skips_only_its_span(
    store: Store, tmp_path: Path
) -> None:
    value: Any = "bottom"
    for _ in range(100):
        value = [value]
    path = tmp_path / "jaeger.json"
    path.write_text(
        json.dumps(jaeger_doc(tags=[{"key": "deep", "type": "string", "value": value}]))
    )
    report = ingest_paths(store, [path])
    assert stored(store) == {"00000000000000a1", "00000000000000a3"}
    assert report.skipped == 1
    assert len(skipping(report)) == 1


# --- parent cycles ----------------------------------------------------------------


def cycle_file(tmp_path: Path, spans: list[dict[str, Any]]) -> Path:
    return write(tmp_path, [line_of(*spans)], "cycle.jsonl")


def server(span_id: str, parent: str | None, start: int, end: int) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "kind": 2,
        "startTimeUnixNano": str(1_767_225_600_000_000_000 + start),
        "endTimeUnixNano": str(1_767_225_600_000_000_000 + end),
        "attributes": [{"key": cv.HTTP_ROUTE, "value": {"stringValue": "/x"}}],
    }
    if parent:
        fields["parentSpanId"] = parent
    return span(span_id, **fields)


def test_a_span_that_is_its_own_parent_is_a_problem_and_still_a_request(
    store: Store, tmp_path: Path
) -> None:
    path = cycle_file(tmp_path, [server("00000000000000d1", "00000000000000d1", 0, 100_000_000)])
    report = ingest_paths(store, [path])
    assert report.counts.get(pk.CYCLE) == 1
    (problem,) = [p for p in report.problems if p.kind == pk.CYCLE]
    assert problem.where == f"{path}:1"
    per_request.refresh(store, report.trace_ids)
    assert store.run("SELECT count(*) FROM requests")[0][0] == 1


def test_a_parent_cycle_of_three_spans_is_a_problem_and_still_a_request(
    store: Store, tmp_path: Path
) -> None:
    spans = [
        server("00000000000000e1", "00000000000000e3", 0, 100_000_000),
        server("00000000000000e2", "00000000000000e1", 10_000_000, 90_000_000),
        server("00000000000000e3", "00000000000000e2", 20_000_000, 80_000_000),
    ]
    report = ingest_paths(store, [cycle_file(tmp_path, spans)])
    assert report.counts.get(pk.CYCLE) == 1
    per_request.refresh(store, report.trace_ids)
    assert store.run("SELECT count(*) FROM requests")[0][0] == 1


def test_strict_ingest_fails_on_a_parent_cycle(store: Store, tmp_path: Path) -> None:
    path = cycle_file(tmp_path, [server("00000000000000d1", "00000000000000d1", 0, 100_000_000)])
    with pytest.raises(IngestError):
        ingest_paths(store, [path], strict=True)
