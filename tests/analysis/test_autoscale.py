"""The autoscale audit finds missed windows, ranks signals and derives a target."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.autoscale import rules as sr
from tracekit.analysis.autoscale.audit import audit, audit_autoscaling, min_requests_for, parse_slo
from tracekit.analysis.autoscale.signal_ranking import auc, spearman
from tracekit.errors import ConfigError, QueryError
from tracekit.render.autoscale import render_json, render_markdown, render_table

from .autoscale_timelines import REPLICAS, cpu_bound_timeline, queueing_timeline

SLO = parse_slo("p95<200ms")


@pytest.fixture(scope="module")
def queueing():
    return audit(queueing_timeline(), None, SLO, 30.0)


@pytest.fixture(scope="module")
def cpu_bound():
    return audit(cpu_bound_timeline(), None, SLO, 30.0)


def test_cpu_rule_misses_every_window_when_the_bottleneck_is_not_cpu(queueing) -> None:
    assert queueing.rule.assumed
    assert queueing.violating_windows >= 8
    assert queueing.missed_windows == queueing.violating_windows
    assert not queueing.rule_adequate
    assert all(w.desired_replicas <= w.replicas for w in queueing.missed)
    codes = [c for c, _ in queueing.flags]
    assert "wrong_signal" in codes and "default_rule" in codes
    assert queueing.summary.startswith("CPU stayed at 35% against a 70% target through")
    assert "the HPA could not fire" in queueing.summary
    assert queueing.first_scale_up is None and queueing.lead_lag_windows is None


def test_inflight_or_queue_is_recommended_with_a_target_that_fires_in_time(queueing) -> None:
    rec = queueing.recommendation
    assert rec is not None
    assert rec.signal in (sr.INFLIGHT, sr.QUEUE_DEPTH)
    values = [w.signals[rec.signal] for w in queueing.windows]
    healthy = [
        v for v, w in zip(values, queueing.windows, strict=True) if w.sufficient and not w.violating
    ]
    violating = [v for v, w in zip(values, queueing.windows, strict=True) if w.violating]
    # Above the quiet level, below every violating window's value with the tolerance.
    assert np.median(healthy[:5]) < rec.target
    assert rec.target * (1 + sr.HPA_TOLERANCE) < min(violating)
    assert rec.would_fire_windows == rec.violating_windows == queueing.violating_windows
    assert f"scale on it with target {rec.target:g}" in queueing.summary
    assert "kind: HorizontalPodAutoscaler" in rec.hpa_snippet
    assert sr.METRIC_NAMES[rec.signal] in rec.hpa_snippet
    assert rec.ray_serve is not None and rec.ray_serve["target_ongoing_requests"] > 0


def test_recommended_rule_replayed_misses_nothing(queueing) -> None:
    rec = queueing.recommendation
    rule = sr.rule_from_flags(rec.signal, rec.target)
    again = audit(queueing_timeline(), rule, SLO, 30.0)
    assert again.missed_windows == 0 and again.rule_adequate
    assert again.lead_lag_windows is not None and again.lead_lag_windows >= 0


def test_signals_are_ranked_with_cpu_last_among_the_present(queueing) -> None:
    names = [s.name for s in queueing.signals if s.available]
    assert names[0] in (sr.INFLIGHT, sr.QUEUE_DEPTH)
    cpu = next(s for s in queueing.signals if s.name == sr.CPU_UTILIZATION)
    best = queueing.signals[0]
    assert best.correlation > 0.9 and best.separation > 0.9
    assert cpu.score < 0.4 < best.score
    gpu = next(s for s in queueing.signals if s.name == sr.GPU_UTILIZATION)
    assert not gpu.available  # no GPU in these traces
    latency = next(s for s in queueing.signals if s.name == sr.LATENCY)
    assert latency.lead_windows == 0  # the objective cannot lead itself


def test_cpu_bound_service_keeps_its_cpu_rule_and_flags_nothing(cpu_bound) -> None:
    assert cpu_bound.violating_windows >= 5
    assert cpu_bound.missed_windows == 0
    assert cpu_bound.rule_adequate
    codes = [c for c, _ in cpu_bound.flags]
    assert "wrong_signal" not in codes and "rule_adequate" in codes
    assert "CPU is an adequate signal; nothing missed" in cpu_bound.summary
    assert cpu_bound.lead_lag_windows is not None and cpu_bound.lead_lag_windows >= 0
    cpu = next(s for s in cpu_bound.signals if s.name == sr.CPU_UTILIZATION)
    assert cpu.correlation > 0.9
    assert cpu_bound.recommendation is not None
    assert cpu_bound.recommendation.signal == sr.CPU_UTILIZATION
    assert cpu_bound.recommendation.target == pytest.approx(0.7)


def test_windows_measure_rate_replicas_and_signals() -> None:
    data = queueing_timeline()
    result = audit(data, None, SLO, 30.0)
    w0 = result.windows[0]
    in_w0 = (data.start_ns - data.start_ns.min()) < 30 * 10**9
    assert w0.requests == int(in_w0.sum())
    assert w0.rate_rps == pytest.approx(in_w0.sum() / 30.0)
    assert w0.replicas == len(REPLICAS)
    assert w0.signals[sr.REQUEST_RATE] == pytest.approx(w0.rate_rps / len(REPLICAS))
    assert w0.signals[sr.LATENCY] == w0.latency_ms
    assert math.isnan(w0.signals[sr.GPU_UTILIZATION])


def test_sparse_windows_are_not_counted() -> None:
    data = queueing_timeline()
    keep = np.arange(len(data.start_ns)) % 40 == 0  # ~15-20 requests a window
    thin = type(data)(
        **{k: v[keep] if isinstance(v, np.ndarray) else v for k, v in data.__dict__.items()}
    )
    result = audit(thin, None, SLO, 30.0, min_requests=1000)
    assert result.sparse_windows == len(result.windows)
    assert result.violating_windows == 0 and result.missed_windows == 0
    assert any(c == "sparse_windows" for c, _ in result.flags)
    assert result.summary.startswith("No window had the 1000 requests p95 needs")


def test_slo_parsing() -> None:
    assert parse_slo("p95<200ms").threshold_ms == 200.0
    assert parse_slo("p99.9 <= 1s").quantile == pytest.approx(0.999)
    assert parse_slo("p99.9 <= 1s").threshold_ms == 1000.0
    assert parse_slo("p50<80").label == "p50"
    assert min_requests_for(0.95) == 20 and min_requests_for(0.99) == 100
    with pytest.raises(ConfigError, match="p95<200ms"):
        parse_slo("fast please")


def test_rank_statistics() -> None:
    assert spearman([1, 2, 3, 4, 5], [10, 20, 30, 40, 500]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4, 5], [5, 4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1, 1], [1, 2, 3, 4]))
    assert auc([5, 6, 7], [1, 2, 3]) == 1.0
    assert auc([1, 2], [1, 2]) == 0.5


def test_json_contract(queueing) -> None:
    doc = json.loads(render_json(queueing))
    for key in ("violating_windows", "missed_windows", "missed", "windows", "rule", "slo",
                "first_violation", "first_scale_up", "lead_lag_windows", "signals",
                "recommendation", "summary", "flags"):  # fmt: skip
        assert key in doc, key
    assert doc["missed_windows"] == len(doc["missed"]) == queueing.missed_windows
    missed = doc["missed"][0]
    for key in ("start_s", "rate_rps", "latency_ms", "signals", "replicas", "desired_replicas"):
        assert key in missed
    assert doc["first_violation"]["window"] == queueing.first_violation
    sig = doc["signals"][0]
    for key in ("name", "correlation", "lead_windows", "separation", "score"):
        assert key in sig
    rec = doc["recommendation"]
    assert rec["signal"] in ("inflight", "queue_depth", "request_rate", "latency",
                             "gpu_utilization", "cpu_utilization")  # fmt: skip
    assert rec["target"] > 0 and "averageValue" in rec["hpa_snippet"]
    assert "target_ongoing_requests" in rec["ray_serve"]
    assert doc["rule"]["metrics"][0]["signal"] == "cpu_utilization"
    assert doc["slo"]["threshold_ms"] == 200.0


def test_table_and_markdown_lead_with_the_sentence(queueing) -> None:
    table = render_table(queueing)
    assert table.splitlines()[0].startswith("CPU stayed at")
    assert "MISSED" in table and "Signals, best first" in table
    md = render_markdown(queueing)
    assert md.startswith("**CPU stayed at") and "```yaml" in md


def test_audit_from_the_store_with_traces(store) -> None:
    from tracekit.testing import TraceBuilder

    data = queueing_timeline()
    b = TraceBuilder(service="ranker", version="v2", seed=3)
    t0 = int(data.start_ns.min())
    # Every 80th request over 60 s windows: ~270 spans, since inserting rows is slow.
    for i in range(0, len(data.start_ns), 80):
        attrs = {
            cv.INFLIGHT: float(data.inflight[i]),
            cv.QUEUE_DEPTH: float(data.queue_depth[i]),
            cv.CPU_UTILIZATION: float(data.cpu_utilization[i]),
        }
        b.request(
            start_ms=(int(data.start_ns[i]) - t0) / 1e6,
            duration_ms=float(data.duration_ms[i]),
            attributes=attrs,
            instance_id=str(data.instance_ids[i]),
        )
    b.load(store)
    slo = parse_slo("p90<180ms")
    result = audit_autoscaling(store, rule=sr.default_rule(), slo=slo, window_s=60.0)
    assert result.release == "v2"
    assert result.windows[0].replicas == 2
    assert result.violating_windows >= 3
    assert result.missed_windows == result.violating_windows
    assert result.recommendation is not None
    assert result.recommendation.signal in (sr.INFLIGHT, sr.QUEUE_DEPTH)
    with pytest.raises(QueryError, match="v9"):
        audit_autoscaling(store, release="v9", slo=SLO)


def test_a_rollout_audited_as_one_time_line_separates_old_healthy_from_new_slow(store) -> None:
    """v2 alone is all violation (nothing to separate); v1 then v2 shows in-flight tracks it."""
    from tracekit.testing import TraceBuilder

    rng = np.random.default_rng(5)
    for version, t0_ms, latency_ms, inflight in (
        ("v1", 0.0, 40.0, 1.0),
        ("v2", 70_000.0, 120.0, 4.0),
    ):
        b = TraceBuilder(service="ranker", version=version, seed=11 if version == "v1" else 12)
        for i in range(240):  # 60 s at 4 requests/s, one replica per release
            b.request(
                start_ms=t0_ms + i * 250.0,
                duration_ms=float(latency_ms * rng.uniform(0.8, 1.2)),
                attributes={
                    cv.INFLIGHT: inflight + float(rng.integers(0, 2)),
                    cv.QUEUE_DEPTH: inflight - 1.0,
                    cv.CPU_UTILIZATION: 0.15,
                },
                instance_id=f"ranker-{version}",
            )
        b.load(store)
    slo = parse_slo("p95<80ms")
    alone = audit_autoscaling(store, release="v2", slo=slo, window_s=10.0)
    assert alone.violating_windows == len([w for w in alone.windows if w.sufficient])
    both = audit_autoscaling(store, release=["v1", "v2"], slo=slo, window_s=10.0)
    assert both.release == "v1+v2"
    assert both.violating_windows == alone.violating_windows
    assert both.missed_windows == both.violating_windows  # CPU at 15% never fires
    rec = both.recommendation
    assert rec is not None and rec.signal in (sr.INFLIGHT, sr.QUEUE_DEPTH)
    assert rec.would_fire_windows == both.violating_windows
    if rec.signal == sr.INFLIGHT:
        # Little's law counts the arriving request too: 1 + 4/s x 0.08 s.
        assert rec.littles_law == pytest.approx(1.32, abs=0.05)
