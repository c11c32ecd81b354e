"""The front door: ``tracekit.Analysis`` answers what each command answers, typed.

A real DuckDB store (and a real chDB table for the ClickHouse path) built from spans;
every method returns the result type its renderers take, training vs serving is
decided inside, and the gate's options merge argument > config file > default.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracekit import Analysis
from tracekit.analysis.attribution.explain import Explanation
from tracekit.analysis.autoscale.audit import AutoscaleResult
from tracekit.analysis.compare.diff import DiffResult
from tracekit.analysis.compare.summary import SlowFast, Summary
from tracekit.analysis.gate.evaluate import GateResult
from tracekit.analysis.report import Report
from tracekit.analysis.results import Outcome, ReleaseRef, Verdict
from tracekit.analysis.store import open_store
from tracekit.analysis.training.gate import TrainingGateResult
from tracekit.analysis.training.model import StepsResult, TrainingDiff
from tracekit.errors import ConfigError, QueryError
from tracekit.testing import TraceBuilder, queue_regression, training_run


def _serving(builder: TraceBuilder) -> None:
    """v1, and v2 whose batch queue grows in a fifth of its requests."""
    queue_regression(builder, extra_ms=40.0, seed=3)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    builder = TraceBuilder(service="ranker", version="v1", seed=2)
    _serving(builder)
    for label, world, straggler in (("8gpu", 8, None), ("16gpu", 16, (3, 30.0))):
        training_run(builder, world_size=world, steps=12, version=label, straggler=straggler)
    path = tmp_path_factory.mktemp("facade") / "tracekit.duckdb"
    with open_store(path) as store:
        builder.load(store)
    return path


@pytest.fixture
def analysis(db: Path) -> Iterator[Analysis]:
    with Analysis.open(db) as a:
        yield a


def test_each_question_returns_the_type_its_renderers_take(analysis: Analysis) -> None:
    assert {"v1", "v2", "8gpu", "16gpu"} <= set(analysis.releases())
    summaries = analysis.summary("v2")
    assert [type(s) for s in summaries] == [Summary] and summaries[0].label == "v2"
    diff = analysis.diff("v1", "v2")
    assert isinstance(diff, DiffResult)
    assert isinstance(diff.before, ReleaseRef) and isinstance(diff.verdict, Verdict)
    assert diff.verdict.primary_stage == "batch_queue" and diff.verdict.kind == "wait"
    slow = analysis.slow("v2")
    assert isinstance(slow, SlowFast)
    assert isinstance(analysis.explain(slow.exemplars[0].trace_id[:12]), Explanation)
    gate = analysis.gate("v1", "v2")
    assert isinstance(gate, GateResult) and gate.result == Outcome.FAIL
    # The gate and the diff speak one vocabulary: the gate's verdict is the diff's.
    assert gate.verdict == diff.verdict and isinstance(gate.before, ReleaseRef)
    auto = analysis.autoscale(["v1", "v2"], slo="p95<20ms", window_s=5.0)
    assert isinstance(auto, AutoscaleResult)
    report = analysis.report("v1", "v2", gate=gate)
    assert isinstance(report, Report) and report.gate is gate
    assert report.verdict == diff.verdict.summary


def test_training_runs_are_told_apart_inside(analysis: Analysis) -> None:
    assert analysis.is_training("8gpu", "16gpu") and not analysis.is_training("v1", "v2")
    assert set(analysis.training_runs()) == {"8gpu", "16gpu"}
    assert isinstance(analysis.diff("8gpu", "16gpu"), TrainingDiff)
    gate = analysis.gate("8gpu", "16gpu", budgets=["step_ms.p50<=+5%"])
    assert isinstance(gate, TrainingGateResult) and gate.exit_code is None
    assert isinstance(analysis.steps("16gpu"), StepsResult)
    page = analysis.report("8gpu", "16gpu")
    assert page.training is not None and page.diff is None


def test_gate_options_come_from_the_argument_then_the_config_then_the_default(
    analysis: Analysis, tmp_path: Path
) -> None:
    config = tmp_path / "tracekit-gate.toml"
    config.write_text('[gate]\nbudgets = ["p50<=+50%"]\nconfidence = 0.9\nmin_effect = "2ms"\n')
    from_file = analysis.gate("v1", "v2", config=config)
    assert [c.name for c in from_file.checks] == ["p50 <= +50%"]
    assert from_file.confidence == 0.9 and from_file.min_effect_ms == 2.0
    flags = analysis.gate(
        "v1", "v2", config=config, budgets=["p99<=+10%"], confidence=0.8, min_effect_ms=0.5
    )
    assert [c.name for c in flags.checks] == ["p99 <= +10%"]
    assert flags.confidence == 0.8 and flags.min_effect_ms == 0.5
    default = analysis.gate("v1", "v2")
    assert [c.name for c in default.checks] == ["p95 <= +10%", "p99 <= +10%"]
    assert default.confidence == 0.95 and default.min_effect_ms == 0.0


def test_what_was_asked_wrongly_is_one_error(analysis: Analysis, db: Path) -> None:
    with pytest.raises(QueryError, match="no requests for release 'v9'"):
        analysis.diff("v1", "v9")
    with pytest.raises(ConfigError, match="--warmup must be 0 or more"):
        analysis.steps(warmup=-1)
    with pytest.raises(ConfigError, match="needs --target"):
        analysis.autoscale("v2", slo="p95<20ms", signal="inflight")
    with pytest.raises(ConfigError, match="ClickHouse store"):
        Analysis.open(db, since="2h")


def test_every_method_names_its_result_type() -> None:
    # What the renderers are dispatched on (tests/render/test_dispatch.py): the methods'
    # annotations, resolved, so a method returning an untyped value fails here.
    for name in ("summary", "diff", "slow", "explain", "gate", "autoscale", "steps", "report"):
        hints = typing.get_type_hints(getattr(Analysis, name))
        assert hints["return"] is not typing.Any, name


def test_requests_without_a_release_label_are_summarised_not_refused(
    corpus_dir: Path, tmp_path: Path
) -> None:
    # Real SDK and Collector files mostly carry no service.version: their requests are
    # the release "" — shown as "(no service.version)", selected with --version ''.
    from tracekit.analysis.facade import ingest
    from tracekit.render import render

    db = tmp_path / "corpus.duckdb"
    ingest([corpus_dir], store=db)
    with Analysis.open(db) as analysis:
        (summary,) = [s for s in analysis.summary() if s.label == ""]
        assert summary.requests > 0
        assert analysis.slow("").label == ""
    assert f"\n(no service.version): {summary.requests} requests" in render([summary], "table")


def test_arguments_are_checked_before_the_store_is_read(analysis: Analysis) -> None:
    with pytest.raises(ConfigError, match="is for training runs"):
        analysis.gate("v1", "v2", budgets=["samples_per_s>=-10%"])  # two releases
    with pytest.raises(ConfigError, match="is for training runs"):
        analysis.report("v1", "v2", budgets=["step_ms.p95<=+5%"])
    with pytest.raises(ConfigError, match="--target needs --signal"):
        analysis.autoscale("v2", slo="p95<20ms", target="5")
    # One budget may be given as a string; "" is no config file (as CI's
    # `--config "${GATE_CONFIG:-}"` passes it).
    one = analysis.gate("v1", "v2", budgets="p99<=+10%", config="")
    assert [c.name for c in one.checks] == ["p99 <= +10%"]
