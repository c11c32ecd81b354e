"""Patterns in one trace (n_plus_one, retry, timeout, error_origin) and their counts per release."""

from __future__ import annotations

import json
from pathlib import Path

from tracekit import conventions as cv
from tracekit.analysis.attribution.explain import Explanation, explain_trace
from tracekit.analysis.attribution.patterns import (
    ERROR_ORIGIN,
    N_PLUS_ONE,
    N_PLUS_ONE_MIN,
    RETRY,
    TIMEOUT,
    Pattern,
    release_patterns,
    round_limit,
)
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import Store
from tracekit.render.explain import render_json, render_markdown, render_table
from tracekit.testing import RequestBuilder, TraceBuilder


def _hotrod(store: Store, corpus_dir: Path, pattern: str) -> tuple[Explanation, dict]:
    name = f"otlp/jaegerv3_n_plus_one_full_{pattern}"
    manifest = json.loads((corpus_dir / f"{name}.manifest.json").read_text())
    ingest_paths(store, [corpus_dir / f"{name}.json"])
    return explain_trace(store, manifest["trace_id"]), manifest


def _kinds(e: Explanation, kind: str) -> list[Pattern]:
    return [p for p in e.patterns if p.kind == kind]


def _calls(r: RequestBuilder, starts_ms: list[float], dur_ms: float, **kw: object) -> None:
    for s in starts_ms:
        r.span("GET /price", start_ms=s, duration_ms=dur_ms, kind="CLIENT", **kw)  # type: ignore[arg-type]


# --- the real traces -------------------------------------------------------------------


def test_hotrod_serial_route_calls_are_an_n_plus_one(store: Store, corpus_dir: Path) -> None:
    e, manifest = _hotrod(store, corpus_dir, "serial")
    assert manifest["pattern_present"] is True
    found = {(p.span_id, p.service, p.operation): p.count for p in _kinds(e, N_PLUS_ONE)}
    assert found == {
        (manifest["expected"]["parent_span_id"], "route", "GET /route"): 10,
        ("f6e63a82f4597e0e", "redis-manual", "GetDriver"): 13,
    }
    redis = next(p for p in _kinds(e, N_PLUS_ONE) if p.operation == "GetDriver")
    assert redis.evidence.startswith(
        "13 serial calls of redis-manual GetDriver under driver driver.DriverService/FindNearest"
    )
    assert "205.7 ms on the path" in redis.evidence


def test_hotrod_concurrent_route_calls_are_not_an_n_plus_one(
    store: Store, corpus_dir: Path
) -> None:
    e, manifest = _hotrod(store, corpus_dir, "concurrent")
    assert manifest["pattern_present"] is False
    parent = manifest["expected"]["parent_span_id"]
    assert not [p for p in _kinds(e, N_PLUS_ONE) if p.span_id == parent]
    route = next(o for o in e.operations if o.operation == "GET /route")
    assert (route.calls, route.calls_on_path, route.serial) == (10, 4, False)
    # The manifest's note: the driver's 13 GetDriver calls are a genuine N+1 here too.
    assert [(p.service, p.operation, p.count) for p in _kinds(e, N_PLUS_ONE)] == [
        ("redis-manual", "GetDriver", 13)
    ]


def test_hotrod_redis_timeouts_are_retried_errors_that_hit_no_limit(
    store: Store, corpus_dir: Path
) -> None:
    # Three GetDriver calls fail ("redis timeout") after 29.4, 33.5 and 30.6 ms and are
    # each called again for the same driver: retries. They share no limit (no parent
    # fails, the three durations spread over 4 ms), and the request succeeds: nothing
    # masks them, so neither timeout nor error_origin is claimed.
    e, _ = _hotrod(store, corpus_dir, "serial")
    (retry,) = _kinds(e, RETRY)
    assert (retry.span_id, retry.operation, retry.count) == ("0efad7b97a83e062", "GetDriver", 3)
    assert "3 after a failed call (93.5 ms spent in failed calls)" in retry.evidence
    assert not _kinds(e, TIMEOUT) and not _kinds(e, ERROR_ORIGIN)
    redis = next(o for o in e.operations if o.operation == "GetDriver")
    assert (redis.calls, redis.errors, redis.serial, redis.stage) == (13, 3, True, cv.DOWNSTREAM)


# --- built edges -----------------------------------------------------------------------


def test_serial_calls_from_the_threshold_on_and_never_a_worker_pool(store: Store) -> None:
    b = TraceBuilder(seed=31)
    below = b.request(duration_ms=100)
    _calls(below, [10 * k for k in range(N_PLUS_ONE_MIN - 1)], 10)
    at = b.request(duration_ms=100)
    _calls(at, [10 * k for k in range(N_PLUS_ONE_MIN)], 10)  # back to back, touching
    pool = b.request(duration_ms=100)
    _calls(pool, [0, 1, 2, 30, 31, 32, 60, 61, 62, 90], 10)  # 3 workers
    loop = b.request(duration_ms=100)
    for k in range(8):  # the process's own work, not a call out
        loop.span("score item", start_ms=10 * k, duration_ms=10)
    b.load(store)
    assert not _kinds(explain_trace(store, below.trace_id), N_PLUS_ONE)
    (p,) = _kinds(explain_trace(store, at.trace_id), N_PLUS_ONE)
    assert (p.span_id, p.count) == (at.span_id, N_PLUS_ONE_MIN)
    fanout = explain_trace(store, pool.trace_id)
    assert not _kinds(fanout, N_PLUS_ONE)
    price = next(o for o in fanout.operations if o.operation == "GET /price")
    assert (price.calls, price.serial) == (10, False)
    assert not _kinds(explain_trace(store, loop.trace_id), N_PLUS_ONE)


def test_a_retry_after_a_timeout(store: Store) -> None:
    b = TraceBuilder(seed=32)
    r = b.request(duration_ms=1500)
    first = r.span("GET /price", start_ms=0, duration_ms=1000.4, kind="CLIENT", error=True)
    r.span(
        "GET /price", start_ms=1, duration_ms=1400, kind="SERVER", parent=first, service="pricing"
    )
    second = r.span("GET /price", start_ms=1001, duration_ms=100, kind="CLIENT")
    r.span(
        "GET /price", start_ms=1002, duration_ms=98, kind="SERVER", parent=second, service="pricing"
    )
    b.load(store)
    e = explain_trace(store, r.trace_id)
    (retry,) = _kinds(e, RETRY)
    assert (retry.span_id, retry.service, retry.operation, retry.count) == (
        first.span_id,
        "pricing",
        "GET /price",
        1,
    )
    (timeout,) = _kinds(e, TIMEOUT)
    assert timeout.span_id == first.span_id
    assert "ended at a 1000.0 ms limit while 1 child span(s) still ran" in timeout.evidence


def test_a_declared_resend_is_a_retry(store: Store) -> None:
    b = TraceBuilder(seed=33)
    r = b.request(duration_ms=100)
    r.span("GET /a", start_ms=0, duration_ms=10, kind="CLIENT")
    r.span(
        "GET /a",
        start_ms=20,
        duration_ms=10,
        kind="CLIENT",
        attributes={cv.HTTP_REQUEST_RESEND_COUNT: 1},
    )
    b.load(store)
    (retry,) = _kinds(explain_trace(store, r.trace_id), RETRY)
    assert retry.count == 1 and cv.HTTP_REQUEST_RESEND_COUNT in retry.evidence


def test_an_error_masked_by_a_proxy_timeout(store: Store) -> None:
    b = TraceBuilder(seed=34)
    r = b.request(duration_ms=3005, error=True)
    proxy = r.span("GET /quote", start_ms=1, duration_ms=3002, kind="CLIENT", error=True)
    backend = r.span(
        "GET /quote", start_ms=2, duration_ms=3998, kind="SERVER", parent=proxy, service="quotes"
    )
    select = r.span(
        "SELECT rates",
        start_ms=5,
        duration_ms=2800,
        kind="CLIENT",
        parent=backend,
        service="quotes",
        error=True,
    )
    b.load(store)
    e = explain_trace(store, r.trace_id)
    (origin,) = _kinds(e, ERROR_ORIGIN)
    assert (origin.span_id, origin.service, origin.operation, origin.count) == (
        select.span_id,
        "quotes",
        "SELECT rates",
        2,
    )
    assert "masked by 2 failing span(s) above it: ranker POST /predict, quotes GET /quote" in (
        origin.evidence
    )
    # The proxy timed out at 3 s; the request that also hit 3 s is not a second timeout.
    (timeout,) = _kinds(e, TIMEOUT)
    assert (timeout.span_id, timeout.operation) == (proxy.span_id, "GET /quote")


def test_of_two_failing_siblings_the_first_to_fail_is_the_origin(store: Store) -> None:
    b = TraceBuilder(seed=35)
    r = b.request(duration_ms=100, error=True)
    r.span("GET /a", start_ms=0, duration_ms=50, kind="CLIENT", error=True)
    early = r.span("GET /b", start_ms=10, duration_ms=20, kind="CLIENT", error=True)
    b.load(store)
    (origin,) = _kinds(explain_trace(store, r.trace_id), ERROR_ORIGIN)
    assert (origin.span_id, origin.operation, origin.count) == (early.span_id, "GET /b", 1)
    assert "failed at 30.0 ms" in origin.evidence


def test_a_slow_child_whose_parent_timed_out_takes_the_blame(store: Store) -> None:
    b = TraceBuilder(seed=36)
    r = b.request(duration_ms=1010, error=True)
    proxy = r.span("GET /quote", start_ms=0, duration_ms=1001, kind="CLIENT", error=True)
    slow = r.span(
        "GET /quote",
        start_ms=0.5,
        duration_ms=1000.3,
        kind="SERVER",
        parent=proxy,
        service="quotes",
    )
    r.span("SELECT ok", start_ms=1, duration_ms=20, kind="CLIENT", parent=slow, service="quotes")
    b.load(store)
    (origin,) = _kinds(explain_trace(store, r.trace_id), ERROR_ORIGIN)
    assert origin.span_id == slow.span_id and "status OK, ran 1000.3 ms" in origin.evidence
    assert "quotes GET /quote timed out after 1001.0 ms waiting on it" in origin.evidence


def test_round_limits() -> None:
    ms = 1_000_000
    assert round_limit(30_600_000) == 30 * ms and round_limit(29_400_000) is None
    assert round_limit(33_500_000) is None and round_limit(5 * ms) is None  # under 10 ms
    assert round_limit(2_503 * ms) == 2_500 * ms and round_limit(15_000 * ms) is None


def test_a_hostile_operation_name_is_escaped_in_every_format(store: Store) -> None:
    hostile = "GET /x\x1b[31m|<b>\u202e"
    b = TraceBuilder(seed=37)
    r = b.request(duration_ms=100)
    for k in range(N_PLUS_ONE_MIN):
        r.span(hostile, start_ms=10 * k, duration_ms=10, kind="CLIENT")
    b.load(store)
    e = explain_trace(store, r.trace_id)
    assert _kinds(e, N_PLUS_ONE) and e.operations[0].operation == hostile
    table, md = render_table(e), render_markdown(e)
    for text in (table, md):
        assert "\x1b" not in text and "\u202e" not in text and "\\x1b[31m" in text
    row = next(line for line in md.splitlines() if line.startswith("| downstream | ranker |"))
    assert "\\|<b>" in row and row.count("|") - row.count("\\|") == 9
    doc = json.loads(render_json(e))
    assert doc["operations"][0]["operation"] == hostile
    assert doc["patterns"][0]["operation"] == hostile


# --- in a release ----------------------------------------------------------------------


def test_release_counts_traces_and_findings(store: Store) -> None:
    b = TraceBuilder(seed=38, version="v1")
    ids = []
    for k in range(3):
        r = b.request(start_ms=1000 * k, duration_ms=100)
        if k < 2:
            _calls(r, [10 * j for j in range(N_PLUS_ONE_MIN)], 10)
        ids.append(r.trace_id)
    b.load(store)
    got = release_patterns(store, "v1")
    assert (got.examined, got.available) == (3, 3)
    (kind,) = got.kinds
    assert (kind.kind, kind.traces, kind.occurrences) == (N_PLUS_ONE, 2, 2)
    assert abs(kind.share - 2 / 3) < 1e-9
    (op,) = got.operations
    assert (op.service, op.operation) == ("ranker", "GET /price")
    tail = release_patterns(store, "v1", ids[1:], limit=1)
    assert (tail.examined, tail.available) == (1, 2)
    assert release_patterns(store, "v1", ids[1:], limit=1) == tail  # deterministic
    assert release_patterns(store, "v9").examined == 0


def test_a_retry_after_an_http_error_the_status_left_unset(store: Store) -> None:
    b = TraceBuilder(seed=37)
    r = b.request(duration_ms=100)
    code = cv.HTTP_RESPONSE_STATUS_CODE
    first = r.span("GET /a", start_ms=0, duration_ms=10, kind="CLIENT", attributes={code: 429})
    r.span("GET /a", start_ms=20, duration_ms=10, kind="CLIENT", attributes={code: 200})
    b.load(store)
    e = explain_trace(store, r.trace_id)
    (retry,) = _kinds(e, RETRY)
    assert (retry.span_id, retry.count) == (first.span_id, 1)
    assert next(o for o in e.operations if o.operation == "GET /a").errors == 1
