"""Renderers: analysis results (dataclasses) → table, json or markdown text.

Renderers never query the store; analysis functions never print. :func:`render` picks
the renderer by the result's type, so a command is parse → one analysis call →
``emit(result, fmt)``. The table below names each result type's renderer module
lazily: a command imports only the renderer it uses.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

FORMATS: tuple[str, ...] = ("table", "json", "markdown")
"""Every analysis command's ``--format`` choices."""

RENDERER_TABLES: dict[str, str] = {
    "DiffResult": "tracekit.render.diff:RENDERERS",
    "Explanation": "tracekit.render.explain:RENDERERS",
    "GateResult": "tracekit.render.gate:RENDERERS",
    "AutoscaleResult": "tracekit.render.autoscale:RENDERERS",
    "SlowFast": "tracekit.render.summary:SLOW_RENDERERS",
    "list[Summary]": "tracekit.render.summary:SUMMARY_RENDERERS",
    "IngestOutcome": "tracekit.render.ingest:RENDERERS",
    "StepsResult": "tracekit.render.training:STEPS_RENDERERS",
    "TrainingDiff": "tracekit.render.training:DIFF_RENDERERS",
    "TrainingGateResult": "tracekit.render.training:GATE_RENDERERS",
}
"""Result type name (``list[T]`` for a list of T) → ``module:table`` of its renderers."""


def type_key(result: Any) -> str:
    """The :data:`RENDERER_TABLES` key of ``result``."""
    if isinstance(result, Sequence) and not isinstance(result, str | bytes):
        inner = type(result[0]).__name__ if len(result) else "object"
        return f"list[{inner}]"
    return type(result).__name__


def renderers_for(result: Any) -> dict[str, Callable[[Any], str]]:
    """The ``{format: renderer}`` table for ``result``'s type."""
    key = type_key(result)
    where = RENDERER_TABLES.get(key)
    if where is None:
        raise TypeError(f"no renderer for a {key}; add it to tracekit.render.RENDERER_TABLES")
    module, _, name = where.partition(":")
    table: dict[str, Callable[[Any], str]] = getattr(importlib.import_module(module), name)
    return table


def render(result: Any, fmt: str) -> str:
    """``result`` as text in ``fmt`` (one of :data:`FORMATS`)."""
    return renderers_for(result)[fmt](result)
