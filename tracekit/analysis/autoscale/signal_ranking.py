"""Which signal tracks the latency objective, how early, and what target to scale it at.

Each candidate signal gets three numbers over the windows with enough requests:

* ``correlation`` — Spearman rank correlation with the window's latency quantile;
* ``separation`` — AUC: the chance a violating window shows a higher value than a
  healthy one (0.5 is chance, 1.0 perfect);
* ``lead_windows`` — how many windows straight before the first violation the signal
  had already left its baseline (:func:`baseline_level`; only for signals that
  separate, AUC ≥ 0.7, and sit above that level when violating). ``best_lag_windows``
  is the lag k ∈ 0..3 at which signal[t−k] correlates best with latency[t], as evidence.

``score = 0.4·max(correlation, 0) + 0.4·max(2·AUC − 1, 0) + 0.2·min(lead, 3)/3``.
The latency quantile tracks itself by definition and cannot lead itself, so it gets a
fixed score of 0.5: it is recommended only when no other signal scores above that.

The target for the chosen signal is the *knee*: the highest value seen in a healthy
window below the lowest value seen in a violating one, lowered when needed so that
value × (1 + tolerance) stays below every violating window's value (the rule must fire
there), then rounded down. For in-flight requests Little's law (in-flight ≈ rate per
replica × latency, at the objective's latency, plus one: ``tracekit.inflight`` counts
the arriving request itself, and an arrival sees the time-average load) is the
cross-check, and the target when
no window shows a knee. It is not allowed to override the knee: traces sampled without
``tracekit.sample.weight`` understate the rate, while the in-flight attribute counts
every request the process held.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tracekit.analysis.autoscale import metric_queries as mq
from tracekit.analysis.autoscale import rules as sr
from tracekit.analysis.autoscale.model import Slo, Window

LEAD_HORIZON = 3
"""Windows before the first violation that count as leading it."""
LATENCY_SCORE = 0.5
"""Fixed score of the objective's own quantile (see the module docstring)."""
MIN_WINDOWS = 4
"""Fewer usable windows than this: no correlation is reported."""
SEPARATING_AUC = 0.7
MIN_BASELINE = 3
"""Healthy windows needed before the first violation to say what 'normal' was."""
TIE = 0.02
"""Scores this close count as equal when choosing the signal to recommend."""
KEEP_MARGIN = 0.15
"""An adequate configured signal is kept unless another scores this much higher."""


@dataclass(frozen=True)
class SignalScore:
    """How well and how early one signal tracks the objective."""

    name: str
    label: str
    available: bool
    correlation: float
    lead_windows: int
    best_lag_windows: int
    lag_correlation: float
    separation: float
    threshold: float
    """Alarm level the lead is measured against (NaN when the signal does not separate)."""
    baseline: float
    """Median of the earliest healthy windows: what 'normal' was (NaN when unknown)."""
    healthy_median: float
    violating_min: float
    violating_max: float
    score: float


@dataclass(frozen=True)
class Recommendation:
    """The signal to scale on, its target, and how the recommended rule would have done."""

    signal: str
    target: float
    rationale: str
    hpa_snippet: str
    ray_serve: dict[str, float | int] | None
    knee: float
    littles_law: float | None
    would_fire_windows: int
    violating_windows: int
    false_alarm_windows: int
    lead_windows: int | None
    """Recommended rule's first scale-up before (+) / after (−) the first violation."""
    keda_snippet: str = ""
    """The same rule as a KEDA ScaledObject with a Prometheus trigger."""
    adapter_rule: str = ""
    """The prometheus-adapter rule serving the HPA's Pods metric (empty for CPU)."""
    promql: str = ""
    """PromQL giving the per-replica value the audit measured, from the exported series."""


def _ranks(a: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(len(a), dtype=np.float64)
    _, inv, counts = np.unique(a, return_inverse=True, return_counts=True)
    return (np.bincount(inv, ranks) / counts)[inv]  # ties share their mean rank


def spearman(x: npt.ArrayLike, y: npt.ArrayLike) -> float:
    """Spearman's rank correlation over pairs where both are finite (NaN if too few)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < MIN_WINDOWS:
        return math.nan
    ra, rb = _ranks(a[ok]), _ranks(b[ok])
    if ra.std() == 0 or rb.std() == 0:
        return math.nan
    return float(np.corrcoef(ra, rb)[0, 1])


def auc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """P(a positive value exceeds a negative one), ties half: the Mann–Whitney AUC."""
    p = np.asarray([v for v in positive if math.isfinite(v)], dtype=np.float64)
    n = np.asarray([v for v in negative if math.isfinite(v)], dtype=np.float64)
    if len(p) == 0 or len(n) == 0:
        return math.nan
    ranks = _ranks(np.concatenate([p, n]))
    u = ranks[: len(p)].sum() - len(p) * (len(p) - 1) / 2.0
    return float(u / (len(p) * len(n)))


def _nz(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def baseline_level(
    windows: Sequence[Window], values: npt.NDArray[np.float64], first_violation: int
) -> tuple[float, float]:
    """Level above which a signal has left its baseline: the median of the earliest half
    of the healthy windows before the first violation, plus three robust standard
    deviations (at least 10% of the baseline). Returns (baseline, threshold); NaN with
    fewer than three such windows."""
    before = [
        float(values[w.index])
        for w in windows[:first_violation]
        if w.sufficient and not w.violating and math.isfinite(values[w.index])
    ]
    early = np.asarray(before[: max(MIN_BASELINE, len(before) // 2)])
    if len(early) < MIN_BASELINE:
        return math.nan, math.nan
    base = float(np.median(early))
    spread = 1.4826 * float(np.median(np.abs(early - base)))
    return base, base + max(3.0 * spread, 0.1 * abs(base), 1e-9)


def score_signal(windows: Sequence[Window], name: str, first_violation: int | None) -> SignalScore:
    """Correlation, lead and separation of one signal (see the module docstring)."""
    values = np.array([w.signals.get(name, math.nan) for w in windows], dtype=np.float64)
    latency = np.array([w.latency_ms if w.sufficient else math.nan for w in windows])
    viol = [float(values[w.index]) for w in windows if w.violating]
    healthy = [float(values[w.index]) for w in windows if w.sufficient and not w.violating]
    usable = np.isfinite(values) & np.isfinite(latency)
    available = int(usable.sum()) >= MIN_WINDOWS and float(np.std(values[usable])) > 0
    rho = spearman(values, latency) if available else math.nan
    lags = [
        spearman(values[: len(values) - k], latency[k:])
        if available and k < len(values)
        else math.nan
        for k in range(LEAD_HORIZON + 1)
    ]
    best_lag = 0
    for k, r in enumerate(lags):  # a later lag must beat the earlier ones clearly
        if not math.isnan(r) and r > _nz(lags[best_lag]) + 0.05:
            best_lag = k
    sep = auc(viol, healthy) if available else math.nan
    h_med = float(np.median(healthy)) if healthy and np.isfinite(healthy).any() else math.nan
    v_fin = [v for v in viol if math.isfinite(v)]
    base, threshold, lead = math.nan, math.nan, 0
    if first_violation is not None:
        base, threshold = baseline_level(windows, values, first_violation)
    separates = name != sr.LATENCY and _nz(sep) >= SEPARATING_AUC and bool(v_fin)
    if (
        separates
        and first_violation is not None
        and math.isfinite(threshold)
        and float(np.median(v_fin)) > threshold
    ):
        t = first_violation - 1
        while t >= 0 and math.isfinite(values[t]) and values[t] > threshold:
            lead += 1
            t -= 1
    if name == sr.LATENCY:
        score = LATENCY_SCORE if available else 0.0
    else:
        score = (
            0.4 * max(_nz(rho), 0.0)
            + 0.4 * max(2.0 * _nz(sep) - 1.0, 0.0)
            + 0.2 * min(lead, LEAD_HORIZON) / LEAD_HORIZON
        )
    return SignalScore(
        name=name,
        label=sr.SIGNAL_LABELS[name],
        available=available,
        correlation=rho,
        lead_windows=lead,
        best_lag_windows=best_lag,
        lag_correlation=lags[best_lag],
        separation=sep,
        threshold=threshold,
        baseline=base,
        healthy_median=h_med,
        violating_min=min(v_fin) if v_fin else math.nan,
        violating_max=max(v_fin) if v_fin else math.nan,
        score=round(score, 4),
    )


def rank_signals(windows: Sequence[Window], first_violation: int | None) -> list[SignalScore]:
    """Every candidate signal, best first (unavailable ones last)."""
    scores = [score_signal(windows, s, first_violation) for s in sr.SIGNALS]
    # The LLM engine's gauges exist only for LLM requests: not listed as missing elsewhere.
    scores = [s for s in scores if s.available or s.name not in sr.LLM_SIGNALS]
    return sorted(scores, key=lambda s: (not s.available, -s.score, sr.SIGNALS.index(s.name)))


def _round_down(signal: str, value: float) -> float:
    """A target people would write, never above ``value`` (the rule must still fire)."""
    if signal in sr.UTILIZATION_SIGNALS:
        return max(0.05, math.floor(value * 20 + 1e-9) / 20) if value >= 0.05 else round(value, 3)
    if signal == sr.LATENCY:
        return float(math.floor(value / 10) * 10) if value >= 50 else float(math.floor(value))
    if value >= 2:
        return float(math.floor(value + 1e-9))
    digits = max(0, 1 - math.floor(math.log10(value))) if value > 0 else 1
    return float(math.floor(value * 10**digits + 1e-9) / 10**digits)


def derive_target(
    windows: Sequence[Window], signal: str, slo: Slo, tolerance: float
) -> tuple[float, float, float | None]:
    """(target, knee, Little's-law estimate) for ``signal`` from the windows."""
    vals = [(w.signals.get(signal, math.nan), w) for w in windows if w.sufficient]
    vals = [(v, w) for v, w in vals if math.isfinite(v)]
    viol = [v for v, w in vals if w.violating]
    healthy = [(v, w) for v, w in vals if not w.violating]
    if viol:
        low = min(viol)
        below = [(v, w) for v, w in healthy if v < low]
        knee_v, knee_w = max(below, key=lambda p: p[0]) if below else (low * 0.8, None)
        cap = low / (1.0 + tolerance + 0.02)
    else:
        knee_v, knee_w = max(healthy, key=lambda p: p[0]) if healthy else (math.nan, None)
        cap = math.inf
    little = None
    if signal == sr.INFLIGHT:
        rate_w = (
            knee_w
            if knee_w is not None
            else (max(healthy, key=lambda p: p[0])[1] if healthy else None)
        )
        if rate_w is not None:
            little = 1.0 + rate_w.signals[sr.REQUEST_RATE] * slo.threshold_ms / 1000.0
    raw = min(knee_v, cap)
    if not math.isfinite(raw) or raw <= 0:
        raw = little if little is not None and little > 0 else 1.0
    target = _round_down(signal, raw)
    if target <= 0:
        target = float(f"{raw:.2g}")
    return target, knee_v, little


def _fmt_num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def hpa_snippet(signal: str, target: float, rule: sr.ScalingRule) -> str:
    """An autoscaling/v2 HorizontalPodAutoscaler scaling on ``signal`` at ``target``."""
    ref = rule.target_ref or "my-service"
    if signal == sr.CPU_UTILIZATION:
        metric = (
            "  - type: Resource\n    resource:\n      name: cpu\n      target:\n"
            f"        type: Utilization\n        averageUtilization: {round(target * 100)}\n"
        )
    else:
        metric = (
            f"  - type: Pods\n    pods:\n      metric:\n        name: {sr.METRIC_NAMES[signal]}\n"
            f'      target:\n        type: AverageValue\n        averageValue: "{_fmt_num(target)}"\n'
        )
    return (
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\n"
        f"metadata:\n  name: {ref}\nspec:\n  scaleTargetRef:\n    apiVersion: apps/v1\n"
        f"    kind: Deployment\n    name: {ref}\n  minReplicas: {rule.min_replicas}\n"
        f"  maxReplicas: {rule.max_replicas}\n  metrics:\n{metric}"
    )


def recommend(
    windows: Sequence[Window],
    scores: Sequence[SignalScore],
    rule: sr.ScalingRule,
    slo: Slo,
    window_s: float,
    rule_adequate: bool,
) -> Recommendation | None:
    """The best signal with a target, checked by replaying it; None without usable windows."""
    usable = [s for s in scores if s.available]
    if not usable:
        return None
    by_name = {s.name: s for s in usable}
    # Near-ties go to the signal earlier in SIGNALS: in-flight is what Ray Serve and most
    # adapters already export, and a whole-number target reads better than a queue fraction.
    near = [s for s in usable if s.name != sr.LATENCY and s.score >= usable[0].score - TIE]
    best = min(near, key=lambda s: sr.SIGNALS.index(s.name)) if near else usable[0]
    configured = [m.signal for m in rule.replayable if m.signal in by_name]
    why = f"best score ({best.score:.2f})"
    if rule_adequate and configured:
        own = by_name[configured[0]]
        if own.score >= best.score - KEEP_MARGIN:
            best, why = (
                own,
                f"the configured signal already tracks the objective (score {own.score:.2f})",
            )
    target, knee, little = derive_target(windows, best.name, slo, sr.HPA_TOLERANCE)
    if rule_adequate and configured and best.name == configured[0]:
        # It fired in every violating window: the configured target is proven, keep it.
        target = next(m.target for m in rule.replayable if m.signal == best.name)
        why += "; it fired in every violating window, so its target stays"
    check = sr.rule_from_flags(best.name, target, rule.min_replicas, rule.max_replicas)
    steps = sr.replay(check, [w.replicas for w in windows], [w.signals for w in windows], window_s)
    fired = [w.index for w, st in zip(windows, steps, strict=True) if st.scale_up]
    viol = [w.index for w in windows if w.violating]
    healthy = {w.index for w in windows if w.sufficient and not w.violating}
    lead = None
    if viol and fired:
        first = next((i for i in fired if i >= viol[0] - LEAD_HORIZON), None)
        while first is not None and first - 1 in fired:
            first -= 1
        lead = None if first is None else viol[0] - first
    parts = [why, f"knee {knee:.3g}" if math.isfinite(knee) else "no healthy window to set a knee"]
    if little is not None:
        parts.append(f"Little's law at {slo.threshold_ms:g} ms: {little:.3g} in flight per replica")
        if math.isfinite(knee) and not knee / 3 <= little <= knee * 3:
            parts.append(
                "traced rate × latency disagrees with the in-flight attribute; "
                "are traces sampled without tracekit.sample.weight?"
            )
    parts.append(f"with target {_fmt_num(target)} the rule would have scaled up in "
                 f"{len(set(fired) & set(viol))} of {len(viol)} violating windows")  # fmt: skip
    ray: dict[str, float | int] | None = None
    if sr.INFLIGHT in by_name:
        ongoing = (
            target if best.name == sr.INFLIGHT else derive_target(windows, sr.INFLIGHT, slo, 0.0)[0]
        )
        ray = {"target_ongoing_requests": ongoing, "min_replicas": rule.min_replicas,
               "max_replicas": rule.max_replicas}  # fmt: skip
    return Recommendation(
        signal=best.name,
        target=target,
        rationale="; ".join(parts),
        hpa_snippet=hpa_snippet(best.name, target, rule),
        ray_serve=ray,
        knee=knee,
        littles_law=little,
        would_fire_windows=len(set(fired) & set(viol)),
        violating_windows=len(viol),
        false_alarm_windows=len(set(fired) & healthy),
        lead_windows=lead,
        keda_snippet=mq.keda_snippet(best.name, target, rule),
        adapter_rule=mq.adapter_rule(best.name),
        promql=mq.per_replica_promql(best.name, rule.target_ref or "my-service"),
    )
