"""The counterfactual rule: quantile matching, shares, tail widening, hidden wait."""

from __future__ import annotations

import math

import numpy as np

from tracekit import conventions as cv
from tracekit.analysis.cohorts.counterfactual import (
    StageEvidence,
    choose_tail,
    is_hidden_wait,
    quantile_match,
    shares,
)


def test_quantile_match_gives_the_before_distribution_in_the_after_order() -> None:
    rng = np.random.default_rng(0)
    after = rng.exponential(10.0, 1000)
    before = rng.normal(5.0, 1.0, 1000)
    matched = quantile_match(after, np.ones(1000), before, np.ones(1000))
    assert np.allclose(np.sort(matched), np.sort(before))
    # the largest after value gets the largest before value: ranks are kept
    assert matched[np.argmax(after)] == before.max()
    assert matched[np.argmin(after)] == before.min()


def test_quantile_match_respects_weights() -> None:
    after = np.arange(10, dtype=float)
    weighted = quantile_match(
        after, np.ones(10), np.array([1.0, 2.0, 3.0]), np.array([1.0, 3.0, 1.0])
    )
    repeated = quantile_match(after, np.ones(10), np.array([1.0, 2, 2, 2, 3]), np.ones(5))
    assert np.array_equal(weighted, repeated)


def test_shares_normalise_overlapping_removals_and_keep_shortfalls() -> None:
    assert shares(10.0, [8.0, 8.0, -1.0]) == [0.5, 0.5, 0.0]
    assert shares(10.0, [3.0, 2.0]) == [0.3, 0.2]
    assert all(math.isnan(s) for s in shares(-2.0, [1.0, 1.0]))


def test_tail_widens_to_p95_when_p99_has_fewer_than_ten_requests() -> None:
    rng = np.random.default_rng(1)
    big, small = rng.exponential(10, 2000), rng.exponential(10, 300)
    assert choose_tail(big, np.ones(2000), big, np.ones(2000)) == (0.99, "")
    q, reason = choose_tail(big, np.ones(2000), small, np.ones(300))
    assert q == 0.95 and "after" in reason and "before" not in reason


def ev(critical: float, measured: float) -> StageEvidence:
    return StageEvidence(critical, critical, measured, float("nan"), measured)


def test_hidden_wait_rule() -> None:
    assert is_hidden_wait(cv.COMPUTE, ev(15.0, 14.0), ev(30.0, 14.5))
    assert not is_hidden_wait(cv.COMPUTE, ev(15.0, 14.0), ev(30.0, 28.0))  # cpu followed
    assert not is_hidden_wait(cv.WAIT, ev(15.0, 14.0), ev(30.0, 14.0))  # already wait
    assert not is_hidden_wait(cv.COMPUTE, ev(15.0, 14.0), ev(15.8, 14.0))  # < 1 ms growth
    assert not is_hidden_wait(cv.COMPUTE, ev(100.0, 90.0), ev(110.0, 90.0))  # < 20% growth
    nan = float("nan")
    assert not is_hidden_wait(cv.COMPUTE, ev(15.0, nan), ev(30.0, 14.0))  # unmeasured before
