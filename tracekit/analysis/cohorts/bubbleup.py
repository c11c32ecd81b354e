"""Attribute values over-represented in slow traces (a BubbleUp, as in Honeycomb).

For one release, every request is *slow* (duration at or above a threshold) or *rest*.
Each trace contributes the set of ``attribute=value`` pairs found on any of its spans
(span attributes of every span in the trace, the downstream service's included) plus
the entry service's ``host.name`` and ``service.instance.id``. A value's *slow share*
is the weighted fraction of slow traces that carry it; *rest share* the same over the
rest. Values are ranked by ``slow_share − rest_share``.

A value is listed only when it occurs in at least :data:`MIN_SLOW_COUNT` slow traces,
its share difference is at least :data:`MIN_SHARE_DIFFERENCE`, and the difference is
significant: a one-sided Fisher exact test (hypergeometric tail, computed in log space)
of "slow traces carry it more often than the rest" at p < :data:`MAX_P_VALUE`. The test
counts traces: the weighted shares times the traces actually seen in each cohort, so a
26% vs 20% difference over 8 slow traces (chance) is not listed, while 60% vs 0% over
20 is. The test runs only on the few rows that pass the cheap thresholds.

One SQL aggregation does the work (``json_each`` over the attributes JSON, one
DISTINCT per trace, one GROUP BY). Parsing the JSON is the cost, so when the rest holds
more than :data:`MAX_REST_TRACES` traces a deterministic hash sample of it (every slow
trace is kept) estimates the rest shares: with 20,000 traces a share's standard error
is under 0.004, far below the 0.05 difference a value needs to be ranked.

Skipped, because a value per trace says nothing about a cohort: attributes with more
than :data:`MAX_CARDINALITY` distinct values in the release, ids, timestamps, URLs,
nanosecond measurements, and the request-level load signals (autoscale's business).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tracekit import conventions as cv
from tracekit.analysis.cohorts.release import NS_PER_MS
from tracekit.analysis.store import Store

MAX_CARDINALITY = 50
MIN_SLOW_COUNT = 3
"""A value must occur in at least this many slow traces to be ranked."""
MIN_SHARE_DIFFERENCE = 0.05
MAX_P_VALUE = 0.05
"""One-sided significance level of the slow-vs-rest test a listed value must pass."""
TOP = 10
MAX_REST_TRACES = 20_000
_HASH_BUCKETS = 1_000_000

SKIPPED_ATTRIBUTES: tuple[str, ...] = (
    cv.URL_FULL,
    cv.BATCH_ID,
    cv.BATCH_REQUEST_COUNT,
    cv.SAMPLE_WEIGHT,
    cv.CPU_TIME_NS,
    cv.GPU_TIME_NS,
    cv.QUEUE_FILL_WAIT_NS,
    cv.QUEUE_WORKER_WAIT_NS,
    cv.INFLIGHT,
    cv.QUEUE_DEPTH,
    cv.CPU_UTILIZATION,
    cv.GPU_UTILIZATION,
)
"""Attributes never ranked, whatever their cardinality."""

SKIPPED_PATTERN = (
    r"(^|[._])(id|ids|uuid|time|timestamp|url|uri|query)$|_ns$|(^|\.)(trace|span)_?id"
    r"|(^|\.)(client|peer)\.port$"
)
"""Key shapes that name identifiers, clocks, URLs or ephemeral ports (``user.id``,
``db.query``, ``*_ns``, ``client.port``)."""

_REQ_CTE = """
WITH req AS (
    SELECT trace_id, sample_weight AS w, {slow} AS slow,
           host_name, instance_id
    FROM requests
    WHERE coalesce(release, '') = $release AND ($service IS NULL OR service_name = $service)
      AND ($route IS NULL OR route = $route OR name = $route)
      AND ({slow} OR hash(trace_id) % $buckets < $keep){kept}
)"""
_SLOW_BY_DURATION = "duration_ns >= $threshold_ns"
_SLOW_BY_IDS = "trace_id IN (SELECT trace_id FROM _tk_slow_ids)"
"""Slow by another latency than the duration (``--metric ttft``): the tail's trace ids."""
_KEPT_IDS = "\n      AND trace_id IN (SELECT trace_id FROM _tk_kept_ids)"
"""...and the requests that latency exists for (the rest is compared among them only)."""

PROMPT_BINS: tuple[tuple[float, str], ...] = (
    (512, "≤512"),
    (1024, "513–1024"),
    (2048, "1025–2048"),
    (4096, "2049–4096"),
    (8192, "4097–8192"),
)
"""Upper bound and label of each prompt-length bin; longer prompts are ``>8192``."""
PROMPT_BIN_KEY = "gen_ai.usage.prompt_tokens (binned)"
"""The ranked attribute that says which prompt lengths the slow requests have."""


def _prompt_bin_sql() -> str:
    tokens = (
        f"coalesce(TRY_CAST(json_extract_string(s.attributes, '$.\"{cv.GEN_AI_USAGE_PROMPT_TOKENS}\"')"
        f" AS DOUBLE), TRY_CAST(json_extract_string(s.attributes,"
        f" '$.\"{cv.GEN_AI_USAGE_INPUT_TOKENS}\"') AS DOUBLE))"
    )
    cases = " ".join(f"WHEN t <= {bound:g} THEN '{label}'" for bound, label in PROMPT_BINS)
    return f"""
    UNION
    SELECT DISTINCT trace_id, '{PROMPT_BIN_KEY}', CASE {cases} ELSE '>8192' END
    FROM (SELECT s.trace_id, {tokens} AS t FROM spans s JOIN req r ON s.trace_id = r.trace_id)
    WHERE t IS NOT NULL AND t >= 0"""


_SQL = (
    _REQ_CTE
    + """,
pairs AS (
    {span_pairs}
    {prompt_bins}
    UNION
    SELECT trace_id, $host_key, host_name FROM req WHERE host_name IS NOT NULL
    UNION
    SELECT trace_id, $instance_key, instance_id FROM req WHERE instance_id IS NOT NULL
),
tagged AS (
    SELECT p.attribute, p.value, r.slow, r.w
    FROM pairs p JOIN req r ON p.trace_id = r.trace_id
),
narrow AS (
    SELECT attribute FROM tagged GROUP BY attribute
    HAVING count(DISTINCT value) <= $max_cardinality
)
SELECT t.attribute, t.value,
       coalesce(sum(t.w) FILTER (WHERE t.slow), 0) AS slow_w,
       coalesce(sum(t.w) FILTER (WHERE NOT t.slow), 0) AS rest_w,
       count(*) FILTER (WHERE t.slow) AS slow_n,
       count(*) FILTER (WHERE NOT t.slow) AS rest_n
FROM tagged t SEMI JOIN narrow n ON t.attribute = n.attribute
GROUP BY t.attribute, t.value
"""
)

SPAN_PAIRS = """
    SELECT DISTINCT s.trace_id, j.key AS attribute, j.value ->> '$' AS value
    FROM spans s JOIN req r ON s.trace_id = r.trace_id, json_each(s.attributes) j
    WHERE j.type IN ('VARCHAR', 'BOOLEAN', 'BIGINT', 'UBIGINT', 'DOUBLE')
      AND NOT list_contains($skipped, j.key)
      AND NOT regexp_matches(j.key, $skipped_pattern)"""
"""Each request's distinct rankable (attribute, value) pairs, from its spans. The same
pairs written once per request (``tracekit attribute``'s ``request_attributes``) are read
instead where a store has them and no span."""

ATTRIBUTED_PAIRS = """
    SELECT DISTINCT a.trace_id, a.attribute, a.value
    FROM request_attributes a JOIN req r ON a.trace_id = r.trace_id
    WHERE NOT list_contains($skipped, a.attribute)
      AND NOT regexp_matches(a.attribute, $skipped_pattern)"""


_IDS_SQL = _REQ_CTE + "\nSELECT trace_id FROM req ORDER BY trace_id"

_TOTALS_SQL = (
    _REQ_CTE
    + """
SELECT coalesce(sum(w) FILTER (WHERE slow), 0), coalesce(sum(w) FILTER (WHERE NOT slow), 0),
       count(*) FILTER (WHERE NOT slow), count(*) FILTER (WHERE slow)
FROM req
"""
)


@dataclass(frozen=True)
class AttributeLift:
    """One attribute value and how much more often slow traces carry it."""

    attribute: str
    value: str
    slow_share: float
    """Weighted fraction of slow traces with this value (0..1)."""
    rest_share: float
    """Weighted fraction of the other traces with this value (0..1)."""
    lift: float
    """slow_share / rest_share (infinite, written as null, when the rest never has it)."""
    slow_count: int
    """Slow traces (not weighted) with this value."""
    rest_count: int


def pair_parameters() -> dict[str, object]:
    """The parameters :data:`SPAN_PAIRS` needs beside ``req``'s."""
    return {"skipped": list(SKIPPED_ATTRIBUTES), "skipped_pattern": SKIPPED_PATTERN}


def rank_attributes(
    store: Store,
    release: str,
    threshold_ms: float,
    *,
    service: str | None = None,
    route: str | None = None,
    top: int = TOP,
    slow_ids: list[str] | None = None,
    kept_ids: list[str] | None = None,
) -> list[AttributeLift]:
    """Values over-represented in requests of ``release`` at or above ``threshold_ms``
    (or, given ``slow_ids``, in those traces: the tail of another latency than the
    duration, compared with the rest of ``kept_ids``, the requests that latency exists
    for). Prompt lengths are ranked in bins (:data:`PROMPT_BINS`)."""
    if slow_ids is None:
        return _rank(store, release, threshold_ms, _SLOW_BY_DURATION, "", service, route, top)
    store.register_rows("_tk_slow_ids", ("trace_id",), [(t,) for t in slow_ids])
    kept = ""
    if kept_ids is not None:
        store.register_rows("_tk_kept_ids", ("trace_id",), [(t,) for t in kept_ids])
        kept = _KEPT_IDS
    try:
        return _rank(store, release, threshold_ms, _SLOW_BY_IDS, kept, service, route, top)
    finally:
        store.con.unregister("_tk_slow_ids")
        if kept_ids is not None:
            store.con.unregister("_tk_kept_ids")


def _rank(
    store: Store,
    release: str,
    threshold_ms: float,
    slow: str,
    kept: str,
    service: str | None,
    route: str | None,
    top: int,
) -> list[AttributeLift]:
    params: dict[str, object] = {
        "release": release,
        "service": service,
        "route": route,
        "threshold_ns": int(round(threshold_ms * NS_PER_MS)),
        "buckets": _HASH_BUCKETS,
        "keep": _HASH_BUCKETS,
    }
    if slow != _SLOW_BY_DURATION:
        del params["threshold_ns"]  # DuckDB refuses a parameter the query does not use
    totals_sql = _TOTALS_SQL.replace("{slow}", slow).replace("{kept}", kept)
    totals = store.con.execute(totals_sql, params).fetchone()
    if totals is None or float(totals[0]) <= 0:
        return []
    if int(totals[2]) > MAX_REST_TRACES:
        params["keep"] = int(_HASH_BUCKETS * MAX_REST_TRACES / int(totals[2]))
        totals = store.con.execute(totals_sql, params).fetchone()
        if totals is None:
            return []
    slow_total, rest_total = float(totals[0]), float(totals[1])
    rest_traces, slow_traces = int(totals[2]), int(totals[3])
    attributed = getattr(store, "attributed", False)
    if attributed and store.load_pairs is not None:  # type: ignore[attr-defined]
        # Only the requests ranked below leave the engine for their attribute pairs.
        ids_sql = _IDS_SQL.replace("{slow}", slow).replace("{kept}", kept)
        ids = [str(r[0]) for r in store.con.execute(ids_sql, params).fetchall()]
        store.load_pairs(ids)  # type: ignore[attr-defined]
    pairs = ATTRIBUTED_PAIRS if attributed else SPAN_PAIRS
    rows = store.con.execute(
        _SQL.replace("{span_pairs}", pairs)
        .replace("{prompt_bins}", "" if attributed else _prompt_bin_sql())
        .replace("{slow}", slow)
        .replace("{kept}", kept),
        {
            **params,
            **pair_parameters(),
            "host_key": cv.HOST_NAME,
            "instance_key": cv.SERVICE_INSTANCE_ID,
            "max_cardinality": MAX_CARDINALITY,
        },
    ).fetchall()
    return rank_rows(
        rows, slow_total, rest_total, slow_traces=slow_traces, rest_traces=rest_traces, top=top
    )


def rank_rows(
    rows: list[tuple[str, str, float, float, int, int]],
    slow_total: float,
    rest_total: float,
    *,
    slow_traces: int | None = None,
    rest_traces: int | None = None,
    top: int = TOP,
) -> list[AttributeLift]:
    """Rank aggregated (attribute, value, slow_w, rest_w, slow_n, rest_n) rows.

    ``slow_traces``/``rest_traces``: traces (not weighted) in each cohort, for the
    significance test; default the weighted totals (right when every weight is 1).
    """
    n_slow = round(slow_total) if slow_traces is None else slow_traces
    n_rest = round(rest_total) if rest_traces is None else rest_traces
    out = []
    for attribute, value, slow_w, rest_w, slow_n, rest_n in rows:
        slow_share = float(slow_w) / slow_total
        rest_share = float(rest_w) / rest_total if rest_total > 0 else 0.0
        if int(slow_n) < MIN_SLOW_COUNT or slow_share - rest_share < MIN_SHARE_DIFFERENCE:
            continue
        p = enrichment_p_value(
            round(slow_share * n_slow), n_slow, round(rest_share * n_rest), n_rest
        )
        if p >= MAX_P_VALUE:
            continue
        lift = slow_share / rest_share if rest_share > 0 else float("inf")
        out.append(
            AttributeLift(
                attribute=str(attribute),
                value=str(value),
                slow_share=slow_share,
                rest_share=rest_share,
                lift=lift,
                slow_count=int(slow_n),
                rest_count=int(rest_n),
            )
        )
    out.sort(key=lambda a: (-(a.slow_share - a.rest_share), -a.slow_count, a.attribute, a.value))
    return out[:top]


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def enrichment_p_value(slow_with: int, slow_n: int, rest_with: int, rest_n: int) -> float:
    """One-sided Fisher exact p-value that slow traces carry a value more often than the
    rest: P(X ≥ slow_with) for X hypergeometric (all traces, those with the value, slow
    traces drawn). Summed in log space, so 20,000-trace cohorts cost no big integers."""
    total, having = slow_n + rest_n, slow_with + rest_with
    if slow_n <= 0 or rest_n <= 0 or slow_with <= 0:
        return 1.0
    hi = min(slow_n, having)
    log_denominator = _log_comb(total, slow_n)
    p = 0.0
    for k in range(slow_with, hi + 1):
        term = math.exp(
            _log_comb(having, k) + _log_comb(total - having, slow_n - k) - log_denominator
        )
        p += term
        # Past the mode the terms only shrink: stop once they no longer matter.
        if term < 1e-12 * p:
            break
    return min(p, 1.0)
