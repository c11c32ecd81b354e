"""What release v2 of ``tracekit demo --llm`` changes, and what tracekit should find.

The engine has two knobs (:class:`EngineKnobs`): how many sequences its KV cache holds
(slots: requests that decode at once; the rest wait in the queue) and whether each
decode step does extra work. v1 runs :data:`BASELINE`; v2 the baseline with one
regression's overrides. Each regression names the metric its effect shows in (TTFT for
a queue, TPOT for a slower step) and the stage and kind of time the diff should name.

No torch here: ``tracekit demo --help`` lists these without importing it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tracekit import conventions as cv
from tracekit.errors import ConfigError


@dataclass(frozen=True)
class EngineKnobs:
    """Every setting a regression may change; the defaults are release v1."""

    slots: int = 8
    """Sequences the KV cache holds: requests decoding at once (the rest queue)."""
    decode_extra: int = 0
    """Width of a square projection each decode step also runs, its result unused
    (0: none): real CPU work, about 3–4 ms a step at 2048 on one core, whatever the batch."""


BASELINE = EngineKnobs()
"""Release v1."""


@dataclass(frozen=True)
class LlmRegression:
    """One v2 change and what the analysis is expected to say about it."""

    name: str
    description: str
    overrides: dict[str, int]
    metric: str
    """The request metric the change shows in: ``ttft`` or ``tpot``."""
    expected_stage: str
    expected_kind: str

    @property
    def knobs(self) -> EngineKnobs:
        return dataclasses.replace(BASELINE, **self.overrides)

    @property
    def expected(self) -> str:
        """``queue (wait)``: the stage and kind the diff should name."""
        return f"{self.expected_stage} ({self.expected_kind})"


LLM_REGRESSIONS: dict[str, LlmRegression] = {
    r.name: r
    for r in (
        LlmRegression(
            name="kv",
            description="a KV cache for 2 sequences (v1: 8): fewer requests decode at once, "
            "the rest queue for a slot",
            overrides={"slots": 2},
            metric="ttft",
            expected_stage=cv.QUEUE,
            expected_kind=cv.WAIT,
        ),
        LlmRegression(
            name="decode",
            description="every decode step also runs a 2048×2048 projection whose result "
            "is unused (a debugging head left on)",
            overrides={"decode_extra": 2048},
            metric="tpot",
            expected_stage=cv.DECODE,
            expected_kind=cv.COMPUTE,
        ),
    )
}
"""Every ``--llm --regression`` value, in the order ``tracekit demo --help`` lists them."""

DEFAULT_LLM_REGRESSION = "kv"


def get_llm_regression(name: str) -> LlmRegression:
    """The regression called ``name``; a :class:`ConfigError` listing the choices otherwise."""
    try:
        return LLM_REGRESSIONS[name]
    except KeyError:
        choices = ", ".join(LLM_REGRESSIONS)
        raise ConfigError(f"unknown LLM regression {name!r}; choose one of: {choices}") from None


def llm_knobs_for(name: str | None) -> EngineKnobs:
    """The knobs an engine runs with for regression ``name`` (baseline when empty)."""
    return get_llm_regression(name).knobs if name else BASELINE
