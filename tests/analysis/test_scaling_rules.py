"""Scaling rules are read from HPA / KEDA / Ray Serve files and replayed as the controllers do."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tracekit.analysis.autoscale import rules as sr
from tracekit.analysis.autoscale.rule_files import load_rule
from tracekit.analysis.autoscale.rules import replay, rule_from_flags
from tracekit.errors import ConfigError

DATA = Path(__file__).resolve().parent.parent / "data" / "autoscale"


def _values(**signals: float) -> dict[str, float]:
    return {s: signals.get(s, math.nan) for s in sr.SIGNALS}


def test_hpa_cpu_file_reads_utilization_as_a_fraction() -> None:
    rule = load_rule(DATA / "hpa_cpu.yaml")
    assert rule.controller == "HPA"
    assert (rule.min_replicas, rule.max_replicas) == (2, 10)
    (metric,) = rule.metrics
    assert metric.signal == sr.CPU_UTILIZATION
    assert metric.target == pytest.approx(0.70)
    assert rule.scale_down.stabilization_s == 300.0
    assert rule.scale_up == sr.DEFAULT_SCALE_UP
    assert rule.target_ref == "ranker"


def test_hpa_with_several_metrics_maps_each_and_notes_the_unreplayable() -> None:
    rule = load_rule(DATA / "hpa_multi.yaml")
    by_signal = {m.signal: m for m in rule.metrics}
    assert by_signal[sr.INFLIGHT].target == 4.0
    assert by_signal[sr.INFLIGHT].kind == "average_value"
    # 250m seconds of p95 latency → 250 ms, compared as a Value (not averaged per pod).
    assert by_signal[sr.LATENCY].target == pytest.approx(250.0)
    assert by_signal[sr.LATENCY].kind == "value"
    assert None in by_signal  # memory
    assert any("memory" in n for n in rule.notes)
    assert rule.scale_up.stabilization_s == 60.0
    assert rule.scale_up.select == "Min"
    assert rule.scale_down.stabilization_s == 120.0


def test_largest_metric_proposal_wins() -> None:
    rule = load_rule(DATA / "hpa_multi.yaml")
    # cpu asks for ceil(2 × 0.35/0.7) = 1, in-flight for ceil(2 × 10/4) = 5.
    flat = sr.ScalingRule(**{**rule.__dict__, "scale_up": sr.ScalingBehavior(0.0)})
    (step,) = replay(flat, [2], [_values(cpu_utilization=0.35, inflight=10.0)], 30.0)
    assert step.proposals == {sr.CPU_UTILIZATION: 1, sr.INFLIGHT: 5}
    assert step.raw == 5 and step.desired == 5


def test_tolerance_band_keeps_the_replica_count() -> None:
    rule = rule_from_flags("cpu", 0.7, 1, 10)
    inside, outside = replay(
        rule, [4, 4], [_values(cpu_utilization=0.76), _values(cpu_utilization=0.78)], 30.0
    )
    assert inside.desired == 4 and not inside.scale_up  # 0.76/0.7 = 1.086, within 0.1
    assert outside.desired == 5 and outside.scale_up  # ceil(4 × 1.114)


def test_min_and_max_replicas_clamp_the_decision() -> None:
    rule = rule_from_flags("inflight", 2.0, min_replicas=3, max_replicas=5)
    high, low = replay(rule, [4, 4], [_values(inflight=20.0), _values(inflight=0.1)], 30.0)
    assert high.raw == 40 and high.desired == 5
    assert low.desired >= 3


def test_scale_up_policies_limit_one_step() -> None:
    rule = load_rule(DATA / "hpa_multi.yaml")
    no_wait = sr.ScalingRule(
        **{**rule.__dict__, "scale_up": sr.ScalingBehavior(0.0, rule.scale_up.policies, "Min")}
    )
    (step,) = replay(no_wait, [2], [_values(inflight=40.0)], 30.0)
    # Min of (+1 pod, +50%) from 2 replicas: 3.
    assert step.desired == 3


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    rule = rule_from_flags("inflight", 2.0, 1, 20)
    values = [_values(inflight=8.0)] + [_values(inflight=1.0)] * 12
    steps = replay(rule, [4] * 13, values, 30.0)
    # Asks for 16, the default policies allow doubling (or +4) per step: 8.
    assert (steps[0].raw, steps[0].desired) == (16, 8)
    # 300 s default window: the high recommendation holds the count for 10 windows.
    assert all(s.desired == 4 for s in steps[1:10])
    assert steps[10].desired < 4


def test_value_target_compares_the_service_total() -> None:
    metric = sr.MetricRule(sr.INFLIGHT, 10.0, "value", "External inflight value 10")
    rule = sr.ScalingRule("HPA", "x", (metric,))
    # 3 per replica × 4 replicas = 12 in total against 10: ceil(4 × 1.2) = 5.
    assert sr.metric_proposal(rule, metric, 4, 3.0) == 5


def test_missing_value_does_not_propose() -> None:
    rule = rule_from_flags("gpu", 0.6)
    (step,) = replay(rule, [3], [_values()], 30.0)
    assert step.proposals == {} and step.desired == 3


def test_keda_scaled_object_maps_prometheus_and_cpu_triggers() -> None:
    rule = load_rule(DATA / "keda_prometheus.yaml")
    assert rule.controller == "KEDA"
    assert (rule.min_replicas, rule.max_replicas) == (1, 12)  # minReplicaCount 0 → 1 serving
    by_signal = {m.signal: m for m in rule.metrics}
    assert by_signal[sr.INFLIGHT].target == 3.0
    assert by_signal[sr.INFLIGHT].kind == "average_value"
    assert by_signal[sr.CPU_UTILIZATION].target == pytest.approx(0.6)
    assert any("kafka" in n for n in rule.notes)
    assert rule.scale_down.stabilization_s == 600.0
    assert rule.target_ref == "ranker"


def test_ray_serve_config_uses_target_ongoing_requests() -> None:
    rule = load_rule(DATA / "ray_serve.yaml")
    assert rule.controller == "Ray Serve"
    assert rule.name == "Ranker"
    (metric,) = rule.metrics
    assert (metric.signal, metric.target) == (sr.INFLIGHT, 3.0)
    assert (rule.min_replicas, rule.max_replicas) == (1, 8)
    assert rule.scale_up.stabilization_s == 60.0
    assert rule.tolerance == 0.0


def test_json_hpa_is_read_too() -> None:
    rule = load_rule(DATA / "hpa_inflight.json")
    assert rule.metrics[0].signal == sr.INFLIGHT and rule.metrics[0].target == 2.0


def test_malformed_hpa_names_file_and_field() -> None:
    with pytest.raises(ConfigError) as err:
        load_rule(DATA / "hpa_bad.yaml")
    msg = str(err.value)
    assert "hpa_bad.yaml" in msg
    assert "spec.metrics[0].resource.target.averageUtilization: expected a number" in msg


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("kind: HorizontalPodAutoscaler\nspec:\n  minReplicas: 1\n", "spec.maxReplicas"),
        (
            "kind: HorizontalPodAutoscaler\nspec:\n  maxReplicas: 3\n  metrics:\n  - type: Pods\n",
            "spec.metrics[0].pods",
        ),
        (
            "kind: HorizontalPodAutoscaler\nspec:\n  maxReplicas: 3\n  behavior:\n    scaleUp:\n"
            "      policies:\n      - type: Pods\n        value: 2\n",
            "spec.behavior.scaleUp.policies[0].periodSeconds",
        ),
        ("kind: ScaledObject\nspec:\n  triggers: 3\n", "spec.triggers"),
        (
            "applications:\n- deployments:\n  - autoscaling_config:\n      min_replicas: two\n",
            "min_replicas",
        ),
    ],
)
def test_each_malformed_field_is_named(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "rule.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"rule.yaml: .*{re.escape(field)}"):
        load_rule(path)


def test_file_without_a_rule_or_with_only_memory_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "deploy.yaml"
    empty.write_text("kind: Deployment\n")
    with pytest.raises(ConfigError, match="no HorizontalPodAutoscaler"):
        load_rule(empty)
    memory = tmp_path / "mem.yaml"
    memory.write_text(
        "kind: HorizontalPodAutoscaler\nspec:\n  maxReplicas: 3\n  metrics:\n  - type: Resource\n"
        "    resource: {name: memory, target: {type: Utilization, averageUtilization: 80}}\n"
    )
    with pytest.raises(ConfigError, match="no metric tracekit can replay"):
        load_rule(memory)


def test_flags_accept_percent_and_aliases() -> None:
    assert sr.parse_target("cpu", "70%") == pytest.approx(0.7)
    assert sr.parse_target("cpu", "0.7") == pytest.approx(0.7)
    assert sr.parse_target("latency", "0.2s") == pytest.approx(200.0)
    assert rule_from_flags("queue", 4).metrics[0].signal == sr.QUEUE_DEPTH
    with pytest.raises(ConfigError, match="unknown signal"):
        rule_from_flags("memory", 1.0)
    with pytest.raises(ConfigError, match="expected a number"):
        sr.parse_target("inflight", "lots")
