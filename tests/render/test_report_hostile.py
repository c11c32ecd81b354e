"""Names and URLs from traces are data, never markup: the report survives hostile ones.

Stage and span names that close a ``<script>``, open an HTML comment, end CDATA or hold
U+2028 keep both JSON blocks valid JSON and every chart drawn; a Jaeger URL whose scheme
is not http(s) becomes no link. The store is built with
:class:`tracekit.testing.TraceBuilder`; the browser test uses the real headless Chromium
of :mod:`browser` and skips where ``/usr/bin/chromium`` is absent.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit import Analysis
from tracekit.analysis.store import open_store
from tracekit.render.html import render_report
from tracekit.testing import TraceBuilder

from .test_report_browser import CHARTS_JS, READY

SCRIPT = "</script><script>alert(1)</script>"
COMMENT = "<!--"
COMMENT_SCRIPT = "<!--<script>"
CDATA = "]]>"
SEPARATORS = "line\u2028para\u2029end"
ENTITY = "&amp;"
STAGES = (SCRIPT, COMMENT, COMMENT_SCRIPT, CDATA, SEPARATORS, ENTITY)
"""Stage names, each one a way to break out of a ``<script>`` or of JSON."""
LINK = '<a href="javascript:alert(1)">x</a>'
ROOT = "<b>POST</b> /predict <!--"
SPANS = (LINK, ROOT)
"""Span names: markup a chart library would draw as a link or as bold text."""
SLOW_STAGE = COMMENT
N = 240
"""Requests per release: enough for the diff's tail and its intervals."""


def _build(b: TraceBuilder, version: str, seed: int, *, t0_ms: float, slow: bool) -> None:
    rng = np.random.default_rng(seed)
    for i in range(N):
        lengths = [round(float(rng.lognormal(np.log(4.0), 0.2)), 3) for _ in STAGES]
        if slow and rng.random() < 0.3:
            lengths[STAGES.index(SLOW_STAGE)] += 40.0
        r = b.request(
            start_ms=t0_ms + i * 100.0,
            duration_ms=round(sum(lengths) + 1.0, 3),
            name=ROOT,
            version=version,
        )
        t = 0.5
        for stage, d in zip(STAGES, lengths, strict=True):
            span = r.stage(stage, start_ms=t, duration_ms=d)
            if stage == SLOW_STAGE:
                r.span(LINK, start_ms=t + 0.1, duration_ms=round(d - 0.2, 3), parent=span)
            t = round(t + d, 3)


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("hostile") / "tracekit.duckdb"
    b = TraceBuilder(service="ranker", version="v1", seed=7)
    _build(b, "v1", 1, t0_ms=0.0, slow=False)
    _build(b, "v2", 2, t0_ms=N * 100.0, slow=True)
    with open_store(path) as store:
        b.load(store)
    return str(path)


def _page(db: str, jaeger_url: str | None = None) -> str:
    # The library entry the CLI calls: the renderer must be safe whatever the CLI lets by.
    with Analysis.open(db) as analysis:
        report = analysis.report("v1", "v2", jaeger_url=jaeger_url)
    return render_report(report)


@pytest.fixture(scope="module")
def hostile_page(hostile_db: str) -> str:
    return _page(hostile_db)


def _block(page: str, element_id: str) -> str:
    m = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', page, re.S)
    assert m, f"no #{element_id} in the page"
    return m.group(1)


def _strings(obj: Any) -> set[str]:
    if isinstance(obj, dict):
        return set().union(*(_strings(v) | {k} for k, v in obj.items()))
    if isinstance(obj, list):
        return set().union(*(_strings(v) for v in obj))
    return {obj} if isinstance(obj, str) else set()


def _body(page: str) -> str:
    """The page after the head: plotly.js itself is inlined in the head."""
    return page.split("</head>", 1)[1]


def test_embedded_json_is_valid_json_holding_the_raw_hostile_names(hostile_page: str) -> None:
    results = json.loads(_block(hostile_page, "tracekit-results"))
    stages = {s["name"] for s in results["diff"]["stages"]}
    assert set(STAGES) <= stages
    assert results["diff"]["verdict"]["primary_stage"] == SLOW_STAGE
    assert set(STAGES) <= _strings(results)
    figures = json.loads(_block(hostile_page, "tracekit-figures"))
    assert figures and all(f["data"] for f in figures.values())
    # Nothing in the data can end the script, open a comment, or end a line for JS.
    for element_id in ("tracekit-results", "tracekit-figures"):
        text = _block(hostile_page, element_id)
        assert not re.search("[<>&\u2028\u2029]", text), element_id
    body = _body(hostile_page)
    assert "<script>alert(1)" not in body
    assert body.count("<script") == body.count("</script>") == 3


def test_every_name_in_the_html_is_escaped(hostile_page: str) -> None:
    body = _body(hostile_page)
    outside_scripts = re.sub(r"<script[^>]*>.*?</script>", "", body, flags=re.S)
    for raw in (*STAGES, *SPANS):
        if any(c in raw for c in "<>"):
            assert raw not in outside_scripts, raw
    assert "<td>&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;</td>" in outside_scripts
    assert "<td>&amp;amp;</td>" in outside_scripts


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)//",
        "JavaScript:alert(document.domain)",
        " javascript:alert(1)",
        "java\tscript:alert(1)",
        "data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==",
        "vbscript:msgbox(1)",
        "//evil.example",
        "https:javascript:alert(1)",
    ],
)
def test_a_jaeger_url_that_is_not_http_becomes_no_link(hostile_db: str, url: str) -> None:
    body = _body(_page(hostile_db, url))
    # The URL stays in the results (as --format json prints it), as data, never a link.
    markup = re.sub(r"<script[^>]*>.*?</script>", "", body, flags=re.S)
    # (A span name holding `<a href=…>` is shown as text, escaped: only a tag counts.)
    assert re.findall(r"<[^>]*\bhref\s*=", markup, flags=re.I) == []
    assert "open in Jaeger" not in markup
    assert "not an http(s) URL" in body


def test_an_http_jaeger_url_still_links_each_trace(hostile_db: str) -> None:
    body = _body(_page(hostile_db, "https://jaeger.example:16686/"))
    hrefs = re.findall(r'<a class="jaeger" href="([^"]*)"', body)
    assert hrefs and all(h.startswith("https://jaeger.example:16686/trace/") for h in hrefs)


# Every axis tick and legend label as drawn, and every link in the charts.
LABELS_JS = """
({
  ticks: Array.from(document.querySelectorAll('.chart .ytick text, .chart .xtick text'))
    .map(function (t) { return t.textContent; }),
  legend: Array.from(document.querySelectorAll('.chart .legendtext'))
    .map(function (t) { return t.textContent; }),
  links: Array.from(document.querySelectorAll('.chart a')).map(function (a) {
    return a.getAttribute('href') || a.getAttribute('xlink:href') || ''; }),
  bold: document.querySelectorAll('.chart tspan[style*="bold"]').length
})
"""


def test_hostile_names_draw_every_chart_and_keep_the_results_readable(
    hostile_page: str, browser, artifacts: Path, tmp_path: Path
) -> None:
    page = tmp_path / "hostile.html"
    page.write_text(hostile_page, encoding="utf-8")
    session, run = browser.open(page, ready_js=READY)
    assert run.errors == [] and run.requests == []
    charts = browser.evaluate(session, CHARTS_JS)
    kinds = {c["kind"] for c in charts}
    assert {"latency", "shares", "distributions", "waterfall"} <= kinds
    assert all(c["points"] > 0 and c["marks"] > 0 for c in charts), charts
    assert browser.evaluate(session, "Number(document.body.dataset.charts)") == len(charts)
    stages = browser.evaluate(
        session,
        "JSON.parse(document.getElementById('tracekit-results').textContent)"
        ".diff.stages.map(function (s) { return s.name; })",
    )
    assert set(STAGES) <= set(stages)
    # Names are drawn as the text they are: no link, no bold, no entity decoded.
    labels = browser.evaluate(session, LABELS_JS)
    assert labels["links"] == [] and labels["bold"] == 0
    assert {SCRIPT, COMMENT, CDATA, ENTITY} <= set(labels["ticks"])
    assert LINK in labels["ticks"] and ROOT in labels["ticks"]
    browser.screenshot(session, artifacts / "hostile.png")
