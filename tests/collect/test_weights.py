"""Weights everywhere: estimated requests beside kept ones, "~N" in tables, the flag for a
store tail-sampled without weights, and OTel's ``ot=th:`` adjusted count."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.cohorts.sampling import UNWEIGHTED_TAIL_SAMPLING
from tracekit.analysis.compare.summary import summarize_release
from tracekit.analysis.ingest import ingest_documents
from tracekit.analysis.store import open_store, schema_sql
from tracekit.cli import main
from tracekit.collect import TailSampler

from .helpers import releases, split_documents


def _store(path: Path, docs: list[dict[str, Any]]) -> Path:
    with open_store(path) as store:
        report = ingest_documents(store, docs, source="test")
        per_request.refresh(store, report.trace_ids)
    return path


def _sampled(n: int, *, keep_weights: bool) -> list[dict[str, Any]]:
    emitted: list[dict[str, Any]] = []
    sampler = TailSampler(
        keep_slowest=5, sample_rest=0.25, decision_wait=0, emit=lambda d, k: emitted.append(d)
    )
    for doc in split_documents(releases(n, seed=5).to_otlp(), per_doc=4):
        sampler.add(doc, 4)
        sampler.decide_due(everything=True)
    if not keep_weights:
        for d in emitted:
            for rs in d["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        s["attributes"] = [
                            a for a in s.get("attributes", ()) if a["key"] != cv.SAMPLE_WEIGHT
                        ]
    return emitted


def test_json_adds_estimated_requests_and_tables_say_approximately(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _store(tmp_path / "s.duckdb", _sampled(1200, keep_weights=True))
    assert main(["summary", "--db", str(db), "--version", "v1", "--format", "json"]) == 0
    release = json.loads(capsys.readouterr().out)["releases"][0]
    assert release["requests"] < 600
    assert release["estimated_requests"] == pytest.approx(1200, rel=0.1)
    assert main(["summary", "--db", str(db), "--version", "v1"]) == 0
    table = capsys.readouterr().out
    assert f"{release['requests']:,} requests kept (~{release['estimated_requests']:,.0f})" in table
    assert (
        main(["diff", "--db", str(db), "--before", "v1", "--after", "v2", "--format", "json"]) == 0
    )
    diff = json.loads(capsys.readouterr().out)
    assert diff["before"]["estimated_requests"] == pytest.approx(1200, rel=0.1)
    assert UNWEIGHTED_TAIL_SAMPLING not in {f["code"] for f in diff["flags"]}


def test_a_store_tail_sampled_without_weights_is_flagged_as_biased(tmp_path: Path) -> None:
    biased = _store(tmp_path / "biased.duckdb", _sampled(1200, keep_weights=False))
    full = _store(
        tmp_path / "full.duckdb", split_documents(releases(400, seed=5).to_otlp(), per_doc=4)
    )
    with open_store(biased, read_only=True) as store:
        summary = summarize_release(store, "v1")
    flag = next(f for f in summary.flags if f.code == UNWEIGHTED_TAIL_SAMPLING)
    assert "quantile reads high" in flag.message
    assert summary.estimated_requests == summary.requests
    with open_store(full, read_only=True) as store:
        assert UNWEIGHTED_TAIL_SAMPLING not in {
            f.code for f in summarize_release(store, "v1").flags
        }


@pytest.mark.skipif(
    "trace_state" not in schema_sql(),
    reason="ingest keeps traceState and reads ot=th: with issue 10's ingest change",
)
def test_a_span_sampled_at_th_8_counts_twice(tmp_path: Path) -> None:
    doc = releases(3, seed=2).to_otlp()
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    for s in spans:
        s["traceState"] = "ot=th:8"
    db = _store(tmp_path / "th.duckdb", [doc])
    with open_store(db, read_only=True) as store:
        summary = summarize_release(store, "v1")
    assert summary.requests == 3
    assert summary.estimated_requests == 6
