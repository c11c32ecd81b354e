"""The regressions a demo v2 release can carry, each one configuration change.

The wait-type effects are sized to stay well clear of what a busy 2-core machine does to
the tail on its own: there the event loop waits for CPU on every await, and a v1 p95 of
40 ms (idle) becomes 100 to 200 ms (load average 10), with intervals as wide. A 60 ms
regression drowns in that; a few hundred milliseconds, as a misconfigured batcher or a
dependency's slow tail produce in production, do not.

Every service reads the same knobs (:class:`Knobs`) and applies the ones it owns: the
ranker the batching, model, cache and contention knobs, the pricing service the slow
tail. v1 always runs :data:`BASELINE`; v2 runs the baseline with one regression's
overrides. Each regression also states what tracekit should find (the stage and the
kind of time), which the end-to-end tests and the demo's closing line check.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tracekit import conventions as cv
from tracekit.errors import ConfigError


@dataclass(frozen=True)
class Knobs:
    """Every setting a regression may change; the defaults are release v1."""

    batch_max_size: int = 8
    """Largest batch the ranker's DynamicBatcher forms."""
    batch_max_wait_ms: float = 2.0
    """How long the first request of a batch waits for others."""
    batch_workers: int = 2
    """Batches that may execute at once (threads running the model)."""
    device_fixed_ms: float = 0.0
    """Stand-in accelerator (``demo --capacity``): a batch's execution also waits this
    long, plus :attr:`device_per_request_ms` per member, with the GIL released, as a
    host thread waits for a GPU batch; 0 for the other demos (the CPU model alone)."""
    device_per_request_ms: float = 0.0
    """The stand-in accelerator's time per request of a batch."""
    model_hidden: int = 128
    """Width of the ranking MLP's hidden layers."""
    model_layers: int = 2
    """Number of hidden layers."""
    cache_enabled: bool = True
    """Whether feature lookups go through the in-process LRU cache."""
    downstream_slow_fraction: float = 0.0
    """Share of pricing calls that take the slow path."""
    downstream_slow_ms: float = 0.0
    """Extra latency of a slow pricing call."""
    contention_threads: int = 0
    """Background threads in the ranker that recompute statistics in pure Python."""
    contention_hold_ms: float = 30.0
    """How long such a thread holds the statistics lock (and burns CPU) per refresh."""
    contention_pause_ms: float = 20.0
    """How long it sleeps between refreshes."""


BASELINE = Knobs()
"""Release v1 (and v2 under ``--regression none``)."""

COMPUTE_STAGES: tuple[str, ...] = (cv.PREPROCESS, cv.MODEL_EXECUTE, cv.POSTPROCESS)
"""Stages whose time is the ranker's own CPU work; contention shows up in them."""


@dataclass(frozen=True)
class Regression:
    """One v2 change and what the analysis is expected to say about it."""

    name: str
    description: str
    overrides: dict[str, object]
    expected_stages: tuple[str, ...]
    """Stages the diff may name as primary (empty for ``none``)."""
    expected_kind: str
    """``wait``, ``compute``, ``hidden_wait``, or ``none`` when nothing regressed."""

    @property
    def knobs(self) -> Knobs:
        return dataclasses.replace(BASELINE, **self.overrides)  # type: ignore[arg-type]


REGRESSIONS: dict[str, Regression] = {
    r.name: r
    for r in (
        Regression(
            name="batch",
            description=(
                "batcher waits up to 150 ms for batches of 32 on one worker "
                "(v1: 2 ms, 8, two workers)"
            ),
            overrides={"batch_max_size": 32, "batch_max_wait_ms": 150.0, "batch_workers": 1},
            expected_stages=(cv.BATCH_QUEUE,),
            expected_kind=cv.WAIT,
        ),
        Regression(
            name="downstream",
            description="pricing service: 20% of calls take 250 ms longer",
            overrides={"downstream_slow_fraction": 0.2, "downstream_slow_ms": 250.0},
            expected_stages=(cv.DOWNSTREAM,),
            expected_kind=cv.WAIT,
        ),
        Regression(
            name="model",
            description="a heavier ranking model: 5 hidden layers of 2048 (v1: 2 of 128)",
            # ~10 ms of CPU a request (4 layers of 1536 were 4.5 ms: +40 ms at p95, which a
            # busy core's bursts hid in 2 of 20 interleaved runs).
            overrides={"model_hidden": 2048, "model_layers": 5},
            expected_stages=(cv.MODEL_EXECUTE,),
            expected_kind=cv.COMPUTE,
        ),
        Regression(
            name="cache",
            description="feature cache disabled: every lookup goes to the feature store",
            overrides={"cache_enabled": False},
            expected_stages=(cv.FEATURE_RETRIEVAL,),
            expected_kind=cv.WAIT,
        ),
        Regression(
            name="contention",
            description=(
                "a background thread recomputes statistics in pure Python, burning CPU "
                "and holding the lock preprocessing needs (120 ms of every 200)"
            ),
            # Long holds: a preprocess that meets one waits up to 120 ms; the duty cycle
            # (CPU burnt) stays 60%.
            overrides={
                "contention_threads": 1,
                "contention_hold_ms": 120.0,
                "contention_pause_ms": 80.0,
            },
            expected_stages=COMPUTE_STAGES,
            expected_kind=cv.HIDDEN_WAIT,
        ),
        Regression(
            name="none",
            description="no change: v2 runs exactly what v1 runs",
            overrides={},
            expected_stages=(),
            expected_kind="none",
        ),
    )
}
"""Every ``--regression`` value, in the order ``tracekit demo --help`` lists them."""

DEFAULT_REGRESSION = "batch"


def get_regression(name: str) -> Regression:
    """The regression called ``name``; a :class:`ConfigError` listing the choices otherwise."""
    try:
        return REGRESSIONS[name]
    except KeyError:
        choices = ", ".join(REGRESSIONS)
        raise ConfigError(f"unknown regression {name!r}; choose one of: {choices}") from None


def knobs_for(name: str | None) -> Knobs:
    """The knobs a service runs with for regression ``name`` (baseline when empty)."""
    if not name:
        return BASELINE
    return get_regression(name).knobs
