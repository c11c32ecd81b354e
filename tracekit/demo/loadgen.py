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

Run it with ``python -m tracekit.demo.loadgen --url http://127.0.0.1:8000/predict``.
"""

from __future__ import annotations

import argparse
import asyncio
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
    done = 0

    async def one(client: httpx.AsyncClient, scheduled_at: float, body: dict[str, Any]) -> None:
        nonlocal done
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
        done += 1
        if on_progress is not None:
            on_progress(done, result.scheduled)

    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        tasks: list[asyncio.Task[None]] = []
        start = time.perf_counter()
        for offset, body in zip(offsets, bodies, strict=True):
            scheduled_at = start + offset
            delay = scheduled_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, scheduled_at, body)))
        # Every request has its own timeout; this bound only guards against a stuck pool.
        _, pending = await asyncio.wait(tasks, timeout=timeout_s + 5.0) if tasks else ((), ())
        for task in pending:
            task.cancel()
        if pending:
            result.errors["abandoned"] = len(pending)
        result.elapsed_s = time.perf_counter() - start
    return result


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
