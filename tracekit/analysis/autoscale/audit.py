"""The autoscaling audit: would the scaling rule have reacted when the latency objective broke?

The traced time line is cut into windows (by request start). Per window: the weighted
request rate, the objective's latency quantile, the replicas seen (distinct
``service.instance.id``), and every candidate signal as a controller would see it —
CPU/GPU utilisation averaged per replica, in-flight and queue depth per replica, request
rate per replica, and the latency quantile. The configured rule is replayed over those
windows (:func:`tracekit.analysis.autoscale.rules.replay`); a window that broke the
objective while the rule would not have scaled up is *missed*. The signals are ranked
(:mod:`tracekit.analysis.autoscale.signal_ranking`) and the best one gets a target.

Windows with fewer requests than the quantile needs (``1/(1-q)``, at least 10) keep
their numbers but count neither as violating nor as healthy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.autoscale import rules as sr
from tracekit.analysis.autoscale import signal_ranking as ranking
from tracekit.analysis.autoscale.model import Slo, Window, min_requests_for, parse_slo
from tracekit.analysis.cohorts.release import concat_releases, load_release
from tracekit.analysis.cohorts.stats import weighted_quantile
from tracekit.analysis.store import Store
from tracekit.errors import ConfigError, QueryError


class Timeline(Protocol):
    """What the audit reads; :class:`~tracekit.analysis.cohorts.release.ReleaseData` fits."""

    label: str
    start_ns: npt.NDArray[np.int64]
    duration_ms: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    instance_ids: npt.NDArray[np.object_]
    inflight: npt.NDArray[np.float64]
    queue_depth: npt.NDArray[np.float64]
    cpu_utilization: npt.NDArray[np.float64]
    gpu_utilization: npt.NDArray[np.float64]


@dataclass
class AutoscaleResult:
    """Everything the renderers show; see docs/autoscale.md for the JSON contract."""

    release: str
    rule: sr.ScalingRule
    slo: Slo
    window_s: float
    min_requests: int
    windows: list[Window]
    violating_windows: int
    missed_windows: int
    sparse_windows: int
    first_violation: int | None
    first_scale_up: int | None
    lead_lag_windows: int | None
    """First scale-up before (+) or after (−) the first violation, in windows."""
    signals: list[ranking.SignalScore]
    recommendation: ranking.Recommendation | None
    summary: str
    rule_adequate: bool
    notes: list[str] = field(default_factory=list)
    flags: list[tuple[str, str]] = field(default_factory=list)
    """(code, message): ``wrong_signal``, ``rule_adequate``, ``no_violations``, ``default_rule``,
    ``sparse_windows``, ``no_scale_up``."""

    @property
    def lead_lag_s(self) -> float | None:
        return None if self.lead_lag_windows is None else self.lead_lag_windows * self.window_s

    @property
    def missed(self) -> list[Window]:
        return [w for w in self.windows if w.missed]


def llm_load_at_arrival(
    data: Timeline,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per request, the other requests of its replica waiting in the engine's queue and
    running (prefill or decode) when it arrived: what vLLM's ``num_requests_waiting`` and
    ``num_requests_running`` gauges read then. A request waits from its arrival for its
    ``queue`` time, then runs for its ``prefill`` + ``decode`` time: vLLM's span starts at
    the arrival. Where the queue starts later (vLLM V1's frontend time, or the work a
    service does before ``tracekit.generation()``), both intervals are placed that much
    early, so a request near a neighbour's end may be counted one way or the other.
    NaN for both when no request has those stages."""
    n = len(data.start_ns)
    stages = getattr(data, "stages", ())
    if not any(s in stages for s in cv.LLM_STAGES):
        return np.full(n, math.nan), np.full(n, math.nan)
    queue, prefill, decode = (data.stage_column(s) for s in cv.LLM_STAGES)  # type: ignore[attr-defined]
    llm = (queue + prefill + decode) > 0
    start = data.start_ns.astype(np.float64)
    admitted = start + queue * 1e6
    done = admitted + (prefill + decode) * 1e6
    waiting, running = np.full(n, math.nan), np.full(n, math.nan)
    inst = data.instance_ids.astype(str)
    for name in np.unique(inst[llm]):
        mine = llm & (inst == name)
        at = start[mine]

        waiting[mine] = _holding(at, start[mine], admitted[mine])
        running[mine] = _holding(at, admitted[mine], done[mine])
    return waiting, running


def _holding(
    at: npt.NDArray[np.float64], lo: npt.NDArray[np.float64], hi: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Per arrival ``at[i]``, the intervals [lo, hi) holding it, request i's own excluded."""
    began = np.searchsorted(np.sort(lo), at, side="right")
    ended = np.searchsorted(np.sort(hi), at, side="right")
    own = (lo <= at) & (at < hi)
    out: npt.NDArray[np.float64] = (began - ended - own).astype(np.float64)
    return out


def _replica_mean(
    values: npt.NDArray[np.float64], weights: npt.NDArray[np.float64], inst: npt.NDArray[np.object_]
) -> float:
    """Mean per replica, then over replicas, as a metrics pipeline averages pods."""
    ok = np.isfinite(values)
    if not ok.any():
        return math.nan
    _, inv = np.unique(inst[ok].astype(str), return_inverse=True)
    sums = np.bincount(inv, values[ok] * weights[ok])
    totals = np.bincount(inv, weights[ok])
    return float(np.mean(sums[totals > 0] / totals[totals > 0]))


def build_windows(data: Timeline, slo: Slo, window_s: float, min_requests: int) -> list[Window]:
    """Cut the time line into windows and measure every signal in each."""
    if len(data.start_ns) == 0:
        raise QueryError("no requests to audit")
    if window_s <= 0:
        raise ConfigError(f"--window must be positive, got {window_s:g} s")
    w_ns = int(round(window_s * 1e9))
    t0 = int(data.start_ns.min())
    idx = ((data.start_ns - t0) // w_ns).astype(np.int64)
    order = np.argsort(idx, kind="stable")
    n_windows = int(idx.max()) + 1
    bounds = np.searchsorted(idx[order], np.arange(n_windows + 1))
    last_start = int(data.start_ns.max())
    waiting, running = llm_load_at_arrival(data)
    windows: list[Window] = []
    replicas_before = 1
    for i in range(n_windows):
        rows = order[bounds[i] : bounds[i + 1]]
        start_ns = t0 + i * w_ns
        # The last window ends at the last arrival, not a full window later.
        span_s = (
            window_s if i < n_windows - 1 else max((last_start - start_ns) / 1e9, window_s / 10)
        )
        span_s = min(span_s, window_s)
        w = data.weights[rows]
        inst = data.instance_ids[rows]
        seen = {str(x) for x in inst if x}
        # An idle window keeps the replicas it had: pods do not vanish when traffic pauses.
        replicas = max(1, len(seen)) if len(rows) else replicas_before
        replicas_before = replicas
        rate = float(w.sum()) / span_s
        latency = (
            weighted_quantile(data.duration_ms[rows], slo.quantile, w) if len(rows) else math.nan
        )
        signals = {
            sr.INFLIGHT: _replica_mean(data.inflight[rows], w, inst),
            sr.QUEUE_DEPTH: _replica_mean(data.queue_depth[rows], w, inst),
            sr.LLM_WAITING: _replica_mean(waiting[rows], w, inst),
            sr.LLM_RUNNING: _replica_mean(running[rows], w, inst),
            sr.REQUEST_RATE: rate / replicas,
            sr.LATENCY: latency,
            sr.GPU_UTILIZATION: _replica_mean(data.gpu_utilization[rows], w, inst),
            sr.CPU_UTILIZATION: _replica_mean(data.cpu_utilization[rows], w, inst),
        }
        sufficient = len(rows) >= min_requests
        windows.append(
            Window(
                index=i,
                start_s=i * window_s,
                start_ns=start_ns,
                requests=len(rows),
                rate_rps=rate,
                latency_ms=latency,
                replicas=replicas,
                signals=signals,
                sufficient=sufficient,
                violating=sufficient and slo.broken_by(latency),
            )
        )
    return windows


def _first_scale_up(windows: list[Window], first_violation: int | None) -> int | None:
    """Start of the scale-up run that answers the first violation.

    Scale-ups long before the violation answered something else; the search starts
    :data:`~tracekit.analysis.autoscale.signal_ranking.LEAD_HORIZON` windows before it and then
    follows the run back to where it began.
    """
    if first_violation is None:
        ups = [w.index for w in windows if w.scale_up]
        return ups[0] if ups else None
    start = max(0, first_violation - ranking.LEAD_HORIZON)
    hit = next((w.index for w in windows[start:] if w.scale_up), None)
    while hit is not None and hit > 0 and windows[hit - 1].scale_up:
        hit -= 1
    return hit


def audit(
    data: Timeline,
    rule: sr.ScalingRule | None = None,
    slo: Slo | None = None,
    window_s: float = 30.0,
    *,
    min_requests: int | None = None,
) -> AutoscaleResult:
    """Replay ``rule`` (default: an HPA on CPU at 70%) against ``slo`` over ``data``."""
    rule = rule or sr.default_rule()
    slo = slo or parse_slo("p95<200ms")
    need = min_requests if min_requests is not None else min_requests_for(slo.quantile)
    windows = build_windows(data, slo, window_s, need)
    steps = sr.replay(rule, [w.replicas for w in windows], [w.signals for w in windows], window_s)
    for w, step in zip(windows, steps, strict=True):
        w.desired_replicas = step.desired
        w.scale_up = step.scale_up
        w.missed = w.violating and not step.scale_up
    violating = [w for w in windows if w.violating]
    first_violation = violating[0].index if violating else None
    first_up = _first_scale_up(windows, first_violation)
    lead_lag = None
    if first_violation is not None and first_up is not None:
        lead_lag = first_violation - first_up
    scores = ranking.rank_signals(windows, first_violation)
    missed = sum(w.missed for w in windows)
    adequate = missed == 0
    rec = ranking.recommend(windows, scores, rule, slo, window_s, adequate)
    result = AutoscaleResult(
        release=data.label,
        rule=rule,
        slo=slo,
        window_s=window_s,
        min_requests=need,
        windows=windows,
        violating_windows=len(violating),
        missed_windows=missed,
        sparse_windows=sum(not w.sufficient for w in windows),
        first_violation=first_violation,
        first_scale_up=first_up,
        lead_lag_windows=lead_lag,
        signals=scores,
        recommendation=rec,
        summary="",
        rule_adequate=adequate,
        notes=list(rule.notes),
    )
    describe(result)
    return result


_LATEST_RELEASE_SQL = """
SELECT release FROM requests
WHERE release IS NOT NULL AND ($service IS NULL OR service_name = $service)
GROUP BY release ORDER BY max(start_ns) DESC, release LIMIT 1
"""


def audit_autoscaling(
    store: Store,
    *,
    release: str | Sequence[str] | None = None,
    rule: sr.ScalingRule | None = None,
    slo: Slo | None = None,
    window_s: float = 30.0,
    service: str | None = None,
) -> AutoscaleResult:
    """:func:`audit` over releases in the store (default: the one traced last).

    Several releases are audited as one time line, as a rollout replaced one by the
    other: the healthy windows of the old release are what lets a signal show that it
    separates them from the violating windows of the new one.
    """
    if release is None:
        row = store.con.execute(_LATEST_RELEASE_SQL, {"service": service}).fetchone()
        if row is None:
            raise QueryError(f"no requests in {store.path}: run `tracekit ingest FILE` first")
        release = str(row[0])
    labels = [release] if isinstance(release, str) else list(release)
    data = concat_releases([load_release(store, label, service=service) for label in labels])
    return audit(data, rule, slo, window_s)


# --- wording --------------------------------------------------------------------------

_WORDS = {1: "one window", 2: "two windows", 3: "three windows"}


def _windows(n: int) -> str:
    return _WORDS.get(n, f"{n} windows")


def _plural(n: int) -> str:
    return f"{n} violating window{'' if n == 1 else 's'}"


def fmt_signal(signal: str, value: float) -> str:
    """A signal value as people write it: ``34%``, ``180 ms``, ``12 req/s``, ``4.5``."""
    if not math.isfinite(value):
        return "–"
    if signal in sr.UTILIZATION_SIGNALS:
        return f"{value * 100:.0f}%"
    if signal == sr.LATENCY:
        return f"{value:.0f} ms"
    if signal == sr.REQUEST_RATE:
        return f"{value:.3g} req/s"
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}".rstrip("0").rstrip(".")


def fmt_target(signal: str, value: float) -> str:
    """A target exactly as the snippet states it (``70%``, ``180 ms``, ``0.12``)."""
    if signal in sr.UTILIZATION_SIGNALS or signal == sr.LATENCY:
        return fmt_signal(signal, value)
    return f"{value:g} req/s" if signal == sr.REQUEST_RATE else f"{value:g}"


def _span(signal: str, values: list[float]) -> str:
    lo, hi = fmt_signal(signal, min(values)), fmt_signal(signal, max(values))
    if lo == hi:
        return lo
    if signal in sr.UTILIZATION_SIGNALS:
        return f"{lo[:-1]}–{hi}"
    return f"{lo}–{hi}"


def _rule_sentence(r: AutoscaleResult) -> str:
    rule, q, bound = r.rule, r.slo.label, f"{r.slo.threshold_ms:g} ms"
    metrics = rule.replayable
    sig = metrics[0].signal or sr.CPU_UTILIZATION
    label = sr.SIGNAL_LABELS[sig] if len(metrics) == 1 else "The rule"
    ctrl = rule.controller_label
    if r.violating_windows == 0:
        usable = sum(w.sufficient for w in r.windows)
        if usable == 0:
            return (f"No window had the {r.min_requests} requests {q} needs; "
                    "widen --window or trace more traffic.")  # fmt: skip
        return f"{q} stayed under {bound} in all {usable} windows with enough requests: nothing to audit."
    v, m = r.violating_windows, r.missed_windows
    if m == 0:
        text = f"{label} tracked {q}: {ctrl} would have scaled up in all {_plural(v)}"
        if r.lead_lag_windows is not None and r.lead_lag_windows > 0:
            text += f", starting {_windows(r.lead_lag_windows)} before {q} crossed {bound}"
        return text + f". {label} is an adequate signal; nothing missed."
    seen = [w.signals[sig] for w in r.missed if math.isfinite(w.signals.get(sig, math.nan))]
    target = fmt_signal(sig, metrics[0].target)
    if not seen:
        text = f"The traces carry no {sr.SIGNAL_LABELS[sig]} values in {m} of {_plural(v)}"
    elif len(metrics) == 1:
        text = f"{label} stayed at {_span(sig, seen)} against a {target} target through {m} of {_plural(v)}"
    else:
        text = (f"None of the rule's {len(metrics)} metrics asked for more replicas through {m} of "
                f"{_plural(v)} ({sr.SIGNAL_LABELS[sig]} at {_span(sig, seen)} against {target})")  # fmt: skip
    if m == v:
        return text + f": {ctrl} could not fire."
    text += f": {ctrl} would not have scaled up in them"
    ll = r.lead_lag_windows
    if ll is not None and ll < 0:
        text += f"; its first scale-up came {_windows(-ll)} ({-ll * r.window_s:g} s) after {q} crossed {bound}"
    return text + "."


def _recommendation_sentence(r: AutoscaleResult) -> str:
    rec = r.recommendation
    if rec is None:
        return ""
    score = next(s for s in r.signals if s.name == rec.signal)
    q, bound = r.slo.label, f"{r.slo.threshold_ms:g} ms"
    target = (
        fmt_signal(rec.signal, rec.target) if rec.signal not in sr.ADDITIVE else f"{rec.target:g}"
    )
    if rec.signal == sr.REQUEST_RATE:
        target += " req/s"
    own = [m.signal for m in r.rule.replayable]
    if r.rule_adequate and r.violating_windows and own and rec.signal == own[0]:
        return ""
    if rec.signal == sr.LATENCY:
        return f"No other signal tracked {q}; scale on {q} itself with target {target}."
    if r.violating_windows == 0:
        return (f"{score.label} tracks {q} best (rank correlation {score.correlation:.2f}); "
                f"scale on it with target {target}.")  # fmt: skip
    start = score.baseline if math.isfinite(score.baseline) else score.healthy_median
    rise = f"{score.label} rose from {fmt_signal(rec.signal, start)} to {fmt_signal(rec.signal, score.violating_max)}"
    when = f", starting {_windows(score.lead_windows)} before" if score.lead_windows else " as"
    return f"{rise}{when} {q} crossed {bound}; scale on it with target {target}."


def describe(r: AutoscaleResult) -> None:
    """Fill ``summary``, ``flags`` and ``notes`` of a finished audit."""
    r.summary = " ".join(s for s in (_rule_sentence(r), _recommendation_sentence(r)) if s)
    if r.rule.assumed:
        r.flags.append(("default_rule", r.rule.notes[0]))
    if r.missed_windows:
        r.flags.append(("wrong_signal", f"{r.missed_windows} of {r.violating_windows} violating "
                        f"windows passed without {r.rule.controller_label} scaling up"))  # fmt: skip
    elif r.violating_windows:
        r.flags.append(
            (
                "rule_adequate",
                f"{r.rule.controller_label} would have scaled up in every violating window",
            )
        )
    else:
        r.flags.append(("no_violations", f"{r.slo.label} never reached {r.slo.threshold_ms:g} ms"))
    if r.sparse_windows:
        note = (f"{r.sparse_windows} of {len(r.windows)} windows had fewer than {r.min_requests} "
                f"requests for {r.slo.label} and are not counted as violating or healthy")  # fmt: skip
        r.flags.append(("sparse_windows", note))
        r.notes.append(note)
