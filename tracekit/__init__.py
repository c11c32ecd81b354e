"""tracekit: where an ML inference request's latency goes, and what a release changed.

The serving-side API is re-exported here and imported lazily, so ``import tracekit``
in a serving process loads neither duckdb, rich nor torch::

    import tracekit
    tracekit.configure(service_name="ranker", service_version="v2")
    tracekit.instrument_fastapi(app)

The analyzer's front door is :class:`tracekit.Analysis` (also lazy: it needs the
``analysis`` extra)::

    with tracekit.Analysis.open("tracekit.duckdb") as analysis:
        print(analysis.diff("v1", "v2").verdict.summary)

and the ``tracekit`` command is a thin layer over it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The one table of the public API: public name -> module that defines it. ``__all__``
# is derived from it, and tests/test_public_api.py pins both.
_EXPORTS: dict[str, str] = {
    "Analysis": "tracekit.analysis.facade",
    "BatchRecorder": "tracekit.instrumentation.batching",
    "ConfigError": "tracekit.errors",
    "DynamicBatcher": "tracekit.instrumentation.batching",
    "TracekitError": "tracekit.errors",
    "communication": "tracekit.instrumentation.training",
    "configure": "tracekit.instrumentation.setup",
    "generation": "tracekit.instrumentation.generation",
    "instrument_ddp": "tracekit.instrumentation.ddp",
    "instrument_fastapi": "tracekit.instrumentation.fastapi",
    "instrument_httpx": "tracekit.instrumentation.httpx",
    "instrument_model": "tracekit.instrumentation.torch",
    "model_execution": "tracekit.instrumentation.torch",
    "profile_next": "tracekit.instrumentation.profiling",
    "shutdown": "tracekit.instrumentation.setup",
    "stage": "tracekit.instrumentation.stages",
    "train_steps": "tracekit.instrumentation.training",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # pragma: no cover
    # "X as X" marks each name as re-exported for type checkers and linters.
    from tracekit.analysis.facade import Analysis as Analysis
    from tracekit.errors import ConfigError as ConfigError
    from tracekit.errors import TracekitError as TracekitError
    from tracekit.instrumentation.batching import BatchRecorder as BatchRecorder
    from tracekit.instrumentation.batching import DynamicBatcher as DynamicBatcher
    from tracekit.instrumentation.ddp import instrument_ddp as instrument_ddp
    from tracekit.instrumentation.fastapi import instrument_fastapi as instrument_fastapi
    from tracekit.instrumentation.generation import generation as generation
    from tracekit.instrumentation.httpx import instrument_httpx as instrument_httpx
    from tracekit.instrumentation.profiling import profile_next as profile_next
    from tracekit.instrumentation.setup import configure as configure
    from tracekit.instrumentation.setup import shutdown as shutdown
    from tracekit.instrumentation.stages import stage as stage
    from tracekit.instrumentation.torch import instrument_model as instrument_model
    from tracekit.instrumentation.torch import model_execution as model_execution
    from tracekit.instrumentation.training import communication as communication
    from tracekit.instrumentation.training import train_steps as train_steps


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tracekit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
