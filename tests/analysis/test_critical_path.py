"""critical_path.analyse_trace on hand-made span lists: the walk's edge cases."""

from __future__ import annotations

from tracekit import conventions as cv
from tracekit.analysis.attribution import critical_path as cp


def trace(*spans: tuple[str, str | None, int, int, str | None]) -> cp.TraceInput:
    """Spans as (id, parent, start, end, stage); everything else plain."""
    n = len(spans)
    return cp.TraceInput(
        span_id=[s[0] for s in spans],
        parent=[s[1] for s in spans],
        name=[s[0] for s in spans],
        kind=["SERVER"] + ["INTERNAL"] * (n - 1),
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
