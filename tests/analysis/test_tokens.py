"""Token latencies (``--metric ttft|tpot``) on generated LLM requests with known answers.

Each request has ``queue``, ``prefill`` and ``decode`` stages and the attributes an
engine writes (TTFT in seconds, token counts). v2 queues longer (a smaller KV budget):
its TTFT grows by the queue alone while its time per output token stays; v3 decodes
slower: TPOT grows, TTFT does not.
"""

from __future__ import annotations

import json
import random

import pytest

from tracekit import conventions as cv
from tracekit.analysis.cohorts.bubbleup import PROMPT_BIN_KEY
from tracekit.analysis.cohorts.tokens import load_metric
from tracekit.analysis.facade import Analysis
from tracekit.analysis.store import open_store
from tracekit.cli import main
from tracekit.errors import ConfigError, QueryError
from tracekit.testing import TraceBuilder

N = 300


def _llm(b: TraceBuilder, label: str, *, queue_ms: float, per_token_ms: float, seed: int) -> None:
    rng = random.Random(seed)
    for i in range(N):
        prompt = rng.choice([200, 400, 800, 1600, 6000])
        out = rng.randint(20, 60)
        # Long prompts wait longest in v2's queue: the tail is the prompts over 4k tokens.
        q = queue_ms * (4.0 if prompt > 4096 else 1.0) * rng.uniform(0.8, 1.2)
        prefill = 0.01 * prompt * rng.uniform(0.9, 1.1)
        decode = per_token_ms * (out - 1) * rng.uniform(0.95, 1.05)
        total = q + prefill + decode + 2.0
        r = b.request(
            start_ms=i * 40.0,
            duration_ms=total,
            version=label,
            attributes={
                cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN: (q + prefill) / 1000.0,
                cv.GEN_AI_USAGE_PROMPT_TOKENS: prompt,
                cv.GEN_AI_USAGE_COMPLETION_TOKENS: out,
            },
        )
        r.stage(cv.QUEUE, start_ms=0.0, duration_ms=q)
        r.stage(cv.PREFILL, start_ms=q, duration_ms=prefill)
        r.stage(cv.DECODE, start_ms=q + prefill, duration_ms=decode)
    # One request of another kind (no token data) in each release: left out of the views.
    b.request(start_ms=N * 40.0, duration_ms=5.0, version=label)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    b = TraceBuilder(seed=1)
    _llm(b, "v1", queue_ms=5.0, per_token_ms=10.0, seed=1)
    _llm(b, "v2", queue_ms=60.0, per_token_ms=10.0, seed=2)
    _llm(b, "v3", queue_ms=5.0, per_token_ms=16.0, seed=3)
    path = tmp_path_factory.mktemp("tokens") / "t.duckdb"
    with open_store(path) as store:
        b.load(store)
    return path


def test_ttft_diff_names_the_queue_and_tpot_does_not_move(db) -> None:
    with Analysis.open(db) as a:
        ttft = a.diff("v1", "v2", metric="ttft")
        tpot = a.diff("v1", "v2", metric="tpot")
        e2e = a.diff("v1", "v2")
    assert ttft.metric == "ttft" and ttft.verdict.primary_stage == cv.QUEUE
    assert ttft.verdict.kind == cv.WAIT
    assert {s.name for s in ttft.stages} >= {cv.QUEUE, cv.PREFILL, cv.DECODE}
    decode = next(s for s in ttft.stages if s.name == cv.DECODE)
    assert decode.mean_before_ms == 0.0 and decode.mean_after_ms == 0.0
    p95 = next(r for r in tpot.latency if r.quantile == "p95")
    assert abs(p95.rel_delta) < 0.1  # the same decode per token
    assert e2e.metric == "e2e"
    # The e2e diff shows the token latencies beside it.
    assert e2e.tokens is not None
    assert e2e.tokens["after"].ttft_ms["p95"] > 2 * e2e.tokens["before"].ttft_ms["p95"]
    # The request without token data is in e2e and left out of the views, with a flag.
    assert e2e.after.requests == N + 1 and ttft.after.requests == N
    assert "metric_requests_left_out" in {f.code for f in ttft.flags}
    # The slow TTFT tail is the long prompts, said by the binned prompt length.
    bins = {(x.attribute, x.value) for x in ttft.attributes}
    assert (PROMPT_BIN_KEY, ">8192") not in bins and (PROMPT_BIN_KEY, "4097–8192") in bins


def test_tpot_is_decode_per_token_after_the_first(db) -> None:
    with Analysis.open(db) as a:
        d = a.diff("v1", "v3", metric="tpot")
        ttft = a.diff("v1", "v3", metric="ttft")
    p50 = next(r for r in d.latency if r.quantile == "p50")
    assert p50.before == pytest.approx(10.0, rel=0.05)
    assert p50.after == pytest.approx(16.0, rel=0.05)
    assert d.verdict.primary_stage == cv.DECODE and d.verdict.kind == cv.COMPUTE
    assert abs(next(r for r in ttft.latency if r.quantile == "p50").rel_delta) < 0.1


def test_summary_shows_the_token_latencies_beside_e2e(db) -> None:
    with Analysis.open(db) as a:
        (s,) = a.summary("v1")
        (t,) = a.summary("v1", metric="ttft")
    assert s.metric == "e2e" and s.tokens is not None
    assert s.tokens.tpot_ms is not None and s.tokens.tpot_ms["p50"] == pytest.approx(10, rel=0.05)
    assert s.tokens.ttft_ms is not None and s.tokens.requests == N
    assert s.tokens.prompt_tokens_p50 in (400, 800)
    assert t.latency["p50"] == pytest.approx(s.tokens.ttft_ms["p50"])


def test_the_commands_take_metric_and_say_so(db, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["diff", "--before", "v1", "--after", "v2", "--metric", "ttft", "--db", str(db)]
    assert main([*args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert next(iter(doc)) == "metric" and doc["metric"] == "ttft"
    assert doc["verdict"]["primary_stage"] == cv.QUEUE
    assert main(["diff", "--before", "v1", "--after", "v2", "--db", str(db)]) == 0
    assert "beside: TTFT p95" in capsys.readouterr().out
    assert main(["summary", "--version", "v1", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "tokens: TTFT p50" in out and "TPOT p50" in out
    gate = ["gate", "--before", "v1", "--after", "v2", "--metric", "ttft", "--db", str(db)]
    assert main([*gate, "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["metric"] == "ttft"


def test_a_release_without_token_data_is_refused_for_token_metrics(tmp_path) -> None:
    b = TraceBuilder(seed=2)
    for i in range(30):
        b.request(start_ms=i * 10.0, duration_ms=20.0, version="plain")
    path = tmp_path / "p.duckdb"
    with open_store(path) as store:
        b.load(store)
    with Analysis.open(path) as a:
        (s,) = a.summary("plain")
        assert s.tokens is None
        with pytest.raises(QueryError, match="--metric ttft needs"):
            a.summary("plain", metric="ttft")
        with pytest.raises(ConfigError, match="--metric"):
            a.summary("plain", metric="tbt")


def test_absent_counts_stay_absent_and_odd_requests_are_read_right(tmp_path) -> None:
    b = TraceBuilder(seed=5)
    for i in range(40):
        # Output counts only (no prompt count): the prompt figures are absent, not 0.
        r = b.request(
            start_ms=i * 50.0,
            duration_ms=130.0,
            version="gen",
            attributes={cv.GEN_AI_USAGE_COMPLETION_TOKENS: 11},
        )
        r.stage(cv.QUEUE, start_ms=0.0, duration_ms=10.0)
        r.stage(cv.PREFILL, start_ms=10.0, duration_ms=20.0)
        r.stage(cv.DECODE, start_ms=30.0, duration_ms=100.0)
    # Gave up in the queue: no first token, so no time to first token.
    gone = b.request(
        start_ms=2500.0, duration_ms=400.0, version="gen",
        attributes={cv.GEN_AI_USAGE_COMPLETION_TOKENS: 0},
    )  # fmt: skip
    gone.stage(cv.QUEUE, start_ms=0.0, duration_ms=400.0)
    # Two generations of 11 tokens under one request: 2 × 10 tokens after each first.
    two = b.request(start_ms=2600.0, duration_ms=300.0, version="gen")
    for k in range(2):
        g = two.span(
            "gen", start_ms=k * 150.0, duration_ms=140.0,
            attributes={cv.GEN_AI_USAGE_COMPLETION_TOKENS: 11},
        )  # fmt: skip
        two.stage(cv.PREFILL, start_ms=k * 150.0, duration_ms=20.0, parent=g)
        two.stage(cv.DECODE, start_ms=k * 150.0 + 20.0, duration_ms=60.0, parent=g)
    for i in range(30):
        b.request(start_ms=i * 10.0, duration_ms=20.0, version="plain")
    path = tmp_path / "m.duckdb"
    with open_store(path) as store:
        b.load(store)
    with Analysis.open(path) as a:
        (s,) = a.summary("gen")
        everyone = a.summary(metric="tpot")  # "plain" has no tokens: left out, not an error
        ttft = a.diff("gen", "gen", metric="ttft")
        tpot = a.diff("gen", "gen", metric="tpot")
    assert s.tokens is not None and s.tokens.prompt_tokens_p50 is None
    assert s.tokens.output_tokens_p50 == 11
    assert [x.label for x in everyone] == ["gen"]
    assert ttft.after.requests == 41  # the 40, and the two-generation one; not the quitter
    # TPOT: 100 ms / 10 for the 40; the pair's 120 ms of decode over 20 tokens is 6 ms.
    assert tpot.after.requests == 41
    assert next(r for r in tpot.latency if r.quantile == "p50").after == pytest.approx(10.0)
    with open_store(path, read_only=True) as store:
        (view,), _ = load_metric(store, ["gen"], "tpot")
    assert sorted(view.duration_ms)[0] == pytest.approx(6.0)
