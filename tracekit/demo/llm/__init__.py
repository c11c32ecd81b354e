"""``tracekit demo --llm``: a token-streaming LLM service, two releases, what v2 broke.

- :mod:`.model`: a tiny decoder-only transformer over bytes (random weights from a seed)
  and the runner that prefills into and decodes from its KV cache;
- :mod:`.engine`: continuous batching — requests join a running batch in free slots,
  one prefill each, one batched decode step for all, tokens streamed as they come;
- :mod:`.service`: the FastAPI app (``POST /generate``, server-sent events), traced with
  ``instrument_fastapi`` and ``tracekit.generation()``;
- :mod:`.client`: open-loop load that reads every answer as a stream, in turns;
- :mod:`.regressions`: what v2 changes (``kv``, ``decode``) and what tracekit should say;
- :mod:`.demo`: starts v1 and v2, drives them interleaved, ingests, prints the diffs.

Importing this package loads nothing heavy; each module imports what it needs.
"""
