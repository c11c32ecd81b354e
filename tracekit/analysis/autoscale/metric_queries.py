"""The series ``configure(metrics="prometheus")`` exports, and the queries and snippets that
turn them into the per-replica value the audit measured.

The audit reads each signal per replica and per window from the request spans
(``tracekit.inflight`` at arrival, requests per second, p95). In production the same
quantities come from the metrics endpoint of :mod:`tracekit.instrumentation.metrics`
(the OTel Prometheus exporter's names: dots become underscores, seconds add
``_seconds``):

* ``tracekit_inflight`` / ``tracekit_queue_depth`` — gauges, one per replica;
* ``http_server_request_duration_seconds_{bucket,count,sum}`` — request rate and latency.

A Kubernetes HPA reads a ``Pods`` metric through prometheus-adapter: :func:`adapter_rule`
is the adapter rule that serves the name the HPA snippet uses. KEDA's Prometheus trigger
runs a query itself: :func:`keda_snippet` sums the series over replicas and lets KEDA
divide by the target (``AverageValue``), which is the per-replica target the audit
derived. GPU utilisation is not exported by tracekit; its queries read NVIDIA DCGM's.
"""

from __future__ import annotations

from typing import Final

from tracekit.analysis.autoscale import rules as sr

HISTOGRAM: Final = "http_server_request_duration_seconds"
"""Prometheus name of OTel's ``http.server.request.duration`` (seconds)."""
SERIES: Final[dict[str, str]] = {
    sr.INFLIGHT: "tracekit_inflight",
    sr.QUEUE_DEPTH: "tracekit_queue_depth",
    sr.LLM_WAITING: "vllm:num_requests_waiting",
    sr.LLM_RUNNING: "vllm:num_requests_running",
    sr.REQUEST_RATE: f"{HISTOGRAM}_count",
    sr.LATENCY: f"{HISTOGRAM}_bucket",
    sr.GPU_UTILIZATION: "DCGM_FI_DEV_GPU_UTIL",
}
"""Signal → the Prometheus series its value is computed from."""
RATE_WINDOW: Final = "1m"
_GAUGES: Final = (sr.INFLIGHT, sr.QUEUE_DEPTH, sr.LLM_WAITING, sr.LLM_RUNNING)
"""Series that are one gauge per replica (vLLM's are per engine, one per pod)."""


def _sel(ref: str) -> str:
    return f'{{job="{ref}"}}'


def total_promql(signal: str, ref: str) -> str:
    """The service-wide value (KEDA divides it by the per-replica target)."""
    s, sel = SERIES.get(signal, ""), _sel(ref)
    if signal in _GAUGES:
        return f"sum({s}{sel})"
    if signal == sr.REQUEST_RATE:
        return f"sum(rate({s}{sel}[{RATE_WINDOW}]))"
    if signal == sr.LATENCY:
        return f"1000 * histogram_quantile(0.95, sum by (le) (rate({s}{sel}[{RATE_WINDOW}])))"
    if signal == sr.GPU_UTILIZATION:
        return f'avg(DCGM_FI_DEV_GPU_UTIL{{pod=~"{ref}-.*"}}) / 100'
    return ""


def per_replica_promql(signal: str, ref: str) -> str:
    """The value the audit measured per replica, as PromQL over the exported series."""
    s, sel = SERIES.get(signal, ""), _sel(ref)
    if signal in _GAUGES:
        return f"avg({s}{sel})"
    if signal == sr.REQUEST_RATE:
        return f"{total_promql(signal, ref)} / count(tracekit_inflight{sel})"
    return total_promql(signal, ref)


def adapter_rule(signal: str) -> str:
    """The prometheus-adapter rule that serves :data:`rules.METRIC_NAMES` ``[signal]`` per pod."""
    name = sr.METRIC_NAMES[signal]
    if signal in _GAUGES:
        series, query = SERIES[signal], "avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"
    elif signal == sr.REQUEST_RATE:
        series = SERIES[signal]
        query = f"sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[{RATE_WINDOW}])) by (<<.GroupBy>>)"
    elif signal == sr.LATENCY:
        series = SERIES[signal]
        query = (
            "1000 * histogram_quantile(0.95, sum(rate(<<.Series>>{<<.LabelMatchers>>}"
            f"[{RATE_WINDOW}])) by (le, <<.GroupBy>>))"
        )
    else:
        return ""
    return (
        "# prometheus-adapter rule (values.yaml: rules.custom) serving the HPA's metric\n"
        f'- seriesQuery: \'{series}{{namespace!="",pod!=""}}\'\n'
        "  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}\n"
        f'  name: {{matches: "^{series}$", as: "{name}"}}\n'
        f"  metricsQuery: '{query}'\n"
    )


def keda_snippet(signal: str, target: float, rule: sr.ScalingRule) -> str:
    """A KEDA ScaledObject with a Prometheus trigger on the exported series."""
    ref = rule.target_ref or "my-service"
    head = (
        "apiVersion: keda.sh/v1alpha1\nkind: ScaledObject\n"
        f"metadata:\n  name: {ref}\nspec:\n  scaleTargetRef:\n    name: {ref}\n"
        f"  minReplicaCount: {rule.min_replicas}\n  maxReplicaCount: {rule.max_replicas}\n"
        "  triggers:\n"
    )
    if signal == sr.CPU_UTILIZATION:
        return head + (
            f'  - type: cpu\n    metricType: Utilization\n    metadata:\n      value: "{round(target * 100)}"\n'
        )
    # Latency does not add up over replicas: compare it as a value, not an average.
    metric_type = "Value" if signal == sr.LATENCY else "AverageValue"
    return head + (
        f"  - type: prometheus\n    metricType: {metric_type}\n    metadata:\n"
        "      serverAddress: http://prometheus.monitoring:9090\n"
        f"      query: {total_promql(signal, ref)}\n"
        f'      threshold: "{target:g}"\n'
    )
