"""Attribute ranking: over-represented values in slow traces, noise attributes skipped."""

from __future__ import annotations

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request as attribution
from tracekit.analysis.cohorts.bubbleup import enrichment_p_value, rank_attributes, rank_rows
from tracekit.analysis.store import SPAN_COLUMNS, Store
from tracekit.testing import TraceBuilder


def load(store: Store, builder: TraceBuilder) -> None:
    columns = list(zip(*builder.rows(), strict=True))
    params = {f"c{i}": list(col) for i, col in enumerate(columns)}
    select = ", ".join(f"unnest($c{i})" for i in range(len(SPAN_COLUMNS)))
    store.con.execute(f"INSERT INTO spans ({', '.join(SPAN_COLUMNS)}) SELECT {select}", params)
    attribution.refresh(store, builder.trace_ids())


def test_rank_rows_needs_support_and_a_real_difference() -> None:
    rows = [
        ("a", "x", 8.0, 10.0, 8, 10),  # 80% vs 10%: ranked first
        ("b", "y", 2.0, 0.0, 2, 0),  # only 2 slow traces: below support
        ("c", "z", 5.0, 50.0, 5, 50),  # 50% vs 50%: no lift
        ("d", "w", 4.0, 0.0, 4, 0),  # 40% vs 0%: ranked, lift infinite
    ]
    ranked = rank_rows(rows, 10.0, 100.0)
    assert [(r.attribute, r.value) for r in ranked] == [("a", "x"), ("d", "w")]
    assert ranked[0].lift == 8.0 and ranked[1].lift == float("inf")


def test_rank_rows_drops_a_difference_that_chance_explains() -> None:
    rows = [
        ("e", "v", 4.0, 20.0, 4, 20),  # 40% vs 20% of 10 slow traces: p ≈ 0.15
        ("f", "u", 3.0, 37.5, 3, 38),  # 37.5% vs 19.5% of 8 slow traces: p ≈ 0.2
        ("a", "x", 8.0, 10.0, 8, 10),  # 80% vs 10%: p < 0.001
    ]
    assert [r.attribute for r in rank_rows(rows, 10.0, 100.0)] == ["a"]
    # the same shares over 10x the traces are no longer chance
    ranked = rank_rows([rows[0]], 10.0, 100.0, slow_traces=100, rest_traces=1000)
    assert [r.attribute for r in ranked] == ["e"]


def test_enrichment_p_value_is_fishers_one_sided_tail() -> None:
    # P(X >= 2), X ~ hypergeometric(N=6, K=3, n=3): (3*3 + 1) / 20
    assert abs(enrichment_p_value(2, 3, 1, 3) - 0.5) < 1e-12
    assert enrichment_p_value(0, 10, 5, 10) == 1.0
    assert enrichment_p_value(13, 20, 0, 180) < 1e-12


def test_finds_cache_miss_and_skips_ids_urls_and_common_values(store: Store) -> None:
    b = TraceBuilder(version="v1", seed=3)
    for i in range(200):
        slow = i % 10 == 0
        r = b.request(
            start_ms=i * 5.0,
            duration_ms=100.0 if slow else 20.0,
            service="ranker",
            # the load generator's ephemeral port happens to repeat among slow traces
            attributes={"user.id": f"u{i}", "enduser.tier": "gold", "client.port": 40000 + i % 2},
        )
        r.stage(
            cv.FEATURE_RETRIEVAL,
            start_ms=0,
            duration_ms=80.0 if slow else 5.0,
            attributes={cv.CACHE_HIT: not slow or i % 30 == 0},
        )
        r.stage(
            cv.DOWNSTREAM,
            start_ms=85.0 if slow else 6.0,
            duration_ms=5.0,
            attributes={cv.URL_FULL: f"http://pricing/item/{i}", cv.SERVER_ADDRESS: "pricing"},
        )
    load(store, b)
    ranked = rank_attributes(store, "v1", 100.0)
    keys = [(a.attribute, a.value) for a in ranked]
    assert keys[0] == (cv.CACHE_HIT, "false")
    assert ranked[0].slow_share > 0.5 and ranked[0].rest_share == 0.0
    assert all(attr not in {"user.id", cv.URL_FULL, "client.port"} for attr, _ in keys)
    assert all(value != "gold" for _, value in keys)  # everyone has it: no lift


def test_weak_difference_over_few_slow_traces_is_not_listed(store: Store) -> None:
    # 8 slow traces; shard=b on 3 of them (38%) and on a fifth of the rest (20%):
    # support and difference thresholds pass, but chance explains it.
    b = TraceBuilder(version="v1", seed=4)
    for i in range(200):
        slow = i % 25 == 0
        shard = "b" if (slow and (i // 25) % 3 == 0) or (not slow and i % 5 == 1) else "a"
        r = b.request(
            start_ms=i * 5.0, duration_ms=100.0 if slow else 20.0, attributes={"shard": shard}
        )
        r.stage(
            cv.FEATURE_RETRIEVAL,
            start_ms=0,
            duration_ms=80.0 if slow else 5.0,
            attributes={cv.CACHE_HIT: not slow},
        )
    load(store, b)
    ranked = rank_attributes(store, "v1", 100.0)
    assert [(a.attribute, a.value) for a in ranked] == [(cv.CACHE_HIT, "false")]
