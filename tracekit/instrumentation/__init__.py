"""Serving-side instrumentation: everything that runs inside the serving process.

Public names are re-exported from :mod:`tracekit`. The modules here are cheap at
import (no torch, duckdb or rich) and never raise into serving code: an internal
failure is logged once and the request goes on (see :mod:`._guard`).

- :mod:`.setup`      ``configure()`` / ``shutdown()``: provider, resource, exporters
- :mod:`.exporters`  OTLP-JSON-lines file exporter, drop-counting export pipeline
- :mod:`.stages`     ``stage()``: decorator and context manager for stage spans
- :mod:`.fastapi`    ``instrument_fastapi()``: request span + load attributes
- :mod:`.sampler`    background CPU/GPU utilisation sampler
- :mod:`.httpx`      ``instrument_httpx()``: downstream CLIENT spans, retries
- :mod:`.torch`      ``model_execution()`` / ``instrument_model()``: device-timed model spans
- :mod:`.generation` ``generation()``: queue, prefill and decode of a token-streaming request
- :mod:`.batching`   ``DynamicBatcher`` and the ``BatchRecorder`` hook API
- :mod:`.profiling`  ``profile_on`` rules and ``profile_next()``: ``torch.profiler`` on trigger
"""
