"""The ``ranker`` inference service: FastAPI + PyTorch, instrumented only through tracekit.

``POST /predict`` with ``{"user_id": 7, "items": [3, 14, ...]}`` runs, in order:

1. ``feature_retrieval``: the user's features from :class:`~tracekit.demo.features.FeatureStore`
   (LRU cache, else SQLite plus the remote round trip), tagged with ``tracekit.cache.hit``;
2. ``preprocess``: crossing user and item features and encoding them (real tensor work,
   in a worker thread as CPU-bound FastAPI code should be);
3. ``batch_queue`` + ``model_execute``: a :class:`tracekit.DynamicBatcher` batches requests
   and runs the PyTorch :class:`~tracekit.demo.model.Ranker` under ``model_execution``;
4. ``downstream``: the pricing service over an instrumented ``httpx.AsyncClient``;
5. ``postprocess``: margins applied, top items chosen.

Run it with ``python -m tracekit.demo.service`` (flags and environment in
:mod:`tracekit.demo.settings`). The ``contention`` regression starts a thread that keeps
recomputing the normalisation statistics in pure Python: it burns a core, competes for the
GIL and holds the statistics lock, so ``preprocess`` waits while its own CPU time stays
the same — wall time that only the CPU measurement can tell apart from work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

import tracekit
from tracekit import conventions as cv
from tracekit.demo import model as ranking
from tracekit.demo.downstream import PRICE_PATH
from tracekit.demo.features import CANDIDATES, HOT_USERS, FeatureStore
from tracekit.demo.settings import (
    ENV_DOWNSTREAM_URL,
    HEALTH_PATH,
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

SERVICE_NAME = "ranker"
"""``service.name`` of the inference service (``tracekit ingest --service ranker``)."""
PREDICT_PATH = "/predict"
DOWNSTREAM_TIMEOUT_S = 2.0
WARM_UP_ROUNDS = 3
"""Rounds of a full batch of requests run, untraced, before the ranker reports ready."""


class PredictRequest(BaseModel):
    user_id: int = Field(ge=0)
    items: list[int] = Field(min_length=1, max_length=CANDIDATES)


class PredictResponse(BaseModel):
    user_id: int
    items: list[int]
    cache_hit: bool


def _refresh_stats(
    stats: ranking.FeatureStats, stop: threading.Event, hold_s: float, pause_s: float
) -> None:
    """The ``contention`` regression: a background thread that keeps recomputing the
    normalisation statistics in pure Python, burning a core and holding the lock every
    ``preprocess`` needs for ``hold_s`` out of every ``hold_s + pause_s``."""
    while not stop.is_set():
        stats.refresh(hold_s)
        stop.wait(pause_s)


@dataclass
class Ranker:
    """Everything a request needs, built once at start-up."""

    settings: Settings
    features: FeatureStore
    model: ranking.Ranker
    encoder: ranking.FeatureEncoder
    stats: ranking.FeatureStats
    items: torch.Tensor
    batcher: Any
    client: httpx.AsyncClient
    stop: threading.Event = field(default_factory=threading.Event)
    hogs: list[threading.Thread] = field(default_factory=list)

    def run_batch(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        # Sync: the batcher runs it in a worker thread, off the event loop.
        knobs = self.settings.knobs
        with tracekit.model_execution():
            scores = ranking.score_batch(self.model, inputs)
            device_ms = knobs.device_fixed_ms + knobs.device_per_request_ms * len(inputs)
            if device_ms > 0:  # the stand-in accelerator (demo --capacity); GIL released
                time.sleep(device_ms / 1000.0)
            return scores

    def preprocess(self, user: Any, item_ids: list[int]) -> torch.Tensor:
        # Runs in a worker thread (asyncio.to_thread copies the trace context), so the
        # stage's CPU time is that thread's own and the event loop stays free meanwhile.
        with tracekit.stage(cv.PREPROCESS):
            return ranking.preprocess(user, item_ids, self.items, self.encoder, self.stats)

    async def predict(self, request: PredictRequest) -> PredictResponse:
        hit = self.features.is_cached(request.user_id)
        # The cache decision is known before the lookup starts (no await in between), so
        # it can be a start attribute of the stage span.
        attributes: dict[str, Any] = {cv.CACHE_HIT: hit}
        async with tracekit.stage(cv.FEATURE_RETRIEVAL, **attributes):
            user, _ = await self.features.get(request.user_id)
        x = await asyncio.to_thread(self.preprocess, user, request.items)
        scores = await self.batcher.submit(x)
        try:
            response = await self.client.post(
                PRICE_PATH, json={"user_id": request.user_id, "items": request.items}
            )
            response.raise_for_status()
            margins = [float(m) for m in response.json()["margins"]]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            raise HTTPException(status_code=502, detail=f"pricing: {exc}") from exc
        with tracekit.stage(cv.POSTPROCESS):
            top = ranking.postprocess(request.items, scores, margins)
        return PredictResponse(user_id=request.user_id, items=top, cache_hit=hit)

    async def warm_up(self) -> None:
        """Run the request path a few times, untraced, before the service reports ready.

        A fresh process pays one-off costs on its first requests (worker threads
        spawned, connections to pricing opened, the first torch ops of each batch
        shape). Under open-loop load one such stall delays every request queued behind
        it, which in a short run is the whole p95 cohort, so a release would look slow
        for having started, not for what it changed. Real services warm up before
        readiness for the same reason. Tracing is configured only afterwards, so none of
        this reaches the traces; pricing is asked only for its untraced health route,
        which opens the pooled connections.
        """
        size = self.settings.knobs.batch_max_size
        items = list(range(CANDIDATES))

        async def one(user_id: int) -> None:
            user, _ = await self.features.get(user_id)
            x = await asyncio.to_thread(self.preprocess, user, items)
            await self.batcher.submit(x)

        for _ in range(WARM_UP_ROUNDS):
            await asyncio.gather(
                *(one(i % HOT_USERS) for i in range(size)),
                *(self.client.get(HEALTH_PATH) for _ in range(size)),
            )

    def start_contention(self) -> None:
        knobs = self.settings.knobs
        args = (self.stop, knobs.contention_hold_ms / 1000.0, knobs.contention_pause_ms / 1000.0)
        for n in range(knobs.contention_threads):
            t = threading.Thread(
                target=_refresh_stats,
                args=(self.stats, *args),
                name=f"stats-refresh-{n}",
                daemon=True,
            )
            t.start()
            self.hogs.append(t)

    async def close(self) -> None:
        self.stop.set()
        for t in self.hogs:
            t.join(timeout=1.0)
        await self.batcher.aclose()
        await self.client.aclose()
        self.features.close()


def build_ranker(settings: Settings) -> Ranker:
    """Model, feature store, batcher and client for ``settings`` (no tracing set up here)."""
    knobs = settings.knobs
    # One intra-op thread: the model's CPU time is then the worker thread's own, which is
    # what tracekit measures; and two processes on two cores do not oversubscribe.
    torch.set_num_threads(1)
    model = ranking.Ranker(hidden=knobs.model_hidden, layers=knobs.model_layers, seed=settings.seed)
    encoder = ranking.FeatureEncoder(seed=settings.seed)
    items = ranking.item_table(settings.seed)
    stats = ranking.FeatureStats(ranking.sample_inputs(items, settings.seed))
    ranking.warm_up(model, encoder, items, stats, knobs.batch_max_size)
    features = FeatureStore(cache_enabled=knobs.cache_enabled, seed=settings.seed)
    features.warm()
    if not settings.downstream_url:
        raise ConfigError(
            f"the ranker needs the pricing service's URL: --downstream-url or {ENV_DOWNSTREAM_URL}"
        )
    client = tracekit.instrument_httpx(
        httpx.AsyncClient(base_url=settings.downstream_url, timeout=DOWNSTREAM_TIMEOUT_S)
    )
    state = Ranker(
        settings=settings,
        features=features,
        model=model,
        encoder=encoder,
        stats=stats,
        items=items,
        batcher=None,
        client=client,
    )
    state.batcher = tracekit.DynamicBatcher(
        state.run_batch,
        max_batch_size=knobs.batch_max_size,
        max_wait_ms=knobs.batch_max_wait_ms,
        workers=knobs.batch_workers,
    )
    return state


def create_app(settings: Settings) -> FastAPI:
    """The ranker app; the model is built and warmed, then tracing configured, in its lifespan."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_ranker(settings)
        await state.warm_up()  # before tracing: warm-up requests are not the release's
        configure_tracing(SERVICE_NAME, settings)
        state.start_contention()
        app.state.ranker = state
        freeze_startup_heap()
        announce_ready(SERVICE_NAME, settings)
        try:
            yield
        finally:
            await state.close()
            tracekit.shutdown()

    app = FastAPI(title="tracekit demo ranker", lifespan=lifespan)

    @app.post(PREDICT_PATH, response_model=PredictResponse)
    async def predict(request: PredictRequest) -> PredictResponse:
        ranker: Ranker = app.state.ranker
        return await ranker.predict(request)

    instrument_app(app, settings)
    return app


def cli_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m tracekit.demo.service`` (defaults from the environment)."""
    return build_parser(
        "python -m tracekit.demo.service",
        "The tracekit demo's ranker: POST /predict, traced with tracekit.",
        downstream=True,
    )


def main(argv: list[str] | None = None) -> None:
    serve_settings = parse_settings(cli_parser(), argv)
    serve(create_app(serve_settings), serve_settings)


if __name__ == "__main__":
    run_main(main)
