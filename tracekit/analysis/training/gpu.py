"""Per-rank GPU time line of a profiled run, read from the ``kineto_gpu`` table.

    gpu = rank_gpu_breakdown(store, "8gpu")   # {rank: RankGpu}
    gpu[0].gpu_idle_pct, gpu[0].comm_overlap_pct

The figures are computed at ingest (:mod:`tracekit.analysis.ingest.kineto_timeline`)
with Holistic Trace Analysis's definitions; docs/kineto.md says which. Percentages of
the temporal breakdown are of the rank's GPU window (first device op's start to the
last one's end), overlap is a percentage of communication time, as in HTA. A run
without profiler files has no rows: the result is empty.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracekit.analysis.store import DatabaseError, Store
from tracekit.errors import QueryError

RANK_STEP = -1
"""``kineto_gpu.step`` of a rank's whole-profile row."""

_NS = 1_000_000.0

_SQL = """
SELECT rank, kernels, window_ns, idle_ns, compute_ns, non_compute_ns, comm_ns,
       overlap_ns, exposed_comm_ns, host_wait_ns, kernel_wait_ns, other_idle_ns,
       kernel_compute_ns, kernel_comm_ns, kernel_memory_ns, kernel_other_ns,
       (SELECT count(*) FROM kineto_gpu s
        WHERE s.run_label = k.run_label AND s.rank = k.rank AND s.step <> $whole) AS steps,
       (SELECT sum(exposed_comm_ns) FROM kineto_gpu s
        WHERE s.run_label = k.run_label AND s.rank = k.rank AND s.step <> $whole) AS exposed
FROM kineto_gpu k
WHERE run_label = $label AND step = $whole
ORDER BY rank
"""


@dataclass(frozen=True)
class RankGpu:
    """One rank's GPU time line (HTA's temporal breakdown, overlap, idle split)."""

    rank: int
    kernels: int
    window_ms: float
    gpu_idle_pct: float
    gpu_compute_pct: float
    gpu_non_compute_pct: float
    comm_overlap_pct: float | None
    """Share of communication time during which a compute kernel ran (None: no comm)."""
    exposed_comm_ms_per_step: float | None
    """Communication with no compute kernel running, mean per profiled step."""
    host_wait_ms: float
    kernel_wait_ms: float
    other_idle_ms: float
    kernel_type_pct: dict[str, float]
    """Summed kernel durations by type (compute, communication, memory, other), % of all."""


def _pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def rank_gpu_breakdown(store: Store, run_label: str) -> dict[int, RankGpu]:
    """GPU figures per rank of ``run_label`` (the ``--version`` the profiles were ingested
    with); empty when the run has no profiler files."""
    try:
        tables = store.run(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'kineto_gpu'"
        )
        if not tables[0][0]:
            return {}
        rows = store.run(_SQL, {"label": run_label, "whole": RANK_STEP})
    except DatabaseError as exc:
        raise QueryError(f"cannot read GPU figures from {store.path}: {exc}") from exc
    out: dict[int, RankGpu] = {}
    for r in rows:
        (rank, kernels, window, idle, compute, non_compute, comm, overlap, _exposed_all,
         host, kwait, other, k_comp, k_comm, k_mem, k_other, steps, exposed) = r  # fmt: skip
        total = k_comp + k_comm + k_mem + k_other
        out[int(rank)] = RankGpu(
            rank=int(rank),
            kernels=int(kernels),
            window_ms=window / _NS,
            gpu_idle_pct=_pct(idle, window),
            gpu_compute_pct=_pct(compute, window),
            gpu_non_compute_pct=_pct(non_compute, window),
            comm_overlap_pct=_pct(overlap, comm) if comm else None,
            exposed_comm_ms_per_step=(exposed / steps / _NS) if steps and comm else None,
            host_wait_ms=host / _NS,
            kernel_wait_ms=kwait / _NS,
            other_idle_ms=other / _NS,
            kernel_type_pct={
                "compute": _pct(k_comp, total),
                "communication": _pct(k_comm, total),
                "memory": _pct(k_mem, total),
                "other": _pct(k_other, total),
            },
        )
    return out
