"""Token latencies of LLM serving: TTFT and time per output token as request metrics.

Every question tracekit answers about a release (summary, diff, gate, report) reads one
:class:`~tracekit.analysis.cohorts.release.ReleaseData`: a latency per request and its
split by stage. :func:`metric_view` turns the end-to-end one into the same shape for
another latency, so every statistic downstream (quantiles, the counterfactual, the
gate's bootstrap) works on it unchanged:

* ``e2e``: the request's duration (the default; the view is the data itself);
* ``ttft`` — time to first token: the engine's own measurement where the request carries
  one (``gen_ai.latency.time_to_first_token``, seconds, as vLLM and
  ``tracekit.generation()`` write it; never less than ``queue + prefill``, which it
  contains), else ``queue + prefill``; a request whose generation ended before its first
  token (0 output tokens) has none. Its stages are ``queue``
  and ``prefill`` (the engine's prefill step produces the first token) and, where the
  measurement is longer than those two, the rest as ``unattributed``; ``decode`` is 0.
  Requests with neither a measurement nor a queue or prefill stage are not LLM requests
  and are left out;
* ``tpot`` — time per output token: ``decode ÷ (output tokens − 1)`` (over several
  generations of one request, ``− 1`` each), the OpenTelemetry
  GenAI ``gen_ai.server.time_per_output_token``; the whole of it is ``decode``. Requests
  with fewer than two output tokens, or no decode stage, are left out.

Token counts come from any span of the request (``gen_ai.usage.completion_tokens``, or
the newer ``gen_ai.usage.output_tokens``; prompt: ``prompt_tokens`` / ``input_tokens``).
Where the engine's TTFT and ``queue + prefill`` disagree by more than
:data:`TTFT_MISMATCH` in the median, the view says so in a flag.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import _FILTER, ReleaseData, load_releases
from tracekit.analysis.cohorts.stats import weighted_quantiles
from tracekit.analysis.results import Flag
from tracekit.analysis.store import Store
from tracekit.errors import ConfigError, QueryError

E2E = "e2e"
TTFT = "ttft"
TPOT = "tpot"
METRICS: tuple[str, ...] = (E2E, TTFT, TPOT)
"""The latencies ``--metric`` takes."""
METRIC_NAMES = {
    E2E: "end-to-end latency",
    TTFT: "time to first token",
    TPOT: "time per output token",
}

TTFT_MISMATCH = 0.1
"""Median relative gap between the engine's TTFT and queue + prefill that is flagged..."""
TTFT_MISMATCH_MS = 5.0
"""...when the median gap is also longer than this (a service's own millisecond before
its generation begins is no mismatch)."""

FloatArray = npt.NDArray[np.float64]


def parse_metric(metric: str | None) -> str:
    """``e2e`` (also None), ``ttft`` or ``tpot``; anything else is refused."""
    name = (metric or E2E).strip().lower()
    if name not in METRICS:
        raise ConfigError(f"--metric {metric!r}: use one of {', '.join(METRICS)}")
    return name


@dataclass(frozen=True)
class Tokens:
    """Per request of a :class:`ReleaseData` (same rows): what its spans say of tokens."""

    ttft_ms: FloatArray
    """The engine's own time to first token (NaN where no span carries it)."""
    prompt_tokens: FloatArray
    output_tokens: FloatArray
    """Output tokens summed over the request's generations that counted them."""
    generations: FloatArray
    """How many of the request's spans counted output tokens (usually 1)."""
    attributed: bool = False
    """Read from a store attributed where the traces live: no span, so no attribute."""

    @property
    def any(self) -> bool:
        return bool(
            np.isfinite(self.ttft_ms).any()
            or np.isfinite(self.prompt_tokens).any()
            or np.isfinite(self.output_tokens).any()
        )


def _attr(key: str) -> str:
    return f"TRY_CAST(json_extract_string(s.attributes, '$.\"{key}\"') AS DOUBLE)"


_OUT_TOKENS = (
    f"coalesce({_attr(cv.GEN_AI_USAGE_COMPLETION_TOKENS)}, {_attr(cv.GEN_AI_USAGE_OUTPUT_TOKENS)})"
)
# Per request: its first token (the earliest TTFT of its spans), its largest prompt, and
# its output tokens summed over the generations that wrote a count, with how many did
# (TPOT divides decode by tokens − generations: each one's first token is prefill's).
# NULLs come back as NaN: numpy would read a masked NULL as 0.
_TOKENS_SQL = f"""
SELECT s.trace_id,
       coalesce(min({_attr(cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN)}), 'NaN'::DOUBLE) AS ttft_s,
       coalesce(max(coalesce({_attr(cv.GEN_AI_USAGE_PROMPT_TOKENS)},
                             {_attr(cv.GEN_AI_USAGE_INPUT_TOKENS)})), 'NaN'::DOUBLE)
           AS prompt_tokens,
       coalesce(sum({_OUT_TOKENS}), 'NaN'::DOUBLE) AS output_tokens,
       count({_OUT_TOKENS})::DOUBLE AS generations
FROM spans s JOIN requests r ON r.trace_id = s.trace_id
WHERE {_FILTER.strip()}
  AND s.attributes IS NOT NULL
  AND contains(s.attributes::VARCHAR, '"gen_ai.')
  AND (json_exists(s.attributes, '$."{cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN}"')
       OR json_exists(s.attributes, '$."{cv.GEN_AI_USAGE_PROMPT_TOKENS}"')
       OR json_exists(s.attributes, '$."{cv.GEN_AI_USAGE_INPUT_TOKENS}"')
       OR json_exists(s.attributes, '$."{cv.GEN_AI_USAGE_COMPLETION_TOKENS}"')
       OR json_exists(s.attributes, '$."{cv.GEN_AI_USAGE_OUTPUT_TOKENS}"'))
GROUP BY s.trace_id
"""


def read_tokens(
    store: Store, data: ReleaseData, *, service: str | None = None, route: str | None = None
) -> Tokens:
    """The token attributes of ``data``'s requests, from their spans (NaN where absent).

    A store attributed where the traces live (ClickHouse, ``tracekit attribute``) keeps
    no spans here: every value is NaN (``attributed``; :func:`metric_view` then says so).
    A release without queue, prefill or decode stages has no LLM request, and its spans
    are not read at all (what keeps an e2e summary or diff of other services as cheap
    as before).
    """
    n = data.n
    out = Tokens(np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan))
    if getattr(store, "attributed", False):
        return dataclasses.replace(out, attributed=True)
    if not any(s in data.stages for s in cv.LLM_STAGES):
        return out  # no LLM request here (ingest derives stages wherever latencies are)
    params = {"labels": [data.label], "service": service, "route": route}
    got = store.con.execute(_TOKENS_SQL, params).fetchnumpy()
    if not len(got["trace_id"]):
        return out
    ids = np.asarray(data.trace_ids, dtype=object).astype(str)
    order = np.argsort(ids, kind="stable")
    found = np.asarray(got["trace_id"], dtype=object).astype(str)
    pos = np.searchsorted(ids[order], found)
    pos = np.clip(pos, 0, max(n - 1, 0))
    hit = ids[order][pos] == found
    rows = order[pos[hit]]
    targets = {
        "ttft_s": (out.ttft_ms, 1000.0),
        "prompt_tokens": (out.prompt_tokens, 1.0),
        "output_tokens": (out.output_tokens, 1.0),
        "generations": (out.generations, 1.0),
    }
    for name, (target, scale) in targets.items():
        values = np.ma.filled(np.ma.asarray(got[name], dtype=np.float64), np.nan)[hit] * scale
        target[rows] = np.where(np.isfinite(values) & (values >= 0), values, np.nan)
    return out


def load_metric(
    store: Store,
    labels: list[str],
    metric: str,
    *,
    service: str | None = None,
    route: str | None = None,
) -> tuple[list[ReleaseData], list[Flag]]:
    """:func:`load_releases`, each release seen through ``metric`` (:func:`metric_view`)."""
    datas = load_releases(store, labels, service=service, route=route)
    if metric == E2E:
        return datas, []
    tokens = [read_tokens(store, d, service=service, route=route) for d in datas]
    return views_of(datas, tokens, metric)


def views_of(
    datas: list[ReleaseData], tokens: list[Tokens], metric: str
) -> tuple[list[ReleaseData], list[Flag]]:
    """Each release through :func:`metric_view`, with every view's flags."""
    views, flags = [], []
    for data, t in zip(datas, tokens, strict=True):
        view, more = metric_view(data, metric, t)
        views.append(view)
        flags.extend(more)
    return views, flags


def _take(data: ReleaseData, keep: npt.NDArray[np.bool_], **changes: Any) -> ReleaseData:
    """``data``'s rows where ``keep``, with the given fields replaced."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(data):
        if f.name in changes:
            continue
        value = getattr(data, f.name)
        if isinstance(value, np.ndarray) and value.shape[:1] == (data.n,):
            fields[f.name] = value[keep]
    return dataclasses.replace(data, **fields, **changes)


def metric_view(data: ReleaseData, metric: str, tokens: Tokens) -> tuple[ReleaseData, list[Flag]]:
    """``data`` with ``metric`` as each request's latency and its split by stage.

    Raises :class:`QueryError` when no request of the release has what the metric needs.
    """
    if metric == E2E:
        return data, []
    queue, prefill, decode = (data.stage_column(s) for s in cv.LLM_STAGES)
    flags: list[Flag] = []
    stages = (*cv.LLM_STAGES, cv.UNATTRIBUTED)
    kinds = {s: data.time_kinds.get(s, cv.default_time_kind(s)) for s in stages}
    if metric == TTFT:
        derived = queue + prefill
        measured = tokens.ttft_ms
        staged = (queue > 0) | (prefill > 0)
        # A generation that ended before its first token (the client gave up in the
        # queue) has no time to first token, whatever its queue time.
        no_first = np.isfinite(tokens.output_tokens) & (tokens.output_tokens == 0)
        keep = (np.isfinite(measured) | staged) & ~no_first
        latency = np.where(np.isfinite(measured), np.maximum(measured, derived), derived)
        keep &= latency > 0
        both = keep & np.isfinite(measured) & staged & (measured > 0)
        if both.any():
            diff = np.abs(measured[both] - derived[both])
            gap = float(np.median(diff / measured[both]))
            if gap > TTFT_MISMATCH and float(np.median(diff)) > TTFT_MISMATCH_MS:
                flags.append(
                    Flag(
                        "ttft_mismatch",
                        f"{data.label}: the engine's time to first token and queue + prefill"
                        f" differ by {gap:.0%} in the median over {int(both.sum())} requests;"
                        " the rest of the engine's figure is unattributed",
                    )
                )
        crit = np.column_stack(
            [queue, prefill, np.zeros(data.n), np.maximum(latency - derived, 0.0)]
        )
        wall = np.column_stack(
            [_col(data, data.stage_wall_ms, s, 0.0) for s in cv.LLM_STAGES[:2]]
            + [np.zeros(data.n), crit[:, 3]]
        )
        cpu = np.column_stack(
            [_col(data, data.stage_cpu_ms, s, np.nan) for s in cv.LLM_STAGES[:2]]
            + [np.full(data.n, np.nan)] * 2
        )
        gpu = np.column_stack(
            [_col(data, data.stage_gpu_ms, s, np.nan) for s in cv.LLM_STAGES[:2]]
            + [np.full(data.n, np.nan)] * 2
        )
        need = "a queue or prefill stage, or gen_ai.latency.time_to_first_token"
    else:
        out = tokens.output_tokens
        gens = np.where(np.isfinite(tokens.generations), np.maximum(tokens.generations, 1), 1)
        after_first = out - gens
        keep = np.isfinite(out) & (after_first >= 1) & (decode > 0)
        per = np.where(keep, after_first, 1.0)
        latency = decode / per
        zeros, nans = np.zeros(data.n), np.full(data.n, np.nan)
        crit = np.column_stack([zeros, zeros, latency, zeros])
        wall = np.column_stack(
            [zeros, zeros, _col(data, data.stage_wall_ms, cv.DECODE, 0.0) / per, zeros]
        )
        cpu = np.column_stack(
            [nans, nans, _col(data, data.stage_cpu_ms, cv.DECODE, np.nan) / per, nans]
        )
        gpu = np.column_stack(
            [nans, nans, _col(data, data.stage_gpu_ms, cv.DECODE, np.nan) / per, nans]
        )
        need = "a decode stage and at least 2 output tokens (gen_ai.usage.completion_tokens)"
    if tokens.attributed:
        if metric == TPOT:
            raise QueryError(
                f"release {data.label!r}: --metric tpot needs the output token counts of the"
                " spans, which a store attributed in ClickHouse does not bring here; run it on"
                " the spans (tracekit ingest, or --store without `tracekit attribute`)"
            )
        flags.append(
            Flag(
                "ttft_from_stages",
                f"{data.label}: the store is attributed in ClickHouse, so the engine's own"
                " time to first token is not read: TTFT is queue + prefill",
            )
        )
    if not keep.any():
        raise QueryError(
            f"release {data.label!r}: no request has {need}, which --metric {metric} needs;"
            " see docs/llm.md for the spans it reads"
        )
    left = int((~keep).sum())
    if left:
        flags.append(
            Flag(
                "metric_requests_left_out",
                f"{data.label}: {left:,} of {data.n:,} requests have no {METRIC_NAMES[metric]}"
                f" (they lack {need}) and are left out",
            )
        )
    view = _take(
        data,
        keep,
        duration_ms=latency[keep],
        stages=stages,
        stage_ms=crit[keep],
        stage_wall_ms=wall[keep],
        stage_cpu_ms=cpu[keep],
        stage_gpu_ms=gpu[keep],
        time_kinds=kinds,
    )
    return view, flags


def _col(data: ReleaseData, m: FloatArray, stage: str, fill: float) -> FloatArray:
    if stage not in data.stages:
        return np.full(data.n, fill)
    return m[:, data.stages.index(stage)]


@dataclass(frozen=True)
class TokenSummary:
    """``summary``'s ``tokens``: the token latencies of a release that has them."""

    ttft_ms: dict[str, float] | None
    """``p50``, ``p95``, ``p99`` of time to first token (None without any)."""
    tpot_ms: dict[str, float] | None
    prompt_tokens_p50: float | None
    prompt_tokens_p95: float | None
    output_tokens_p50: float | None
    requests: int
    """Requests with a time to first token."""


def _quantiles(values: FloatArray, weights: FloatArray) -> dict[str, float] | None:
    ok = np.isfinite(values)
    if not ok.any():
        return None
    qs = weighted_quantiles(values[ok], [0.5, 0.95, 0.99], weights[ok])
    return {"p50": float(qs[0]), "p95": float(qs[1]), "p99": float(qs[2])}


def _q(values: FloatArray, weights: FloatArray, q: float) -> float | None:
    ok = np.isfinite(values)
    if not ok.any():
        return None
    return float(weighted_quantiles(values[ok], [q], weights[ok])[0])


def token_summary(data: ReleaseData, tokens: Tokens) -> TokenSummary | None:
    """TTFT and TPOT quantiles and token counts of ``data`` (e2e rows); None without any."""
    has_stages = any(s in data.stages for s in cv.LLM_STAGES)
    if not tokens.any and not has_stages:
        return None
    ttft = tpot = None
    ttft_n = 0
    try:
        t_view, _ = metric_view(data, TTFT, tokens)
        ttft, ttft_n = _quantiles(t_view.duration_ms, t_view.weights), t_view.n
    except QueryError:
        pass
    try:
        p_view, _ = metric_view(data, TPOT, tokens)
        tpot = _quantiles(p_view.duration_ms, p_view.weights)
    except QueryError:
        pass
    if ttft is None and tpot is None and not tokens.any:
        return None
    return TokenSummary(
        ttft_ms=ttft,
        tpot_ms=tpot,
        prompt_tokens_p50=_q(tokens.prompt_tokens, data.weights, 0.5),
        prompt_tokens_p95=_q(tokens.prompt_tokens, data.weights, 0.95),
        output_tokens_p50=_q(tokens.output_tokens, data.weights, 0.5),
        requests=ttft_n,
    )
