"""Steps, scaling diff and gate on generated 8- and 64-rank runs (the trace builder)."""

from __future__ import annotations

import json

import pytest

from tracekit import conventions as cv
from tracekit.analysis.store import open_store
from tracekit.analysis.training.diff import diff_runs
from tracekit.analysis.training.gate import gate_runs
from tracekit.analysis.training.model import IMBALANCE, PEER_WAIT, TRANSFER
from tracekit.analysis.training.steps import load_run, steps_report
from tracekit.render.training import DIFF_RENDERERS, GATE_RENDERERS, STEPS_RENDERERS
from tracekit.testing import TraceBuilder, training_run


def _store(tmp_path, worlds=((8, "8gpu"), (64, "64gpu")), **after):
    """A store of two training runs (world size, label); ``after`` shapes the second."""
    (w1, v1), (w2, v2) = worlds
    b = TraceBuilder(service="trainer", version=v1, seed=1)
    training_run(b, world_size=w1, steps=12, version=v1)
    training_run(b, world_size=w2, steps=12, version=v2, **after)
    store = open_store(tmp_path / "t.duckdb")
    b.load(store)
    return store


def test_components_add_up_to_the_step_time_and_ranks_are_learned(tmp_path):
    with _store(tmp_path) as store:
        run = load_run(store, "64gpu")
    assert run.world_size == 64 and len(run.ranks) == 64 and run.steps == 11
    total = sum(c.mean_ms for c in run.components)
    assert total == pytest.approx(run.step_ms_mean, rel=1e-9)
    # the mid-backward bucket overlaps compute; the last one is exposed
    assert 0 < run.overlap_pct < 100
    assert run.matched_collectives == 2 * 12
    assert run.clock_offset_ms == 0 and not run.flags


def test_a_straggler_is_named_with_its_rank_and_host(tmp_path):
    with _store(tmp_path, straggler=(37, 30.0)) as store:
        run = load_run(store, "64gpu")
        d = diff_runs(store, "8gpu", "64gpu")
    assert run.stragglers[0].rank == 37 and run.stragglers[0].share == 1.0
    assert run.stragglers[0].mean_lag_ms == pytest.approx(30.0, abs=1.0)
    by = {c.name: c for c in run.components}
    assert by[PEER_WAIT].mean_ms > 25 and by[IMBALANCE].mean_ms < 1.0
    assert d.verdict.bottleneck == "straggler" and d.verdict.ranks == [37]
    assert "node-4" in d.verdict.summary


def test_communication_growth_is_named(tmp_path):
    with _store(tmp_path, transfer_ms=40.0) as store:
        d = diff_runs(store, "8gpu", "64gpu")
    assert d.verdict.bottleneck == "communication"
    top = max(d.components, key=lambda c: c.share or 0)
    assert top.name == TRANSFER


def test_data_loading_growth_is_named(tmp_path):
    with _store(tmp_path, data_ms=40.0) as store:
        d = diff_runs(store, "8gpu", "64gpu")
    assert d.verdict.bottleneck == "data_loading"
    assert "num_workers" in d.verdict.summary


def test_the_same_run_at_8_and_64_ranks_has_no_bottleneck(tmp_path):
    with _store(tmp_path) as store:
        d = diff_runs(store, "8gpu", "64gpu")
        g = gate_runs(store, "8gpu", "64gpu")
    assert d.scaling.ideal == 8.0 and d.scaling.efficiency == pytest.approx(1.0, abs=0.05)
    assert d.verdict.bottleneck == "none"
    assert g.result == "pass" and g.exit_code is None  # the CLI sets it


def test_clock_offsets_between_hosts_are_aligned_and_flagged(tmp_path):
    with _store(tmp_path, straggler=(3, 20.0), host_offsets_ms={2: 7.5, 5: -3.0}) as store:
        run = load_run(store, "64gpu")
        doc = json.loads(STEPS_RENDERERS["json"](steps_report(store, "64gpu")))
    assert run.clock_offset_ms == pytest.approx(7.5, abs=0.01)
    assert [f.code for f in run.flags] == ["clock_aligned"]
    # without alignment host 2's ranks would look 7.5 ms late at every collective
    assert run.stragglers[0].rank == 3
    assert doc["runs"][0]["clock_offset_ms"] == pytest.approx(7.5, abs=0.01)
    assert doc["flags"][0]["code"] == "clock_aligned"


def test_json_has_the_documented_keys(tmp_path):
    with _store(tmp_path, straggler=(1, 10.0)) as store:
        steps = json.loads(STEPS_RENDERERS["json"](steps_report(store)))
        diff = json.loads(DIFF_RENDERERS["json"](diff_runs(store, "8gpu", "64gpu")))
    run = steps["runs"][0]
    assert {"label", "world_size", "steps", "step_ms", "components", "overlap_pct"} <= set(run)
    assert {"samples_per_s", "ranks", "stragglers", "clock_offset_ms"} <= set(run)
    assert set(run["step_ms"]) == {"p50", "p95"}
    assert {"rank", "step_ms_p50", "data_wait_ms", "compute_ms", "comm_exposed_ms"} <= set(
        run["ranks"][0]
    )
    assert "peer_wait_ms" in run["ranks"][0]
    assert {"rank", "last_arrivals", "mean_lag_ms"} <= set(run["stragglers"][0])
    assert diff["kind"] == "training"
    assert {"label", "world_size", "steps", "step_ms_p50", "samples_per_s"} <= set(diff["after"])
    assert set(diff["scaling"]) == {"speedup", "ideal", "efficiency"}
    assert {"name", "before_ms", "after_ms", "delta_ms", "share"} <= set(diff["components"][0])
    assert {"bottleneck", "summary", "ranks"} <= set(diff["verdict"])
    assert isinstance(diff["flags"], list)


def test_gate_budget_on_step_time_fails_a_slower_run(tmp_path):
    with _store(tmp_path, transfer_ms=40.0) as store:
        g = gate_runs(store, "8gpu", "64gpu", ["step_ms.p50<=+10%", "samples_per_s>=100"])
    assert [c.result for c in g.checks] == ["fail", "pass"] and g.result == "fail"


def test_stage_names_are_the_conventions():
    assert cv.default_time_kind(cv.DATA_WAIT) == cv.WAIT
    assert cv.default_time_kind(cv.COMMUNICATION) == cv.WAIT
    assert cv.default_time_kind(cv.BACKWARD) == cv.COMPUTE


def _runs(tmp_path, before: dict, after: dict):
    b = TraceBuilder(service="trainer", version="8gpu", seed=2)
    training_run(b, world_size=8, steps=12, version="8gpu", **before)
    training_run(b, world_size=64, steps=12, version="64gpu", **after)
    store = open_store(tmp_path / "t.duckdb")
    b.load(store)
    return store


def test_a_baseline_measured_on_a_busier_machine_does_not_hide_slow_data(tmp_path):
    # the 8-rank run's compute was 40 ms slower (the machine): measured scaling looks
    # ideal, yet the 64-rank run waits 40 ms a step on its loader
    with _runs(tmp_path, {"forward_ms": 60.0}, {"data_ms": 42.0}) as store:
        d = diff_runs(store, "8gpu", "64gpu")
    assert d.scaling.efficiency > 0.9
    assert d.verdict.bottleneck == "data_loading", d.verdict.summary
    assert "faster with the same per-rank work" in d.verdict.summary


def test_the_same_work_running_slower_is_named_compute_with_its_stages(tmp_path):
    # the run: activation recomputation on at 64 ranks, same per-rank batch
    before = {"forward_ms": 60.0, "backward_ms": 120.0}
    after = {"forward_ms": 72.0, "backward_ms": 190.0}
    with _runs(tmp_path, before, after) as store:
        d = diff_runs(store, "8gpu", "64gpu")
    assert d.scaling.efficiency < 0.8
    assert d.verdict.bottleneck == "compute", d.verdict.summary
    s = d.verdict.summary
    assert "the same work ran slower" in s and "close to ideal" not in s
    # backward first (it grew most), with its factor; forward after it
    assert s.index("backward 120.0 → 190.0 ms (×1.58)") < s.index("forward")
    assert "(×1.20)" in s
    assert "recomputation" in d.verdict.fix
    assert "slower_compute" in [f.code for f in d.flags]


def test_smaller_per_rank_work_is_named_compute_as_changed_work(tmp_path):
    # strong scaling: the global batch kept, so each of 64 ranks gets a quarter of the
    # samples; per sample, compute got dearer (fixed costs no longer hidden)
    with _runs(tmp_path, {"batch": 32}, {"batch": 8, "forward_ms": 10.0}) as store:
        d = diff_runs(store, "8gpu", "64gpu")
    assert d.verdict.bottleneck == "compute", d.verdict.summary
    assert "per-rank work changed: 32 → 8 samples per rank per step (×0.25)" in d.verdict.summary
    assert "per-GPU batch" in d.verdict.fix
    assert "batch_changed" in [f.code for f in d.flags]


def test_low_efficiency_is_never_none(tmp_path):
    # every rank takes its turn being late (no one rank is): jitter, named as such
    with _runs(tmp_path, {"jitter_ms": 0.5}, {"jitter_ms": 60.0}) as store:
        d = diff_runs(store, "8gpu", "64gpu")
    assert d.scaling.efficiency < 0.9
    assert d.verdict.bottleneck != "none", d.verdict.summary
    assert d.verdict.bottleneck == "straggler" and d.verdict.ranks == []
    assert "ranks take turns being late (jitter)" in d.verdict.summary


def test_close_to_ideal_is_none_and_says_the_threshold(tmp_path):
    with _runs(tmp_path, {}, {}) as store:
        d = diff_runs(store, "8gpu", "64gpu")
    assert d.scaling.efficiency >= 0.9
    assert d.verdict.bottleneck == "none"
    assert "close to ideal (efficiency at least 90%)" in d.verdict.summary


def test_communication_names_the_bus_bandwidth_before_and_after(tmp_path):
    with _runs(tmp_path, {}, {"transfer_ms": 40.0, "ranks_per_host": 8}) as store:
        d = diff_runs(store, "8gpu", "64gpu", link_gbps=400)
    assert d.verdict.bottleneck == "communication", d.verdict.summary
    bw = d.bandwidth
    assert bw is not None and bw.op == "all_reduce"
    assert (bw.before_scope, bw.scope) == ("intra-node", "inter-node")
    # 25 MiB in 10 ms then 40 ms, × 2(n−1)/n for 8 and 64 ranks
    assert bw.before_busbw_gb_s == pytest.approx((25 << 20) / 0.010 / 1e9 * 2 * 7 / 8)
    assert bw.after_busbw_gb_s == pytest.approx((25 << 20) / 0.040 / 1e9 * 2 * 63 / 64)
    assert bw.link_fraction == pytest.approx(bw.after_busbw_gb_s / 50.0)
    assert "all_reduce bus bandwidth 4.59 GB/s intra-node → 1.29 GB/s inter-node" in (
        d.verdict.summary
    )
    assert "3% of a 400 Gb/s link" in d.verdict.summary
    assert "well under the link's rate" in d.verdict.fix


def test_a_loss_outside_every_stage_is_compute_and_said_so(tmp_path):
    # 4 ranks take 60 ms more a step than 2, in time no stage span covers
    b = TraceBuilder(service="trainer", seed=1)
    for version, world, gap in (("a", 2, 0.0), ("b", 4, 60.0)):
        t = 0.0
        for i in range(10):
            for r in range(world):
                s = b.step(i, rank=r, world_size=world, start_ms=t, duration_ms=60 + gap,
                           samples=32, host="h0", version=version)  # fmt: skip
                s.stage(cv.FORWARD, start_ms=0, duration_ms=20)
                s.stage(cv.BACKWARD, start_ms=20, duration_ms=40)
            t += 60 + gap
    with open_store(tmp_path / "t.duckdb") as store:
        b.load(store)
        d = diff_runs(store, "a", "b")
    assert d.scaling.efficiency == pytest.approx(0.5, abs=0.01)
    assert d.verdict.bottleneck == "compute", d.verdict.summary
    assert "outside every recorded stage" in d.verdict.summary
    assert "of the lost step time" in d.verdict.summary


def test_a_link_rate_is_gigabits_and_gigabytes_are_refused():
    from tracekit.errors import ConfigError
    from tracekit.units import parse_link_gbps

    assert [parse_link_gbps(v) for v in ("400", "400Gb/s", "100G", "25 gbps", 200)] == [
        400.0, 400.0, 100.0, 25.0, 200.0,
    ]  # fmt: skip
    for bad in ("50GB/s", "50 GBps", "fast", "0", "-1", "nan"):
        with pytest.raises(ConfigError):
            parse_link_gbps(bad)


def _one_and_two_ranks(tmp_path, **after):
    return _store(tmp_path, ((1, "1rank"), (2, "2rank")), **after)


def test_the_gate_reads_a_relative_samples_budget_as_the_efficiency_it_is(tmp_path):
    with _one_and_two_ranks(tmp_path, transfer_ms=40.0) as store:
        g = gate_runs(store, "1rank", "2rank", ["samples_per_s>=-10%", "efficiency>=0.8"])
        before, after = load_run(store, "1rank"), load_run(store, "2rank")
        d = diff_runs(store, "1rank", "2rank")
    text = GATE_RENDERERS["table"](g)
    relative, absolute = g.checks
    assert relative.result == "fail" and g.result == "fail"
    # -10% against ideal scaling is 90% efficiency: observed and budget in that one unit
    efficiency = f"{1 + relative.observed:.1%} of ideal"
    assert efficiency == f"{d.scaling.efficiency:.1%} of ideal"
    assert relative.words.observed == efficiency and relative.words.limit == "≥ 90% of ideal"
    assert absolute.words.observed == efficiency and absolute.words.limit == "≥ 80% of ideal"
    # samples/s as measured, before → after, beside it (it rose: two ranks do more)
    measured = f"samples/s {before.samples_per_s:,.1f} → {after.samples_per_s:,.1f}"
    assert after.samples_per_s > before.samples_per_s
    assert f"samples_per_s>=-10%: fail — scaling efficiency {efficiency} (95% interval " in text
    assert f"budget ≥ 90% of ideal); {measured} as measured" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("samples_per_s>=-10%  fail"))
    assert row.split()[2:] == [
        "scaling",
        "efficiency",
        *efficiency.split(),
        *(relative.words.interval.split()),
        "≥",
        "90%",
        "of",
        "ideal",
        *measured.split(),
    ]
    assert "-0." not in text  # no bare fraction beside a percent budget


def test_step_budgets_say_their_unit_and_the_run_they_are_against(tmp_path):
    with _one_and_two_ranks(tmp_path, transfer_ms=40.0) as store:
        g = gate_runs(store, "1rank", "2rank", ["step_ms.p95<=+10%", "step_ms.p50<=120ms"])
    relative, absolute = g.checks
    assert relative.words.observed == f"{relative.observed:+.1%} against 1rank"
    assert relative.words.limit == "≤ +10%"
    assert absolute.words.observed == f"{absolute.observed:,.1f} ms"
    assert absolute.words.limit == "≤ 120 ms"
    assert absolute.words.measured.startswith("step p50 ") and absolute.words.measured.endswith(
        " ms"
    )


def test_one_rank_is_one_rank(tmp_path):
    with _one_and_two_ranks(tmp_path, transfer_ms=40.0) as store:
        steps = STEPS_RENDERERS["table"](steps_report(store))
        d = diff_runs(store, "1rank", "2rank")
    diff = DIFF_RENDERERS["table"](d)
    assert "run 1rank: 1 rank, " in steps and "run 2rank: 2 ranks, " in steps
    assert diff.startswith("training diff 1rank (1 rank) → 2rank (2 ranks)\n")
    assert d.verdict.summary.startswith("1rank (1 rank) → 2rank (2 ranks): ")
    # the verdict's second sentence starts with a capital
    assert ". Communication accounts for " in d.verdict.summary
    assert "1 ranks" not in steps + diff


def test_bandwidth_headers_name_no_unit_the_figures_do_not_have(tmp_path):
    with _one_and_two_ranks(tmp_path, transfer_ms=40.0) as store:
        steps = STEPS_RENDERERS["table"](steps_report(store))
    head = next(ln for ln in steps.splitlines() if ln.startswith("collectives ("))
    assert "in GB/s" not in head and "1 GB/s = 10⁹ bytes/s" in head
    assert all(line == line.rstrip() for line in steps.splitlines())


def test_a_training_gate_writes_junit_and_its_report_as_a_serving_gate_does(tmp_path):
    # --junit and --html were silently ignored on two training runs.
    import xml.etree.ElementTree as ET

    from tracekit.cli import main

    with _store(tmp_path, transfer_ms=40.0):
        pass
    junit, html = tmp_path / "gate.xml", tmp_path / "report.html"
    budgets = ["--budget", "step_ms.p50<=+10%", "--budget", "samples_per_s>=100"]
    args = ["gate", "--before", "8gpu", "--after", "64gpu", *budgets, "--db"]
    args += [str(tmp_path / "t.duckdb"), "--junit", str(junit), "--html", str(html)]
    assert main(args) == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1" and suite.get("tests") == "2"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert set(cases) == {"step_ms.p50<=+10%", "samples_per_s>=100"}
    assert cases["step_ms.p50<=+10%"].find("failure") is not None
    assert "64gpu" in html.read_text(encoding="utf-8")
