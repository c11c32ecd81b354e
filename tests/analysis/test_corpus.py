"""Every real trace file in tests/data/corpus/traces ingests, with its oddities counted.

Expected span/trace counts and oddities are those the corpus README lists per file;
the two HotROD captures also carry manifests whose expected answers are checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.analysis.ingest import ingest_paths

# file: (traces, spans, expected problem counts) -- from the corpus README
CORPUS = {
    "otlp/goauto_nethttp_collector_fileexporter.jsonl": (1, 2, {}),
    # one Node process: its children overflowing their parent by up to 0.75 ms (22 in all)
    # are within the one-host tolerance, not skew
    "otlp/highlight_nextjs_traces.json": (1, 8, {"orphan": 1}),
    "otlp/highlight_node_fs_traces.json": (2, 218, {"orphan": 8}),
    "otlp/jaeger_memory_fixture_otel_traces_01.json": (2, 4, {"orphan": 4}),
    "otlp/jaegerui_nodejs_collector_fileexporter_4lines.jsonl": (1, 4, {}),
    "otlp/jaegerv3_GetTrace_result_envelope.json": (1, 1, {"no_timestamps": 1}),
    "otlp/jaegerv3_n_plus_one_full_concurrent.json": (1, 40, {}),
    "otlp/jaegerv3_n_plus_one_full_serial.json": (1, 40, {}),
    "otlp/otelproto_example_trace.json": (1, 1, {"orphan": 1}),
    "otlp/otelrust_collector_fileexporter_traces.json": (1, 2, {}),
    "otlp/otelrust_serde_all_defaults_traces.json": (1, 2, {}),
    "jaeger/jaeger_anonymizer_span_array.json": (1, 2, {"orphan": 1}),
    # two services without host or instance: told apart by service, so skew
    "jaeger/jaegerui_petclinic_spanLongerAsParent.json": (1, 8, {"skew": 2}),
    "jaeger/jaegerui_petclinic_testTraceNormal.json": (1, 5, {}),
    # 1 trace id + 11 span ids, none hex; op3's child overflows it by 680 ms on the
    # same host (foobar.org): an overrun, not skew
    "jaeger/jaegerui_tracegraph_nonhex_ids.json": (1, 11, {"non_hex_id": 12, "overrun": 1}),
    "jaeger/tracecompass_jaeger_multiple_services.json": (1, 5, {}),
    # a child ending 0.202 ms after its parent in one process: within the tolerance
    "jaeger/tracecompass_jaeger_simple.json": (1, 3, {}),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus_file_ingests_with_its_oddities_counted(store, corpus_dir: Path, name: str) -> None:
    traces, spans, problems = CORPUS[name]
    report = ingest_paths(store, [corpus_dir / name])
    assert (report.traces, report.spans_read, report.spans_stored) == (traces, spans, spans)
    assert report.counts == problems and report.skipped == 0
    bad = store.con.execute(
        "SELECT count(*) FROM spans WHERE end_ns < start_ns OR length(trace_id) <> 32 "
        "OR length(span_id) <> 16 OR trace_id <> lower(trace_id)"
    ).fetchone()
    assert bad == (0,)


def test_every_corpus_file_is_in_the_table(corpus_dir: Path) -> None:
    present = {
        str(p.relative_to(corpus_dir))
        for p in corpus_dir.rglob("*.json*")
        if not p.name.endswith(".manifest.json")
    }
    assert present == set(CORPUS)


@pytest.mark.parametrize("pattern", ["serial", "concurrent"])
def test_hotrod_manifest_answers_hold_after_ingest(store, corpus_dir: Path, pattern: str) -> None:
    manifest = json.loads(
        (corpus_dir / f"otlp/jaegerv3_n_plus_one_full_{pattern}.manifest.json").read_text()
    )
    ingest_paths(store, [corpus_dir / f"otlp/jaegerv3_n_plus_one_full_{pattern}.json"])
    expected = manifest["expected"]
    rows = store.con.execute(
        "SELECT start_ns, end_ns FROM spans WHERE trace_id = ? AND parent_span_id = ? AND name = ? "
        "AND service_name = ? ORDER BY start_ns",
        [
            manifest["trace_id"],
            expected["parent_span_id"],
            expected["operation"],
            expected["service"],
        ],
    ).fetchall()
    assert len(rows) == expected["siblings"]
    wall_ms = (max(e for _, e in rows) - min(s for s, _ in rows)) / 1e6
    total_ms = sum(e - s for s, e in rows) / 1e6
    overlapping = sum(1 for (_, e1), (s2, _) in zip(rows, rows[1:], strict=False) if s2 < e1)
    assert wall_ms == pytest.approx(expected["wall_ms"], abs=0.1)
    assert total_ms == pytest.approx(expected["sum_of_durations_ms"], abs=0.1)
    assert overlapping == expected["overlapping_pairs"]


def test_the_whole_corpus_directory_ingests_in_one_go(store, corpus_dir: Path) -> None:
    report = ingest_paths(store, [corpus_dir])
    # README.md and the two manifests are not traces: warned about, not skipped.
    assert report.counts["unrecognized"] == 3 and report.skipped == 0
    # The two otelrust files hold the same trace: its 2 spans are duplicates.
    assert report.counts["duplicate"] == 2
    assert report.spans_stored == sum(s for _, s, _ in CORPUS.values()) - 2


def test_the_ingest_report_repeats_from_run_to_run(corpus_dir, tmp_path) -> None:
    # Duplicate spans in one line were listed in whatever order DuckDB's threads gave.
    from tracekit.analysis.facade import ingest

    runs = [ingest([corpus_dir], store=tmp_path / f"{i}.duckdb") for i in range(4)]
    problems = [[str(p) for p in run.report.problems] for run in runs]
    assert any("repeats an earlier one" in p for p in problems[0])
    assert all(p == problems[0] for p in problems[1:])
