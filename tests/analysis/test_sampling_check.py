"""The unweighted-tail-sampling check reads at most CHECK_SAMPLE ids per group and
decides as it does from all of them (shares are what it compares)."""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.analysis.cohorts import sampling
from tracekit.analysis.cohorts.release import ReleaseData


def release(n: int, *, tail_sampled: bool, seed: int = 1) -> ReleaseData:
    """``n`` kept requests; when ``tail_sampled``, the fast ones were kept only when their
    trace id's random bits lie under 30 % of the range (no weights written)."""
    rng = np.random.default_rng(seed)
    duration = rng.lognormal(3.0, 0.5, n)
    bits = rng.random(n)
    if tail_sampled:
        slow = duration >= np.quantile(duration, 0.8)
        bits = np.where(slow, bits, bits * 0.3)
    ids = np.array([f"{i:018x}{int(b * (1 << 56)):014x}" for i, b in enumerate(bits)], dtype=object)
    nan = np.full(n, np.nan)
    empty = np.zeros((n, 0))
    return ReleaseData(
        label="v",
        trace_ids=ids,
        start_ns=np.arange(n, dtype=np.int64),
        duration_ms=duration,
        weights=np.ones(n),
        is_error=np.zeros(n, dtype=bool),
        stages=(),
        stage_ms=empty,
        stage_wall_ms=empty,
        stage_cpu_ms=empty,
        stage_gpu_ms=empty,
        time_kinds={},
        instance_ids=np.full(n, "", dtype=object),
        inflight=nan,
        queue_depth=nan,
        cpu_utilization=nan,
        gpu_utilization=nan,
    )


@pytest.mark.parametrize("tail_sampled", [True, False])
def test_a_large_release_read_through_a_sample_decides_as_all_of_its_ids(
    monkeypatch: pytest.MonkeyPatch, tail_sampled: bool
) -> None:
    rel = release(200_000, tail_sampled=tail_sampled)
    sampled = sampling.unweighted_tail_sampling(rel)
    monkeypatch.setattr(sampling, "CHECK_SAMPLE", 10**9)
    whole = sampling.unweighted_tail_sampling(rel)
    assert (sampled is not None) == (whole is not None) == tail_sampled
