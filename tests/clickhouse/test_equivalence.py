"""The same traces in DuckDB and in the exporter's ClickHouse table give the same answers.

Two releases are built with :class:`tracekit.testing.TraceBuilder`, written to OTLP JSONL,
and ingested twice with the real CLI: into a DuckDB file and, through the exporter's own
DDL, into ClickHouse (chDB here). Every analysis command then runs against both with
``--format json`` and the outputs must be identical, byte for byte.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from tracekit import conventions as cv
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
def stores(tmp_path_factory: pytest.TempPathFactory, clickhouse_url: str) -> dict[str, str]:
    import uuid

    tmp = tmp_path_factory.mktemp("equiv")
    f1, _ = build(tmp, "v1", 1, miss=0.05)
    f2, trace = build(tmp, "v2", 2, miss=0.35)
    duck = str(tmp / "t.duckdb")
    table = f"otel_traces_eq_{uuid.uuid4().hex[:8]}"
    assert run("ingest", str(f1), str(f2), "--db", duck)[0] == 0
    rc, out, err = run("ingest", str(f1), str(f2), "--store", clickhouse_url, "--table", table)
    assert rc == 0, err
    assert "table created with the exporter's DDL" in out
    return {"duck": duck, "ch": clickhouse_url, "table": table, "trace": trace}


COMMANDS = [
    ["diff", "--before", "v1", "--after", "v2"],
    ["diff", "--before", "v1", "--after", "v2", "--route", "/predict"],
    ["summary"],
    ["summary", "--version", "v2", "--service", "ranker"],
    ["slow", "--version", "v2"],
    ["gate", "--before", "v1", "--after", "v2", "--budget", "p95<=+10%"],
    ["autoscale", "--version", "v2", "--slo", "p95<60ms", "--window", "2s"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:1] + c[3:4]))
def test_every_command_gives_the_same_json_from_duckdb_and_clickhouse(
    stores: dict[str, str], command: list[str]
) -> None:
    duck = run(*command, "--format", "json", "--db", stores["duck"])
    ch = run(*command, "--format", "json", "--store", stores["ch"], "--table", stores["table"])
    assert duck[0] == ch[0], (duck[2], ch[2])
    assert duck[1], duck[2]
    assert json.loads(ch[1]) == json.loads(duck[1])
    assert ch[1] == duck[1]


def test_explain_pulls_one_trace_by_prefix_and_matches_duckdb(stores: dict[str, str]) -> None:
    prefix = stores["trace"][:10]
    duck = run("explain", prefix, "--format", "json", "--db", stores["duck"])
    ch = run(
        "explain", prefix, "--format", "json", "--store", stores["ch"], "--table", stores["table"]
    )
    assert duck[0] == ch[0] == 0, ch[2]
    assert ch[1] == duck[1]


def test_ingesting_the_same_files_again_writes_nothing(
    stores: dict[str, str], tmp_path: Path
) -> None:
    f, _ = build(tmp_path, "v1", 1, miss=0.05)
    rc, out, _ = run("ingest", str(f), "--store", stores["ch"], "--table", stores["table"])
    assert rc == 0
    assert ": 0 spans written," in out
