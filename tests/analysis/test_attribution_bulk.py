"""The vectorised attribution (bulk.analyse_all, what refresh runs) against the reference.

critical_path.analyse_trace is the pure-Python walk tracekit shipped first; it stays
as the reference. Every trace of the shared corpus, of the builder's demo-shaped
requests and of a few thousand random trees (skew, orphans, batch spans, missing
timestamps, cycles, traces without any tracekit.stage) must come out of ``refresh``
exactly as the reference computes it trace by trace.
"""

from __future__ import annotations

import json
import random
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import critical_path as cp
from tracekit.analysis.attribution import per_request
from tracekit.analysis.attribution.operations import request_operations
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import SPAN_COLUMNS, Store
from tracekit.testing import TraceBuilder, worked_example


def reference(store: Store) -> tuple[dict[str, Any], dict[str, int]]:
    """Per trace, what the Python walk makes of it; plus the refresh tallies."""
    c = per_request.fetch_spans(store, None)
    out: dict[str, Any] = {}
    tally = {"batch": 0, "no_ts": 0, "no_root": 0, "attached": 0, "dropped": 0, "skew": 0}
    for lo, hi in per_request.trace_bounds(c["trace_id"]):
        t = per_request.trace_input(c, lo, hi)
        a = cp.analyse_trace(t)
        if a == cp.SKIP_BATCH:
            tally["batch"] += 1
        elif a == cp.SKIP_NO_TIMESTAMPS:
            tally["no_ts"] += 1
        elif a == cp.SKIP_NO_ROOT:
            tally["no_root"] += 1
        if isinstance(a, str):
            continue
        tally["attached"] += a.orphans_attached
        tally["dropped"] += a.orphans_dropped
        tally["skew"] += a.skewed_spans
        stages = sorted(
            (s.stage, s.time_kind, s.critical_ns, s.wall_ns, s.cpu_time_ns, s.gpu_time_ns)
            for s in a.stages
        )
        ops = [astuple(row) for row in request_operations(t, a)]
        out[c["trace_id"][lo]] = (
            t.span_id[a.root],
            a.start_ns,
            a.duration_ns,
            hi - lo,
            a.skewed_spans,
            stages,
            ops,
        )
    return out, tally


def stored(store: Store) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for row in store.run(
        "SELECT trace_id, root_span_id, start_ns, duration_ns, span_count, skewed_spans "
        "FROM requests"
    ):
        out[row[0]] = [*row[1:], [], []]
    for tid, *rest in store.run(
        "SELECT trace_id, stage, time_kind, critical_ns, wall_ns, cpu_time_ns, gpu_time_ns "
        "FROM request_stages"
    ):
        out[tid][-2].append(tuple(rest))
    for tid, *rest in store.run(
        "SELECT trace_id, stage, service, operation, critical_ns, calls, calls_on_path, "
        "overlapping, errors FROM request_operations"
    ):
        out[tid][-1].append(tuple(rest))
    return {k: (*v[:-2], sorted(v[-2]), sorted(v[-1])) for k, v in out.items()}


def assert_same(store: Store) -> per_request.RefreshReport:
    report = per_request.refresh(store)
    want, tally = reference(store)
    got = stored(store)
    assert got == want
    assert (
        report.batch_traces,
        report.skipped_no_timestamps,
        report.skipped_no_root,
        report.orphans_attached,
        report.orphans_dropped,
        report.skewed_spans,
    ) == tuple(tally.values())
    for _, _, duration, _, _, stages, ops in got.values():
        assert sum(s[2] for s in stages) == duration
        # the operations split the same path: per stage, they add up to it exactly
        by_stage: dict[str, int] = {}
        for stage, *_, crit, _calls, _on, _over, _err in ops:
            by_stage[stage] = by_stage.get(stage, 0) + crit
        assert {k: v for k, v in by_stage.items() if v} == {s[0]: s[2] for s in stages if s[2]}
    return report


def test_corpus_traces_attribute_as_the_reference_does(store: Store, corpus_dir: Path) -> None:
    files = [p for p in sorted(corpus_dir.rglob("*.json*")) if "manifest" not in p.name]
    ingest_paths(store, files)
    report = assert_same(store)
    assert report.requests >= 10


def test_demo_shaped_requests_attribute_as_the_reference_does(store: Store) -> None:
    b = TraceBuilder(service="ranker", version="v1", seed=3)
    for k in range(40):
        worked_example(b, start_ms=k * 200.0)
    b.load(store)
    assert_same(store)


_REF = "opentracing.ref_type"
_STAGE_CHOICES = [None, None, None, cv.PREPROCESS, cv.MODEL_EXECUTE, cv.DOWNSTREAM, "custom"]
_KIND_CHOICES = ["SERVER", "SERVER", "INTERNAL", "CLIENT", "CLIENT", "PRODUCER", "CONSUMER"]
_CLIENT_ATTRS: list[dict[str, Any]] = [
    {cv.SERVER_ADDRESS: "pricing", cv.SERVER_PORT: 8080, cv.URL_TEMPLATE: "/price/{sku}"},
    {cv.HTTP_REQUEST_METHOD: "GET", cv.URL_FULL: "http://0.0.0.0:8081/customer?customer=567"},
    {cv.HTTP_REQUEST_METHOD: "GET", cv.URL_FULL: "http://0.0.0.0:8081/customer?customer=12"},
    {cv.SERVER_ADDRESS: "db", cv.HTTP_REQUEST_METHOD: "POST"},
    {cv.URL_FULL: "not a url [::"},
]


def _random_rows(rnd: random.Random, trace_no: int) -> list[tuple[Any, ...]]:
    n = rnd.randint(1, 14)
    tid = f"{trace_no:032x}"
    ids = [f"{rnd.getrandbits(64):016x}" for _ in range(n)]
    fallback = rnd.random() < 0.25
    # time units around the walk's back-to-back tolerance: overlaps within it, beyond it
    unit = rnd.choice([1, cp.BACK_TO_BACK_NS // 4, cp.BACK_TO_BACK_NS, 10 * cp.BACK_TO_BACK_NS])
    rows = []
    for i in range(n):
        if i == 0:
            parent = None if rnd.random() < 0.9 else ids[-1]  # sometimes a cycle
        elif rnd.random() < 0.12:
            parent = None if rnd.random() < 0.5 else f"{rnd.getrandbits(64):016x}"
        else:
            parent = ids[rnd.randrange(i)]
        start = rnd.randint(0, 60) if i else 0
        end = start + rnd.choice([0, rnd.randint(0, 40), rnd.randint(0, 120)])
        if rnd.random() < 0.05:
            end = start - rnd.randint(1, 5)
        start, end = start * unit + rnd.randint(0, 2), end * unit
        links = []
        if rnd.random() < 0.08 and parent is not None:  # FOLLOWS_FROM, as the Collector has it
            links.append({"trace_id": tid, "span_id": parent, "attributes": {_REF: "follows_from"}})
        if rnd.random() < 0.08:  # a link into the trace (reaches the span only if parentless)
            links.append({"trace_id": tid, "span_id": rnd.choice(ids), "attributes": {}})
        if rnd.random() < 0.04:  # a link elsewhere, or a child_of one: no matter
            other = rnd.choice([f"{trace_no + 1:032x}", tid])
            ref = {_REF: "child_of"} if other == tid else {}
            links.append({"trace_id": other, "span_id": rnd.choice(ids), "attributes": ref})
        no_ts = rnd.random() < 0.01
        stage = None if fallback else rnd.choice(_STAGE_CHOICES)
        batch = rnd.random() < 0.04
        attrs: dict[str, Any] = {}
        if batch:
            attrs[cv.BATCH_REQUEST_COUNT] = 2
        if rnd.random() < 0.2:
            attrs[cv.HTTP_ROUTE] = rnd.choice(["/a/123", "/b", "/users/7f3e9a0b12"])
        if rnd.random() < 0.05:
            attrs[cv.DB_SYSTEM] = "redis"
        if rnd.random() < 0.3:  # what a CLIENT span calls when no SERVER span answers
            attrs.update(rnd.choice(_CLIENT_ATTRS))
        if rnd.random() < 0.3:  # a failure the status may leave unset (span_failed)
            attrs[cv.HTTP_RESPONSE_STATUS_CODE] = rnd.choice([200, 404, 500, "503", "x"])
        rows.append(
            (
                tid,
                ids[i],
                parent,
                rnd.choice(["op", "GET /x", "handler 42", "GET /x/77"]),
                rnd.choice(_KIND_CHOICES),
                None if no_ts else start,
                None if no_ts else end,
                rnd.choice(["UNSET", "UNSET", "OK", "ERROR"]),
                rnd.choice(["svc", "svc", "other", None, ""]),
                "v1",
                None,
                None,
                stage,
                rnd.choice([None, cv.WAIT, cv.COMPUTE, "bogus"]),
                rnd.choice([None, rnd.randint(0, 50)]),
                rnd.choice([None, None, rnd.randint(0, 50)]),
                1.0,
                json.dumps(attrs),
                "{}",
                json.dumps(links) if links else rnd.choice([None, "[]"]),
                "random",
            )
        )
    return rows


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_random_trees_attribute_as_the_reference_does(store: Store, seed: int) -> None:
    rnd = random.Random(seed)
    rows = [r for k in range(700) for r in _random_rows(rnd, seed * 10_000 + k)]
    assert len(SPAN_COLUMNS) == len(rows[0])
    store.insert_spans(rows)
    report = assert_same(store)
    assert report.requests > 300 and report.fallback_traces > 50


def test_a_partial_refresh_keeps_other_traces(store: Store) -> None:
    rnd = random.Random(9)
    rows = [r for k in range(50) for r in _random_rows(rnd, k)]
    store.insert_spans(rows)
    per_request.refresh(store)
    before = stored(store)
    some = sorted(before)[:10]
    per_request.refresh(store, some)
    assert stored(store) == before


def test_refresh_in_batches_of_traces_writes_what_one_batch_does(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    rnd = random.Random(4)
    store.insert_spans([r for k in range(120) for r in _random_rows(rnd, k)])
    per_request.refresh(store)
    whole = stored(store)
    monkeypatch.setattr(per_request, "REFRESH_TRACES", 17)
    report = per_request.refresh(store)
    assert stored(store) == whole and report.requests == len(whole)
    ids = sorted(whole)[:50]
    per_request.refresh(store, ids)
    assert stored(store) == whole


def test_the_reference_type_is_the_jaeger_readers() -> None:
    from tracekit.analysis.ingest.jaeger import REF_TYPE_ATTR

    assert _REF == REF_TYPE_ATTR


def _path_ms(store: Store) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for tid, stage, crit in store.run("SELECT trace_id, stage, critical_ns FROM request_stages"):
        if crit:
            out.setdefault(tid, {})[stage] = crit / 1e6
    return out


def test_edge_traces_built_for_each_rule_attribute_as_the_reference_does(store: Store) -> None:
    b = TraceBuilder(service="api", version="v1", seed=11)
    tol_ms = cp.BACK_TO_BACK_NS / 1e6
    got: dict[str, dict[str, float]] = {}

    def back_to_back(overlap_ms: float) -> str:
        r = b.request(duration_ms=100)
        r.stage(cv.BATCH_QUEUE, start_ms=0, duration_ms=50 + overlap_ms)
        r.stage(cv.MODEL_EXECUTE, start_ms=50, duration_ms=50)
        return r.trace_id

    within, beyond = back_to_back(tol_ms), back_to_back(2 * tol_ms)
    # a message: produced in preprocess, consumed (and worked on) by another service
    r = b.request(duration_ms=100)
    pre = r.stage(cv.PREPROCESS, start_ms=0, duration_ms=30)
    send = r.span("send", start_ms=20, duration_ms=5, kind="PRODUCER", parent=pre)
    handle = r.span(
        "handle", start_ms=24, duration_ms=90, kind="CONSUMER", parent=send, service="worker"
    )
    r.stage(cv.MODEL_EXECUTE, start_ms=30, duration_ms=60, parent=handle)
    r.stage(cv.POSTPROCESS, start_ms=30, duration_ms=40)
    message = r.trace_id
    # follows-from: an audit write the request started but did not wait for
    r = b.request(duration_ms=100)
    a = r.stage(cv.PREPROCESS, start_ms=0, duration_ms=40)
    audit = r.span("audit", start_ms=35, duration_ms=60, parent=a, follows_from=True)
    r.span("audit write", start_ms=40, duration_ms=50, parent=audit)
    follows = r.trace_id
    # a parentless span in the trace, reached only by a link to the request
    r = b.request(duration_ms=100)
    r.stage(cv.PREPROCESS, start_ms=0, duration_ms=20)
    r.span("callback", start_ms=30, duration_ms=60, parentless=True, links=[r], stage="custom")
    linked = r.trace_id
    b.load(store)
    assert_same(store)
    got = _path_ms(store)
    assert got[within] == {cv.BATCH_QUEUE: 50, cv.MODEL_EXECUTE: 50}
    assert got[beyond] == {cv.UNATTRIBUTED: 50, cv.MODEL_EXECUTE: 50}
    assert got[message] == {cv.PREPROCESS: 30, cv.POSTPROCESS: 40, cv.UNATTRIBUTED: 30}
    assert got[follows] == {cv.PREPROCESS: 40, cv.UNATTRIBUTED: 60}
    assert got[linked] == {cv.PREPROCESS: 20, cv.UNATTRIBUTED: 80}
    # what the request did not wait for is not its time at all: no wall, not skew
    stages = {s for (s,) in store.run("SELECT stage FROM request_stages")}
    assert cv.MODEL_EXECUTE in stages and "custom" not in stages
    assert store.run(
        "SELECT count(*) FROM request_stages WHERE trace_id = ? AND stage = ?",
        [message, cv.MODEL_EXECUTE],
    ) == [(0,)]
    assert store.run("SELECT sum(skewed_spans) FROM requests") == [(0,)]
