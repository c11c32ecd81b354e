"""The reference system behind ``tracekit demo``: a real service, a real regression.

- :mod:`tracekit.demo.service`: the ``ranker`` inference service (FastAPI + PyTorch),
  instrumented only through tracekit's public API.
- :mod:`tracekit.demo.downstream`: the ``pricing`` service the ranker calls over HTTP.
- :mod:`tracekit.demo.features` and :mod:`tracekit.demo.model`: the feature store behind
  an LRU cache and the PyTorch ranking model.
- :mod:`tracekit.demo.loadgen`: an open-loop load generator (Poisson arrivals, latency
  from the scheduled send time).
- :mod:`tracekit.demo.regressions`: the five regressions a v2 release can carry.
- :mod:`tracekit.demo.runner`: starts everything for v1 then v2, analyses, cleans up.

Importing this package loads nothing heavy; each module imports what it needs.
"""

from __future__ import annotations
