"""Live collection: ``tracekit collect``'s OTLP/HTTP receiver, batching writer and tail
sampler.

    collector = Collector("tracekit.duckdb", port=4318)
    collector.start()          # POST /v1/traces now lands in the store, batch by batch
    collector.status()         # spans/s, requests stored, releases seen, rejected
    collector.stop()           # write everything accepted, then return

:mod:`.decode` turns request bodies into OTLP JSON documents, :mod:`.writer` writes them
with ingest's own decoder and refreshes attribution, :mod:`.sampler` keeps slow traces
and a weighted fraction of the rest, :mod:`.server` speaks OTLP/HTTP. This layer sits
beside gate and autoscale: it uses ingest, attribution's refresh and the store.
"""

from __future__ import annotations

from tracekit.analysis.collect.sampler import TailSampler, th_adjusted_count
from tracekit.analysis.collect.server import Collector, CollectStatus, SamplingPolicy
from tracekit.analysis.collect.writer import BatchWriter

__all__ = [
    "BatchWriter",
    "CollectStatus",
    "Collector",
    "SamplingPolicy",
    "TailSampler",
    "th_adjusted_count",
]
