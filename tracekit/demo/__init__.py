"""The reference system behind ``tracekit demo``: a real service, a real regression.

- :mod:`tracekit.demo.service`: the ``ranker`` inference service (FastAPI + PyTorch),
  instrumented only through tracekit's public API.
- :mod:`tracekit.demo.downstream`: the ``pricing`` service the ranker calls over HTTP.
- :mod:`tracekit.demo.features` and :mod:`tracekit.demo.model`: the feature store behind
  an LRU cache and the PyTorch ranking model.
- :mod:`tracekit.demo.loadgen`: an open-loop load generator (Poisson arrivals, latency
  from the scheduled send time).
- :mod:`tracekit.demo.regressions`: the regressions a v2 release can carry.
- :mod:`tracekit.demo.interleave`: several releases served at once and loaded in turns
  of short blocks, the ones not under load frozen, so all see the same machine.
- :mod:`tracekit.demo.runner`: starts v1 and v2, loads them interleaved, analyses,
  cleans up.
- :mod:`tracekit.demo.processes` and :mod:`tracekit.demo.settings`: starting and stopping
  the service processes; the variables and defaults they read.
- :mod:`tracekit.demo.collect_loop`: ``--collect``, spans over OTLP into ``tracekit collect``.
- :mod:`tracekit.demo.training` and :mod:`tracekit.demo.trainer`: ``--training``, a 1-rank
  and a 2-rank DDP job and the scaling diff.
- :mod:`tracekit.demo.capacity`: ``--capacity``, small against big batches under bursty
  load and ``tracekit capacity``'s verdict for each.
- :mod:`tracekit.demo.llm`: ``--llm``, a token-streaming LLM service with continuous
  batching, two releases and the diff in TTFT and TPOT beside e2e.
- :mod:`tracekit.demo.command`: the ``tracekit demo`` command (serving, ``--training``,
  ``--capacity`` or ``--llm``).

Importing this package loads nothing heavy; each module imports what it needs.
"""

from __future__ import annotations
