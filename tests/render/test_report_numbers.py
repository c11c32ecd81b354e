"""`tracekit report` writes one self-contained page whose numbers are the JSON ones.

The report is written by the real CLI from a real DuckDB store; the numbers are compared
with what ``tracekit diff / gate / autoscale --format json`` print for the same store:
the embedded results, the chart markers and the table cells.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tracekit.cli import main

SLO = "p95<100ms"
JAEGER = "http://jaeger.example:16686"


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    capsys.readouterr()
    main(list(argv))
    return json.loads(capsys.readouterr().out)


def embedded(page: str, element_id: str) -> Any:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S)
    assert m, f"no #{element_id} in the page"
    return json.loads(m.group(1))


@pytest.fixture(scope="module")
def page(report_db: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = tmp_path_factory.mktemp("page") / "report.html"
    argv = ["report", "--before", "v1", "--after", "v2", "--db", report_db, "-o", str(out)]
    assert main(argv + ["--slo", SLO, "--jaeger-url", JAEGER]) == 0
    return out.read_text(encoding="utf-8")


def test_page_is_self_contained_and_small(page: str) -> None:
    assert len(page.encode()) < 10_000_000
    # Nothing fetched: no external script, stylesheet, image or font.
    assert not re.search(r"<(script|img|iframe)[^>]+src=|<link[^>]+href=", page)
    # (plotly.js itself names CDN URLs for map tiles and MathJax, used by no chart here;
    # the browser test proves the page fetches nothing.)
    assert "Plotly.newPlot" in page and "plotly.js" in page  # the library is inline


def test_embedded_results_are_what_format_json_prints(
    page: str, report_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = ["--db", report_db]
    diff = cli_json(capsys, "diff", "--before", "v1", "--after", "v2", "--jaeger-url", JAEGER, "--format", "json", *db)  # fmt: skip
    capsys.readouterr()
    main(["gate", "--before", "v1", "--after", "v2", "--format", "json", *db])
    gate = json.loads(capsys.readouterr().out)
    audit = cli_json(capsys, "autoscale", "--version", "v1", "--version", "v2", "--slo", SLO, "--window", "30s", "--format", "json", *db)  # fmt: skip
    results = embedded(page, "tracekit-results")
    assert results["diff"] == diff
    assert results["gate"] == gate
    assert results["autoscale"] == audit


def test_charts_and_tables_show_the_json_numbers(
    page: str, report_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    diff = cli_json(capsys, "diff", "--before", "v1", "--after", "v2", "--format", "json", "--db", report_db)  # fmt: skip
    figures = embedded(page, "tracekit-figures")
    by_kind = {
        kind: [
            figures[cid]
            for cid, k in re.findall(r'id="(chart-\d+)" data-chart="(\w+)"', page)
            if k == kind
        ]  # fmt: skip
        for kind in ("latency", "shares", "distributions", "waterfall", "autoscale")
    }
    assert all(by_kind.values()), {k: len(v) for k, v in by_kind.items()}

    latency = {row["quantile"]: row for row in diff["latency"]}
    markers = {t["name"]: t for t in by_kind["latency"][0]["data"] if t["mode"] == "markers+text"}
    after = markers["v2 p50/p95/p99"]
    for q, y, (delta, lo, hi, before) in zip(after["text"], after["y"], after["customdata"], strict=True):  # fmt: skip
        row = latency[q]
        assert (y, delta, lo, hi, before) == (row["after"], row["delta"], row["ci_low"], row["ci_high"], row["before"])  # fmt: skip
    assert markers["v1 p50/p95/p99"]["y"] == [latency[q]["before"] for q in ("p50", "p95", "p99")]

    removed = {}
    for trace in by_kind["shares"][0]["data"]:
        removed.update(zip(trace["y"], trace["x"], strict=True))
    assert removed == {s["name"]: s["counterfactual_p99_removed_ms"] for s in diff["stages"]}

    cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", page)]
    p99 = latency["p99"]
    assert f"{p99['after']:.1f}" in cells and f"{p99['delta']:+.1f}" in cells
    assert html.escape(diff["verdict"]["summary"]) in page


def test_waterfalls_are_the_exemplars_linked_to_jaeger(
    page: str, report_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    diff = cli_json(capsys, "diff", "--before", "v1", "--after", "v2", "--jaeger-url", JAEGER, "--format", "json", "--db", report_db)  # fmt: skip
    shown = re.findall(r'<div class="trace" data-trace-id="([0-9a-f]+)">', page)
    assert shown == [e["trace_id"] for e in diff["exemplars"]]
    links = re.findall(r'<a class="jaeger" href="([^"]+)"', page)
    assert links == [e["url"] for e in diff["exemplars"]]
    assert all(u.startswith(f"{JAEGER}/trace/") for u in links)


def test_without_slo_the_page_says_how_to_get_the_time_line(report_db: str, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", "--before", "v1", "--after", "v2", "--db", report_db, "-o", str(out)]) == 0  # fmt: skip
    text = out.read_text(encoding="utf-8")
    assert 'data-chart="autoscale"' not in text
    assert "--slo" in text and "autoscale" not in embedded(text, "tracekit-results")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--before", "v1", "--after", "v9"], "v9"),
        (["--before", "v1", "--after", "v2", "--slo", "fast"], "--slo"),
        (["--before", "v1", "--after", "v2", "-o", "/nonexistent/dir/r.html"], "does not exist"),
    ],
)
def test_user_errors_exit_2_with_one_line(
    argv: list[str], needle: str, report_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", *argv, "--db", report_db]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err


def test_gate_html_is_the_report_around_the_gate_decision(
    report_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gate.html"
    argv = ["gate", "--before", "v1", "--after", "v2", "--db", report_db, "--format", "json"]
    assert main([*argv, "--html", str(out)]) == 1  # the exit code is still the gate's
    gate = json.loads(capsys.readouterr().out)
    page = out.read_text(encoding="utf-8")
    results = embedded(page, "tracekit-results")
    assert results["gate"] == gate and gate["result"] == "fail"
    assert '<span class="badge fail">FAIL</span>' in page
    assert 'data-chart="latency"' in page and 'data-chart="waterfall"' in page
