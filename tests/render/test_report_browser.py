"""The report in a real headless Chromium: offline, no console errors, every chart drawn.

Chromium (Debian's ``chromium`` package) is driven over the DevTools protocol on a pipe
(:mod:`browser`); the page opens from ``file://`` with the network switched off. A
full-page screenshot is written to build/test-output/render/ (or $TRACEKIT_TEST_OUTPUT).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tracekit.analysis.store import open_store
from tracekit.cli import main
from tracekit.testing import TraceBuilder, training_run

READY = "document.body.dataset.charts !== undefined"

# Per chart: its kind, the points its traces hold, and the SVG marks plotly drew.
CHARTS_JS = """
Array.from(document.querySelectorAll('.chart')).map(function (g) {
  return {
    kind: g.dataset.chart,
    points: (g.data || []).reduce(function (n, t) {
      return n + (t.x || []).length + (t.median || []).length; }, 0),
    marks: g.querySelectorAll(
      '.scatterlayer .point, .scatterlayer .js-line, .barlayer .point, .boxlayer .box'
    ).length
  };
})
"""

# The waterfalls' "critical path" trace: its bars as drawn (width in pixels).
CRITICAL_JS = """
Array.from(document.querySelectorAll('.chart[data-chart="waterfall"]')).map(function (g) {
  var i = g.data.findIndex(function (t) { return t.name === 'critical path'; });
  var trace = g.querySelectorAll('.barlayer .trace')[i];
  var bars = trace ? Array.from(trace.querySelectorAll('.point path')) : [];
  return {
    bars: bars.length,
    drawn: bars.filter(function (p) { return p.getBBox().width > 0; }).length,
    legend: Array.from(g.querySelectorAll('.legendtext')).map(function (t) {
      return t.textContent; })
  };
})
"""

FITS_JS = """
new Promise(function (done) {
  window.dispatchEvent(new Event('beforeprint'));
  setTimeout(function () {
    done(Array.from(document.querySelectorAll('.chart')).map(function (g) {
      var svg = g.querySelector('.main-svg').getBoundingClientRect();
      return {svg_w: svg.width, svg_h: svg.height, box_h: g.getBoundingClientRect().height};
    }));
  }, 300);
})
"""


def write(tmp_path: Path, argv: list[str]) -> Path:
    out = tmp_path / "page.html"
    assert main([*argv, "-o" if argv[0] == "report" else "--html", str(out)]) in (0, 1, 3)
    return out


def test_report_opens_offline_with_every_chart_drawn(
    report_db: str, browser, artifacts: Path, tmp_path: Path
) -> None:
    page = write(
        tmp_path,
        ["report", "--before", "v1", "--after", "v2", "--slo", "p95<100ms", "--db", report_db],
    )
    session, run = browser.open(page, ready_js=READY)
    assert run.errors == []
    assert run.requests == []
    charts = browser.evaluate(session, CHARTS_JS)
    kinds = [c["kind"] for c in charts]
    for kind in ("latency", "shares", "distributions", "waterfall", "autoscale"):
        assert kind in kinds
    assert all(c["points"] > 0 and c["marks"] > 0 for c in charts), charts
    assert browser.evaluate(session, "Number(document.body.dataset.charts)") == len(charts)

    waterfalls = browser.evaluate(session, CRITICAL_JS)
    assert waterfalls and all(w["drawn"] > 0 and w["drawn"] == w["bars"] for w in waterfalls)
    assert all("critical path" in w["legend"] for w in waterfalls)
    verdict = browser.evaluate(session, "document.getElementById('verdict').textContent")
    assert verdict.startswith("p99 grew") and "batch_queue" in verdict

    shot = browser.screenshot(session, artifacts / "report.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 50_000

    # Printable: at paper width with the print stylesheet, every chart refits and keeps
    # the room it draws in (nothing below it is painted over); then Chromium prints it.
    browser.call("Emulation.setEmulatedMedia", {"media": "print"}, session=session)
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        {"width": 720, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        session=session,
    )
    fits = browser.evaluate(session, FITS_JS)
    assert fits and all(f["svg_w"] <= 720 and f["svg_h"] <= f["box_h"] for f in fits), fits
    pdf = base64.b64decode(
        browser.call("Page.printToPDF", {"printBackground": True}, session=session)["data"]
    )
    (artifacts / "report.pdf").write_bytes(pdf)
    assert pdf[:5] == b"%PDF-" and pdf.count(b"/Type /Page") > 2


@pytest.mark.parametrize(
    ("name", "argv", "kinds"),
    [
        ("slow", ["slow", "--version", "v2"], {"slow", "latency", "waterfall"}),
        (
            "autoscale",
            ["autoscale", "--version", "v1", "--version", "v2", "--slo", "p95<100ms"],
            {"autoscale"},
        ),
    ],
)
def test_slow_and_autoscale_write_their_part_alone(
    name: str,
    argv: list[str],
    kinds: set[str],
    report_db: str,
    browser,
    artifacts: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = write(tmp_path, [*argv, "--db", report_db])
    capsys.readouterr()
    session, run = browser.open(page, ready_js=READY)
    assert run.errors == [] and run.requests == []
    charts = browser.evaluate(session, CHARTS_JS)
    assert {c["kind"] for c in charts} == kinds
    assert all(c["points"] > 0 and c["marks"] > 0 for c in charts), charts
    browser.screenshot(session, artifacts / f"{name}.png")


def test_training_runs_show_steps_per_rank_and_scaling(
    browser, artifacts: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "train.duckdb"
    b = TraceBuilder(service="trainer", seed=1)
    training_run(b, world_size=4, steps=6, version="4gpu", ranks_per_host=4)
    training_run(b, world_size=8, steps=6, version="8gpu", straggler=(5, 30.0), ranks_per_host=4)
    with open_store(db) as store:
        b.load(store)
    page = write(tmp_path, ["report", "--before", "4gpu", "--after", "8gpu", "--db", str(db)])
    capsys.readouterr()
    main(["diff", "--before", "4gpu", "--after", "8gpu", "--db", str(db), "--format", "json"])
    diff = json.loads(capsys.readouterr().out)
    session, run = browser.open(page, ready_js=READY)
    assert run.errors == [] and run.requests == []
    charts = browser.evaluate(session, CHARTS_JS)
    assert [c["kind"] for c in charts] == ["training"] * 4  # scaling, components, 2 runs
    assert all(c["points"] > 0 and c["marks"] > 0 for c in charts), charts
    results = json.loads(
        browser.evaluate(session, "document.getElementById('tracekit-results').textContent")
    )
    assert results["training"] == diff
    ranks = browser.evaluate(session, "document.querySelectorAll('.chart')[3].data[0].x.length")
    assert ranks == 8
    browser.screenshot(session, artifacts / "training.png")
