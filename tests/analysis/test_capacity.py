"""The capacity analysis tells latency-bound from cost-bound releases on generated time lines."""

from __future__ import annotations

import random

import pytest

from tracekit import conventions as cv
from tracekit import units
from tracekit.analysis.autoscale.model import parse_slo
from tracekit.analysis.capacity.analyse import PEAK_RULE_FACTOR, PEAK_RULE_TOP, capacity
from tracekit.analysis.capacity.model import BALANCED, COST_BOUND, INCONCLUSIVE, LATENCY_BOUND
from tracekit.analysis.store import open_store
from tracekit.errors import ConfigError
from tracekit.testing import TraceBuilder

SLO = parse_slo("p95<100ms")
WINDOW_S = 2.0
PODS = ("pod-a", "pod-b")
SPIKES = set(range(10, 13)) | set(range(20, 22))
"""Windows 10–12 and 20–21 carry 3× the traffic (spikes of 6 s and 4 s)."""


def _release(
    b: TraceBuilder,
    label: str,
    *,
    windows: int = 30,
    rps: float = 12.0,
    spike_factor: float = 3.0,
    latency_ms: float = 40.0,
    spike_latency_ms: float | None = None,
    model_ms: float | None = 5.0,
    gpu: bool = True,
    spike_error_share: float = 0.0,
    seed: int = 0,
) -> None:
    """Evenly spaced arrivals alternating between two pods, ``rps`` a window (× the spike
    factor in :data:`SPIKES`), each with a ``model_execute`` stage of ``model_ms``."""
    rng = random.Random(seed)
    for w in range(windows):
        spike = w in SPIKES
        n = round(rps * (spike_factor if spike else 1.0) * WINDOW_S)
        base = spike_latency_ms if spike and spike_latency_ms is not None else latency_ms
        for k in range(n):
            start = (w + k / n) * WINDOW_S * 1000.0
            failed = spike and rng.random() < spike_error_share
            duration = 2.0 if failed else round(base * rng.uniform(0.9, 1.1), 3)
            r = b.request(
                start_ms=start,
                duration_ms=duration,
                version=label,
                instance_id=PODS[k % 2],
                error=failed,
            )
            if model_ms is not None and not failed:
                r.stage(
                    cv.MODEL_EXECUTE,
                    start_ms=1.0,
                    duration_ms=model_ms,
                    gpu_ms=model_ms * 0.9 if gpu else None,
                )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    b = TraceBuilder(seed=3)
    # Meets the objective outside spikes, 250 ms inside them.
    _release(b, "lat", spike_latency_ms=250.0, model_ms=20.0, seed=1)
    # Meets it everywhere; 5 ms of GPU per request at 6 rps a pod: GPUs ~3% busy.
    _release(b, "idle", seed=2)
    # Meets it; 60 ms of GPU per request at 8 rps a pod (16 in spikes): about half busy.
    _release(b, "busy", rps=16.0, spike_factor=2.0, latency_ms=70.0, model_ms=60.0, seed=3)
    # Like "lat", but half the spike requests fail fast (2 ms).
    _release(b, "errs", spike_latency_ms=250.0, spike_error_share=0.5, seed=4)
    # Model spans without device time, and none at all.
    _release(b, "nogpu", gpu=False, seed=5)
    _release(b, "nomodel", model_ms=None, seed=6)
    _release(b, "short", windows=4, seed=7)
    s = open_store(tmp_path_factory.mktemp("capacity") / "t.duckdb")
    b.load(s)
    yield s
    s.con.close()


def _one(store, label, **kw):
    result = capacity(store, [label], SLO, window_s=WINDOW_S, **kw)
    return result.releases[0]


def _codes(r) -> set[str]:
    return {f.code for f in r.flags}


def test_release_missing_only_in_spikes_is_latency_bound(store) -> None:
    r = _one(store, "lat")
    assert r.verdict == LATENCY_BOUND
    assert r.peak_rule == PEAK_RULE_FACTOR
    assert r.peak.windows == len(SPIKES) and r.peak.miss_share == 1.0
    assert r.normal.miss_share == 0.0
    assert r.spikes.count == 2
    assert r.spikes.duration_s_p50 == pytest.approx(4.0)
    assert r.spikes.duration_s_p90 == pytest.approx(6.0)
    assert r.spikes.rate_ratio == pytest.approx(3.0, rel=0.05)
    assert r.spikes.p95_inside_ms > 200 and r.spikes.p95_outside_ms < 50
    assert r.headroom.knee_rps_per_replica == pytest.approx(6.0, rel=0.05)
    assert r.headroom.peak_rps_per_replica == pytest.approx(18.0, rel=0.05)
    assert "misses p95<100ms" in r.reason and "2 spikes of 4–6 s" in r.reason
    # The sentence gives the table's counts: missed of judged, per regime and in all.
    judged = r.peak.judged_windows + r.normal.judged_windows
    assert (r.peak.missed_windows, r.peak.judged_windows) == (len(SPIKES), len(SPIKES))
    assert f"in {len(SPIKES)} of {judged} judged windows" in r.reason
    assert f"({len(SPIKES)} of {len(SPIKES)} peak, 0 of {judged - len(SPIKES)} normal)" in r.reason
    # Every spike request is 250 ± 10% ms against 100 ms: ~150 ms past it each.
    spike_requests = 36 * WINDOW_S * len(SPIKES)
    assert r.overrun.requests == pytest.approx(spike_requests)
    assert r.overrun.excess_s == pytest.approx(spike_requests * 0.150, rel=0.05)
    assert sum(p.missed for p in r.windows) == len(SPIKES)
    assert all(p.peak == (i in SPIKES) for i, p in enumerate(r.windows))


def test_release_meeting_the_objective_with_idle_gpus_is_cost_bound(store) -> None:
    r = _one(store, "idle", replica_cost_per_h=3.6)
    assert r.verdict == COST_BOUND
    per_pod = 6 * WINDOW_S * 25 + 18 * WINDOW_S * 5
    assert r.cost.gpu_busy_fraction == pytest.approx(per_pod * 0.0045 / 60, rel=0.03)
    assert r.headroom.knee_rps_per_replica is None
    # 2 pods for ~60 s over ~1,000 accepted requests; $3.6/h is $0.001 per replica-second.
    accepted = 12 * 2 * 25 + 36 * 2 * 5
    assert r.cost.replica_seconds_per_1k == pytest.approx(120.0 / accepted * 1000, rel=0.02)
    assert r.cost.cost_per_1k == pytest.approx(r.cost.replica_seconds_per_1k * 0.001)
    assert "its GPUs 4% busy" in r.reason
    assert r.overrun.requests == 0 and r.overrun.excess_s == 0


def test_release_meeting_the_objective_with_busy_gpus_is_balanced(store) -> None:
    r = _one(store, "busy")
    assert r.verdict == BALANCED
    # Per pod: 8 rps (16 in spikes) × 54 ms of device time, over 60 s.
    per_pod = 8 * WINDOW_S * 25 + 16 * WINDOW_S * 5
    assert r.cost.gpu_busy_fraction == pytest.approx(per_pod * 0.054 / 60, rel=0.03)
    assert r.cost.gpu_busy_fraction >= 0.4
    assert "cost_not_judged" not in _codes(r)


def test_too_few_windows_is_inconclusive(store) -> None:
    r = _one(store, "short")
    assert r.verdict == INCONCLUSIVE
    assert r.reason == (
        "only 4 windows had the 20 accepted requests p95 needs, and a verdict needs at least 6."
    )


def test_failed_requests_are_not_accepted(store) -> None:
    r = _one(store, "errs")
    # Counted fast failures would pull the spike p50 to 2 ms.
    assert r.peak.p50_ms > 200
    assert r.peak.error_rate == pytest.approx(0.5, abs=0.1)
    assert r.normal.error_rate == 0.0
    assert r.verdict == LATENCY_BOUND
    failed = r.peak.requests * r.peak.error_rate
    accepted = r.peak.requests + r.normal.requests - failed
    assert r.cost.replica_seconds_per_1k == pytest.approx(120.0 / accepted * 1000, rel=0.02)


def test_absent_device_time_is_none_and_wall_time_stands_in_named_as_such(store) -> None:
    r = _one(store, "nogpu")
    assert r.cost.gpu_busy_fraction is None
    # 5 ms of wall per request, as "idle" but with no device time: the stand-in judges it.
    per_pod = 6 * WINDOW_S * 25 + 18 * WINDOW_S * 5
    assert r.cost.execution_busy_fraction == pytest.approx(per_pod * 0.005 / 60, rel=0.03)
    assert {"no_device_time", "busy_from_wall_time"} <= _codes(r)
    assert "cost_not_judged" not in _codes(r)
    assert r.verdict == COST_BOUND and "its model executions 4% busy (wall time)" in r.reason
    # With device time, the wall figure is still there, and no stand-in flag.
    idle = _one(store, "idle")
    assert idle.cost.execution_busy_fraction == pytest.approx(per_pod * 0.005 / 60, rel=0.03)
    assert "busy_from_wall_time" not in _codes(idle)
    m = _one(store, "nomodel")
    assert m.cost.gpu_busy_fraction is None and m.cost.execution_busy_fraction is None
    assert {"no_model_spans", "cost_not_judged"} <= _codes(m)
    assert m.verdict == BALANCED


def test_prices_per_release_and_a_default(store) -> None:
    result = capacity(
        store, ["idle", "nogpu"], SLO, window_s=WINDOW_S, replica_cost_per_h={"idle": 3.6}
    )
    idle, nogpu = result.releases
    assert idle.cost.cost_per_1k == pytest.approx(idle.cost.replica_seconds_per_1k * 0.001)
    assert nogpu.cost.cost_per_1k is None and nogpu.cost.replica_cost_per_h is None
    assert any(f.code == "no_replica_cost" and "nogpu" in f.message for f in result.flags)
    assert "Money is unknown where no replica cost was given." in result.summary
    with pytest.raises(ConfigError, match="which is not a --version"):
        capacity(store, ["idle"], SLO, window_s=WINDOW_S, replica_cost_per_h={"B": 1.0})
    assert units.parse_replica_costs(["A=4/h", "1.2/h"], ["A", "B"]) == {"A": 4.0, "B": 1.2}
    assert units.parse_replica_costs("2.50/h", ["A"]) == 2.5
    with pytest.raises(ConfigError, match="priced twice"):
        units.parse_replica_costs(["A=4/h", "A=5/h"], ["A"])
    with pytest.raises(ConfigError, match="two prices"):
        units.parse_replica_costs(["4/h", "5/h"], ["A"])


def test_flat_time_line_takes_the_top_decile_as_peak() -> None:
    b = TraceBuilder(seed=9)
    _release(b, "flat", spike_factor=1.0, seed=9)
    s = open_store(":memory:")
    b.load(s)
    r = capacity(s, ["flat"], SLO, window_s=WINDOW_S).releases[0]
    assert r.peak_rule == PEAK_RULE_TOP
    assert r.peak.windows == 3 and r.normal.windows == 27


def test_summary_names_the_latency_bound_release_first(store) -> None:
    result = capacity(store, ["idle", "lat"], SLO, window_s=WINDOW_S, replica_cost_per_h=3.6)
    assert [r.label for r in result.releases] == ["idle", "lat"]
    assert result.summary.startswith("fix lat first: it misses p95<100ms")
    assert "idle meets p95<100ms with its GPUs 4% busy at $" in result.summary
    assert result.slo == "p95<100ms" and result.window_s == WINDOW_S
    unknown = capacity(store, ["idle", "lat"], SLO, window_s=WINDOW_S)
    assert unknown.summary.endswith("Costs are unknown: no replica cost was given.")
    assert "no_replica_cost" in {f.code for f in unknown.flags}


def _two_latency_bound(far_windows: int, far_ms: float) -> TraceBuilder:
    """Two latency-bound releases: "many" misses in every spike window by a little (130 ms
    against 100), "far" in only ``far_windows`` of them, by ``far_ms``."""
    b = TraceBuilder(seed=11)
    _release(b, "many", spike_latency_ms=130.0, seed=12)
    rng = random.Random(13)
    for w in range(30):
        spike = w in SPIKES
        n = round(12.0 * (3.0 if spike else 1.0) * WINDOW_S)
        late = spike and w in sorted(SPIKES)[:far_windows]
        for k in range(n):
            b.request(
                start_ms=(w + k / n) * WINDOW_S * 1000.0,
                duration_ms=(far_ms if late else 40.0) * rng.uniform(0.9, 1.1),
                version="far",
                instance_id=PODS[k % 2],
            ).stage(cv.MODEL_EXECUTE, start_ms=1.0, duration_ms=5.0, gpu_ms=4.5)
    return b


def test_of_two_latency_bound_releases_the_one_furthest_past_the_objective_is_first() -> None:
    b = _two_latency_bound(far_windows=1, far_ms=1000.0)
    s = open_store(":memory:")
    b.load(s)
    result = capacity(s, ["many", "far"], SLO, window_s=WINDOW_S)
    many, far = result.releases
    assert many.verdict == far.verdict == LATENCY_BOUND
    # "many" misses in more windows; "far" runs further past the objective in all.
    assert many.peak.missed_windows > far.peak.missed_windows == 1
    assert far.overrun.requests < many.overrun.requests
    assert far.overrun.excess_s > many.overrun.excess_s
    assert result.summary.startswith("fix far first: 72 of its requests (8%) took longer than")
    # The sentence names both figures, its own and the other's.
    far_s, many_s = f"{far.overrun.excess_s:,.1f} s", f"{many.overrun.excess_s:,.1f} s"
    assert f"100 ms, {far_s} past it in all, against 360 of many's, {many_s} past it." in (
        result.summary
    )
    assert "many is latency-bound too: it misses p95<100ms in 5 of 30" in result.summary
    # By a little more than "many" instead: "many" binds first.
    b = _two_latency_bound(far_windows=1, far_ms=200.0)
    s = open_store(":memory:")
    b.load(s)
    result = capacity(s, ["far", "many"], SLO, window_s=WINDOW_S)
    assert result.summary.startswith("fix many first: 360 of its requests")


def test_every_reason_and_summary_is_made_of_full_sentences(store) -> None:
    labels = ["lat", "idle", "busy", "errs", "nogpu", "nomodel", "short"]
    texts = [_one(store, label).reason for label in labels]
    texts += [
        capacity(store, [a, b], SLO, window_s=WINDOW_S).summary
        for a, b in [("idle", "lat"), ("busy", "nomodel"), ("short", "busy"), ("lat", "errs")]
    ]
    for text in texts:
        assert text.endswith("."), text
        # No fragment glued to a label ("A it meets"), no doubled parentheses or stops.
        assert not any(f"{label} it " in text for label in labels), text
        assert ") (" not in text and ".." not in text and ". ." not in text, text
