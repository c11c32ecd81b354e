"""The training analysis's result types: plain dataclasses, rendered elsewhere.

At the bottom of the training package so that the step reader, the diff and the gate
share them without importing each other's internals. Field names are the JSON keys
(docs/design.md, "Training steps", issue 12); times are milliseconds as floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit import conventions as cv
from tracekit.analysis.results import Flag, TrainingVerdict

PEER_WAIT = "comm_peer_wait"
"""Component: exposed communication spent waiting for the last rank to arrive."""
TRANSFER = "comm_transfer"
"""Component: exposed communication after the last rank arrived (the transfer itself)."""
IMBALANCE = "compute_imbalance"
"""Component: a rank's compute above the fastest rank's, averaged over ranks."""

COMPUTE_STAGES: tuple[str, ...] = (cv.FORWARD, cv.BACKWARD, cv.OPTIMIZER)
"""Stages whose time is this rank's own compute (compared per sample across runs)."""
COMPONENT_ORDER: tuple[str, ...] = (
    cv.DATA_WAIT,
    cv.FORWARD,
    cv.BACKWARD,
    cv.OPTIMIZER,
    IMBALANCE,
    PEER_WAIT,
    TRANSFER,
)
"""Components in step order; user stages follow, then ``unattributed``."""

DATA_LOADING = "data_loading"
COMMUNICATION = "communication"
STRAGGLER = "straggler"
COMPUTE = "compute"
NONE = "none"
BOTTLENECKS: tuple[str, ...] = (DATA_LOADING, COMMUNICATION, STRAGGLER, COMPUTE, NONE)
"""Verdicts of a training diff."""


def bottleneck_of(component: str) -> str:
    """The bottleneck a component's growth points at."""
    if component == cv.DATA_WAIT:
        return DATA_LOADING
    if component == TRANSFER:
        return COMMUNICATION
    if component in (PEER_WAIT, IMBALANCE):
        return STRAGGLER
    return COMPUTE


@dataclass
class StepQuantiles:
    p50: float
    p95: float


@dataclass
class Component:
    """One component of a run's mean step time."""

    name: str
    mean_ms: float
    share: float
    """Of the mean step time (components add up to it)."""


@dataclass
class RankRow:
    """One rank of a run. The ``gpu_*`` fields come from a profiler trace when one exists."""

    rank: int
    host: str | None
    steps: int
    step_ms_p50: float
    data_wait_ms: float
    compute_ms: float
    comm_exposed_ms: float
    peer_wait_ms: float
    last_arrivals: int
    gpu_idle_pct: float | None = None
    gpu_compute_pct: float | None = None
    gpu_non_compute_pct: float | None = None
    comm_overlap_pct: float | None = None


@dataclass
class Straggler:
    rank: int
    host: str | None
    last_arrivals: int
    """Collectives this rank reached last."""
    share: float
    """Of the run's matched collectives."""
    mean_lag_ms: float
    """How much later than the median of the other ranks it arrived, when last."""
    lateness_ms: float = 0.0
    """Median over steps of how much later than the others it arrived at the step's
    collectives (last or not; negative: earlier): near 0 when ranks only take turns."""
    late_steps: float = 0.0
    """Share of steps in which it arrived after the others (by that median)."""
    lateness_se_ms: float = float("inf")
    """Standard error of ``lateness_ms`` from the steps' own spread (MAD-based)."""


@dataclass
class CollectiveBandwidth:
    """Collectives of one op, process group and size class: how fast they moved bytes.

    Bandwidths are GB/s (10⁹ bytes/s) as nccl-tests prints them: ``algbw`` = bytes ÷
    transfer time, ``busbw`` = algbw × the op's bus factor for ``group_size`` ranks
    (docs/training.md, "Collective bandwidth").
    """

    op: str
    group: str
    group_size: int
    bytes: float
    """Mean payload per collective (nccl-tests' size: all_gather's output, reduce_scatter's input)."""
    count: int
    """Collectives (each counted once, however many ranks ran it)."""
    time_ms: float
    """Mean transfer time: from the later of the last rank's arrival and the end of the
    group's previous collective, to the end (median over the ranks)."""
    algbw_gb_s: float
    busbw_gb_s: float | None
    """None for an op without a bus factor (gather, scatter, custom ops)."""
    scope: str
    """``intra-node``, ``inter-node`` (its ranks are on more than one host) or ``unknown``."""
    group_desc: str | None = None
    link_fraction: float | None = None
    """busbw ÷ the link's peak (``--link-gbps`` ÷ 8), for collectives that cross hosts."""


@dataclass
class GroupComm:
    """One process group's communication in a run, per rank and step."""

    group: str
    group_desc: str | None
    group_size: int
    role: str
    """``data_parallel``, ``fsdp``, ``tensor``, ``pipeline``, ``expert`` or ``other``: from the
    group's description or name, else from its ops (docs/training.md)."""
    ops: list[str]
    launched_under: str
    """The stage most of its time was launched under (``backward`` for DDP buckets,
    ``forward`` for FSDP's all-gathers)."""
    per_step: float
    """Collectives per rank per step."""
    wall_ms: float
    """Summed collective time per rank per step."""
    exposed_ms: float
    """Of it, on the step's critical path (not hidden under compute)."""


@dataclass
class RunSteps:
    """One training run (a ``service.version``): where its step time goes."""

    label: str
    world_size: int
    steps: int
    step_ms: StepQuantiles
    step_ms_mean: float
    components: list[Component]
    overlap_pct: float | None
    """Share of communication time that ran while the launching stage computed."""
    samples_per_s: float | None
    samples_per_rank_step: float | None
    ranks: list[RankRow]
    stragglers: list[Straggler]
    matched_collectives: int
    """Collectives matched across every rank by (group, seq)."""
    clock_offset_ms: float
    """Largest clock shift applied to a host to align collective ends (0: one host)."""
    warmup_steps: int
    flags: list[Flag] = field(default_factory=list)
    collectives: list[CollectiveBandwidth] = field(default_factory=list)
    """Bandwidth per (op, group, size class) where the spans carry bytes."""
    groups: list[GroupComm] = field(default_factory=list)
    tokens_per_rank_step: float | None = None
    """Mean tokens per rank per step, where every step span carries ``tracekit.step.tokens``."""
    link_gbps: float | None = None
    """The link's peak in Gb/s (``--link-gbps``, else the ``tracekit.link.gbps`` resource)."""
    step_times_ms: list[float] = field(default_factory=list, repr=False)
    """Per step, the mean over ranks of the step span's duration (for diff and gate)."""
    component_steps_ms: dict[str, list[float]] = field(default_factory=dict, repr=False)
    """Per component, its per-step value (aligned with ``step_times_ms``)."""
    samples_per_step: list[float] = field(default_factory=list, repr=False)


@dataclass
class StepsResult:
    """``tracekit steps``: one entry per training run in the store."""

    runs: list[RunSteps]
    db: str
    flags: list[Flag] = field(default_factory=list)


@dataclass
class RunSummary:
    label: str
    world_size: int
    steps: int
    step_ms_p50: float
    samples_per_s: float | None


@dataclass
class Scaling:
    speedup: float | None
    ideal: float
    efficiency: float | None


@dataclass
class DiffComponent:
    """One component's mean per-step time in each run and its share of the lost efficiency."""

    name: str
    before_ms: float
    """Per-sample compute is scaled to the after run's per-rank batch."""
    after_ms: float
    delta_ms: float
    share: float | None
    """Of the step time lost against ideal scaling, by the counterfactual rule."""
    bottleneck: str


@dataclass
class TrainingDiff:
    """``tracekit diff`` of two training runs."""

    before: RunSummary
    after: RunSummary
    scaling: Scaling
    components: list[DiffComponent]
    verdict: TrainingVerdict
    flags: list[Flag]
    ideal_step_ms: float
    """The after run's mean step time under perfect scaling."""
    bandwidth: BandwidthChange | None = None
    kind: str = "training"


@dataclass
class BandwidthChange:
    """The after run's busiest collective (by transfer time) against the same op before."""

    op: str
    scope: str
    before_busbw_gb_s: float | None
    after_busbw_gb_s: float
    link_gbps: float | None
    link_fraction: float | None
    """Of the after run's link peak (inter-node collectives)."""
    before_scope: str | None = None

    def sentence(self) -> str:
        a = gb_s(self.after_busbw_gb_s)
        if self.before_busbw_gb_s is None:
            text = f"{_where(self.scope)}{self.op} bus bandwidth {a}"
        elif self.before_scope not in (None, self.scope):
            text = (
                f"{self.op} bus bandwidth {gb_s(self.before_busbw_gb_s)} {self.before_scope} "
                f"→ {a} {self.scope}"
            )
        else:
            text = (
                f"{_where(self.scope)}{self.op} bus bandwidth {gb_s(self.before_busbw_gb_s)} → {a}"
            )
        if self.link_fraction is not None and self.link_gbps:
            text += f", {self.link_fraction:.0%} of a {self.link_gbps:g} Gb/s link"
        return text


def rank_count(n: int) -> str:
    """``1 rank``, ``2 ranks``."""
    return f"{n} rank" if n == 1 else f"{n} ranks"


def gb_s(value: float) -> str:
    """A bandwidth as nccl-tests prints it (GB/s), in MB/s under 0.1 GB/s (gloo on loopback)."""
    if value >= 10:
        return f"{value:.1f} GB/s"
    if value >= 0.1:
        return f"{value:.2f} GB/s"
    return f"{value * 1000:.2f} MB/s"


def _where(scope: str) -> str:
    return "" if scope == "unknown" else f"{scope} "
