"""diff, summary and slow end to end: built spans → store → attribution → analysis → CLI.

Traces come from :class:`tracekit.testing.TraceBuilder`; the critical path and the
stage split are computed by the real attribution, and attribute ranking reads the
spans table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request as attribution
from tracekit.analysis.compare.diff import diff_releases
from tracekit.analysis.compare.summary import slow_vs_fast, summarize_all, summarize_release
from tracekit.analysis.store import SPAN_COLUMNS, Store, open_store
from tracekit.cli import main
from tracekit.errors import QueryError
from tracekit.testing import TraceBuilder

N = 1200


def load(store: Store, builder: TraceBuilder) -> None:
    """Insert the built spans with one bulk statement (column lists unnested), then
    refresh attribution; row-at-a-time inserts would dominate the test's runtime."""
    columns = list(zip(*builder.rows(), strict=True))
    params = {f"c{i}": list(col) for i, col in enumerate(columns)}
    select = ", ".join(f"unnest($c{i})" for i in range(len(SPAN_COLUMNS)))
    store.con.execute(
        f"INSERT OR IGNORE INTO spans ({', '.join(SPAN_COLUMNS)}) SELECT {select}", params
    )
    attribution.refresh(store, builder.trace_ids())


def ms(rng: np.random.Generator, median: float, sd: float = 0.25) -> float:
    # whole microseconds, so back-to-back stages share exact nanosecond boundaries
    return round(float(rng.lognormal(np.log(median), sd)), 3)


def build_release(
    store: Store,
    version: str,
    seed: int,
    *,
    miss_rate: float = 0.05,
    batch_queue_ms: float = 8.0,
    sibling_ms: float = 5.0,
    host_of_slow: str | None = None,
) -> None:
    """Requests of the reference pipeline: feature_retrieval, then a 40 ms downstream call
    with a concurrent ``embedding_lookup`` (``sibling_ms``, normally hidden behind the
    call), then preprocess → batch_queue → model_execute → postprocess."""
    rng = np.random.default_rng(seed)
    b = TraceBuilder(service="ranker", version=version, seed=seed)
    for i in range(N):
        hit = bool(rng.random() >= miss_rate)
        fr = ms(rng, 3.0) if hit else ms(rng, 45.0, 0.1)
        side = ms(rng, sibling_ms, 0.1)
        down = ms(rng, 40.0, 0.1)
        seq = [ms(rng, 5.0), ms(rng, batch_queue_ms, 0.5), ms(rng, 15.0, 0.15), ms(rng, 3.0)]
        total = round(fr + max(side, down) + sum(seq) + 0.5, 3)
        r = b.request(start_ms=i * 20.0, duration_ms=total)
        r.stage(cv.FEATURE_RETRIEVAL, start_ms=0.0, duration_ms=fr, attributes={cv.CACHE_HIT: hit})
        r.stage("embedding_lookup", start_ms=fr, duration_ms=side, time_kind=cv.WAIT)
        call = r.stage(
            cv.DOWNSTREAM, start_ms=fr, duration_ms=down, attributes={cv.SERVER_ADDRESS: "pricing"}
        )
        r.span(
            "GET /price",
            start_ms=round(fr + 0.2, 3),
            duration_ms=round(down - 0.4, 3),
            kind="SERVER",
            parent=call,
            service="pricing",
        )
        t = round(fr + max(side, down), 3)
        for stage, d in zip(
            (cv.PREPROCESS, cv.BATCH_QUEUE, cv.MODEL_EXECUTE, cv.POSTPROCESS), seq, strict=True
        ):
            r.stage(stage, start_ms=t, duration_ms=d)
            t = round(t + d, 3)
    load(store, b)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("diff") / "tracekit.duckdb"
    with open_store(path) as store:
        build_release(store, "v1", seed=1, miss_rate=0.03)
        build_release(store, "v2", seed=2, miss_rate=0.30)
        # v3: retrieval's side call grows 5 → 25 ms, still hidden behind the 40 ms
        # downstream call; the batch queue regresses for real
        build_release(store, "v3", seed=3, miss_rate=0.03, sibling_ms=25.0, batch_queue_ms=40.0)
    return path


def test_cache_miss_regression_names_retrieval_and_ranks_cache_hit_false(db: Path) -> None:
    with open_store(db, read_only=True) as store:
        result = diff_releases(store, "v1", "v2", jaeger_url="http://jaeger:16686")
    assert result.verdict.primary_stage == cv.FEATURE_RETRIEVAL
    assert result.verdict.kind == cv.WAIT
    top = result.attributes[0]
    assert (top.attribute, top.value) == (cv.CACHE_HIT, "false")
    assert top.slow_share > 0.8 > 0.3 > top.rest_share
    assert result.exemplars[0].url == f"http://jaeger:16686/trace/{result.exemplars[0].trace_id}"
    assert len(result.exemplars) == 3


def test_regression_hidden_behind_a_longer_concurrent_sibling_gets_no_blame(db: Path) -> None:
    with open_store(db, read_only=True) as store:
        result = diff_releases(store, "v1", "v3")
    by_name = {s.name: s for s in result.stages}
    assert result.verdict.primary_stage == cv.BATCH_QUEUE
    hidden = by_name["embedding_lookup"]
    assert hidden.share < 0.05
    # its own spans did take ~20 ms longer, but off the critical path
    assert hidden.wall_tail_after_ms > hidden.wall_tail_before_ms + 10.0
    assert abs(hidden.tail_after_ms - hidden.tail_before_ms) < 1.0


def test_unknown_release_names_the_releases_present(db: Path) -> None:
    with open_store(db, read_only=True) as store, pytest.raises(QueryError, match="v1.*v2|v2.*v1"):
        diff_releases(store, "v1", "v9")


def test_summary_splits_the_tail_by_stage(db: Path) -> None:
    with open_store(db, read_only=True) as store:
        summary = summarize_release(store, "v3")
        assert [s.label for s in summarize_all(store)] == ["v1", "v2", "v3"]
    assert summary.requests == N
    assert summary.latency["p50"] < summary.latency["p99"]
    shares = {s.name: s.tail_share for s in summary.stages}
    assert max(shares, key=lambda k: shares[k]) == cv.BATCH_QUEUE
    assert abs(sum(shares.values()) - 1.0) < 1e-6
    assert "batch_queue wait" in summary.summary


def test_slow_vs_fast_finds_cache_misses(db: Path) -> None:
    with open_store(db, read_only=True) as store:
        result = slow_vs_fast(store, "v2")
        with pytest.raises(QueryError, match="--version"):
            slow_vs_fast(store)
    assert result.primary_stage == cv.FEATURE_RETRIEVAL
    assert abs(sum(g.share for g in result.stages) - 1.0) < 1e-6
    assert (result.attributes[0].attribute, result.attributes[0].value) == (cv.CACHE_HIT, "false")
    assert result.slow_requests >= 8 and result.fast_requests >= N // 2


def test_cli_diff_json_table_markdown_and_errors(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--db", str(db)]
    assert main(["diff", "--before", "v1", "--after", "v2", "--format", "json", *base]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["verdict"]["primary_stage"] == cv.FEATURE_RETRIEVAL
    assert main(["diff", "--before", "v1", "--after", "v2", *base]) == 0
    assert capsys.readouterr().out.startswith("p99 grew")
    assert main(["diff", "--before", "v1", "--after", "v2", "--format", "markdown", *base]) == 0
    assert "### tracekit diff: v1 → v2" in capsys.readouterr().out

    assert main(["diff", "--before", "v1", "--after", "nope", *base]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "releases present" in err and "v2" in err
    assert (
        main(["diff", "--before", "v1", "--after", "v2", "--db", str(db.parent / "none.duckdb")])
        == 2
    )
    assert "no tracekit store" in capsys.readouterr().err


def test_cli_summary_and_slow(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--db", str(db)]
    assert main(["summary", *base, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in doc["releases"]] == ["v1", "v2", "v3"]
    assert main(["summary", "--version", "v2", *base]) == 0
    assert capsys.readouterr().out.startswith("p99")
    assert main(["slow", "--version", "v2", *base, "--format", "markdown"]) == 0
    assert "tracekit.cache.hit=false" in capsys.readouterr().out
    assert main(["slow", *base]) == 2
    assert "--version" in capsys.readouterr().err
