"""An open-loop load generator: Poisson arrivals, latency from the scheduled send time.

A closed-loop client (send, wait, send again) slows down when the server stalls, so
it sends fewer requests exactly when latency is bad and the stall hides in a handful
of samples: coordinated omission. Here arrival times are drawn up front from a seeded
exponential inter-arrival distribution, every request is launched at its own time no
matter how many are still outstanding, and its latency runs from the time it was
*scheduled*, so any delay in this process (a busy event loop, a full connection pool)
counts against the service too, as it would for a real user.

It is bounded: at most ``rate × duration`` requests (and ``max_requests``), launched
within ``duration`` seconds, each with a timeout, after which it stops by itself. It
only targets loopback addresses.

:func:`run_blocks` drives several targets (releases) in turn, in short blocks on a fixed
time grid (:func:`block_plan`), so that whatever else the machine is doing meanwhile
falls on every release alike. Every target's r-th block has the same arrival times and
request bodies: the releases are compared on identical inputs.

Run it with ``python -m tracekit.demo.loadgen --url http://127.0.0.1:8000/predict``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import random
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from tracekit.demo.features import CANDIDATES, HOT_USERS, ITEM_COUNT, USER_COUNT
from tracekit.errors import ConfigError

COLD_FRACTION = 0.005
"""Share of requests for a user outside the hot set (a likely cache miss)."""
REQUEST_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 256

Payload = Callable[[random.Random], dict[str, Any]]


def ranker_payload(rng: random.Random) -> dict[str, Any]:
    """A ``/predict`` body: a mostly-hot user and a random slate of candidates."""
    if rng.random() < COLD_FRACTION:
        user = rng.randrange(HOT_USERS, USER_COUNT)
    else:
        user = rng.randrange(HOT_USERS)
    items = [rng.randrange(ITEM_COUNT) for _ in range(CANDIDATES)]
    return {"user_id": user, "items": items}


def arrival_offsets(
    rate: float, duration_s: float, seed: int, limit: int | None = None
) -> list[float]:
    """Send times (seconds from the start) of a Poisson process of ``rate`` per second."""
    if rate <= 0 or duration_s <= 0:
        raise ConfigError("load: --rate and --duration must be positive")
    rng = random.Random(seed)
    offsets: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s and (limit is None or len(offsets) < limit):
        offsets.append(t)
        t += rng.expovariate(rate)
    return offsets


def require_loopback(url: str) -> None:
    """Refuse any target that does not resolve to a loopback address only."""
    host = urlsplit(url).hostname
    if not host:
        raise ConfigError(f"load: {url!r} has no host")
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise ConfigError(f"load: cannot resolve {host!r}: {exc}") from exc
    addresses = {str(info[4][0]) for info in infos}
    if not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise ConfigError(
            f"load: {host} resolves to {', '.join(sorted(addresses))}; "
            "the load generator only targets loopback addresses"
        )


@dataclass
class LoadResult:
    """What one run measured. Latencies are milliseconds from the scheduled send time."""

    scheduled: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    """How late each request actually left (event loop or pool delays); already inside
    its latency."""
    errors: dict[str, int] = field(default_factory=dict)
    elapsed_s: float = 0.0

    @property
    def completed(self) -> int:
        return len(self.latencies_ms)

    @property
    def failed(self) -> int:
        return sum(self.errors.values())

    def quantile(self, q: float) -> float:
        """Nearest-rank quantile of the successful requests' latency (nan when none)."""
        if not self.latencies_ms:
            return float("nan")
        ordered = sorted(self.latencies_ms)
        rank = max(0, min(len(ordered) - 1, int(q * len(ordered) + 0.999999) - 1))
        return ordered[rank]

    def summary(self) -> dict[str, Any]:
        return {
            "scheduled": self.scheduled,
            "completed": self.completed,
            "failed": self.failed,
            "errors": self.errors,
            "elapsed_s": round(self.elapsed_s, 3),
            "p50_ms": round(self.quantile(0.50), 3),
            "p95_ms": round(self.quantile(0.95), 3),
            "p99_ms": round(self.quantile(0.99), 3),
            "max_send_lag_ms": round(max(self.send_lag_ms, default=0.0), 3),
        }


async def _send(
    client: httpx.AsyncClient,
    url: str,
    sends: Sequence[tuple[float, dict[str, Any]]],
    result: LoadResult,
    tick: Callable[[], None],
) -> list[asyncio.Task[None]]:
    """POST each body at its ``perf_counter`` time; returns once the last one is sent."""

    async def one(scheduled_at: float, body: dict[str, Any]) -> None:
        result.send_lag_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
        try:
            response = await client.post(url, json=body)
            if response.status_code >= 400:
                key = f"http {response.status_code}"
                result.errors[key] = result.errors.get(key, 0) + 1
            else:
                result.latencies_ms.append((time.perf_counter() - scheduled_at) * 1000.0)
        except httpx.HTTPError as exc:
            key = type(exc).__name__
            result.errors[key] = result.errors.get(key, 0) + 1
        tick()

    tasks: list[asyncio.Task[None]] = []
    for scheduled_at, body in sends:
        delay = scheduled_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled_at, body)))
    return tasks


async def _finish(tasks: list[asyncio.Task[None]], result: LoadResult, timeout_s: float) -> None:
    """Wait for every request of ``tasks`` to end; abandon (and count) stuck ones."""
    # Every request has its own timeout; this bound only guards against a stuck pool.
    _, pending = await asyncio.wait(tasks, timeout=timeout_s + 5.0) if tasks else ((), ())
    for task in pending:
        task.cancel()
    if pending:
        result.errors["abandoned"] = result.errors.get("abandoned", 0) + len(pending)


async def run_load(
    url: str,
    *,
    rate: float,
    duration_s: float,
    seed: int = 0,
    max_requests: int | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
    payload: Payload = ranker_payload,
    on_progress: Callable[[int, int], None] | None = None,
) -> LoadResult:
    """Drive ``url`` with POSTs at Poisson times; returns once every request has ended."""
    require_loopback(url)
    offsets = arrival_offsets(rate, duration_s, seed, max_requests)
    body_rng = random.Random(seed + 1)
    bodies = [payload(body_rng) for _ in offsets]
    result = LoadResult(scheduled=len(offsets))
    tick = _progress(result.scheduled, on_progress)
    async with _client(timeout_s) as client:
        start = time.perf_counter()
        sends = [(start + offset, body) for offset, body in zip(offsets, bodies, strict=True)]
        await _finish(await _send(client, url, sends, result, tick), result, timeout_s)
        result.elapsed_s = time.perf_counter() - start
    return result


def _client(timeout_s: float) -> httpx.AsyncClient:
    # Keep-alive limit = connection limit: past the keep-alive limit httpcore closes
    # "surplus" idle connections, and one already handed to a queued request can be among
    # them; that request then hangs until its read timeout (encode/httpcore#1110). Seen
    # here as 5 s requests and ReadErrors when many requests were in flight at once.
    limits = httpx.Limits(
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
    )
    return httpx.AsyncClient(timeout=timeout_s, limits=limits)


def _progress(total: int, on_progress: Callable[[int, int], None] | None) -> Callable[[], None]:
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if on_progress is not None:
            on_progress(done, total)

    return tick


# --- several targets in alternating blocks -------------------------------------------


@dataclass(frozen=True)
class Block:
    """One stretch of load against one target."""

    target: int
    """Index into the targets."""
    round: int
    """Every target has one block per round; equal rounds have equal arrivals and bodies."""
    offsets: tuple[float, ...]
    """Send times from the start of the block's slot."""
    seed: int
    """Seed of the block's request bodies."""


def block_plan(
    targets: int,
    *,
    rate: float,
    duration_s: float,
    block_s: float,
    seed: int = 0,
    align_s: float = 0.0,
) -> list[Block]:
    """Blocks giving each of ``targets`` about ``duration_s`` of Poisson load at ``rate``.

    The load is cut into rounds of ``block_s`` per target (as many as come closest to
    ``duration_s``; one shorter block if ``duration_s`` is shorter); each round holds one
    block of every target, in a seeded random order (so that no target always comes
    first, nor always after the same neighbour). Within a round every target gets the
    same arrival offsets and bodies.

    With ``align_s`` > 0, every block starts with a request ``align_s`` after its slot
    begins (the very first block at its start) and ends ``align_s`` before the slot
    does. An analysis that cuts the time line into windows of one slot from the first
    request then finds exactly one block in each window, even if a request reaches the
    server up to ``align_s`` late.
    """
    if targets < 1 or block_s <= 0:
        raise ConfigError("load: need at least one target and a positive block length")
    rounds = max(1, round(duration_s / block_s))
    length = min(block_s, duration_s)
    if length <= 3 * align_s:
        raise ConfigError(f"load: blocks of {length:g} s are too short to align")
    rng = random.Random(seed)
    plan: list[Block] = []
    for r in range(rounds):
        block_seed = rng.getrandbits(32)
        offsets = arrival_offsets(rate, length - 2 * align_s, block_seed)
        if align_s > 0 and offsets:
            offsets = [o - offsets[0] + align_s for o in offsets]
        order = list(range(targets))
        rng.shuffle(order)
        for t in order:
            # The very first block starts at its slot's start: the windows begin there.
            lead = align_s if not plan and offsets else 0.0
            plan.append(Block(t, r, tuple(o - lead for o in offsets), block_seed))
    return plan


class _Turns:
    """Which target runs: thaw one before its block, freeze it once it is idle again."""

    def __init__(self, targets: int, pause: Callable[[int], None], resume: Callable[[int], None]):
        self.pause_fn, self.resume_fn = pause, resume
        self.frozen = [True] * targets  # the caller hands them over frozen
        self.active = [0] * targets
        self.current: int | None = None

    def enter(self, target: int) -> None:
        previous, self.current = self.current, target
        if previous is not None:
            self.settle(previous)
        if self.frozen[target]:
            self.resume_fn(target)
            self.frozen[target] = False

    def settle(self, target: int) -> None:
        """Freeze ``target`` if it is neither serving a block nor about to."""
        if self.active[target] == 0 and self.current != target and not self.frozen[target]:
            self.pause_fn(target)
            self.frozen[target] = True

    def thaw_all(self) -> None:
        self.current = None
        for target in range(len(self.frozen)):
            if self.frozen[target]:
                self.resume_fn(target)
                self.frozen[target] = False


async def run_blocks(
    urls: Sequence[str],
    plan: Sequence[Block],
    *,
    block_s: float,
    pause: Callable[[int], None],
    resume: Callable[[int], None],
    settle_s: float = 0.05,
    timeout_s: float = REQUEST_TIMEOUT_S,
    payload: Payload = ranker_payload,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[LoadResult]:
    """Drive ``urls`` block by block, one target at a time; one result per target.

    The targets come frozen (``pause`` was called for each) and leave thawed. Block *i*
    owns the slot
    ``[i, i + 1) × block_s`` of a fixed time grid: its target is thawed ``settle_s``
    before the slot begins (time for a thawed process to catch up on its timers), and
    frozen again once the block's last request has ended and the next block belongs to
    another target. Blocks are not held back for the previous one's last requests, so a
    slow release does not stretch the run; for those few milliseconds two targets run.
    """
    for url in urls:
        require_loopback(url)
    results = [LoadResult() for _ in urls]
    for block in plan:
        results[block.target].scheduled += len(block.offsets)
        results[block.target].elapsed_s += block_s
    tick = _progress(sum(r.scheduled for r in results), on_progress)
    turns = _Turns(len(urls), pause, resume)

    async def finish(block: Block, tasks: list[asyncio.Task[None]]) -> None:
        await _finish(tasks, results[block.target], timeout_s)
        turns.active[block.target] -= 1
        turns.settle(block.target)

    # One pool per target: one release's connections never queue behind another's.
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(_client(timeout_s)) for _ in urls]
        endings: list[asyncio.Task[None]] = []
        try:
            origin = time.perf_counter() + settle_s
            for i, block in enumerate(plan):
                start = origin + i * block_s
                await _sleep_until(start - settle_s)
                turns.enter(block.target)
                turns.active[block.target] += 1
                body_rng = random.Random(block.seed + 1)
                sends = [(start + o, payload(body_rng)) for o in block.offsets]
                url, result = urls[block.target], results[block.target]
                tasks = await _send(clients[block.target], url, sends, result, tick)
                endings.append(asyncio.create_task(finish(block, tasks)))
            # Bounded: every request has its timeout, so this only guards against a bug
            # leaving the caller waiting forever on services that are frozen.
            async with asyncio.timeout(timeout_s + 30.0):
                await asyncio.gather(*endings)
        finally:
            for ending in endings:
                ending.cancel()
            # All thawed, whatever happened: the caller stops them next, and a frozen
            # process could neither answer a request still in flight nor act on SIGTERM.
            turns.thaw_all()
    return results


async def _sleep_until(when: float) -> None:
    delay = when - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tracekit.demo.loadgen",
        description="Open-loop Poisson load against a loopback URL; prints a JSON summary.",
    )
    parser.add_argument(
        "--url", required=True, help="POST target, e.g. http://127.0.0.1:8000/predict"
    )
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of load")
    parser.add_argument("--seed", type=int, default=0, help="seed of arrivals and bodies")
    parser.add_argument("--max-requests", type=int, default=None, help="stop after this many")
    parser.add_argument("--wait", type=float, default=0.0, help="seconds to wait before starting")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.wait > 0:
            time.sleep(args.wait)
        result = asyncio.run(
            run_load(
                args.url,
                rate=args.rate,
                duration_s=args.duration,
                seed=args.seed,
                max_requests=args.max_requests,
            )
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.summary()))
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
