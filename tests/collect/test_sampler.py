"""The tail sampler: whole-trace decisions after the wait, weights that keep the analysis
unbiased (a sampled store agrees with the full one), and the OTel threshold arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.cohorts.release import load_release
from tracekit.analysis.cohorts.stats import bootstrap_quantiles, weighted_quantiles
from tracekit.analysis.compare.diff import diff_releases
from tracekit.analysis.ingest import ingest_documents
from tracekit.analysis.store import Store, open_store
from tracekit.collect import TailSampler, th_adjusted_count
from tracekit.collect.sampler import rest_keeps

from .helpers import releases, split_documents

QS = (0.5, 0.9, 0.95, 0.99)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _sampler(emitted: list[dict[str, Any]], clock: _Clock, **kw: Any) -> TailSampler:
    kw = {"keep_slowest": 5.0, "sample_rest": 0.25, "decision_wait": 2.0, **kw}
    return TailSampler(emit=lambda doc, n: emitted.append(doc), clock=clock, **kw)


def _spans(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        s for d in docs for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]
    ]


def _weight(span: dict[str, Any]) -> float:
    for a in span.get("attributes", ()):
        if a["key"] == cv.SAMPLE_WEIGHT:
            return float(a["value"]["doubleValue"])
    raise AssertionError("kept span without tracekit.sample.weight")


def _load(path: Path, docs: list[dict[str, Any]]) -> Store:
    store = open_store(path)
    report = ingest_documents(store, docs, source="test")
    per_request.refresh(store, report.trace_ids)
    return store


def test_th_threshold_gives_the_otel_adjusted_count() -> None:
    assert th_adjusted_count("ot=th:8") == 2.0
    assert th_adjusted_count("ot=th:c") == 4.0
    assert th_adjusted_count("vendor=x,ot=rv:abcdef12345678;th:fd70a4") == pytest.approx(
        2**56 / (2**56 - 0xFD70A400000000)
    )
    assert th_adjusted_count("ot=th:0") == 1.0
    assert th_adjusted_count(None) == 1.0
    assert th_adjusted_count("ot=th:zz") == 1.0


def test_rest_keeps_by_the_trace_ids_random_bits() -> None:
    assert rest_keeps("0" * 18 + "00000000000000", 0.01)
    assert not rest_keeps("0" * 18 + "ffffffffffffff", 0.99)
    assert rest_keeps("0" * 18 + "7fffffffffffff", 0.5)
    assert not rest_keeps("0" * 18 + "80000000000000", 0.5)


def test_a_trace_is_decided_whole_after_the_wait_and_late_spans_follow() -> None:
    clock = _Clock()
    emitted: list[dict[str, Any]] = []
    s = _sampler(emitted, clock, min_window=0)
    doc = releases(1).to_otlp()
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    root, stages = spans[0], spans[1:]
    first = {
        "resourceSpans": [{**doc["resourceSpans"][0], "scopeSpans": [{"spans": [root, stages[0]]}]}]
    }
    s.add(first, 2)
    assert s.decide_due() == 0 and not emitted  # still inside --decision-wait
    clock.now = 2.5
    assert s.decide_due() == 1
    assert {x["spanId"] for x in _spans(emitted)} == {root["spanId"], stages[0]["spanId"]}
    late = {"resourceSpans": [{**doc["resourceSpans"][0], "scopeSpans": [{"spans": stages[1:]}]}]}
    s.add(late, len(stages) - 1)
    assert len(_spans(emitted)) == len(spans)
    assert s.stats.late_spans == len(stages) - 1
    assert s.held_spans == 0


def test_a_trace_without_its_root_is_kept_with_the_weight_it_had() -> None:
    clock = _Clock()
    emitted: list[dict[str, Any]] = []
    s = _sampler(emitted, clock, min_window=0)
    doc = releases(1).to_otlp()
    child = doc["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    child["traceState"] = "ot=th:8"
    s.add({"resourceSpans": [{"resource": {}, "scopeSpans": [{"spans": [child]}]}]}, 1)
    s.decide_due(everything=True)
    assert [_weight(x) for x in _spans(emitted)] == [2.0]
    assert s.stats.kept_unranked == 1


def test_sampled_store_agrees_with_the_full_store_within_the_intervals(tmp_path: Path) -> None:
    docs = split_documents(releases(1500, seed=11).to_otlp(), per_doc=4)
    clock = _Clock()
    emitted: list[dict[str, Any]] = []
    sampler = _sampler(emitted, clock, window=500)
    for i, doc in enumerate(docs):
        clock.now = i * 0.01
        sampler.add(doc, 4)
        sampler.decide_due()
    sampler.decide_due(everything=True)
    kept = sampler.stats.kept_slow + sampler.stats.kept_rest + sampler.stats.kept_unranked
    assert kept < 0.45 * sampler.stats.traces_decided  # it did sample

    with (
        _load(tmp_path / "full.duckdb", docs) as full,
        _load(tmp_path / "sampled.duckdb", emitted) as part,
    ):
        rng = np.random.default_rng(0)
        for label in ("v1", "v2"):
            f, p = load_release(full, label), load_release(part, label)
            assert p.n < f.n
            assert p.weights.sum() == pytest.approx(f.n, rel=0.1)  # estimated requests
            truth = weighted_quantiles(f.duration_ms, QS, f.weights)
            reps = bootstrap_quantiles(p.duration_ms, QS, p.weights, n_boot=400, rng=rng)
            low, high = np.quantile(reps, [0.005, 0.995], axis=0)
            assert np.all((low <= truth) & (truth <= high)), (label, truth, low, high)
        d_full = diff_releases(full, "v1", "v2")
        d_part = diff_releases(part, "v1", "v2")
    assert d_full.verdict.primary_stage == d_part.verdict.primary_stage == cv.DOWNSTREAM
    assert d_full.verdict.kind == d_part.verdict.kind
    for row_full, row_part in zip(d_full.latency, d_part.latency, strict=True):
        assert row_part.ci_low <= row_full.delta <= row_part.ci_high, (row_full, row_part)
