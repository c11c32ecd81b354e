"""``tracekit demo --capacity``: A and B served under bursty load, ingested, judged.

One real run of the command (four service processes, a real DynamicBatcher in each
ranker, bursty open-loop load in turns, ingest, ``Analysis.capacity``) serves every test
of the run; the plan and the settings are checked without starting anything.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from tracekit import cli
from tracekit.analysis.capacity.model import COST_BOUND, LATENCY_BOUND, CapacityResult
from tracekit.demo import capacity
from tracekit.demo.capacity import RELEASES, burst_plan
from tracekit.demo.loadgen import Block
from tracekit.demo.settings import ENV_BATCH, BatchKnobs, parse_batch
from tracekit.errors import ConfigError

from .conftest import assert_all_gone, record_started_pids


def test_burst_plan_spikes_the_same_rounds_for_both_releases() -> None:
    plan = burst_plan(2, seed=3)
    assert len(plan.spike_rounds) == capacity.SPIKES and 0 not in plan.spike_rounds
    by_round: dict[int, list[Block]] = {}
    for block in plan.blocks:
        by_round.setdefault(block.round, []).append(block)
    counts: dict[int, int] = {}
    for r, (first, second) in by_round.items():
        # Same arrivals and bodies for A and B (each one's first block starts at 0).
        assert {first.target, second.target} == {0, 1}
        assert first.seed == second.seed and len(first.offsets) == len(second.offsets)
        gaps = [b - a for a, b in zip(first.offsets, first.offsets[1:], strict=False)]
        assert gaps == pytest.approx(
            [b - a for a, b in zip(second.offsets, second.offsets[1:], strict=False)]
        )
        counts[r] = len(first.offsets)
    quiet = max(n for r, n in counts.items() if r not in plan.spike_rounds)
    assert all(counts[r] >= 2 * quiet for r in plan.spike_rounds)
    assert burst_plan(2, seed=3) == plan  # deterministic from the seed
    firsts = [next(b for b in plan.blocks if b.target == t) for t in (0, 1)]
    assert all(b.offsets[0] == 0.0 for b in firsts)
    later = [b for b in plan.blocks if b not in firsts]
    assert all(b.offsets[0] == capacity.ALIGN_S for b in later)


def test_batch_override_reaches_the_knobs_and_bad_values_are_refused() -> None:
    assert parse_batch("16,20,1") == BatchKnobs(16, 20.0, 1)
    knobs = BatchKnobs(16, 20.0, 1, 10.0, 12.0)
    assert parse_batch(knobs.env_value()) == knobs
    assert parse_batch("") is None
    for bad in ("16,20", "16,20,1,10", "0,20,1", "16,nan,1", "16,20,1,-1,2"):
        with pytest.raises(ConfigError, match=ENV_BATCH):
            parse_batch(bad)


@dataclass
class Run:
    out: str
    err: str
    workdir: Path
    pids: list[int]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("capacity") / "out"
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        pids = record_started_pids(mp)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["demo", "--capacity", "--keep", str(workdir)])
    assert code == 0, err.getvalue()[-3000:]
    yield Run(out.getvalue(), err.getvalue(), workdir, pids)


@pytest.mark.slow
def test_every_request_is_served_and_every_process_stopped(run: Run) -> None:
    assert len(run.pids) == 4  # pricing and ranker for A and for B
    assert_all_gone(run.pids)
    served = re.findall(r"(A|B)\b.*?: (\d+)/(\d+) requests ok", run.err)
    assert {label for label, _, _ in served} == {"A", "B"}, run.err
    assert all(ok == total for _, ok, total in served)
    assert (run.workdir / capacity.DB_NAME).exists()


@pytest.mark.slow
def test_b_misses_in_the_spikes_and_a_meets_it_mostly_idle(run: Run) -> None:
    verdicts = dict(re.findall(r"^(A|B): (\w+) — ", run.out, re.M))
    assert verdicts == {"A": COST_BOUND, "B": LATENCY_BOUND}, run.out
    assert re.search(r"^summary: fix B first: ", run.out, re.M), run.out
    # The result lines say so, one expectation per release, each held.
    found = re.findall(r"^tracekit capacity found: (.*) ([✓✗])$", run.out, re.M)
    assert found == [("cost_bound", "✓"), ("latency_bound, fix B first", "✓")], run.out
    args = ["capacity", "--version", "A", "--version", "B", "--slo", capacity.SLO]
    args += ["--window", f"{capacity.WINDOW_S}s", "--format", "json"]
    for c in RELEASES:
        args += ["--replica-cost", f"{c.label}={c.price_per_h:.2f}/h"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main([*args, "--db", str(run.workdir / capacity.DB_NAME)]) == 0
    a, b = json.loads(out.getvalue())["releases"]
    assert b["peak"]["miss_share"] == 1.0 and b["normal"]["miss_share"] == 0.0
    assert a["peak"]["missed_windows"] == a["normal"]["missed_windows"] == 0
    assert b["spikes"]["count"] == capacity.SPIKES
    # B's spikes run far past the objective; A's requests hardly ever do.
    assert b["overrun"]["excess_s"] > 10 * max(a["overrun"]["excess_s"], 1.0)
    # One window per block: the quiet blocks are the normal windows, the spikes the peak.
    for r in (a, b):
        assert r["normal"]["windows"] == capacity.ROUNDS - capacity.SPIKES, r["normal"]
        assert r["peak"]["windows"] == capacity.SPIKES
    # No device time on a CPU machine: GPU busy is absent, the wall-time stand-in judged.
    assert a["cost"]["gpu_busy_fraction"] is None
    assert a["cost"]["execution_busy_fraction"] < 0.4 < b["cost"]["execution_busy_fraction"] * 2
    assert {"no_device_time", "busy_from_wall_time"} <= {f["code"] for f in a["flags"]}
    # The curve fitted from B's real batches recovers its accelerator's cost per request
    # (40 ms; the CPU model adds a little), and its fixed cost (5 ms, plus the model's).
    curve = b["batching"]["curve"]
    assert 39.0 < curve["per_request_ms"] < 45.0 and 3.0 < curve["intercept_ms"] < 30.0
    # One replica each for the same load: money per request follows the price.
    ratio = (a["cost"]["cost_per_1k"] / b["cost"]["cost_per_1k"]) / (
        a["cost"]["replica_seconds_per_1k"] / b["cost"]["replica_seconds_per_1k"]
    )
    assert ratio == pytest.approx(4.00 / 1.20, rel=1e-3)


def _result(a: str, b: str, summary: str) -> CapacityResult:
    releases = [SimpleNamespace(label="A", verdict=a), SimpleNamespace(label="B", verdict=b)]
    return SimpleNamespace(releases=releases, summary=summary)  # type: ignore[return-value]


def test_result_lines_mark_each_expectation(capsys: pytest.CaptureFixture[str]) -> None:
    ok = _result(COST_BOUND, LATENCY_BOUND, "fix B first: it misses p95<1000ms in 2 of 7.")
    assert capacity.print_verdict(ok) is True
    out = capsys.readouterr().out
    assert "injected in A: small batches on a fast, dear accelerator — batches of ≤2" in out
    assert "expected: latency_bound, fix B first" in out
    assert out.count("✓") == 2 and "✗" not in out and out.count("result") == 1
    # A rated latency-bound, and named first: both expectations fail, each marked.
    wrong = _result(LATENCY_BOUND, LATENCY_BOUND, "fix A first: 160 of its requests …")
    assert capacity.print_verdict(wrong) is False
    out = capsys.readouterr().out
    assert "found: latency_bound ✗" in out and "found: latency_bound, fix A first ✗" in out
    # No result at all (the analysis failed): nothing holds, nothing is invented.
    assert capacity.print_verdict(None) is False
    assert capsys.readouterr().out.count("✗") == 2


@pytest.mark.slow
def test_capacity_speaks_the_one_vocabulary(run: Run, vocabulary) -> None:
    vocabulary.check(run.out, "tracekit demo --capacity")
    args = ["capacity", "--version", "A", "--version", "B", "--slo", capacity.SLO]
    args += ["--window", f"{capacity.WINDOW_S}s", "--db", str(run.workdir / capacity.DB_NAME)]
    for fmt in ("table", "markdown"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main([*args, "--format", fmt]) == 0
        vocabulary.check(out.getvalue(), f"tracekit capacity --format {fmt}")
