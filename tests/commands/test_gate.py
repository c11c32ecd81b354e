"""`tracekit gate` end to end: store → gate → exit code, JSON, JUnit XML, markdown, config.

Large releases are written straight into the derived tables (``requests`` and
``request_stages``) with bulk SQL; one test goes through the span builder and
attribution to show the whole pipeline, coordinated-omission warning included.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.gate.budgets import parse_budgets
from tracekit.analysis.gate.evaluate import run_gate
from tracekit.analysis.store import Store, open_store
from tracekit.cli import main
from tracekit.errors import QueryError
from tracekit.render.gate import render_markdown


def insert_release(store: Store, label: str, stages: dict[str, np.ndarray]) -> None:
    """One request per row of ``stages``; its duration is the sum of its stage times."""
    matrix = np.column_stack([stages[s] for s in stages])
    n = len(matrix)
    ids = np.array([f"{label}-{i:06d}" for i in range(n)])
    ns = np.round(matrix * 1e6).astype(np.int64)
    store.con.register(
        "gate_rows",
        {
            "trace_id": ids,
            "start_ns": np.arange(n, dtype=np.int64) * 5_000_000,  # overlapping arrivals
            "duration_ns": ns.sum(axis=1),
        },
    )
    store.con.execute(
        "INSERT INTO requests SELECT trace_id, trace_id, 'ranker', $release, 'ranker-0', "
        "'host-a', 'POST /predict', '/predict', start_ns, duration_ns, false, 1.0, "
        "NULL, NULL, NULL, NULL, 1, 0 FROM gate_rows",
        {"release": label},
    )
    store.con.unregister("gate_rows")
    for j, stage in enumerate(stages):
        store.con.register("gate_rows", {"trace_id": ids, "critical_ns": ns[:, j]})
        store.con.execute(
            "INSERT INTO request_stages SELECT trace_id, $stage, $kind, critical_ns, "
            "critical_ns, NULL, NULL FROM gate_rows",
            {"stage": stage, "kind": cv.default_time_kind(stage)},
        )
        store.con.unregister("gate_rows")


def served(rng: np.random.Generator, n: int, extra_queue_ms: float = 0.0) -> dict:
    queue = rng.lognormal(np.log(8.0), 0.5, n)
    queue += np.where(rng.random(n) < 0.10, extra_queue_ms, 0.0)
    return {
        cv.FEATURE_RETRIEVAL: rng.lognormal(np.log(12.0), 0.15, n),
        cv.BATCH_QUEUE: queue,
        cv.MODEL_EXECUTE: rng.lognormal(np.log(20.0), 0.1, n),
    }


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """v1 baseline; v2 unchanged; v3 with a batch-queue tail regression; v4 only 60 requests."""
    path = tmp_path_factory.mktemp("gate") / "tracekit.duckdb"
    rng = np.random.default_rng(42)
    with open_store(path) as store:
        insert_release(store, "v1", served(rng, 4_000))
        insert_release(store, "v2", served(rng, 4_000))
        insert_release(store, "v3", served(rng, 4_000, extra_queue_ms=40.0))
        insert_release(store, "v4", served(rng, 60))
    return str(path)


def gate(db: str, *args: str) -> int:
    return main(["gate", "--db", db, *args])


def test_exit_codes(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate(db, "--before", "v1", "--after", "v2") == 0
    assert gate(db, "--before", "v1", "--after", "v3") == 1
    assert gate(db, "--before", "v1", "--after", "v4") == 3
    capsys.readouterr()
    assert gate(db, "--before", "v1", "--after", "v2", "--budget", "p99 > 1ms") == 2
    assert gate(db, "--before", "v1", "--after", "v9") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("tracekit gate: error: ") for line in err)
    assert "operator must be < or <=" in err[0]
    assert "releases present" in err[1]
    # A usage error is one line too, naming what is missing, and exit 2.
    assert main(["gate", "--db", db, "--before", "v1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tracekit gate: error: ") and "--after" in err[0]


def test_json_has_the_documented_fields(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = gate(db, "--before", "v1", "--after", "v3", "--format", "json")
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["result"] == "fail"
    assert doc["before"] == {"label": "v1", "requests": 4000, "estimated_requests": 4000}
    assert doc["after"] == {"label": "v3", "requests": 4000, "estimated_requests": 4000}
    assert (doc["confidence"], doc["correction"]) == (0.95, "holm")
    for check in doc["checks"]:
        for key in ("name", "result", "observed", "budget", "ci_low", "ci_high", "samples"):
            assert key in check
        assert check["ci_low"] > check["budget"]  # failed: the interval is beyond it
        assert set(check["samples"]) == {"before", "after", "before_tail", "after_tail"}
    assert doc["verdict"]["primary_stage"] == cv.BATCH_QUEUE
    assert doc["summary"].startswith("fail: v3 breaks 2 of 2 budgets")

    gate(db, "--before", "v1", "--after", "v4", "--format", "json")
    small = json.loads(capsys.readouterr().out)
    assert [c["needed_samples"] for c in small["checks"]] == [200, 1000]


def test_failure_names_the_stage_and_kind_from_the_diff(db: str) -> None:
    with open_store(db, read_only=True) as store:
        result = run_gate(store, "v1", "v3", budgets=parse_budgets(["p99<=+10%"]))
    (check,) = result.checks
    assert result.verdict is not None and result.verdict.kind == "wait"
    assert re.fullmatch(
        r"p99 \+\d+% \(CI \+\d+\.\.\+\d+%\) over budget \+10%: \d+% of it batch_queue wait",
        check.message,
    ), check.message


def test_gate_still_decides_when_the_diff_fails(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracekit.analysis.compare.diff as diff

    def broken(*args: object, **kwargs: object) -> None:
        raise QueryError("diff exploded")

    monkeypatch.setattr(diff, "compute_diff", broken)
    with open_store(db, read_only=True) as store:
        result = run_gate(store, "v1", "v3")
    assert result.result == "fail" and result.verdict is None
    assert [w.code for w in result.warnings] == ["no_verdict"]
    assert "diff exploded" in result.warnings[0].message


def test_junit_xml_is_valid_junit(db: str, tmp_path: Path) -> None:
    out = tmp_path / "gate.xml"
    budgets = ["--budget", "p50<=+50%", "--budget", "p99<=+10%", "--budget", "p99.9<=+10%"]
    assert gate(db, "--before", "v1", "--after", "v3", *budgets, "--junit", str(out)) == 1
    root = ET.parse(out).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "tracekit gate"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["p50 <= +50%", "p99 <= +10%", "p99.9 <= +10%"]
    for el in (root, suite):
        assert el.get("tests") == "3"
        assert el.get("failures") == str(sum(c.find("failure") is not None for c in cases))
        assert el.get("skipped") == str(sum(c.find("skipped") is not None for c in cases))
        assert el.get("errors") == "0"
        float(el.get("time", "x"))
    assert [c.find("failure") is not None for c in cases] == [False, True, False]
    assert cases[2].find("skipped") is not None  # p99.9 of 4k requests: 4 in its tail
    assert all(c.get("classname") and float(c.get("time", "x")) == 0 for c in cases)
    failure = cases[1].find("failure")
    assert failure is not None and failure.get("message", "").startswith("p99 +")
    # Schema order: properties, then test cases, then system-out.
    tags = [child.tag for child in suite]
    assert tags[0] == "properties" and tags[-1] == "system-out"
    assert set(tags[1:-1]) == {"testcase"}


def _cells(line: str) -> list[str]:
    return re.split(r"(?<!\\)\|", line.strip())[1:-1]


def test_markdown_report_is_a_table(db: str, tmp_path: Path) -> None:
    out = tmp_path / "summary.md"
    assert gate(db, "--before", "v1", "--after", "v3", "--markdown", str(out)) == 1
    text = out.read_text()
    assert text.startswith("## ❌ tracekit gate: fail\n")
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 2  # header, separator, one row per budget
    widths = {len(_cells(r)) for r in rows}
    assert widths == {7}
    assert all(re.fullmatch(r"\s*:?-{3,}:?\s*", c) for c in _cells(rows[1]))
    assert "❌ fail" in rows[2]
    assert "batch_queue wait" in text


def test_markdown_escapes_pipes_in_cells(db: str) -> None:
    with open_store(db, read_only=True) as store:
        result = run_gate(store, "v1", "v2")
    text = render_markdown(result)
    assert text.startswith("## ✅ tracekit gate: pass")
    rows = [line for line in text.splitlines() if line.startswith("|")]
    assert {len(_cells(r)) for r in rows} == {7}


def test_config_file_supplies_budgets_and_flags_override_it(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "tracekit-gate.toml"
    cfg.write_text(
        '[gate]\nconfidence = 0.9\nmin_effect = "0.5ms"\n'
        'budgets = ["p99 <= +10%", "stage.batch_queue.p99 < 40ms"]\n'
    )
    assert (
        gate(db, "--before", "v1", "--after", "v2", "--config", str(cfg), "--format", "json") == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in doc["checks"]] == ["p99 <= +10%", "stage.batch_queue.p99 < 40ms"]
    assert (doc["confidence"], doc["min_effect_ms"]) == (0.9, 0.5)

    args = ["--config", str(cfg), "--budget", "p50<=+50%", "--format", "json"]
    assert gate(db, "--before", "v1", "--after", "v3", *args) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)["checks"]] == ["p50 <= +50%"]

    cfg.write_text('[gate]\nbudgets = ["p99 <= +10%", "p95 > 3ms"]\n')
    assert gate(db, "--before", "v1", "--after", "v2", "--config", str(cfg)) == 2
    assert "gate.budgets[1] (line 2)" in capsys.readouterr().err


def test_table_output(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert gate(db, "--before", "v1", "--after", "v4") == 3
    out = capsys.readouterr().out
    assert "inconclusive" in out and "about 1,000 requests per release" in out
    assert "inconclusive: 2 of 2 budgets undecided for v4 against v1" in out


def test_builder_traces_from_a_closed_loop_get_a_warning(store: Store) -> None:
    from tracekit.testing import TraceBuilder

    rng = np.random.default_rng(3)
    for version in ("v1", "v2"):
        b = TraceBuilder(version=version, seed=1 if version == "v1" else 2)
        t = 0.0
        for _ in range(40):
            pre, model = float(rng.uniform(2, 4)), float(rng.uniform(10, 30))
            r = b.request(start_ms=t, duration_ms=pre + model)
            r.stage(cv.PREPROCESS, start_ms=0.0, duration_ms=pre)
            r.stage(cv.MODEL_EXECUTE, start_ms=pre, duration_ms=model)
            t += pre + model + 1.0  # the next request starts only after this one ended
        b.load(store)
    result = run_gate(store, "v1", "v2", budgets=parse_budgets(["p50 <= +50%"]))
    assert result.checks[0].samples.before == 40
    assert {w.code for w in result.warnings} >= {"coordinated_omission"}
