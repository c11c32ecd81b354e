"""The ``llm`` service: a token-streaming FastAPI endpoint over a continuous-batching engine.

``POST /generate`` with ``{"prompt": "…", "max_tokens": 24}`` answers a stream of
server-sent events, one per token as the engine produces it
(``data: {"index": 0, "token": 104}``), then ``data: [DONE]``. The model is
:class:`~tracekit.demo.llm.model.TinyDecoder` over bytes (random weights from the seed;
the prompt's UTF-8 bytes are its tokens), served by
:class:`~tracekit.demo.llm.engine.Engine` with the KV cache and decode step of the
release's regression (:mod:`tracekit.demo.llm.regressions`).

Tracing is tracekit's public API only: ``instrument_fastapi`` makes each request's SERVER
span; inside it the response's stream runs in ``tracekit.generation()``, whose marks the
engine calls — ``admitted()`` when the request gets a slot, ``first_token()`` when its
prefill returns, ``token()`` per later token — so every request carries ``queue``,
``prefill`` and ``decode`` stage spans and vLLM's ``gen_ai.*`` latency attributes.

Run it with ``python -m tracekit.demo.llm.service`` (flags and environment in
:mod:`tracekit.demo.settings`; ``--regression kv|decode``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import torch
from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

import tracekit
from tracekit.demo.llm.engine import Engine
from tracekit.demo.llm.model import MAX_SEQ, Device, Runner, TinyDecoder, encode
from tracekit.demo.llm.regressions import BASELINE, EngineKnobs, llm_knobs_for
from tracekit.demo.settings import (
    Settings,
    announce_ready,
    build_parser,
    configure_tracing,
    freeze_startup_heap,
    instrument_app,
    parse_settings,
    run_main,
    serve,
)
from tracekit.errors import ConfigError

SERVICE_NAME = "llm"
"""``service.name`` of the LLM service."""
GENERATE_PATH = "/generate"
MODEL_NAME = "tiny-byte-decoder"
"""``gen_ai.response.model`` of every request."""
MAX_NEW_TOKENS = 128
DONE_EVENT = b"data: [DONE]\n\n"
"""The stream's last event."""
DECODE_ROWS = BASELINE.slots
"""Rows of every decode step in either release, the unused ones padding (see
:class:`~tracekit.demo.llm.model.Runner`)."""
DEVICE = Device(decode_ms=3.0, prefill_ms=1.0, prefill_token_ms=0.02)
"""The stand-in accelerator of either release (:class:`~tracekit.demo.llm.model.Device`):
3 ms a decode step whatever the batch, 1 ms + 0.02 ms a prompt token a prefill."""
WARM_UP_PROMPTS = (8, 24, 48, 96)
"""Prompt lengths the untraced warm-up runs (a few shapes of every torch op)."""


class GenerateRequest(BaseModel):
    prompt: str = Field(min_length=1, max_length=MAX_SEQ)
    max_tokens: int = Field(ge=1, le=MAX_NEW_TOKENS)


def token_event(index: int, token: int) -> bytes:
    """One server-sent event: the ``index``-th token of the answer."""
    return b"data: " + json.dumps({"index": index, "token": token}).encode() + b"\n\n"


def build_engine(knobs: EngineKnobs, seed: int) -> Engine:
    """The model (seeded), its KV cache of ``knobs.slots`` sequences, the engine over it."""
    # One intra-op thread: two releases on two cores do not oversubscribe them.
    torch.set_num_threads(1)
    model = TinyDecoder(seed=seed)
    runner = Runner(
        model,
        slots=knobs.slots,
        decode_rows=DECODE_ROWS,
        device=DEVICE,
        decode_extra=knobs.decode_extra,
    )
    return Engine(runner)


async def warm_up(engine: Engine) -> None:
    """Every prompt shape of the warm-up, a full cache's worth at once, untraced: the
    first runs of each torch op shape and the worker thread cost what no request should."""
    prompts = [encode("w" * n) for n in WARM_UP_PROMPTS]
    for _ in range(2):
        await asyncio.gather(
            *(engine.generate(prompts[i % len(prompts)], 8) for i in range(2 * engine.slots))
        )


async def stream_tokens(engine: Engine, prompt: list[int], max_tokens: int) -> AsyncIterator[bytes]:
    """The response body: the request's tokens as events, traced as one generation."""
    with tracekit.generation(
        prompt_tokens=len(prompt), max_tokens=max_tokens, model=MODEL_NAME
    ) as g:
        request = engine.submit(prompt, max_tokens, marks=g)
        index = 0
        async for token in engine.stream(request):
            yield token_event(index, token)
            index += 1
    yield DONE_EVENT


def create_app(settings: Settings) -> FastAPI:
    """The LLM app; the engine is built and warmed, then tracing configured, in its lifespan."""
    knobs = llm_knobs_for(settings.regression)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = build_engine(knobs, settings.seed)
        engine.start()
        await warm_up(engine)  # before tracing: warm-up requests are not the release's
        configure_tracing(SERVICE_NAME, settings)
        app.state.engine = engine
        freeze_startup_heap()
        announce_ready(SERVICE_NAME, settings)
        try:
            yield
        finally:
            await engine.aclose()
            tracekit.shutdown()

    app = FastAPI(title="tracekit demo LLM", lifespan=lifespan)

    @app.post(GENERATE_PATH)
    async def generate(request: GenerateRequest) -> StreamingResponse:
        engine: Engine = app.state.engine
        prompt = encode(request.prompt)
        try:
            engine.check(prompt, request.max_tokens)
        except ConfigError as exc:
            raise HTTPException(status_code=422, detail=str(exc)) from exc
        return StreamingResponse(
            stream_tokens(engine, prompt, request.max_tokens), media_type="text/event-stream"
        )

    instrument_app(app, settings)
    return app


def cli_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m tracekit.demo.llm.service`` (defaults from the environment)."""
    return build_parser(
        "python -m tracekit.demo.llm.service",
        "The tracekit demo's LLM service: POST /generate streams tokens, traced with tracekit.",
        downstream=False,
    )


def main(argv: list[str] | None = None) -> None:
    serve_settings = parse_settings(cli_parser(), argv, regressions=llm_knobs_for)
    serve(create_app(serve_settings), serve_settings)


if __name__ == "__main__":
    run_main(main)
