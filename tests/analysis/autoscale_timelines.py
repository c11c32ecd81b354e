"""Synthetic, seeded time lines for the autoscale tests (arrays, no store).

Latency follows a queue: mean = base / (1 − ρ) with ρ = per-replica arrival rate over
capacity; in-flight follows Little's law (rate × mean latency, plus the request itself).
"""

from __future__ import annotations

from dataclasses import make_dataclass

import numpy as np
import numpy.typing as npt

from tracekit.analysis.autoscale.audit import Timeline

WINDOW_S = 30.0
REPLICAS = ("pod-a", "pod-b")


# Built from the protocol's own fields, so the fixture has exactly what the audit reads.
Arrays = make_dataclass("Arrays", list(Timeline.__annotations__.items()))


def timeline(
    rate_per_replica: npt.ArrayLike,
    capacity: npt.ArrayLike,
    *,
    base_ms: float,
    cpu: str,
    seed: int,
    label: str = "v2",
) -> Arrays:
    """One window per element of ``rate_per_replica`` / ``capacity`` (req/s per replica).

    ``cpu="flat"``: CPU stays near 35% whatever the load (the bottleneck is elsewhere);
    ``cpu="bound"``: CPU utilisation is 0.1 + ρ, so it rises with load and latency.
    """
    rng = np.random.default_rng(seed)
    lam = np.asarray(rate_per_replica, dtype=float)
    mu = np.asarray(capacity, dtype=float)
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("t", "d", "i", "inf", "q", "cpu")}
    for w, (lr, m) in enumerate(zip(lam, mu, strict=True)):
        rho = min(lr / m, 0.95)
        mean_ms = base_ms / (1.0 - rho)
        n = rng.poisson(lr * len(REPLICAS) * WINDOW_S)
        cols["t"].append((w * WINDOW_S + rng.uniform(0, WINDOW_S, n)) * 1e9)
        sigma = 0.5
        cols["d"].append(rng.lognormal(np.log(mean_ms) - sigma**2 / 2, sigma, n))
        cols["i"].append(rng.choice(np.array(REPLICAS, dtype=object), n))
        inflight = rng.poisson(lr * mean_ms / 1000.0, n) + 1.0
        cols["inf"].append(inflight)
        cols["q"].append(np.maximum(inflight - 2.0, 0.0))
        level = 0.35 if cpu == "flat" else min(0.1 + rho, 1.0)
        cols["cpu"].append(np.clip(rng.normal(level, 0.02, n), 0, 1))
    t = np.concatenate(cols["t"]).astype(np.int64)
    order = np.argsort(t, kind="stable")
    n_all = len(t)
    return Arrays(
        label=label,
        start_ns=t[order] + 1_767_225_600 * 10**9,
        duration_ms=np.concatenate(cols["d"])[order],
        weights=np.ones(n_all),
        instance_ids=np.concatenate(cols["i"])[order],
        inflight=np.concatenate(cols["inf"])[order],
        queue_depth=np.concatenate(cols["q"])[order],
        cpu_utilization=np.concatenate(cols["cpu"])[order],
        gpu_utilization=np.full(n_all, np.nan),
    )


def queueing_timeline(seed: int = 7) -> Arrays:
    """Arrivals rise a little, then a slower release eats capacity (the seed's case):
    in-flight and queue grow with latency, CPU stays flat, the arrival rate plateaus."""
    lam = np.concatenate([np.full(6, 10.0), np.linspace(10, 13, 5), np.full(19, 13.0)])
    lam = lam + np.random.default_rng(seed + 1).normal(0, 0.5, len(lam))
    mu = np.concatenate([np.full(12, 25.0), np.linspace(25, 15, 18)])
    return timeline(lam, mu, base_ms=40.0, cpu="flat", seed=seed)


def cpu_bound_timeline(seed: int = 11) -> Arrays:
    """Load rises until CPU saturates: CPU, latency and in-flight climb together."""
    lam = np.concatenate([np.full(8, 10.0), np.linspace(10, 23.5, 16), np.full(6, 23.5)])
    return timeline(lam, np.full(len(lam), 25.0), base_ms=20.0, cpu="bound", seed=seed)
