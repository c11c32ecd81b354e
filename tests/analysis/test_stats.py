"""Weighted quantiles and bootstrap intervals behave as the docstrings promise."""

from __future__ import annotations

import numpy as np

from tracekit.analysis.cohorts.stats import holm_adjust, quantile_deltas, weighted_quantile


def test_weighted_quantile_is_inverse_cdf() -> None:
    values = np.arange(1, 101, dtype=float)
    assert weighted_quantile(values, 0.99) == 99.0
    assert weighted_quantile(values, 0.5) == 50.0


def test_weight_counts_as_repeated_requests() -> None:
    plain = np.array([1.0, 2.0, 2.0, 2.0, 3.0])
    weighted = np.array([1.0, 2.0, 3.0])
    for q in (0.2, 0.5, 0.8, 0.99):
        assert weighted_quantile(plain, q) == weighted_quantile(weighted, q, [1, 3, 1])


def test_bootstrap_interval_covers_a_real_shift_and_excludes_zero() -> None:
    rng = np.random.default_rng(1)
    before = rng.lognormal(3.0, 0.4, 5000)
    after = before * 1.3
    (d,) = quantile_deltas(before, rng.permutation(after), [0.95], seed=3)
    assert d.ci_low > 0
    assert d.ci_low <= d.delta <= d.ci_high
    assert 0.2 < d.rel_ci_low < 0.3 < d.rel_ci_high < 0.4


def test_no_change_interval_contains_zero() -> None:
    rng = np.random.default_rng(2)
    before = rng.lognormal(3.0, 0.4, 3000)
    after = rng.lognormal(3.0, 0.4, 3000)
    (d,) = quantile_deltas(before, after, [0.5], seed=4)
    assert d.ci_low < 0 < d.ci_high


def test_holm_adjusts_in_rank_order() -> None:
    assert holm_adjust([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]
