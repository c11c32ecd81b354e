"""The result vocabulary every analysis answer is written in (docs/design.md, "Results").

The small types that ``diff``, ``gate``, ``slow`` and the training commands all return
live here once, below every analysis layer, so compare, gate, training and the
renderers name the same thing the same way:

- :class:`ReleaseRef` — a release (or training run) as a result reports it;
- :class:`Outcome` — a gate's or a budget's pass / fail / inconclusive;
- :class:`Verdict` — which stage grew the tail and what kind of time it is;
- :class:`TrainingVerdict` — what ate a training run's scaling efficiency;
- :class:`Flag` — something the reader must know to trust the answer.

What an outcome means to a shell (exit codes) is the CLI's business, not the
analysis': see ``tracekit.commands._common.EXIT_CODES``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Outcome(StrEnum):
    """A budget's or a whole gate's result (JSON: the lower-case word)."""

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"


PASS = Outcome.PASS
FAIL = Outcome.FAIL
INCONCLUSIVE = Outcome.INCONCLUSIVE


def overall(results: Sequence[str]) -> Outcome:
    """Fail if any check fails, else inconclusive if any is, else pass."""
    if FAIL in results:
        return FAIL
    if INCONCLUSIVE in results:
        return INCONCLUSIVE
    return PASS


@dataclass(frozen=True)
class ReleaseRef:
    """A release as a result names it: its label and how many requests it holds."""

    label: str
    requests: int
    """Requests kept in the store."""
    estimated_requests: float = 0.0
    """Their summed sample weights: the requests they stand for."""


@dataclass(frozen=True)
class NamedOperation:
    """The operation that holds most of the primary stage's growth (docs/diff.md)."""

    service: str
    operation: str
    """Attacker-controlled text from the traces: escape it wherever it is shown."""
    removed_ms: float
    """Tail growth that disappears when this operation alone is put back."""
    stage_removed_ms: float
    """The same for its whole stage."""
    share: float
    """Of the tail growth (as a stage's share)."""
    calls_before: float
    calls_after: float
    """Calls per tail-cohort request."""
    serial: bool | None
    """After the release, calls repeated in a request ran one after another (None: no
    request called it twice)."""


@dataclass(frozen=True)
class Verdict:
    """The answer to "which stage grew the tail, and what kind of time is it"."""

    primary_stage: str | None
    kind: str
    """``wait``, ``compute``, ``hidden_wait`` or ``none``."""
    share: float | None
    """Fraction of the tail growth the primary stage explains (NaN when no stage is
    named; JSON null)."""
    summary: str
    operation: NamedOperation | None = None
    """The operation beneath the primary stage that holds most of its growth, if one does."""


@dataclass(frozen=True)
class Flag:
    """Something the reader must know to trust the answer; ``code`` is stable."""

    code: str
    message: str


@dataclass
class TrainingVerdict:
    """What ate a training run's efficiency: data loading, communication, a straggler
    or compute (docs/design.md, "Training steps")."""

    bottleneck: str
    summary: str
    fix: str
    ranks: list[int]
    """The straggler ranks, when the bottleneck is a straggler."""
    shares: dict[str, float] = field(default_factory=dict)
    """Share of the lost step time per bottleneck."""


UNLABELLED = "(no service.version)"
"""How prose names the requests whose resource carried no ``service.version`` (their
label is ``""``: ``tracekit summary`` shows them, ``--version ''`` selects them)."""


def release_name(label: str) -> str:
    """``label`` as a sentence or a table shows it: :data:`UNLABELLED` for ``""``."""
    return label or UNLABELLED
