"""The sentences and flags ``diff``, ``summary`` and ``slow`` lead with.

One place decides how a stage is named in prose ("batching", "a dependency"), how an
interval is written, and when a flag is raised, so the three commands speak alike:
"p99 grew 160.2 → 238.5 ms (+78.3 ms, CI +61..+95): 71% of it is batch_queue wait —
the issue is batching, not the model."
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import ReleaseData
from tracekit.analysis.cohorts.stats import QuantileDelta
from tracekit.analysis.results import Flag, release_name

FEW_REQUESTS = 100
"""Fewer requests than this in a release: quantile estimates rest on a handful."""
CPU_SCALING_TARGET = 0.7
"""The usual HPA target the wrong-signal flag compares against."""
CPU_FLAT_POINTS = 0.05
"""Median CPU utilisation rising by no more than this counts as 'did not rise'."""

STAGE_PROSE: dict[str, str] = {
    cv.FEATURE_RETRIEVAL: "feature retrieval",
    cv.PREPROCESS: "preprocessing",
    cv.BATCH_QUEUE: "batching",
    cv.MODEL_EXECUTE: "the model",
    cv.POSTPROCESS: "postprocessing",
    cv.DOWNSTREAM: "a dependency",
    cv.UNATTRIBUTED: "code outside every stage (add a tracekit.stage around it)",
    cv.QUEUE: "requests waiting in the engine's queue",
    cv.PREFILL: "prefill (the prompt's forward pass)",
    cv.DECODE: "decode (the steps after the first token)",
}
"""How ``the issue is …`` names a stage; any other stage is ``the <name> stage``."""
UNATTRIBUTED_PHRASE = "unattributed time (in no stage)"
"""How ``unattributed`` is named in a sentence: never with a kind, since time in no
stage carries no evidence of being wait or compute (it is stored as ``wait``)."""


def quantile_name(q: float) -> str:
    """0.99 → ``p99``; 0.999 → ``p99.9``."""
    return "p" + f"{q * 100:.1f}".rstrip("0").rstrip(".")


def _num(x: float) -> str:
    return f"{x:.1f}"


def _ci(lo: float, hi: float) -> str:
    if math.isnan(lo) or math.isnan(hi):
        return "CI n/a"
    digits = 1 if max(abs(lo), abs(hi)) < 10 else 0
    return f"CI {lo:+.{digits}f}..{hi:+.{digits}f}"


def kind_phrase(stage: str, kind: str) -> str:
    """``batch_queue wait``, ``model_execute compute``, ``model_execute hidden wait``;
    ``unattributed time (in no stage)`` whatever its kind."""
    if stage == cv.UNATTRIBUTED:
        return UNATTRIBUTED_PHRASE
    return f"{stage} {'hidden wait' if kind == cv.HIDDEN_WAIT else kind}"


def issue_phrase(named: Sequence[tuple[str, str]], all_stages: Sequence[str]) -> str:
    """``the issue is batching or a dependency, not the model`` from (stage, kind) pairs."""
    nouns = []
    for stage, kind in named:
        noun = STAGE_PROSE.get(stage, f"the {stage} stage")
        if kind == cv.HIDDEN_WAIT:
            noun = f"contention in {noun} (wall time grew, CPU/GPU time did not)"
        nouns.append(noun)
    phrase = "the issue is " + " or ".join(nouns)
    if cv.MODEL_EXECUTE in all_stages and all(s != cv.MODEL_EXECUTE for s, _ in named):
        phrase += ", not the model"
    elif any(s == cv.MODEL_EXECUTE and k == cv.HIDDEN_WAIT for s, k in named):
        phrase += ", not the model's compute"
    return phrase


def verdict_sentence(
    d: QuantileDelta,
    named: Sequence[tuple[str, str, float]],
    confidence: float,
    *,
    all_stages: Sequence[str] = (),
    detail: str | None = None,
) -> str:
    """The diff verdict. ``named``: (stage, kind, share) of the stages that explain the
    growth, primary first; empty when the tail did not grow significantly. ``detail``
    follows the primary stage in parentheses: the operation that holds most of its
    growth (``+180.0 ms: 160.0 ms of it redis-manual GetDriver, …``)."""
    q = quantile_name(d.q)
    head = (
        f"{q} {_num(d.before)} → {_num(d.after)} ms ({d.delta:+.1f} ms, {_ci(d.ci_low, d.ci_high)})"
    )
    if not named:
        if d.ci_low > 0:
            return f"{q} grew {head[len(q) + 1 :]}, but no stage explains it."
        if d.ci_high < 0:
            return f"{q} fell {head[len(q) + 1 :]}: no tail regression."
        return f"No significant tail change: {head}; the {confidence:.0%} interval includes zero."
    parts = [f"{share:.0%} of it is {kind_phrase(stage, kind)}" for stage, kind, share in named[:1]]
    if detail:
        parts[0] += f" ({detail})"
    parts += [f"{share:.0%} {kind_phrase(stage, kind)}" for stage, kind, share in named[1:]]
    explained = " and ".join(parts)
    issue = issue_phrase([(s, k) for s, k, _ in named], all_stages)
    return f"{q} grew {head[len(q) + 1 :]}: {explained} — {issue}."


def split_sentence(prefix: str, total_ms: float, stage_ms: Sequence[tuple[str, float]]) -> str:
    """``<prefix> 160.0 ms: feature_retrieval 15.0, …, downstream 45.0 ms`` (the seed's split)."""
    parts = ", ".join(f"{s} {_num(v)}" for s, v in stage_ms if v >= 0.05)
    return f"{prefix} {_num(total_ms)} ms: {parts} ms"


def few_requests_flag(
    releases: Sequence[ReleaseData], cohort: str, tail_counts: Sequence[int]
) -> Flag | None:
    """Raised when a release has fewer than :data:`FEW_REQUESTS` requests, or its
    (possibly widened) tail cohort still has fewer than ten."""
    thin = [
        f"{release_name(r.label)} has {r.n} requests ({c} in the ≥ {cohort} cohort)"
        for r, c in zip(releases, tail_counts, strict=True)
        if r.n < FEW_REQUESTS or c < 10
    ]
    if not thin:
        return None
    return Flag(
        "few_requests",
        "; ".join(thin) + ": tail quantiles rest on a handful of requests, intervals are wide.",
    )


def _finite(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return x[np.isfinite(x)]


def cpu_flag(
    before_cpu: npt.NDArray[np.float64], after_cpu: npt.NDArray[np.float64], d: QuantileDelta
) -> Flag | None:
    """``wrong_scaling_signal``: the tail grew while CPU utilisation did not rise and
    stayed under the usual 70% HPA target, so a CPU autoscaler could not have fired."""
    a = _finite(after_cpu)
    if len(a) == 0 or len(a) < 0.5 * len(after_cpu):
        return None
    a_med = float(np.median(a))
    b = _finite(before_cpu)
    b_med = float(np.median(b)) if len(b) else float("nan")
    if a_med >= CPU_SCALING_TARGET or (not math.isnan(b_med) and a_med - b_med > CPU_FLAT_POINTS):
        return None
    lo, hi = np.quantile(a, [0.1, 0.9])
    was = f" (median {b_med:.0%} before, {a_med:.0%} after)" if not math.isnan(b_med) else ""
    return Flag(
        "wrong_scaling_signal",
        f"{quantile_name(d.q)} grew {d.delta:+.1f} ms while CPU stayed at {lo:.0%}–{hi:.0%}{was}; "
        f"an HPA on CPU at {CPU_SCALING_TARGET:.0%} could not have fired — see tracekit autoscale.",
    )
