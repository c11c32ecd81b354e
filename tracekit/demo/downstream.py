"""The ``pricing`` service the ranker calls: a second FastAPI process with its own latency.

``POST /price`` with ``{"user_id": 7, "items": [...]}`` answers ``{"margins": [...]}``
after a short, seeded delay that stands for its own lookups. Under the ``downstream``
regression a seeded share of calls takes the slow path (say 10% of calls, 40 ms more),
the classic slow tail of a dependency. It is instrumented with
``tracekit.instrument_fastapi`` only: the ranker's ``traceparent`` header puts its server
span inside the ranker's trace, under the ranker's ``downstream`` span.

Run it with ``python -m tracekit.demo.downstream`` (flags and environment in
:mod:`tracekit.demo.settings`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

from fastapi import FastAPI
from pydantic import BaseModel, Field

import tracekit
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

SERVICE_NAME = "pricing"
"""``service.name`` of the downstream service."""
PRICE_PATH = "/price"
BASE_MS = 2.0
"""Least time a pricing call takes."""
JITTER_MS = 1.5
"""Mean of the exponential part of a call's time."""


class PriceRequest(BaseModel):
    user_id: int = Field(ge=0)
    items: list[int] = Field(max_length=1024)


class PriceResponse(BaseModel):
    margins: list[float]


class Pricing:
    """Margins per item, with the latency profile the knobs ask for."""

    def __init__(self, settings: Settings) -> None:
        knobs = settings.knobs
        self.slow_fraction = knobs.downstream_slow_fraction
        self.slow_ms = knobs.downstream_slow_ms
        # Separate streams: turning the slow tail on must not change the base delays.
        self._delay_rng = random.Random(settings.seed)
        self._slow_rng = random.Random(settings.seed + 1)
        self.slow_calls = 0

    def delay_s(self) -> float:
        ms = BASE_MS + self._delay_rng.expovariate(1.0 / JITTER_MS)
        if self._slow_rng.random() < self.slow_fraction:
            self.slow_calls += 1
            ms += self.slow_ms
        return ms / 1000.0

    @staticmethod
    def margins(user_id: int, items: list[int]) -> list[float]:
        # Deterministic per (user, item): the same request always gets the same prices.
        return [1.0 + ((user_id * 31 + item * 17) % 50) / 100.0 for item in items]


def create_app(settings: Settings) -> FastAPI:
    """The pricing app; tracing is configured in its lifespan."""
    pricing = Pricing(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        configure_tracing(SERVICE_NAME, settings)
        freeze_startup_heap()
        announce_ready(SERVICE_NAME, settings)
        try:
            yield
        finally:
            tracekit.shutdown()

    app = FastAPI(title="tracekit demo pricing", lifespan=lifespan)

    @app.post(PRICE_PATH, response_model=PriceResponse)
    async def price(request: PriceRequest) -> PriceResponse:
        await asyncio.sleep(pricing.delay_s())
        return PriceResponse(margins=pricing.margins(request.user_id, request.items))

    instrument_app(app, settings)
    return app


def cli_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m tracekit.demo.downstream`` (defaults from the environment)."""
    return build_parser(
        "python -m tracekit.demo.downstream",
        "The tracekit demo's pricing service: POST /price, traced with tracekit.",
        downstream=False,
    )


def main(argv: list[str] | None = None) -> None:
    serve_settings = parse_settings(cli_parser(), argv)
    serve(create_app(serve_settings), serve_settings)


if __name__ == "__main__":
    run_main(main)
