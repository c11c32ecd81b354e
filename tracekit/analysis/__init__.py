"""The analyzer: ingest → store → attribution → diff / gate / autoscale → results.

Needs the ``analysis`` extra (duckdb, numpy). The front door is :class:`Analysis`
(``from tracekit import Analysis``), opened on a store; it is imported lazily, so
``import tracekit.analysis.store`` loads no more than the store. Analysis functions
return dataclasses and never print; renderers in ``tracekit.render`` turn them into text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from tracekit.analysis.facade import Analysis as Analysis

__all__ = ["Analysis"]


def __getattr__(name: str) -> Any:
    if name == "Analysis":
        from tracekit.analysis.facade import Analysis

        return Analysis
    raise AttributeError(f"module 'tracekit.analysis' has no attribute {name!r}")
