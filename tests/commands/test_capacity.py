"""``tracekit capacity`` through the CLI: every format, the HTML page, bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.analysis.test_capacity import _release
from tracekit.analysis.store import open_store
from tracekit.cli import main
from tracekit.testing import TraceBuilder


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("capacity") / "t.duckdb"
    b = TraceBuilder(seed=3)
    _release(b, "A", latency_ms=40.0, model_ms=2.0)
    _release(b, "B", latency_ms=40.0, spike_latency_ms=250.0, model_ms=20.0, seed=1)
    with open_store(path) as store:
        b.load(store)
    return path


ARGS = ["capacity", "--version", "A", "--version", "B", "--slo", "p95<100ms", "--window", "2s"]


def test_json_has_the_documented_keys_and_names_the_latency_bound_release_first(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*ARGS, "--replica-cost", "2.50/h", "--db", str(db), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert set(doc) == {"slo", "window_s", "releases", "summary", "flags"}
    rel = {r["label"]: r for r in doc["releases"]}
    assert rel["B"]["verdict"] == "latency_bound"
    assert rel["A"]["verdict"] in ("cost_bound", "balanced")
    assert {"label", "verdict", "normal", "peak", "spikes", "cost", "headroom", "batching"} <= set(
        rel["A"]
    )
    assert {"p50_ms", "p95_ms", "p99_ms", "windows", "miss_share"} <= set(rel["A"]["peak"])
    assert {"count", "duration_s_p50", "duration_s_p90", "rate_ratio"} <= set(rel["A"]["spikes"])
    assert {"replica_seconds_per_1k", "gpu_busy_fraction", "cost_per_1k"} <= set(rel["A"]["cost"])
    assert {"knee_rps_per_replica", "peak_rps_per_replica"} <= set(rel["A"]["headroom"])
    assert rel["A"]["cost"]["cost_per_1k"] == pytest.approx(
        rel["A"]["cost"]["replica_seconds_per_1k"] * 2.5 / 3600
    )
    assert "windows" not in rel["A"]
    assert doc["summary"].startswith("fix B first")


def test_a_price_per_release_prices_each_alone(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prices = ["--replica-cost", "A=4.00/h", "--replica-cost", "B=1.20/h"]
    assert main([*ARGS, *prices, "--db", str(db), "--format", "json"]) == 0
    rel = {r["label"]: r["cost"] for r in json.loads(capsys.readouterr().out)["releases"]}
    for label, price in (("A", 4.0), ("B", 1.2)):
        assert rel[label]["replica_cost_per_h"] == price
        assert rel[label]["cost_per_1k"] == pytest.approx(
            rel[label]["replica_seconds_per_1k"] * price / 3600, rel=1e-4
        )


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_people_formats_show_every_release_and_the_summary(
    db: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    assert main([*ARGS, "--db", str(db), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert "A: " in out and "B: latency_bound" in out and "fix B first" in out
    assert "spikes:" in out and "headroom:" in out


def test_html_page_draws_the_capacity_part(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "cap.html"
    assert main([*ARGS, "--db", str(db), "--html", str(page)]) == 0
    html = page.read_text()
    assert 'id="capacity"' in html or "Capacity:" in html
    assert "Latency against arrival rate" in html and '"capacity"' in html


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--replica-cost", "cheap"], "--replica-cost"),
        (["--replica-cost", "C=1/h"], "not a --version"),
        (["--gpus-per-replica", "0"], "--gpus-per-replica"),
        (["--version", "nope"], "nope"),
    ],
)
def test_bad_options_are_one_line_exit_2(
    db: Path, capsys: pytest.CaptureFixture[str], extra: list[str], needle: str
) -> None:
    assert main([*ARGS, *extra, "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert any(needle in line for line in err), err


def test_help_keeps_each_example_line_and_fits_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["capacity", "--help"])
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()), out
    # A continued example stays two lines: the backslash ends the first.
    assert '--slo "p95<100ms" \\\n      --replica-cost A=4.00/h --replica-cost B=1.20/h' in out
