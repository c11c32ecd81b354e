"""Reading scaling rules from files: Kubernetes HPA, KEDA ScaledObject, Ray Serve config.

:func:`load_rule` reads YAML or JSON (JSON is YAML), finds the first document that is a
``HorizontalPodAutoscaler`` (``autoscaling/v2``, ``v2beta2`` or ``v1``), a KEDA
``ScaledObject`` or a Ray Serve config carrying an ``autoscaling_config``, and turns it
into a :class:`~tracekit.analysis.autoscale.rules.ScalingRule`. Every malformed field is a
:class:`~tracekit.errors.ConfigError` naming the file and the field's path, e.g.
``hpa.yaml: spec.metrics[0].resource.target.averageUtilization: expected a number``.

Metrics are matched to trace signals by name: ``cpu`` (Resource), and for Pods / Object /
External / Prometheus metrics a name or query mentioning in-flight, queue, request rate,
latency, GPU or CPU. Metrics the traces cannot show (memory, a Kafka lag) are kept as
unreplayable and named in the rule's notes.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from tracekit.analysis.autoscale import rules as sr
from tracekit.errors import ConfigError

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)([a-zA-Z]*)$")
_SUFFIX = {
    "": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40,
}  # fmt: skip

# Order matters: "tracekit_inflight_requests" mentions requests but is an in-flight gauge.
_NAME_HINTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("num_requests_waiting",), sr.LLM_WAITING),
    (("num_requests_running",), sr.LLM_RUNNING),
    (("inflight", "in_flight", "ongoing", "concurren", "active_request"), sr.INFLIGHT),
    (("queue",), sr.QUEUE_DEPTH),
    (("latency", "duration", "response_time", "histogram_quantile"), sr.LATENCY),
    (("gpu", "dcgm"), sr.GPU_UTILIZATION),
    (("cpu",), sr.CPU_UTILIZATION),
    (("requests_per_second", "request_rate", "rps", "qps", "requests_total", "http_request"), sr.REQUEST_RATE),
)  # fmt: skip


_NOT_TRACED: tuple[str, ...] = ("cache_usage", "kv_cache")
"""Metric names of quantities the traces do not hold: read, named, never replayed."""


class _Doc:
    """A parsed document plus the file name, so every error can say where it is."""

    def __init__(self, file: str, data: Any) -> None:
        self.file = file
        self.data = data

    def fail(self, path: str, reason: str) -> ConfigError:
        return ConfigError(f"{self.file}: {path}: {reason}")

    def get(self, obj: Any, key: str, path: str, *, required: bool = False) -> Any:
        if not isinstance(obj, dict):
            raise self.fail(path, f"expected a mapping, got {type(obj).__name__}")
        if key not in obj or obj[key] is None:
            if required:
                raise self.fail(f"{path}.{key}" if path else key, "required field is missing")
            return None
        return obj[key]

    def number(self, value: Any, path: str) -> float:
        """A plain number or a Kubernetes quantity (``500m``, ``1.5``, ``2k``)."""
        if isinstance(value, bool):
            raise self.fail(path, f"expected a number, got {value!r}")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            m = _QUANTITY.match(value.strip())
            if m and m.group(2) in _SUFFIX:
                return float(m.group(1)) * _SUFFIX[m.group(2)]
        raise self.fail(path, f"expected a number, got {value!r}")

    def integer(self, value: Any, path: str, *, minimum: int = 0) -> int:
        number = self.number(value, path)
        if number != int(number) or number < minimum:
            raise self.fail(path, f"expected a whole number >= {minimum}, got {value!r}")
        return int(number)

    def items(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, f"expected a list, got {type(value).__name__}")
        return value


def signal_for_name(name: str) -> str | None:
    """The trace signal a metric name or query most likely measures, or None."""
    low = name.lower()
    if any(h in low for h in _NOT_TRACED):
        return None  # e.g. vLLM's gpu_cache_usage_perc: KV-cache use, not GPU utilisation
    for hints, signal in _NAME_HINTS:
        if any(h in low for h in hints):
            return signal
    return None


def _to_units(signal: str | None, target: float, name: str) -> float:
    """A target as the file states it → tracekit's units."""
    low = name.lower()
    if signal in sr.UTILIZATION_SIGNALS and target > 1.0:
        return target / 100.0  # percent, as DCGM and averageUtilization state it
    if signal == sr.LATENCY and ("second" in low or low.endswith("_s")):
        return target * 1000.0
    return target


def load_rule(path: str | Path) -> sr.ScalingRule:
    """The scaling rule in ``path`` (HPA, KEDA ScaledObject or Ray Serve config)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read scaling rule {p}: {exc.strerror or exc}") from exc
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}: not valid YAML or JSON: {exc}".replace("\n", " ")) from exc
    for data in docs:
        doc = _Doc(str(path), data)
        if not isinstance(data, dict):
            continue
        kind = data.get("kind")
        if kind == "HorizontalPodAutoscaler":
            return _hpa(doc)
        if kind == "ScaledObject":
            return _keda(doc)
        found = _find_ray_config(data)
        if found is not None:
            return _ray(doc, *found)
    raise ConfigError(
        f"{p}: no HorizontalPodAutoscaler, KEDA ScaledObject or Ray Serve autoscaling_config found"
    )


# --- Kubernetes HPA ---------------------------------------------------------------------


def _hpa(doc: _Doc) -> sr.ScalingRule:
    data = doc.data
    spec = doc.get(data, "spec", "", required=True)
    name = str((data.get("metadata") or {}).get("name", "hpa"))
    lo = doc.get(spec, "minReplicas", "spec")
    min_r = 1 if lo is None else doc.integer(lo, "spec.minReplicas", minimum=1)
    max_r = doc.integer(
        doc.get(spec, "maxReplicas", "spec", required=True), "spec.maxReplicas", minimum=1
    )
    if max_r < min_r:
        raise doc.fail("spec.maxReplicas", f"{max_r} is below spec.minReplicas {min_r}")
    metrics: list[sr.MetricRule] = []
    v1_cpu = doc.get(spec, "targetCPUUtilizationPercentage", "spec")
    if v1_cpu is not None:  # autoscaling/v1
        pct = doc.number(v1_cpu, "spec.targetCPUUtilizationPercentage")
        metrics.append(
            sr.MetricRule(sr.CPU_UTILIZATION, pct / 100.0, "utilization", f"cpu {pct:g}%")
        )
    raw_metrics = doc.get(spec, "metrics", "spec")
    if raw_metrics is not None:
        for i, m in enumerate(doc.items(raw_metrics, "spec.metrics")):
            metrics.append(_hpa_metric(doc, m, f"spec.metrics[{i}]"))
    if not metrics:  # the API server's default when no metric is given
        metrics.append(sr.MetricRule(sr.CPU_UTILIZATION, 0.8, "utilization", "cpu 80% (default)"))
    behavior = doc.get(spec, "behavior", "spec") or {}
    return _hpa_rule(doc, spec, "HPA", name, metrics, min_r, max_r, behavior, "spec.behavior")


def _hpa_rule(
    doc: _Doc,
    spec: Any,
    controller: str,
    name: str,
    metrics: list[sr.MetricRule],
    min_r: int,
    max_r: int,
    behavior: Any,
    bpath: str,
) -> sr.ScalingRule:
    """The rule an HPA enforces, ``behavior`` (found at ``bpath``) included.

    A KEDA ScaledObject's rule too: KEDA creates an HPA and hands it that behaviour.
    """
    return _finish(
        doc,
        sr.ScalingRule(
            controller=controller,
            name=name,
            metrics=tuple(metrics),
            min_replicas=min_r,
            max_replicas=max_r,
            scale_up=_behavior(doc, behavior, "scaleUp", bpath, sr.DEFAULT_SCALE_UP),
            scale_down=_behavior(doc, behavior, "scaleDown", bpath, sr.DEFAULT_SCALE_DOWN),
            tolerance=_tolerance(doc, behavior, bpath),
            source=doc.file,
            target_ref=_target_ref(spec),
        ),
    )


def _hpa_metric(doc: _Doc, m: Any, path: str) -> sr.MetricRule:
    mtype = doc.get(m, "type", path, required=True)
    if mtype in ("Resource", "ContainerResource"):
        key = "resource" if mtype == "Resource" else "containerResource"
        body = doc.get(m, key, path, required=True)
        rname = str(doc.get(body, "name", f"{path}.{key}", required=True))
        tpath = f"{path}.{key}.target"
        target = doc.get(body, "target", f"{path}.{key}", required=True)
        ttype = doc.get(target, "type", tpath, required=True)
        if ttype == "Utilization":
            pct = doc.number(
                doc.get(target, "averageUtilization", tpath, required=True),
                f"{tpath}.averageUtilization",
            )
            signal = sr.CPU_UTILIZATION if rname == "cpu" else None
            return sr.MetricRule(signal, pct / 100.0, "utilization", f"{mtype} {rname} {pct:g}%")
        if ttype == "AverageValue":
            value = doc.number(
                doc.get(target, "averageValue", tpath, required=True), f"{tpath}.averageValue"
            )
            # An absolute CPU quantity needs the pod's request, which traces do not carry.
            return sr.MetricRule(
                None, value, "average_value", f"{mtype} {rname} averageValue {value:g}"
            )
        raise doc.fail(f"{tpath}.type", f"expected Utilization or AverageValue, got {ttype!r}")
    if mtype in ("Pods", "Object", "External"):
        key = mtype.lower()
        body = doc.get(m, key, path, required=True)
        metric = doc.get(body, "metric", f"{path}.{key}", required=True)
        mname = str(doc.get(metric, "name", f"{path}.{key}.metric", required=True))
        tpath = f"{path}.{key}.target"
        target = doc.get(body, "target", f"{path}.{key}", required=True)
        ttype = doc.get(target, "type", tpath, required=True)
        field_name = {"AverageValue": "averageValue", "Value": "value"}.get(str(ttype))
        if field_name is None:
            raise doc.fail(f"{tpath}.type", f"expected AverageValue or Value, got {ttype!r}")
        value = doc.number(
            doc.get(target, field_name, tpath, required=True), f"{tpath}.{field_name}"
        )
        if value <= 0:
            raise doc.fail(f"{tpath}.{field_name}", f"expected a positive target, got {value:g}")
        signal = signal_for_name(mname)
        kind = "average_value" if ttype == "AverageValue" else "value"
        return sr.MetricRule(
            signal, _to_units(signal, value, mname), kind, f"{mtype} {mname} {field_name} {value:g}"
        )
    raise doc.fail(
        f"{path}.type",
        f"expected Resource, ContainerResource, Pods, Object or External, got {mtype!r}",
    )


def _behavior(
    doc: _Doc, behavior: Any, key: str, path: str, default: sr.ScalingBehavior
) -> sr.ScalingBehavior:
    rules = doc.get(behavior, key, path)
    if rules is None:
        return default
    p = f"{path}.{key}"
    window = doc.get(rules, "stabilizationWindowSeconds", p)
    stab = (
        default.stabilization_s
        if window is None
        else float(doc.integer(window, f"{p}.stabilizationWindowSeconds"))
    )
    select = doc.get(rules, "selectPolicy", p) or "Max"
    if select not in ("Max", "Min", "Disabled"):
        raise doc.fail(f"{p}.selectPolicy", f"expected Max, Min or Disabled, got {select!r}")
    raw = doc.get(rules, "policies", p)
    policies = default.policies
    if raw is not None:
        policies = tuple(
            sr.ScalingPolicy(
                kind=_policy_type(doc, pol, f"{p}.policies[{i}]"),
                value=float(doc.integer(doc.get(pol, "value", f"{p}.policies[{i}]", required=True), f"{p}.policies[{i}].value", minimum=1)),
                period_s=float(doc.integer(doc.get(pol, "periodSeconds", f"{p}.policies[{i}]", required=True), f"{p}.policies[{i}].periodSeconds", minimum=1)),
            )
            for i, pol in enumerate(doc.items(raw, f"{p}.policies"))
        )  # fmt: skip
    return sr.ScalingBehavior(stab, policies, select)


def _policy_type(doc: _Doc, pol: Any, path: str) -> str:
    kind = doc.get(pol, "type", path, required=True)
    if kind not in ("Pods", "Percent"):
        raise doc.fail(f"{path}.type", f"expected Pods or Percent, got {kind!r}")
    return str(kind)


def _tolerance(doc: _Doc, behavior: Any, path: str) -> float:
    """``behavior.scaleUp.tolerance`` (newer clusters) overrides the controller default."""
    up = doc.get(behavior, "scaleUp", path) or {}
    value = doc.get(up, "tolerance", f"{path}.scaleUp")
    return sr.HPA_TOLERANCE if value is None else doc.number(value, f"{path}.scaleUp.tolerance")


def _target_ref(spec: Any) -> str:
    ref = spec.get("scaleTargetRef") if isinstance(spec, dict) else None
    return str(ref.get("name", "")) if isinstance(ref, dict) else ""


def _finish(doc: _Doc, rule: sr.ScalingRule) -> sr.ScalingRule:
    """Note unreplayable metrics; refuse a rule the traces cannot replay at all."""
    skipped = [m.source for m in rule.metrics if m.signal is None]
    if not rule.replayable:
        raise ConfigError(
            f"{doc.file}: no metric tracekit can replay from traces ({', '.join(skipped)}); "
            "use --signal/--target to audit a signal the traces carry"
        )
    notes = list(rule.notes)
    if skipped:
        notes.append(f"not in the traces, so not replayed: {', '.join(skipped)}")
    return sr.ScalingRule(**{**rule.__dict__, "notes": tuple(notes)})


# --- KEDA ---------------------------------------------------------------------------------


def _keda(doc: _Doc) -> sr.ScalingRule:
    data = doc.data
    spec = doc.get(data, "spec", "", required=True)
    name = str((data.get("metadata") or {}).get("name", "scaledobject"))
    lo = doc.get(spec, "minReplicaCount", "spec")
    hi = doc.get(spec, "maxReplicaCount", "spec")
    # KEDA defaults are 0 and 100; a service that served traffic had at least one replica.
    min_r = max(1, 0 if lo is None else doc.integer(lo, "spec.minReplicaCount"))
    max_r = 100 if hi is None else doc.integer(hi, "spec.maxReplicaCount", minimum=1)
    metrics = []
    triggers = doc.items(doc.get(spec, "triggers", "spec", required=True), "spec.triggers")
    for i, trig in enumerate(triggers):
        path = f"spec.triggers[{i}]"
        ttype = str(doc.get(trig, "type", path, required=True))
        meta = doc.get(trig, "metadata", path) or {}
        if ttype in ("cpu", "memory"):
            mtype = (
                doc.get(trig, "metricType", path)
                or doc.get(meta, "type", f"{path}.metadata")
                or "Utilization"
            )
            value = doc.number(
                doc.get(meta, "value", f"{path}.metadata", required=True), f"{path}.metadata.value"
            )
            if mtype == "Utilization" and ttype == "cpu":
                metrics.append(
                    sr.MetricRule(
                        sr.CPU_UTILIZATION, value / 100.0, "utilization", f"cpu {value:g}%"
                    )
                )
            else:
                metrics.append(
                    sr.MetricRule(None, value, "average_value", f"{ttype} {mtype} {value:g}")
                )
            continue
        threshold = doc.get(meta, "threshold", f"{path}.metadata")
        if threshold is None:
            threshold = doc.get(meta, "targetValue", f"{path}.metadata")
        if threshold is None:
            metrics.append(sr.MetricRule(None, 1.0, "average_value", f"{ttype} trigger"))
            continue
        value = doc.number(threshold, f"{path}.metadata.threshold")
        label = " ".join(
            str(meta.get(k, "")) for k in ("metricName", "query", "queueName") if meta.get(k)
        )
        signal = (
            signal_for_name(f"{ttype} {label}") if ttype in ("prometheus", "metrics-api") else None
        )
        kind = "value" if doc.get(trig, "metricType", path) == "Value" else "average_value"
        metrics.append(
            sr.MetricRule(
                signal,
                _to_units(signal, value, label),
                kind,
                f"{ttype} {label or ''} threshold {value:g}".replace("  ", " "),
            )
        )
    behavior = (
        (doc.get(spec, "advanced", "spec") or {}).get("horizontalPodAutoscalerConfig") or {}
    ).get("behavior") or {}
    bpath = "spec.advanced.horizontalPodAutoscalerConfig.behavior"
    return _hpa_rule(doc, spec, "KEDA", name, metrics, min_r, max(max_r, min_r), behavior, bpath)


# --- Ray Serve ---------------------------------------------------------------------------


def _find_ray_config(data: dict[str, Any]) -> tuple[dict[str, Any], str, str] | None:
    """(autoscaling_config, its path, deployment name) of the first autoscaled deployment."""
    if "target_ongoing_requests" in data or "target_num_ongoing_requests_per_replica" in data:
        return data, "", "deployment"
    if isinstance(data.get("autoscaling_config"), dict):
        return data["autoscaling_config"], "autoscaling_config", str(data.get("name", "deployment"))
    apps = data.get("applications")
    groups = (
        [(f"applications[{i}].", a) for i, a in enumerate(apps)]
        if isinstance(apps, list)
        else [("", data)]
    )
    for prefix, group in groups:
        deployments = group.get("deployments") if isinstance(group, dict) else None
        for j, dep in enumerate(deployments if isinstance(deployments, list) else []):
            if isinstance(dep, dict) and isinstance(dep.get("autoscaling_config"), dict):
                return (
                    dep["autoscaling_config"],
                    f"{prefix}deployments[{j}].autoscaling_config",
                    str(dep.get("name", j)),
                )
    return None  # fmt: skip


def _ray(doc: _Doc, cfg: dict[str, Any], path: str, deployment: str) -> sr.ScalingRule:
    def field(key: str, default: float) -> float:
        value = cfg.get(key)
        return default if value is None else doc.number(value, f"{path}.{key}" if path else key)

    target = field("target_ongoing_requests", field("target_num_ongoing_requests_per_replica", 2.0))
    if target <= 0:
        raise doc.fail(
            f"{path}.target_ongoing_requests" if path else "target_ongoing_requests",
            "expected a positive number",
        )
    min_r = max(1, int(field("min_replicas", 1)))
    max_r = max(min_r, int(field("max_replicas", 1)))
    factor = field(
        "upscaling_factor", field("upscale_smoothing_factor", field("smoothing_factor", 1.0))
    )
    return sr.ScalingRule(
        controller="Ray Serve",
        name=deployment,
        metrics=(sr.MetricRule(sr.INFLIGHT, target, "average_value", f"target_ongoing_requests {target:g}"),),
        min_replicas=min_r,
        max_replicas=max_r,
        tolerance=0.0,  # Ray Serve acts on any change of the rounded-up replica count
        scale_up=sr.ScalingBehavior(field("upscale_delay_s", 30.0)),
        scale_down=sr.ScalingBehavior(field("downscale_delay_s", 600.0)),
        smoothing=factor,
        source=doc.file,
        target_ref=deployment,
    )  # fmt: skip
