"""Live collection: ``tracekit collect``'s receivers, batching writer and tail sampler.

    collector = Collector("tracekit.duckdb", port=4318, grpc_port=4317)
    collector.start()          # OTLP/HTTP and OTLP/gRPC now land in the store
    collector.status()         # spans/s, requests stored, releases seen, rejected
    collector.stop()           # answer what is in flight, write everything accepted

A service beside the analysis, not a step of it: it writes through ingest into the
store. :mod:`.decode` turns request bodies into clean OTLP JSON documents under
:class:`Limits`; :mod:`.otlp_http` (uvicorn) and :mod:`.otlp_grpc` (grpcio) frame
the answers; :mod:`.server` holds what both share; :mod:`.writer` writes batches with
ingest's own decoder and refreshes attribution; :mod:`.sampler` keeps slow traces and a
weighted fraction of the rest.
"""

from __future__ import annotations

from tracekit.collect.decode import Limits
from tracekit.collect.sampler import TailSampler, th_adjusted_count
from tracekit.collect.server import Collector, CollectStatus, SamplingPolicy, read_token
from tracekit.collect.writer import BatchWriter

__all__ = [
    "BatchWriter",
    "CollectStatus",
    "Collector",
    "Limits",
    "SamplingPolicy",
    "TailSampler",
    "read_token",
    "th_adjusted_count",
]
