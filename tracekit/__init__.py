"""tracekit: where an ML inference request's latency goes, and what a release changed.

The serving-side API is re-exported here and imported lazily, so ``import tracekit``
in a serving process loads neither duckdb, rich nor torch::

    import tracekit
    tracekit.configure(service_name="ranker", service_version="v2")
    tracekit.instrument_fastapi(app)

The analyzer lives in :mod:`tracekit.analysis` and the ``tracekit`` command.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "BatchRecorder": "tracekit.instrumentation.batching",
    "DynamicBatcher": "tracekit.instrumentation.batching",
    "configure": "tracekit.instrumentation.setup",
    "instrument_fastapi": "tracekit.instrumentation.fastapi",
    "instrument_httpx": "tracekit.instrumentation.httpx",
    "instrument_model": "tracekit.instrumentation.torch",
    "model_execution": "tracekit.instrumentation.torch",
    "shutdown": "tracekit.instrumentation.setup",
    "stage": "tracekit.instrumentation.stages",
}

__all__ = [
    "BatchRecorder",
    "DynamicBatcher",
    "configure",
    "instrument_fastapi",
    "instrument_httpx",
    "instrument_model",
    "model_execution",
    "shutdown",
    "stage",
]

if TYPE_CHECKING:  # pragma: no cover
    from tracekit.instrumentation.batching import BatchRecorder, DynamicBatcher
    from tracekit.instrumentation.fastapi import instrument_fastapi
    from tracekit.instrumentation.httpx import instrument_httpx
    from tracekit.instrumentation.setup import configure, shutdown
    from tracekit.instrumentation.stages import stage
    from tracekit.instrumentation.torch import instrument_model, model_execution


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
