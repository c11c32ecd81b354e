"""critical_path.analyse_trace: the walk's edge cases, Jaeger UI's own test traces, and
the HotROD captures, against a port of Jaeger UI's walk (:func:`jaeger_ui`, at the end)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit import conventions as cv
from tracekit.analysis.attribution import critical_path as cp
from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import Store


def trace(
    *spans: tuple[str, str | None, int, int, str | None],
    kinds: dict[str, str] | None = None,
    follows: tuple[str, ...] = (),
) -> cp.TraceInput:
    """Spans as (id, parent, start, end, stage); everything else plain.

    ``kinds``: span kinds by id (default SERVER for the first, INTERNAL for the rest);
    ``follows``: ids tied to the trace only by FOLLOWS_FROM or a link.
    """
    n = len(spans)
    kind = ["SERVER"] + ["INTERNAL"] * (n - 1)
    for i, s in enumerate(spans):
        kind[i] = (kinds or {}).get(s[0], kind[i])
    return cp.TraceInput(
        span_id=[s[0] for s in spans],
        parent=[s[1] for s in spans],
        name=[s[0] for s in spans],
        kind=kind,
        start=[s[2] for s in spans],
        end=[s[3] for s in spans],
        service=["svc"] * n,
        stage=[s[4] for s in spans],
        time_kind=[None] * n,
        cpu_ns=[None] * n,
        gpu_ns=[None] * n,
        is_batch=[False] * n,
        is_db=[False] * n,
        route=[None] * n,
        follows=[s[0] in follows for s in spans],
    )


def totals(a: cp.TraceAnalysis | str) -> dict[str, int]:
    assert isinstance(a, cp.TraceAnalysis)
    got = {s.stage: s.critical_ns for s in a.stages if s.critical_ns}
    assert sum(got.values()) == a.duration_ns
    assert sum(a.critical_ns) == a.duration_ns
    return got


def test_deep_chain_walks_without_recursion() -> None:
    depth = 5000
    spans = [("r", None, 0, 2 * depth, None)]
    for i in range(1, depth):
        spans.append((f"s{i}", spans[-1][0], i, 2 * depth - i, cv.PREPROCESS if i == 1 else None))
    a = cp.analyse_trace(trace(*spans))
    assert totals(a) == {cv.UNATTRIBUTED: 2, cv.PREPROCESS: 2 * depth - 2}
    assert isinstance(a, cp.TraceAnalysis) and max(a.depth) == depth - 1


def test_back_to_back_children_are_all_on_the_path() -> None:
    a = cp.analyse_trace(
        trace(
            ("r", None, 0, 30, None),
            ("a", "r", 0, 10, "x"),
            ("b", "r", 10, 20, "y"),
            ("c", "r", 20, 30, "z"),
        )
    )
    assert totals(a) == {"x": 10, "y": 10, "z": 10}


def test_of_children_ending_together_the_longer_one_is_taken() -> None:
    a = cp.analyse_trace(
        trace(("r", None, 0, 30, None), ("short", "r", 20, 30, "s"), ("long", "r", 5, 30, "l"))
    )
    assert totals(a) == {cv.UNATTRIBUTED: 5, "l": 25}


def test_zero_length_spans_and_zero_length_request() -> None:
    assert totals(cp.analyse_trace(trace(("r", None, 5, 5, None), ("z", "r", 5, 5, "x")))) == {}
    a = cp.analyse_trace(trace(("r", None, 0, 10, None), ("z", "r", 4, 4, "x")))
    assert totals(a) == {cv.UNATTRIBUTED: 10}


def test_cycle_without_a_root_is_skipped() -> None:
    assert (
        cp.analyse_trace(trace(("a", "b", 0, 1, None), ("b", "a", 0, 1, None))) == cp.SKIP_NO_ROOT
    )


def test_root_is_earliest_then_longest_parentless_span() -> None:
    a = cp.analyse_trace(
        trace(
            ("late", None, 10, 20, None), ("early", None, 0, 5, None), ("long", None, 0, 30, None)
        )
    )
    assert isinstance(a, cp.TraceAnalysis) and a.root == 2
    assert (a.orphans_attached, a.orphans_dropped) == (2, 0)


def test_wall_time_is_the_union_of_the_stages_own_spans() -> None:
    a = cp.analyse_trace(
        trace(
            ("r", None, 0, 100, None),
            ("a", "r", 0, 40, "x"),
            ("b", "r", 20, 60, "x"),
            ("c", "a", 10, 30, "x"),
            ("d", "r", 80, 90, "x"),
        )
    )
    assert isinstance(a, cp.TraceAnalysis)
    (x,) = [s for s in a.stages if s.stage == "x"]
    # path: d 10, b 40, then a for [0, 20] (its part after b started is hidden behind b)
    assert x.wall_ns == 70 and x.critical_ns == 70


def path_by_span(a: cp.TraceAnalysis | str, t: cp.TraceInput) -> dict[str, int]:
    """Path time per span id (spans with none left out)."""
    assert isinstance(a, cp.TraceAnalysis)
    assert sum(a.critical_ns) == a.duration_ns
    return {t.span_id[i]: c for i, c in enumerate(a.critical_ns) if c}


def test_back_to_back_stages_overlapping_by_a_nanosecond_both_stay_on_the_path() -> None:
    a = cp.analyse_trace(
        trace(
            ("r", None, 0, 100_000, None),
            ("q", "r", 0, 50_001, "batch_queue"),
            ("m", "r", 50_000, 100_000, "model_execute"),
        )
    )
    assert isinstance(a, cp.TraceAnalysis)
    crit = {s.stage: s.critical_ns for s in a.stages if s.critical_ns}
    assert crit == {"batch_queue": 50_000, "model_execute": 50_000}


def test_fallback_stage_names_group_operations() -> None:
    assert cp.fallback_stage_name("GET /users/12345", None) == "get /users/{id}"
    assert cp.fallback_stage_name("x", "/Items/{item_id}") == "/items/{item_id}"
    assert cp.fallback_stage_name("Load  0123456789abcdef", None) == "load {id}"
    assert len(cp.fallback_stage_name("y" * 200, None)) == 48
    assert cp.fallback_stage_name("   ", None) == cv.UNATTRIBUTED


# --- Jaeger UI's test traces (packages/jaeger-ui/src/components/TracePage/CriticalPath/
# testCases/test1..9.js), as span lists; their expected sections summed per span.
JAEGER_UI_CASES = {
    # C's children D and E run one after the other: both on the path
    "test1": (
        [("C", None, 1, 101), ("D", "C", 20, 40), ("E", "C", 50, 60)],
        {},
        (),
        {"C": 41 + 10 + 19, "E": 10, "D": 20},
    ),
    # A was still running when C started: C holds X up, A does not
    "test2": (
        [("X", None, 1, 101), ("A", "X", 10, 50), ("C", "X", 20, 60)],
        {},
        (),
        {"X": 41 + 19, "C": 40},
    ),
    # a child starting after its parent ended is dropped
    "test3": ([("A", None, 100, 140), ("B", "A", 150, 200)], {}, (), {"A": 40}),
    "test4": (
        [("A", None, 1, 31), ("B", "A", 40, 80), ("C", "B", 50, 60)],
        {},
        (),
        {"A": 30},
    ),
    # a CONSUMER under a PRODUCER, reached by FOLLOWS_FROM: off the path with its child
    "test5": (
        [("A", None, 1, 31), ("B", "A", 10, 20), ("C", "B", 12, 14)],
        {"A": "PRODUCER", "B": "CONSUMER"},
        ("B",),
        {"A": 30},
    ),
    # children overflowing their parent are clipped to it, grandchildren to the clipped child
    "test6": (
        [("A", None, 1, 30), ("B", "A", 15, 35), ("C", "B", 10, 25)],
        {},
        (),
        {"B": 5, "C": 10, "A": 14},
    ),
    "test7": (
        [("A", None, 1, 30), ("B", "A", 15, 35), ("C", "B", 20, 40)],
        {},
        (),
        {"C": 10, "B": 5, "A": 14},
    ),
    "test8": ([("A", None, 10, 30), ("B", "A", 5, 35)], {}, (), {"B": 20}),
    "test9": ([("A", None, 10, 30), ("B", "A", 1, 5)], {}, (), {"A": 20}),
}


@pytest.mark.parametrize("case", sorted(JAEGER_UI_CASES))
def test_jaeger_ui_test_traces_get_jaeger_ui_paths(case: str) -> None:
    spans, kinds, follows, want = JAEGER_UI_CASES[case]
    us = 1_000  # Jaeger's times are microseconds
    t = trace(*[(i, p, s * us, e * us, None) for i, p, s, e in spans], kinds=kinds, follows=follows)
    assert path_by_span(cp.analyse_trace(t), t) == {k: v * us for k, v in want.items()}
    assert path_by_span(cp.analyse_trace(t), t) == path_by_span(jaeger_ui(t), t)


def test_jaeger_ui_finds_the_last_finishing_child_before_the_cursor() -> None:
    # findLastFinishingChildSpan.test.js: C's children end at 40 (D) and 60 (E); with the
    # cursor at 50, D; X's children A and C both end after 20, so none there
    us = 1_000
    t = trace(
        ("C", None, 1 * us, 101 * us, None),
        ("D", "C", 20 * us, 40 * us, None),
        ("E", "C", 50 * us, 60 * us, None),
    )
    a = cp.analyse_trace(t)
    assert isinstance(a, cp.TraceAnalysis)
    assert [t.span_id[i] for i, _, _ in a.segments] == ["C", "E", "C", "D", "C"]
    t = trace(
        ("X", None, 1 * us, 101 * us, None),
        ("A", "X", 10 * us, 50 * us, None),
        ("C", "X", 20 * us, 60 * us, None),
    )
    a = cp.analyse_trace(t)
    assert isinstance(a, cp.TraceAnalysis)
    assert [(t.span_id[i], s // us, e // us) for i, s, e in a.segments] == [
        ("X", 60, 101),
        ("C", 20, 60),
        ("X", 1, 20),
    ]


# --- the rules at their edges -----------------------------------------------------------

TOL = cp.BACK_TO_BACK_NS


@pytest.mark.parametrize("overlap", [0, 1, TOL // 2, TOL])
def test_a_child_overlapping_the_next_by_at_most_the_tolerance_stays_on_the_path(
    overlap: int,
) -> None:
    t = trace(
        ("r", None, 0, 100_000, None),
        ("q", "r", 0, 50_000 + overlap, cv.BATCH_QUEUE),
        ("m", "r", 50_000, 100_000, cv.MODEL_EXECUTE),
    )
    assert totals(cp.analyse_trace(t)) == {cv.BATCH_QUEUE: 50_000, cv.MODEL_EXECUTE: 50_000}


@pytest.mark.parametrize("overlap", [TOL + 1, 2 * TOL, 40_000])
def test_a_child_overlapping_the_next_by_more_than_the_tolerance_is_off_the_path(
    overlap: int,
) -> None:
    t = trace(
        ("r", None, 0, 100_000, None),
        ("q", "r", 0, 50_000 + overlap, cv.BATCH_QUEUE),
        ("m", "r", 50_000, 100_000, cv.MODEL_EXECUTE),
    )
    assert totals(cp.analyse_trace(t)) == {cv.UNATTRIBUTED: 50_000, cv.MODEL_EXECUTE: 50_000}


def test_a_worker_pool_puts_only_the_calls_that_freed_a_worker_on_the_path() -> None:
    # two workers, six calls of 30 ms; each worker takes its next call 0.2 ms after
    # finishing one: c2 after c0, c3 after c1, ...
    us = 1_000
    starts = [0, 5_000, 30_200, 35_200, 60_400, 65_400]
    calls = [(f"c{k}", "r", s * us, (s + 30_000) * us, None) for k, s in enumerate(starts)]
    t = trace(("r", None, 0, 100_000 * us, None), *calls)
    got = path_by_span(cp.analyse_trace(t), t)
    assert got == path_by_span(jaeger_ui(t), t)
    # c5, then c3 (it freed c5's worker), then c1; r has 0-5 ms, the two 0.2 ms hand-overs
    # and the end
    assert got == {"r": 10_000 * us, "c5": 30_000 * us, "c3": 30_000 * us, "c1": 30_000 * us}


def test_a_consumer_under_a_producer_is_off_the_path_with_its_subtree() -> None:
    # (times in ns, all overlaps far below or above nothing: the rule is the kinds)
    t = trace(
        ("r", None, 0, 100, None),
        ("send", "r", 10, 20, None),
        ("handle", "send", 15, 90, cv.PREPROCESS),
        ("work", "handle", 20, 80, cv.MODEL_EXECUTE),
        ("late", "send", 150, 300, None),  # handled after the request: not skew either
        kinds={"send": "PRODUCER", "handle": "CONSUMER", "late": "CONSUMER"},
    )
    a = cp.analyse_trace(t)
    assert path_by_span(a, t) == {"r": 90, "send": 10}
    assert isinstance(a, cp.TraceAnalysis)
    assert (a.detached, a.skewed_spans, a.orphans_attached) == (2, 0, 0)
    assert a.tree_parent[2] is None and a.tree_parent[3] is None
    assert {s.stage for s in a.stages} == {cv.UNATTRIBUTED}


def test_a_consumer_under_anything_but_a_producer_is_walked() -> None:
    t = trace(
        ("r", None, 0, 100, None),
        ("poll", "r", 10, 90, None),
        ("handle", "poll", 15, 90, None),
        kinds={"poll": "CLIENT", "handle": "CONSUMER"},
    )
    assert path_by_span(cp.analyse_trace(t), t) == {"r": 20, "poll": 5, "handle": 75}


def test_a_span_reached_by_follows_from_is_off_the_path_with_its_subtree() -> None:
    t = trace(
        ("r", None, 0, 100, None),
        ("a", "r", 0, 40, None),
        ("later", "a", 30, 95, None),
        ("inner", "later", 40, 90, None),
        follows=("later",),
    )
    a = cp.analyse_trace(t)
    assert path_by_span(a, t) == {"r": 60, "a": 40}
    assert isinstance(a, cp.TraceAnalysis) and a.detached == 1


def test_a_parentless_span_reached_only_by_a_link_is_not_an_orphan_of_the_request() -> None:
    t = trace(
        ("r", None, 0, 100, None),
        ("linked", None, 10, 90, None),
        ("orphan", None, 20, 30, None),
        follows=("linked",),
    )
    a = cp.analyse_trace(t)
    assert path_by_span(a, t) == {"r": 90, "orphan": 10}
    assert isinstance(a, cp.TraceAnalysis)
    assert (a.detached, a.orphans_attached, a.orphans_dropped) == (1, 1, 0)


def test_of_children_ending_together_the_longer_one_is_taken_where_jaeger_takes_the_first() -> None:
    t = trace(("r", None, 0, 30, None), ("short", "r", 20, 30, None), ("long", "r", 5, 30, None))
    assert path_by_span(cp.analyse_trace(t), t) == {"r": 5, "long": 25}
    assert path_by_span(jaeger_ui(t), t) == {"r": 20, "short": 10}


def test_touching_children_stay_on_the_path_where_jaeger_drops_one() -> None:
    t = trace(
        ("r", None, 0, 30, None),
        ("a", "r", 0, 10, None),
        ("b", "r", 10, 20, None),
        ("c", "r", 20, 30, None),
    )
    assert path_by_span(cp.analyse_trace(t), t) == {"a": 10, "b": 10, "c": 10}
    assert path_by_span(jaeger_ui(t), t) == {"a": 10, "r": 10, "c": 10}


# --- the real traces --------------------------------------------------------------------


def _hotrod(store: Store, corpus_dir: Path, pattern: str) -> tuple[cp.TraceInput, list[int]]:
    """The HotROD capture's trace and its manifest's sibling group (row numbers)."""
    name = f"otlp/jaegerv3_n_plus_one_full_{pattern}"
    manifest = json.loads((corpus_dir / f"{name}.manifest.json").read_text())
    ingest_paths(store, [corpus_dir / f"{name}.json"])
    c = per_request.fetch_spans(store, None)
    t = per_request.trace_input(c, 0, len(c["trace_id"]))
    want = manifest["expected"]
    group = [
        i
        for i in range(len(t.span_id))
        if t.parent[i] == want["parent_span_id"]
        and t.name[i] == want["operation"]
        and t.service[i] == want["service"]
    ]
    assert len(group) == want["siblings"]
    return t, group


def test_hotrod_with_three_route_workers_has_jaeger_uis_path(
    store: Store, corpus_dir: Path
) -> None:
    t, group = _hotrod(store, corpus_dir, "concurrent")
    a = cp.analyse_trace(t)
    got = path_by_span(a, t)
    # Jaeger UI: 5 of the 11 calls (the customer call and the 4 route calls that each
    # freed the worker the next one on the path waited for), every span's time the same
    on_path = sorted(t.span_id[i] for i in group if t.span_id[i] in got)
    assert on_path == [
        "044fc0a48a35d8cb",
        "5894c92b9d67fdc4",
        "72bc23154c387b1f",
        "77a06db87a702bb5",
        "e2edfe329f1a15d8",
    ]
    assert got == path_by_span(jaeger_ui(t), t)
    assert len(t.span_id) == 40


def test_hotrod_with_one_route_worker_has_every_call_on_the_path(
    store: Store, corpus_dir: Path
) -> None:
    t, group = _hotrod(store, corpus_dir, "serial")
    got = path_by_span(cp.analyse_trace(t), t)
    assert all(t.span_id[i] in got for i in group)
    assert got == path_by_span(jaeger_ui(t), t)


# --- Jaeger UI's walk, ported as an oracle ----------------------------------------------


def jaeger_ui(t: cp.TraceInput) -> cp.TraceAnalysis:
    """Jaeger UI's critical path (CriticalPath/index.ts with utils/) of the trace's first
    root, per span, in a TraceAnalysis with only ``critical_ns`` and ``duration_ns`` set.

    createCPSpanMap drops a CONSUMER under a PRODUCER with its subtree (and the older
    getChildOfSpans a FOLLOWS_FROM child); sanitizeOverFlowingChildren clips or drops
    children outside their parent; findLastFinishingChildSpan takes the child that
    ended strictly before the cursor, the first of equal ends in child order.
    """
    n = len(t.span_id)
    index = {s: i for i, s in enumerate(t.span_id)}
    follows = t.follows or [False] * n
    kids: dict[int, list[int]] = {i: [] for i in range(n)}
    for i, p in enumerate(t.parent):
        j = index.get(p) if p is not None else None
        blocking = not (j is not None and t.kind[j] == "PRODUCER" and t.kind[i] == "CONSUMER")
        if j is not None and not follows[i] and blocking:
            kids[j].append(i)
    root = min((i for i in range(n) if t.parent[i] not in index), key=lambda i: t.start[i] or 0)
    s: dict[int, int] = {}
    e: dict[int, int] = {}
    order, stack = [], [root]
    while stack:  # pre-order, the map's insertion order
        i = stack.pop()
        order.append(i)
        s[i], e[i] = t.start[i] or 0, t.end[i] or 0
        stack.extend(reversed(kids[i]))
    alive = set(order)
    parent = {c: p for p in order for c in kids[p]}
    for i in order[1:]:
        p = parent[i]
        outside = s[i] >= e[p] if s[i] >= s[p] else e[i] <= s[p]
        if p not in alive or outside:
            alive.discard(i)
        else:
            s[i], e[i] = max(s[i], s[p]), min(e[i], e[p])
    crit = [0] * n
    span, ret = root, None
    while True:
        best, best_end = None, -1
        for c in kids[span]:
            if c in alive and (ret is None or e[c] < ret) and e[c] > best_end:
                best, best_end = c, e[c]
        top = e[span] if ret is None else ret
        if best is not None:
            crit[span] += top - e[best]
            span, ret = best, None
        else:
            crit[span] += top - s[span]
            if span == root:
                break
            span, ret = parent[span], s[span]
    return cp.TraceAnalysis(
        root=root,
        start_ns=s[root],
        duration_ns=e[root] - s[root],
        stages=[],
        effective_stage=[],
        clipped_start=[],
        clipped_end=[],
        depth=[],
        tree_parent=[],
        critical_ns=crit,
    )
