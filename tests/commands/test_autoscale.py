"""`tracekit autoscale` parses its flags, calls the audit and exits 0 / 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.cli import main
from tracekit.commands._types import duration_type

from ..analysis.autoscale_timelines import queueing_timeline

parse_window = duration_type()  # what --window uses

DATA = Path(__file__).resolve().parent.parent / "data" / "autoscale"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding a thinned queueing time line (release v2, two replicas)."""
    from tracekit.analysis.store import open_store
    from tracekit.testing import TraceBuilder

    path = tmp_path_factory.mktemp("autoscale") / "tracekit.duckdb"
    data = queueing_timeline(seed=5)
    b = TraceBuilder(service="ranker", version="v2", seed=4)
    t0 = int(data.start_ns.min())
    for i in range(0, len(data.start_ns), 80):
        b.request(
            start_ms=(int(data.start_ns[i]) - t0) / 1e6,
            duration_ms=float(data.duration_ms[i]),
            attributes={
                cv.INFLIGHT: float(data.inflight[i]),
                cv.QUEUE_DEPTH: float(data.queue_depth[i]),
                cv.CPU_UTILIZATION: float(data.cpu_utilization[i]),
            },
            instance_id=str(data.instance_ids[i]),
        )
    with open_store(path) as store:
        b.load(store)
    return str(path)


ARGS = ["--slo", "p90<180ms", "--window", "1m"]


def test_default_rule_table_says_it_assumed_cpu(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["autoscale", *ARGS, "--db", db]) == 0
    out = capsys.readouterr().out
    assert out.startswith("CPU stayed at")
    assert "assumed a Kubernetes HPA on CPU at 70%" in out


def test_json_with_an_hpa_file(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["autoscale", "--version", "v2", "--hpa", str(DATA / "hpa_cpu.yaml"), *ARGS,
                 "--format", "json", "--db", db])  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["rule"]["controller"] == "HPA" and not doc["rule"]["assumed"]
    assert doc["missed_windows"] == doc["violating_windows"] > 0
    assert doc["recommendation"]["signal"] in ("inflight", "queue_depth")


def test_signal_flags_and_markdown(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["autoscale", "--signal", "inflight", "--target", "1.5", *ARGS,
                 "--format", "markdown", "--db", db])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "nothing missed" in out and "| window |" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--hpa", str(DATA / "hpa_bad.yaml")], "averageUtilization: expected a number"),
        (["--signal", "inflight"], "--signal needs --target"),
        (["--version", "v9"], "no requests for release 'v9'"),
        (["--window", "soon"], "--window 'soon'"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    db: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(["autoscale", *ARGS, *argv, "--db", db]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_missing_store_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["autoscale", *ARGS, "--db", str(tmp_path / "none.duckdb")]) == 2
    assert "tracekit ingest" in capsys.readouterr().err


def test_window_durations() -> None:
    assert parse_window("30s") == 30.0
    assert parse_window("1m") == 60.0
    assert parse_window("500ms") == 0.5
    assert parse_window("45") == 45.0
