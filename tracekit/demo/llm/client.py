"""Load for the LLM service: open-loop arrivals, every answer read token by token.

Arrivals are the serving demo's (:func:`tracekit.demo.loadgen.block_plan`: Poisson
times drawn up front, each release's r-th block the same), and so are the turns — one
release thawed for its block, the others frozen. What differs is the request: a prompt
of varied length and a varied ``max_tokens`` (:func:`llm_payload`), and a response that
is a stream. Each one is read with httpx as it comes; the client's time to the first
token and to the end are measured from the *scheduled* send time (no coordinated
omission), and a request counts as served only if its stream brought exactly
``max_tokens`` tokens, in order, then ``[DONE]``. Loopback targets only; every request
has a timeout, so a run is bounded in time as well as count.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import string
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tracekit.demo.loadgen import (
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT_S,
    Block,
    LoadResult,
    _Turns,  # the serving demo's freeze/thaw bookkeeping, shared rather than copied
    require_loopback,
)

PROMPT_CHARS = (8, 96)
"""Shortest and longest prompt (characters = byte tokens)."""
MAX_TOKENS = (4, 24)
"""Least and most ``max_tokens`` a request asks for."""


def llm_payload(rng: random.Random) -> dict[str, Any]:
    """A ``/generate`` body: a prompt of random words, a random number of tokens to make."""
    length = rng.randint(*PROMPT_CHARS)
    text = ""
    while len(text) < length:
        word = "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
        text = f"{text} {word}" if text else word
    return {"prompt": text[:length], "max_tokens": rng.randint(*MAX_TOKENS)}


@dataclass
class StreamLoad(LoadResult):
    """A :class:`LoadResult` of streams: also each served request's time to first token."""

    ttft_ms: list[float] = field(default_factory=list)
    tokens: int = 0
    """Tokens received by served requests."""

    def ttft_quantile(self, q: float) -> float:
        """Nearest-rank quantile of the client's time to first token (nan when none)."""
        if not self.ttft_ms:
            return float("nan")
        ordered = sorted(self.ttft_ms)
        return ordered[max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))]


def _count(result: LoadResult, key: str) -> None:
    result.errors[key] = result.errors.get(key, 0) + 1


async def read_stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    scheduled_at: float,
    result: StreamLoad,
) -> None:
    """Send one request and read its events; record it as served or as one error."""
    result.send_lag_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
    first: float | None = None
    index = 0
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code >= 400:
                await response.aread()
                _count(result, f"http {response.status_code}")
                return
            done = False
            # Read to the end of the body, not just to [DONE]: the service sends the
            # body's end once the request's span has ended (SpansBeforeResponse), and a
            # release is frozen as soon as its block's last request is over here.
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if done:
                    _count(result, "data after [DONE]")
                    return
                if data == "[DONE]":
                    done = True
                    continue
                if json.loads(data).get("index") != index:
                    _count(result, "out of order")
                    return
                if first is None:
                    first = time.perf_counter()
                index += 1
            end = time.perf_counter()
            if not done:
                _count(result, "no [DONE]")
                return
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: an event that is not JSON
        _count(result, type(exc).__name__)
        return
    if index != body["max_tokens"] or first is None:
        _count(result, "wrong token count")
        return
    result.ttft_ms.append((first - scheduled_at) * 1000.0)
    result.latencies_ms.append((end - scheduled_at) * 1000.0)
    result.tokens += index


def _client(timeout_s: float) -> httpx.AsyncClient:
    # Keep-alive limit = connection limit (see tracekit.demo.loadgen._client).
    limits = httpx.Limits(
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
    )
    return httpx.AsyncClient(timeout=timeout_s, limits=limits)


async def run_stream_blocks(
    urls: Sequence[str],
    plan: Sequence[Block],
    *,
    block_s: float,
    pause: Callable[[int], None],
    resume: Callable[[int], None],
    settle_s: float = 0.05,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> list[StreamLoad]:
    """Drive ``urls`` block by block, one target at a time; one result per target.

    As :func:`tracekit.demo.loadgen.run_blocks`: the targets come frozen and leave
    thawed; block *i* owns the slot ``[i, i + 1) × block_s`` of a fixed grid, its target
    thawed ``settle_s`` before it and frozen again once the block's last stream has
    ended and the next block is another target's.
    """
    for url in urls:
        require_loopback(url)
    results = [StreamLoad() for _ in urls]
    for block in plan:
        results[block.target].scheduled += len(block.offsets)
        results[block.target].elapsed_s += block_s
    turns = _Turns(len(urls), pause, resume)

    async def launch(block: Block, client: httpx.AsyncClient, start: float) -> list[Any]:
        """Start each of the block's requests at its time; returns once the last is sent."""
        rng = random.Random(block.seed + 1)
        result, url = results[block.target], urls[block.target]
        tasks = []
        for offset in block.offsets:
            body = llm_payload(rng)
            await _sleep_until(start + offset)
            read = read_stream(client, url, body, start + offset, result)
            tasks.append(asyncio.create_task(read))
        return tasks

    async def finish(block: Block, tasks: list[asyncio.Task[None]]) -> None:
        if tasks:
            # each read has its timeout; this bound only guards against a stuck pool
            _, pending = await asyncio.wait(tasks, timeout=timeout_s + 5.0)
            for task in pending:
                task.cancel()
                _count(results[block.target], "abandoned")
        turns.active[block.target] -= 1
        turns.settle(block.target)

    async with contextlib.AsyncExitStack() as stack:
        # one pool per target: one release's connections never queue behind another's
        clients = [await stack.enter_async_context(_client(timeout_s)) for _ in urls]
        endings: list[asyncio.Task[None]] = []
        try:
            origin = time.perf_counter() + settle_s
            for i, block in enumerate(plan):
                start = origin + i * block_s
                await _sleep_until(start - settle_s)
                turns.enter(block.target)
                turns.active[block.target] += 1
                tasks = await launch(block, clients[block.target], start)
                endings.append(asyncio.create_task(finish(block, tasks)))
            async with asyncio.timeout(timeout_s + 30.0):
                await asyncio.gather(*endings)
        finally:
            for ending in endings:
                ending.cancel()
            # all thawed, whatever happened: the caller stops them next
            turns.thaw_all()
    return results


async def _sleep_until(when: float) -> None:
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
