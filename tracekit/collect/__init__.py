"""Live collection: ``tracekit collect``'s receivers, batching writer and tail sampler.

    collector = Collector("tracekit.duckdb", port=4318, grpc_port=4317)
    collector.start()          # OTLP/HTTP and OTLP/gRPC now land in the store
    collector.status()         # spans/s, requests stored, releases seen, rejected
    collector.stop()           # answer what is in flight, write everything accepted

A service beside the analysis, not a step of it: it writes through ingest into the
store. :mod:`.decode` turns request bodies into clean OTLP JSON documents under
:class:`Limits` (in worker processes, :mod:`.pool`); :mod:`.otlp_http` (uvicorn) and
:mod:`.otlp_grpc` (grpcio) frame the answers; :mod:`.server` holds what both share;
:mod:`.wal` makes what is acknowledged durable; :mod:`.writer` writes batches with
ingest's own decoder and refreshes attribution; :mod:`.sampler` keeps slow traces and a
weighted fraction of the rest.

Names are imported on first use, so a decoding worker process that imports
:mod:`.decode` does not load the store, DuckDB or NumPy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BatchWriter": "tracekit.collect.writer",
    "CollectStatus": "tracekit.collect.server",
    "Collector": "tracekit.collect.server",
    "Limits": "tracekit.collect.decode",
    "SamplingPolicy": "tracekit.collect.server",
    "TailSampler": "tracekit.collect.sampler",
    "read_token": "tracekit.collect.server",
    "th_adjusted_count": "tracekit.collect.sampler",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from tracekit.collect.decode import Limits as Limits
    from tracekit.collect.sampler import TailSampler as TailSampler
    from tracekit.collect.sampler import th_adjusted_count as th_adjusted_count
    from tracekit.collect.server import Collector as Collector
    from tracekit.collect.server import CollectStatus as CollectStatus
    from tracekit.collect.server import SamplingPolicy as SamplingPolicy
    from tracekit.collect.server import read_token as read_token
    from tracekit.collect.writer import BatchWriter as BatchWriter


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tracekit.collect' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
