"""Scaling rules: what an autoscaler is configured to do, and replaying it over windows.

A :class:`ScalingRule` is the part of a Kubernetes ``autoscaling/v2``
HorizontalPodAutoscaler, a KEDA ``ScaledObject`` or a Ray Serve ``autoscaling_config``
that decides replica counts: the metrics with their targets, min/max replicas, the
tolerance, and the scale-up / scale-down behaviour. :func:`~tracekit.analysis.autoscale.rule_files.load_rule` reads any of the
three files (YAML or JSON); :mod:`tracekit.analysis.autoscale.rule_files` holds the parsers.

:func:`replay` runs the controller's arithmetic once per window:
``desired = ceil(current × value / target)`` per metric, skipped inside the tolerance
band, the largest over metrics, stabilised (lowest recommendation over the scale-up
window, highest over the scale-down window), limited by the scaling policies, clamped to
min/max. ``current`` is the replica count the trace observed, because the audit asks
"would the rule have asked for more than it had?", not "what would it have become?".

Signal values arrive in tracekit's units: utilisation as a 0..1 fraction, in-flight,
queue depth and request rate per replica, latency in milliseconds. Targets are
converted to the same units when a rule is read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from tracekit.errors import ConfigError

INFLIGHT: Final = "inflight"
QUEUE_DEPTH: Final = "queue_depth"
REQUEST_RATE: Final = "request_rate"
LATENCY: Final = "latency"
GPU_UTILIZATION: Final = "gpu_utilization"
CPU_UTILIZATION: Final = "cpu_utilization"
LLM_WAITING: Final = "llm_waiting"
"""LLM serving: requests waiting in the engine's queue per replica (vLLM's
``vllm:num_requests_waiting``), measured at each arrival from the traced queue stages."""
LLM_RUNNING: Final = "llm_running"
"""LLM serving: requests in prefill or decode per replica (``vllm:num_requests_running``)."""
SIGNALS: Final = (
    INFLIGHT,
    QUEUE_DEPTH,
    LLM_WAITING,
    LLM_RUNNING,
    REQUEST_RATE,
    LATENCY,
    GPU_UTILIZATION,
    CPU_UTILIZATION,
)
"""Candidate scaling signals, in the order tables show them."""
LLM_SIGNALS: Final = frozenset({LLM_WAITING, LLM_RUNNING})
"""Signals only LLM requests (queue, prefill and decode stages) have; left out otherwise."""

ADDITIVE: Final = frozenset({INFLIGHT, QUEUE_DEPTH, REQUEST_RATE, LLM_WAITING, LLM_RUNNING})
"""Signals whose per-replica values add up to a service total (a ``Value`` target sees the total)."""

UTILIZATION_SIGNALS: Final = frozenset({CPU_UTILIZATION, GPU_UTILIZATION})

SIGNAL_LABELS: Final[dict[str, str]] = {
    INFLIGHT: "In-flight per replica",
    QUEUE_DEPTH: "Queue depth per replica",
    LLM_WAITING: "Waiting requests per replica (vLLM num_requests_waiting)",
    LLM_RUNNING: "Running requests per replica (vLLM num_requests_running)",
    REQUEST_RATE: "Request rate per replica",
    LATENCY: "Latency",
    GPU_UTILIZATION: "GPU",
    CPU_UTILIZATION: "CPU",
}

METRIC_NAMES: Final[dict[str, str]] = {
    INFLIGHT: "tracekit_inflight",
    QUEUE_DEPTH: "tracekit_queue_depth",
    LLM_WAITING: "vllm_num_requests_waiting",
    LLM_RUNNING: "vllm_num_requests_running",
    REQUEST_RATE: "tracekit_requests_per_second",
    LATENCY: "tracekit_request_latency_p95_ms",
    GPU_UTILIZATION: "tracekit_gpu_utilization",
    CPU_UTILIZATION: "cpu",
}
"""Pods-metric names the recommended HPA snippet uses: the gauges exactly as
``configure(metrics="prometheus")`` exports them; rate and p95 as prometheus-adapter
serves them from ``http_server_request_duration_seconds`` (see ``metric_queries``)."""

SIGNAL_ALIASES: Final[dict[str, str]] = {
    "cpu": CPU_UTILIZATION,
    "gpu": GPU_UTILIZATION,
    "inflight": INFLIGHT,
    "in_flight": INFLIGHT,
    "ongoing": INFLIGHT,
    "concurrency": INFLIGHT,
    "queue": QUEUE_DEPTH,
    "rate": REQUEST_RATE,
    "rps": REQUEST_RATE,
    "qps": REQUEST_RATE,
    "p95": LATENCY,
    "waiting": LLM_WAITING,
    "num_requests_waiting": LLM_WAITING,
    "vllm:num_requests_waiting": LLM_WAITING,
    "running": LLM_RUNNING,
    "num_requests_running": LLM_RUNNING,
    "vllm:num_requests_running": LLM_RUNNING,
    **{s: s for s in SIGNALS},
}
"""Names accepted by ``--signal``."""

HPA_TOLERANCE: Final = 0.1
"""kube-controller-manager's default ``--horizontal-pod-autoscaler-tolerance``."""
DEFAULT_CPU_TARGET: Final = 0.7


@dataclass(frozen=True)
class MetricRule:
    """One metric of a rule. ``signal`` is None when the traces cannot show it (memory)."""

    signal: str | None
    target: float
    """In tracekit's units (see the module docstring)."""
    kind: str
    """``utilization`` / ``average_value`` (per replica) or ``value`` (the service total)."""
    source: str
    """How the file spelled it, e.g. ``Resource cpu averageUtilization 70``."""


@dataclass(frozen=True)
class ScalingPolicy:
    """At most ``value`` pods (``Pods``) or percent (``Percent``) per ``period_s``."""

    kind: str
    value: float
    period_s: float


@dataclass(frozen=True)
class ScalingBehavior:
    """One direction of ``spec.behavior``: stabilisation window and rate limits."""

    stabilization_s: float
    policies: tuple[ScalingPolicy, ...] = ()
    """Empty means unlimited."""
    select: str = "Max"
    """``Max``, ``Min`` or ``Disabled``."""


DEFAULT_SCALE_UP: Final = ScalingBehavior(
    0.0, (ScalingPolicy("Percent", 100.0, 15.0), ScalingPolicy("Pods", 4.0, 15.0)), "Max"
)
"""autoscaling/v2 default: double or add 4 pods per 15 s, whichever is more, no stabilisation."""
DEFAULT_SCALE_DOWN: Final = ScalingBehavior(300.0, (ScalingPolicy("Percent", 100.0, 15.0),), "Max")
"""autoscaling/v2 default: 300 s stabilisation, then all pods may go at once."""


@dataclass(frozen=True)
class ScalingRule:
    """What decides replica counts, whatever file it came from."""

    controller: str
    """``HPA``, ``KEDA``, ``Ray Serve`` or ``flags``."""
    name: str
    metrics: tuple[MetricRule, ...]
    min_replicas: int = 1
    max_replicas: int = 100
    tolerance: float = HPA_TOLERANCE
    scale_up: ScalingBehavior = DEFAULT_SCALE_UP
    scale_down: ScalingBehavior = DEFAULT_SCALE_DOWN
    smoothing: float = 1.0
    """Ray Serve's upscaling factor: desired = ceil(current × (1 + (ratio − 1) × smoothing))."""
    source: str = "flags"
    target_ref: str = ""
    """Name of the scaled workload (``scaleTargetRef.name``, Ray deployment), when known."""
    assumed: bool = False
    """True for the default rule used when none was given."""
    notes: tuple[str, ...] = ()

    @property
    def replayable(self) -> tuple[MetricRule, ...]:
        """The metrics the traces can show."""
        return tuple(m for m in self.metrics if m.signal is not None)

    @property
    def controller_label(self) -> str:
        return {"HPA": "the HPA", "flags": "the rule"}.get(self.controller, self.controller)


def default_rule() -> ScalingRule:
    """A Kubernetes HPA on CPU at 70%: what most services run when nobody chose."""
    return ScalingRule(
        controller="HPA",
        name="default",
        metrics=(MetricRule(CPU_UTILIZATION, DEFAULT_CPU_TARGET, "utilization", "cpu 70%"),),
        source="default",
        assumed=True,
        notes=(
            "no scaling rule given: assumed a Kubernetes HPA on CPU at 70% "
            "(pass --hpa FILE or --signal/--target)",
        ),
    )


def canonical_signal(name: str) -> str:
    """``cpu`` → ``cpu_utilization`` etc.; :class:`ConfigError` listing the choices."""
    key = name.strip().lower().replace("-", "_")
    if key not in SIGNAL_ALIASES:
        raise ConfigError(f"unknown signal {name!r}: choose one of {', '.join(SIGNALS)}")
    return SIGNAL_ALIASES[key]


def parse_target(signal: str, text: str) -> float:
    """A ``--target`` in tracekit's units: ``0.7``, ``70`` or ``70%`` for utilisation,
    ``200ms`` / ``0.2s`` for latency, a plain number otherwise."""
    signal = canonical_signal(signal)
    raw = text.strip().lower()
    try:
        if signal in UTILIZATION_SIGNALS:
            value = float(raw.rstrip("%"))
            return value / 100.0 if raw.endswith("%") or value > 1.0 else value
        if signal == LATENCY:
            if raw.endswith("ms"):
                return float(raw[:-2])
            if raw.endswith("s"):
                return float(raw[:-1]) * 1000.0
        return float(raw)
    except ValueError as exc:
        raise ConfigError(f"--target {text!r}: expected a number for {signal}") from exc


def rule_from_flags(
    signal: str, target: float, min_replicas: int = 1, max_replicas: int = 100
) -> ScalingRule:
    """An HPA-like rule on one signal, per replica (``target`` in tracekit's units)."""
    sig = canonical_signal(signal)
    if not target > 0:
        raise ConfigError(f"--target must be positive, got {target}")
    if not 1 <= min_replicas <= max_replicas:
        raise ConfigError(f"replicas: need 1 <= min ({min_replicas}) <= max ({max_replicas})")
    kind = "utilization" if sig in UTILIZATION_SIGNALS else "average_value"
    return ScalingRule(
        controller="flags",
        name=f"{sig} at {target:g}",
        metrics=(MetricRule(sig, float(target), kind, f"--signal {signal} --target {target:g}"),),
        min_replicas=min_replicas,
        max_replicas=max_replicas,
    )


# --- replay ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayStep:
    """The controller's decision at the end of one window."""

    current: int
    raw: int
    """Largest per-metric proposal, before stabilisation, policies and min/max."""
    desired: int
    proposals: dict[str, int] = field(default_factory=dict)
    """Per replayed metric (by signal name); absent where the window had no value."""

    @property
    def scale_up(self) -> bool:
        return self.desired > self.current


def metric_proposal(
    rule: ScalingRule, metric: MetricRule, current: int, value: float
) -> int | None:
    """Replicas one metric asks for, or None when the value is missing."""
    if metric.signal is None or not math.isfinite(value):
        return None
    observed = value * current if metric.kind == "value" and metric.signal in ADDITIVE else value
    ratio = observed / metric.target
    if abs(ratio - 1.0) <= rule.tolerance:
        return current
    return max(1, math.ceil(current * (1.0 + (ratio - 1.0) * rule.smoothing) - 1e-9))


def _limit(behavior: ScalingBehavior, current: int, up: bool) -> int:
    """Furthest the policies let one evaluation move from ``current``."""
    if behavior.select == "Disabled":
        return current
    if not behavior.policies:
        return 10**9 if up else 0
    sign = 1 if up else -1
    limits = []
    for p in behavior.policies:
        step = p.value if p.kind == "Pods" else current * p.value / 100.0
        moved = current + sign * step
        limits.append(math.ceil(moved - 1e-9) if up else math.floor(moved + 1e-9))
    # "Max" picks the policy allowing the biggest change, in either direction.
    if up:
        return max(limits) if behavior.select == "Max" else min(limits)
    return min(limits) if behavior.select == "Max" else max(limits)


def _lookback(stabilization_s: float, window_s: float) -> int:
    """Earlier windows whose evaluation falls strictly inside the stabilisation window."""
    return max(0, math.ceil(stabilization_s / window_s - 1e-9) - 1)


def replay(
    rule: ScalingRule,
    replicas: Sequence[int],
    values: Sequence[Mapping[str, float]],
    window_s: float,
) -> list[ReplayStep]:
    """One controller evaluation per window; ``values[t][signal]`` as the controller sees it.

    Rate limits apply once per evaluation from the observed count (a window longer than a
    policy period would allow more in reality; the audit asks about direction, not speed).
    """
    steps: list[ReplayStep] = []
    raws: list[int] = []
    for t, (current, vals) in enumerate(zip(replicas, values, strict=True)):
        current = max(1, int(current))
        proposals: dict[str, int] = {}
        for m in rule.replayable:
            p = metric_proposal(rule, m, current, vals.get(m.signal or "", math.nan))
            if p is not None:
                proposals[m.signal or ""] = max(p, proposals.get(m.signal or "", 0))
        raw = max(proposals.values()) if proposals else current
        raws.append(raw)
        up_from = max(0, t - _lookback(rule.scale_up.stabilization_s, window_s))
        down_from = max(0, t - _lookback(rule.scale_down.stabilization_s, window_s))
        rec = current
        rec = max(rec, min(raws[up_from : t + 1]))
        rec = min(rec, max(raws[down_from : t + 1]))
        if rec > current:
            rec = min(rec, _limit(rule.scale_up, current, up=True))
        elif rec < current:
            rec = max(rec, _limit(rule.scale_down, current, up=False))
        desired = min(max(rec, rule.min_replicas), rule.max_replicas)
        steps.append(ReplayStep(current, raw, desired, proposals))
    return steps
