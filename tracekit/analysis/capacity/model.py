"""The capacity analysis's result types: plain dataclasses, rendered elsewhere.

Field names are the JSON keys of docs/capacity.md (issue 27); times are milliseconds,
rates requests per second, costs in the currency of ``--replica-cost``. A figure the
traces cannot give (no batch spans, no device time) is ``None`` and named in ``flags``,
never zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.analysis.results import Flag

LATENCY_BOUND = "latency_bound"
COST_BOUND = "cost_bound"
BALANCED = "balanced"
INCONCLUSIVE = "inconclusive"
VERDICTS: tuple[str, ...] = (LATENCY_BOUND, COST_BOUND, BALANCED, INCONCLUSIVE)


@dataclass
class Regime:
    """Latency of accepted requests in one kind of window (normal or peak)."""

    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    windows: int
    requests: float
    """Weighted (estimated) requests, accepted or not."""
    miss_share: float | None
    """``missed_windows`` ÷ ``judged_windows`` (None when none was judged)."""
    request_miss_share: float | None
    """Share of these windows' requests that arrived in a missing window."""
    error_rate: float | None
    """Failed ÷ all requests in these windows (failed requests are not accepted)."""
    judged_windows: int = 0
    """Windows with as many accepted requests as the objective's quantile needs."""
    missed_windows: int = 0
    """Judged windows whose objective quantile breaks the objective."""


@dataclass
class Spikes:
    """Runs of consecutive peak windows."""

    count: int
    duration_s_p50: float | None
    duration_s_p90: float | None
    rate_ratio: float | None
    """Median over spikes of their peak arrival rate ÷ the median window rate."""
    p95_inside_ms: float | None
    p95_outside_ms: float | None


@dataclass
class Cost:
    replica_seconds_per_1k: float | None
    """Replica-seconds (replicas counted from service.instance.id per window) per 1,000
    accepted requests."""
    gpu_busy_fraction: float | None
    """Union of model-execution (batch) device intervals per replica ÷ wall time, mean over
    replicas; None without model executions or without device time (``gpu_time_ns``)."""
    cost_per_1k: float | None
    """replica_seconds_per_1k × the release's --replica-cost per second; None without one."""
    execution_busy_fraction: float | None = None
    """The same union over the executions' *wall* intervals: what a CPU-served model is busy,
    and a stand-in for GPU busy where no device time was measured (flag
    ``busy_from_wall_time``); None without model executions."""
    replica_cost_per_h: float | None = None
    """The price per replica-hour this release's cost was computed with."""


@dataclass
class Overrun:
    """Accepted requests slower than the objective's threshold, and by how much in all:
    what ranks latency-bound releases (the most time past the objective first)."""

    requests: float
    """Weighted (estimated) accepted requests slower than the threshold."""
    share: float | None
    """``requests`` ÷ all accepted requests (None without any)."""
    excess_s: float
    """Σ weight × (latency − threshold) over those requests, in seconds."""


@dataclass
class Headroom:
    knee_rps_per_replica: float | None
    """Highest per-replica arrival rate of a window that met the objective below the
    lowest rate of one that missed it (None: it never missed, or never met)."""
    peak_rps_per_replica: float
    """Highest per-replica arrival rate seen in a window with enough requests."""


@dataclass
class Curve:
    """Model execution time of a batch against its size, fitted over real batches."""

    intercept_ms: float
    per_request_ms: float
    batches: int
    r2: float | None = None


@dataclass
class BatchOption:
    max_wait_ms: float
    max_batch: int
    p95_queue_ms: float
    """p95 of the simulated batch_queue wait (fill + worker) over the replayed arrivals."""
    gpu_ms_per_request: float


@dataclass
class Batching:
    """Batching advice from the traced batcher (docs/capacity.md, "Batching")."""

    curve: Curve
    workers: int
    """Workers per replica the replay uses (most batches running at once, as traced)."""
    observed: BatchOption | None
    """The batcher as traced: its max wait and batch size, replayed the same way."""
    options: list[BatchOption]
    pick: BatchOption | None
    """The option of lowest GPU time per request whose p95 queue wait is within the
    budget, normal and peak alike; None when none is (flag ``no_batching_option``)."""
    queue_budget_ms: float
    fill_wait_ms_p95: float | None
    worker_wait_ms_p95: float | None
    batch_size_p50: float | None
    triton: str | None = None
    """``dynamic_batching { … }`` implementing ``pick``."""
    tracekit_batcher: str | None = None
    """``DynamicBatcher(max_batch_size=…, max_wait_ms=…, workers=…)`` implementing ``pick``."""


@dataclass
class ReleaseCapacity:
    label: str
    verdict: str
    reason: str
    """Why this verdict, with the numbers: full sentences, each ending with a full stop."""
    normal: Regime
    peak: Regime
    spikes: Spikes
    cost: Cost
    headroom: Headroom
    overrun: Overrun
    batching: Batching | None
    peak_rule: str
    """Which windows are peak: ``top decile`` or ``above 1.5× the median rate``."""
    flags: list[Flag] = field(default_factory=list)
    windows: list[WindowPoint] = field(default_factory=list, repr=False)
    """Per window, for the HTML chart (left out of the JSON)."""


@dataclass
class WindowPoint:
    start_s: float
    rate_rps: float
    rps_per_replica: float
    latency_ms: float | None
    """The objective's quantile in the window (None with too few requests)."""
    peak: bool
    missed: bool
    replicas: int


@dataclass
class CapacityResult:
    """``tracekit capacity``: one entry per release, and which binds first."""

    releases: list[ReleaseCapacity]
    slo: str
    window_s: float
    summary: str
    flags: list[Flag] = field(default_factory=list)
