"""The fast path for OTLP JSON lines (msgspec + SQL) against the Python reference decoder.

Each case ingests the same spans as a JSON-lines file (the fast path) and as one OTLP
document (the Python decoder) and compares the stored rows. The cases pin the lines it
must hand to Python (repeated attribute keys, api_v3's ``result`` wrapper, enum names),
batches that end mid-file, and streams cut short.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.ingest import fast, ingest_paths, staging
from tracekit.analysis.store import SPAN_COLUMNS, open_store
from tracekit.testing import TraceBuilder

JSON_COLUMNS = ("attributes", "resource_attributes", "links")


def build(n_requests: int = 40) -> TraceBuilder:
    b = TraceBuilder(seed=3)
    for i in range(n_requests):
        r = b.request(start_ms=i * 200, duration_ms=120, attributes={cv.INFLIGHT: i % 7})
        r.stage(
            cv.FEATURE_RETRIEVAL,
            start_ms=1,
            duration_ms=10,
            attributes={cv.CACHE_HIT: i % 3 == 0, "note": 'say "hi"\\ \u00e9'},
        )
        r.stage(cv.MODEL_EXECUTE, start_ms=12, duration_ms=50, cpu_ms=20, gpu_ms=30)
        call = r.stage(cv.DOWNSTREAM, start_ms=70, duration_ms=40)
        r.span("GET /price", start_ms=72, duration_ms=30, kind="SERVER", parent=call, service="px")
        if i % 10 == 0:
            b.batch([r], start_ms=i * 200, duration_ms=5, attributes={cv.SAMPLE_WEIGHT: 2.5})
    return b


def rows(store: Any) -> list[tuple[Any, ...]]:
    cols = [c for c in SPAN_COLUMNS if c != "source"]
    out = []
    for row in store.con.execute(
        f"SELECT {', '.join(cols)} FROM spans ORDER BY trace_id, span_id"
    ).fetchall():
        named = dict(zip(cols, row, strict=True))
        for c in JSON_COLUMNS:
            named[c] = json.loads(named[c])
        out.append(tuple(named.items()))
    return out


def python_rows(tmp_path: Path, doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    pretty = tmp_path / "reference.json"
    pretty.write_text(json.dumps(doc, indent=1))
    with open_store(tmp_path / "reference.duckdb") as s:
        ingest_paths(s, [pretty])
        return rows(s)


def write_lines(path: Path, docs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(d, separators=(",", ":")) + "\n" for d in docs))
    return path


def one_line_per_resource(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"resourceSpans": [rs]} for rs in doc["resourceSpans"]]


def stage_file(tmp_path: Path, path: Path, *, threads: int) -> tuple[list[int], list[Any]]:
    with open_store(tmp_path / f"stage{threads}.duckdb") as s:
        staging.create(s)
        odd = fast.stage_lines(s, str(path), gzip=False, file_no=0, display="x")
        staged = s.run(
            "SELECT * EXCLUDE (source) FROM _tk_stage ORDER BY lineno, seq, trace_id, span_id"
        )
        return odd, staged


def test_a_file_in_small_batches_stores_what_the_python_decoder_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast, "BATCH_SPANS", 20)
    b = build()
    text = b.write_jsonl(tmp_path / "built.jsonl", spans_per_line=7).read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    # Several resources in one line (repeating earlier spans), and a malformed line.
    mixed = {"resourceSpans": lines[0]["resourceSpans"] + lines[-1]["resourceSpans"]}
    path = write_lines(tmp_path / "spans.jsonl", [*lines[:9], mixed, *lines[9:]])
    body = path.read_text().splitlines(keepends=True)
    path.write_text("".join([*body[:5], '{"resourceSpans": [ {"broken"\n', *body[5:]]))
    with open_store(tmp_path / "fast.duckdb") as s:
        s.run("SET threads = 3")
        report = ingest_paths(s, [path])
        assert report.counts == {"duplicate": _spans(mixed), "malformed": 1}
        assert [p.where for p in report.skipping_problems] == [f"{path}:6"]
        got = rows(s)
    assert got == python_rows(tmp_path, b.to_otlp())


def _spans(line: dict[str, Any]) -> int:
    return sum(len(ss["spans"]) for rs in line["resourceSpans"] for ss in rs["scopeSpans"])


def test_repeated_attribute_keys_keep_the_last_as_python_does(tmp_path: Path) -> None:
    b = build(2)
    doc = b.to_otlp()
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    span["attributes"].append({"key": cv.STAGE, "value": {"stringValue": "postprocess"}})
    path = write_lines(tmp_path / "spans.jsonl", one_line_per_resource(doc))
    odd, _ = stage_file(tmp_path, path, threads=1)
    assert odd == []
    with open_store(tmp_path / "fast.duckdb") as s:
        ingest_paths(s, [path])
        assert s.run("SELECT stage FROM spans WHERE span_id = ?", [span["spanId"]]) == [
            ("postprocess",)
        ]
        assert rows(s) == python_rows(tmp_path, doc)


def test_api_v3_result_lines_go_to_python_and_store_the_same(tmp_path: Path) -> None:
    b = build(3)
    doc = b.to_otlp()
    path = write_lines(tmp_path / "v3.jsonl", [{"result": doc}])
    odd, staged = stage_file(tmp_path, path, threads=1)
    assert odd == [1] and staged == []
    with open_store(tmp_path / "fast.duckdb") as s:
        ingest_paths(s, [path])
        assert rows(s) == python_rows(tmp_path, doc)


def test_repeated_span_in_one_line_keeps_the_first_as_python_does(tmp_path: Path) -> None:
    b = build(2)
    doc = b.to_otlp()
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans.append({**spans[0], "name": "a later copy"})
    spans.insert(0, {**spans[1], "name": "an earlier copy"})
    path = write_lines(tmp_path / "spans.jsonl", [doc])
    with open_store(tmp_path / "fast.duckdb") as s:
        report = ingest_paths(s, [path])
        assert report.counts == {"duplicate": 2}
        assert rows(s) == python_rows(tmp_path, doc)


def test_a_directory_of_small_per_rank_files_stores_what_one_file_does(tmp_path: Path) -> None:
    b = build(30)
    whole = b.write_jsonl(tmp_path / "whole.jsonl", spans_per_line=3)
    lines = whole.read_text().splitlines(keepends=True)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for k in range(0, len(lines), 2):
        (ranks / f"rank{k:04d}.jsonl").write_text("".join(lines[k : k + 2]))
    # One rank file needs the reference decoder (api_v3 wrapper): counted as its own.
    odd_doc = {"result": json.loads(lines[0])}
    (ranks / "rank0000.jsonl").write_text(json.dumps(odd_doc) + "\n" + lines[1])
    with open_store(tmp_path / "one.duckdb") as s:
        ingest_paths(s, [whole])
        one = rows(s)
    with open_store(tmp_path / "many.duckdb") as s:
        report = ingest_paths(s, [ranks])
        assert report.files == len(list(ranks.iterdir())) and report.skipped == 0
        logged = s.run("SELECT sum(spans), count(*) FROM ingest_log")
        assert logged == [(len(b.spans), report.files)]
        assert rows(s) == one


# Attribute values as real exporters and hand-written files spell them, odd ones
# included: each is (value, whether the SQL may map it itself).
VALUE_CASES: list[tuple[Any, bool]] = [
    ({"stringValue": "plain"}, True),
    ({"stringValue": 'quote " backslash \\ tab \t é ✓ \u2028 😀'}, True),
    ({"stringValue": ""}, True),
    ({"stringValue": "x" * 4096}, True),
    ({"stringValue": "x" * 4097}, False),  # truncated, with a problem: Python's job
    ({"stringValue": 42}, False),
    ({"stringValue": None, "intValue": "12"}, True),
    ({"boolValue": True}, True),
    ({"boolValue": False}, True),
    ({"boolValue": "true"}, False),
    ({"intValue": "200"}, True),
    ({"intValue": 200}, True),
    ({"intValue": "-9223372036854775808"}, True),
    ({"intValue": "9223372036854775808"}, False),
    ({"intValue": "12x"}, False),
    ({"intValue": 1.5}, False),
    ({"doubleValue": 2.5}, True),
    ({"doubleValue": 0.1}, True),
    ({"doubleValue": 0}, True),
    ({"doubleValue": -3}, True),
    ({"doubleValue": 1e-4}, True),
    ({"doubleValue": 123456789012345.6}, True),
    ({"doubleValue": 1e16}, False),
    ({"doubleValue": 1e-5}, False),
    ({"doubleValue": "2.5"}, False),
    ({"doubleValue": "NaN"}, False),
    ({"bytesValue": "AAEC"}, True),
    ({"arrayValue": {"values": [{"intValue": "1"}]}}, False),
    ({"kvlistValue": {"values": [{"key": "a", "value": {"boolValue": True}}]}}, False),
    ({}, True),
    (None, True),
    ("not an AnyValue", True),
]


@pytest.mark.parametrize(("value", "fast_path"), VALUE_CASES, ids=lambda v: repr(v)[:40])
def test_each_kind_of_attribute_value_stores_what_the_python_decoder_stores(
    tmp_path: Path, value: Any, fast_path: bool
) -> None:
    b = build(1)
    doc = b.to_otlp()
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    span["attributes"].append({"key": "probe", "value": value})
    path = write_lines(tmp_path / "spans.jsonl", [doc])
    odd, _ = stage_file(tmp_path, path, threads=1)
    assert odd == ([] if fast_path else [1])
    with open_store(tmp_path / "fast.duckdb") as s:
        ingest_paths(s, [path])
        assert rows(s) == python_rows(tmp_path, doc)


@pytest.mark.parametrize(
    ("weight", "trace_state", "expected"),
    [
        ({"doubleValue": 2.5}, "", 2.5),
        ({"intValue": "4"}, "ot=th:8", 4.0),
        ({"boolValue": True}, "", 1.0),
        ({"stringValue": "3"}, "ot=th:c", 4.0),
        (None, "ot=th:8", 2.0),
        (None, "ot=rv:abc;th:0", 1.0),
        (None, "vendor=x", 1.0),
    ],
)
def test_sample_weight_from_the_attribute_else_the_tracestate(
    tmp_path: Path, weight: Any, trace_state: str, expected: float
) -> None:
    b = build(1)
    doc = b.to_otlp()
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    span["attributes"] = [a for a in span["attributes"] if a["key"] != cv.SAMPLE_WEIGHT]
    if weight is not None:
        span["attributes"].append({"key": cv.SAMPLE_WEIGHT, "value": weight})
    span["traceState"] = trace_state
    path = write_lines(tmp_path / "spans.jsonl", [doc])
    with open_store(tmp_path / "fast.duckdb") as s:
        ingest_paths(s, [path])
        got = s.run("SELECT sample_weight FROM spans WHERE span_id = ?", [span["spanId"]])
        assert got == [(expected,)]
        assert rows(s) == python_rows(tmp_path, doc)


def test_repeated_keys_set_the_stage_and_times_from_their_last_value(tmp_path: Path) -> None:
    b = build(1)
    doc = b.to_otlp()
    span = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    span["attributes"] += [
        {"key": cv.CPU_TIME_NS, "value": {"intValue": "7"}},
        {"key": "other", "value": {"boolValue": True}},
        {"key": cv.CPU_TIME_NS, "value": {"intValue": "9"}},
        {"key": cv.GPU_TIME_NS, "value": {"doubleValue": 3.5}},  # not an integer: none
    ]
    path = write_lines(tmp_path / "spans.jsonl", [doc])
    odd, _ = stage_file(tmp_path, path, threads=1)
    assert odd == []
    with open_store(tmp_path / "fast.duckdb") as s:
        ingest_paths(s, [path])
        got = s.run(
            "SELECT cpu_time_ns, gpu_time_ns FROM spans WHERE span_id = ?", [span["spanId"]]
        )
        assert got == [(9, None)]
        assert rows(s) == python_rows(tmp_path, doc)


def test_a_batch_that_fails_on_its_staging_thread_fails_the_ingest_and_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast, "BATCH_SPANS", 20)
    path = build().write_jsonl(tmp_path / "built.jsonl", spans_per_line=7)
    real = fast._stage
    calls: list[int] = []

    def fail_second(store: Any, frames: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        real(store, frames)

    monkeypatch.setattr(fast, "_stage", fail_second)
    with open_store(tmp_path / "fast.duckdb") as s:
        with pytest.raises(RuntimeError, match="disk full"):
            ingest_paths(s, [path])
        assert len(calls) >= 2
        assert s.span_count() == 0
        # The stage is gone and the connection is free for the next ingest.
        monkeypatch.setattr(fast, "_stage", real)
        report = ingest_paths(s, [path])
        assert report.spans_stored == len(build().spans) and report.skipped == 0
