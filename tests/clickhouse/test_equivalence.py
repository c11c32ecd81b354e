"""The same traces in DuckDB and in the exporter's ClickHouse table give the same answers.

Two releases are built with :class:`tracekit.testing.TraceBuilder`, written to OTLP JSONL,
and ingested with the real CLI: into a DuckDB file and, through the exporter's own DDL,
into three ClickHouse tables (chDB here): one read by pulling its spans, one attributed by
``tracekit attribute``, one attributed by two shards (0/2 and 1/2). Every analysis command
then runs against each with ``--format json`` and the outputs must be identical, byte for
byte.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.store.attributed import AttributedNames
from tracekit.analysis.store.clickhouse import connect
from tracekit.analysis.store.url import parse_store_url
from tracekit.cli import main
from tracekit.testing import TraceBuilder

N = 240


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def build(path: Path, version: str, seed: int, miss: float) -> tuple[Path, str]:
    """Requests with a cache-dependent retrieval, a downstream call into another service
    (whose resource carries a different version), sample weights on a quarter of them."""
    rng = np.random.default_rng(seed)
    b = TraceBuilder(service="ranker", version=version, seed=seed)
    for i in range(N):
        t0 = i * 40.0
        hit = bool(rng.random() > miss)
        fr = round(float(rng.lognormal(np.log(3.0 if hit else 30.0), 0.2)), 3)
        ds = round(float(rng.lognormal(np.log(12.0), 0.3)), 3)
        me = round(float(rng.lognormal(np.log(15.0), 0.15)), 3)
        route = "/predict" if i % 5 else "/rank"
        r = b.request(
            start_ms=t0,
            duration_ms=fr + ds + me,
            route=route,
            name=f"POST {route}",
            weight=4.0 if i % 4 == 0 else None,
            attributes={cv.INFLIGHT: int(rng.integers(1, 9)), cv.CPU_UTILIZATION: 0.25},
            instance_id=f"ranker-{i % 3}",
        )
        r.stage(cv.FEATURE_RETRIEVAL, start_ms=t0, duration_ms=fr, attributes={cv.CACHE_HIT: hit})
        call = r.stage(cv.DOWNSTREAM, start_ms=t0 + fr, duration_ms=ds)
        r.span(
            "GET /price",
            start_ms=t0 + fr + 1,
            duration_ms=ds - 2,
            kind="SERVER",
            parent=call,
            service="pricing",
            attributes={"pricing.tier": ["a", "b"][i % 2], "pricing.ratio": 0.5},
        )
        r.stage(
            cv.MODEL_EXECUTE, start_ms=t0 + fr + ds, duration_ms=me, attributes={cv.BATCH_SIZE: 4}
        )
    return b.write_jsonl(path / f"{version}.jsonl"), b.trace_ids()[7]


@pytest.fixture(scope="module")
def stores(
    tmp_path_factory: pytest.TempPathFactory, clickhouse_url: str
) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("equiv")
    f1, _ = build(tmp, "v1", 1, miss=0.05)
    f2, trace = build(tmp, "v2", 2, miss=0.35)
    duck = str(tmp / "t.duckdb")
    tag = uuid.uuid4().hex[:8]
    # The analysis commands read the attributed tables of their own spans table, so each
    # way of attributing gets a table of its own holding the same spans.
    tables = {k: f"otel_traces_eq_{k}_{tag}" for k in ("pulled", "attributed", "sharded")}
    assert run("ingest", str(f1), str(f2), "--db", duck)[0] == 0
    for table in tables.values():
        rc, out, err = run("ingest", str(f1), str(f2), "--store", clickhouse_url, "--table", table)
        assert rc == 0, err
        assert "table created with the exporter's DDL" in out
    for table, shards in ((tables["attributed"], ["0/1"]), (tables["sharded"], ["0/2", "1/2"])):
        written = 0
        for shard in shards:
            rc, out, err = run(
                "attribute", "--store", clickhouse_url, "--table", table, "--shard", shard,
                "--format", "json",
            )  # fmt: skip
            assert rc == 0, err
            written += json.loads(out)["requests"]
        assert written == 2 * N
    yield {"duck": duck, "ch": clickhouse_url, **tables, "trace": trace}
    url = parse_store_url(clickhouse_url)
    client = connect(url)
    try:
        for table in tables.values():
            for name in (table, *AttributedNames.for_table(table).all()):
                client.command(f"DROP TABLE IF EXISTS `{url.database}`.`{name}`")
    finally:
        client.close()


COMMANDS = [
    ["diff", "--before", "v1", "--after", "v2"],
    ["diff", "--before", "v1", "--after", "v2", "--route", "/predict"],
    ["summary"],
    ["summary", "--version", "v2", "--service", "ranker"],
    ["slow", "--version", "v2"],
    ["gate", "--before", "v1", "--after", "v2", "--budget", "p95<=+10%"],
    ["autoscale", "--version", "v2", "--slo", "p95<60ms", "--window", "2s"],
]


IDS = [" ".join(c[:1] + c[3:4]) for c in COMMANDS]


@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_every_command_gives_the_same_json_from_duckdb_and_clickhouse(
    stores: dict[str, str], command: list[str]
) -> None:
    duck = run(*command, "--format", "json", "--db", stores["duck"])
    ch = run(*command, "--format", "json", "--store", stores["ch"], "--table", stores["pulled"])
    assert duck[0] == ch[0], (duck[2], ch[2])
    assert duck[1], duck[2]
    assert json.loads(ch[1]) == json.loads(duck[1])
    assert ch[1] == duck[1]
    # No attributed tables here: the spans were pulled, and the command says so.
    assert ch[2].startswith("note: no attributed tables in "), ch[2]


@pytest.mark.parametrize("source", ["attributed", "sharded"])
@pytest.mark.parametrize("command", COMMANDS, ids=IDS)
def test_every_command_gives_the_same_json_from_the_attributed_tables(
    stores: dict[str, str], command: list[str], source: str
) -> None:
    duck = run(*command, "--format", "json", "--db", stores["duck"])
    ch = run(*command, "--format", "json", "--store", stores["ch"], "--table", stores[source])
    assert duck[0] == ch[0], (duck[2], ch[2])
    assert duck[1], duck[2]
    # Patterns are detected in spans, which attributed rows do not carry: null there,
    # and no pattern flag; everything else (operations included) is the same.
    got, want = json.loads(ch[1]), _without_patterns(json.loads(duck[1]))
    assert got == want
    assert got.get("patterns") in (
        None,
        {"before": None, "after": None},
        {"slow": None, "fast": None},
    )
    # Read from attributed requests that are up to date: no fallback, no lag.
    assert ch[2] == ""


_PATTERN_CODES = ("n_plus_one", "retry", "timeout", "error_origin")


def _without_patterns(doc: dict) -> dict:
    """``doc`` as an attributed store answers it: patterns null, no pattern flag."""
    if isinstance(doc.get("patterns"), dict):
        doc["patterns"] = {k: None for k in doc["patterns"]}
    if isinstance(doc.get("flags"), list):
        doc["flags"] = [f for f in doc["flags"] if f.get("code") not in _PATTERN_CODES]
    return doc


@pytest.mark.parametrize("source", ["pulled", "attributed", "sharded"])
def test_explain_pulls_one_trace_by_prefix_and_matches_duckdb(
    stores: dict[str, str], source: str
) -> None:
    prefix = stores["trace"][:10]
    duck = run("explain", prefix, "--format", "json", "--db", stores["duck"])
    ch = run(
        "explain", prefix, "--format", "json", "--store", stores["ch"], "--table", stores[source]
    )
    assert duck[0] == ch[0] == 0, ch[2]
    assert ch[1] == duck[1]


@pytest.mark.parametrize(
    "source",
    ["pulled", "attributed", "sharded"],
)
def test_the_report_shows_the_same_slowest_traces(
    stores: dict[str, str], source: str, tmp_path: Path
) -> None:
    pages = {}
    for name, where in (
        ("duck", ["--db", stores["duck"]]),
        (source, ["--store", stores["ch"], "--table", stores[source]]),
    ):
        page = tmp_path / f"{name}.html"
        rc, _, err = run("report", "--before", "v1", "--after", "v2", "-o", str(page), *where)
        assert rc == 0, err
        pages[name] = page.read_text()
    traces = {
        k: re.findall(r'<div class="trace" data-trace-id="([0-9a-f]+)"', v)
        for k, v in pages.items()
    }
    assert traces["duck"]
    assert traces[source] == traces["duck"]
    assert "ingest it first" not in pages[source]


def test_ingesting_the_same_files_again_writes_nothing(
    stores: dict[str, str], tmp_path: Path
) -> None:
    f, _ = build(tmp_path, "v1", 1, miss=0.05)
    rc, out, _ = run("ingest", str(f), "--store", stores["ch"], "--table", stores["pulled"])
    assert rc == 0
    assert ": 0 spans written," in out
