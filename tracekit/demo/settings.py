"""How a demo service process is configured and served: environment, arguments, tracing.

Each setting has one environment variable (declared once, here) and one command-line
flag; the flag wins. ``tracekit demo`` sets the variables for the processes it starts
and ``docker-compose.yml`` sets the same ones, so a test can check both against
:data:`ENV_VARS`.

A service binds its own socket (port 0 lets the OS choose) and prints
``LISTENING_MARKER host port`` on stdout, so whoever started it learns the port
without racing for a free one; ``READY_MARKER`` follows once start-up has finished.
Readiness is read from that line rather than polled over HTTP so that no health
check lands in the traces.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import tracekit
from tracekit.demo.regressions import Knobs, knobs_for
from tracekit.errors import ConfigError

if TYPE_CHECKING:  # `tracekit demo` reads its defaults here without needing FastAPI
    from fastapi import FastAPI

DEFAULT_DURATION_S = 25.0
"""Seconds of load per release in ``tracekit demo``."""
DEFAULT_RATE = 30.0
"""Requests per second (Poisson arrivals) in ``tracekit demo``."""
DEFAULT_BLOCK_S = 1.5
"""Seconds per block of load in ``tracekit demo``. Short, so that the machine's other work
of a few seconds falls on both releases; long enough that one autoscale window (one
block) holds the 20 requests a p95 needs at the default rate."""

GATE_BUDGETS = ("p50<=+25%", "p95<=+50%")
"""The budgets ``tracekit demo`` gates with. The gate's defaults (p95 and p99 within +10%)
are for a CI load test of thousands of requests: at the demo's ~660 a release a p99 has
fewer than the 10 tail samples it needs, and a +10% p95 interval straddles its budget,
so no change could only ever be *inconclusive*. On a 2-core machine running both
releases and other work, the intervals of a no-change run were p50 −24..+16% and p95
−33..+38% at worst: these budgets are what a 25-second run there can decide, and the
batch regression breaks both several times over."""
GATE_MIN_EFFECT = "5ms"
"""The demo's minimum effect: a change smaller than this never fails a budget."""

ENV_HOST = "TRACEKIT_DEMO_HOST"
"""Address to bind (default 127.0.0.1; the compose file uses 0.0.0.0)."""
ENV_PORT = "TRACEKIT_DEMO_PORT"
"""Port to bind; 0 lets the OS pick a free one."""
ENV_VERSION = "TRACEKIT_DEMO_VERSION"
"""Release label, written as the ``service.version`` resource attribute."""
ENV_REGRESSION = "TRACEKIT_DEMO_REGRESSION"
"""Regression this process runs with (see :mod:`tracekit.demo.regressions`)."""
ENV_TRACE_FILE = "TRACEKIT_DEMO_TRACE_FILE"
"""OTLP JSON-lines file the spans go to; empty for none."""
ENV_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
"""OTLP/HTTP endpoint the spans also go to (e.g. Jaeger's http://jaeger:4318)."""
ENV_DOWNSTREAM_URL = "TRACEKIT_DEMO_DOWNSTREAM_URL"
"""Base URL of the pricing service (ranker only)."""
ENV_SEED = "TRACEKIT_DEMO_SEED"
"""Seed of every random choice a service makes (latencies, slow calls, data)."""
ENV_BATCH = "TRACEKIT_DEMO_BATCH"
"""Batcher of the ranker as ``max_batch_size,max_wait_ms,workers`` (e.g. ``16,20,1``),
optionally followed by the stand-in accelerator's ``,fixed_ms,per_request_ms`` per batch
(``demo --capacity``); empty: the regression's."""

ENV_VARS: tuple[str, ...] = (
    ENV_HOST,
    ENV_PORT,
    ENV_VERSION,
    ENV_REGRESSION,
    ENV_TRACE_FILE,
    ENV_OTLP_ENDPOINT,
    ENV_DOWNSTREAM_URL,
    ENV_SEED,
    ENV_BATCH,
)
"""Every variable a demo process reads."""

LISTENING_MARKER = "TRACEKIT_DEMO_LISTENING"
"""First word of the line a service prints once its socket is bound."""
READY_MARKER = "TRACEKIT_DEMO_READY"
"""First word of the line a service prints once start-up has finished."""

HEALTH_PATH = "/healthz"
"""Answers 200 once the service has finished starting (model built, cache warm)."""

KEEP_ALIVE_S = 300
"""Seconds an idle keep-alive connection stays open (uvicorn's default is 5).

``tracekit demo`` freezes a release between its blocks of load. Frozen longer than the
keep-alive, the service would close its idle connections the instant it is thawed, racing
the client's next request on them (a spurious "server disconnected" error)."""


@dataclass(frozen=True)
class Settings:
    """One service process's configuration."""

    host: str
    port: int
    version: str
    regression: str
    trace_file: str
    otlp_endpoint: str
    downstream_url: str
    seed: int
    batch: BatchKnobs | None = None
    """The batcher (and stand-in accelerator) over the regression's; None: its own."""

    @property
    def knobs(self) -> Knobs:
        knobs = knobs_for(self.regression)
        if self.batch is None:
            return knobs
        b = self.batch
        return dataclasses.replace(
            knobs,
            batch_max_size=b.max_batch_size,
            batch_max_wait_ms=b.max_wait_ms,
            batch_workers=b.workers,
            device_fixed_ms=b.device_fixed_ms,
            device_per_request_ms=b.device_per_request_ms,
        )


@dataclass(frozen=True)
class BatchKnobs:
    """A ranker's batcher and its stand-in accelerator, as :data:`ENV_BATCH` carries them."""

    max_batch_size: int
    max_wait_ms: float
    workers: int
    device_fixed_ms: float = 0.0
    device_per_request_ms: float = 0.0

    def env_value(self) -> str:
        """The :data:`ENV_BATCH` value (:func:`parse_batch` reads it back)."""
        return (
            f"{self.max_batch_size},{self.max_wait_ms:g},{self.workers},"
            f"{self.device_fixed_ms:g},{self.device_per_request_ms:g}"
        )


def parse_batch(raw: str) -> BatchKnobs | None:
    """``max_batch_size,max_wait_ms,workers[,fixed_ms,per_request_ms]`` from
    :data:`ENV_BATCH`; None when empty."""
    if not raw:
        return None
    parts = raw.split(",")
    try:
        if len(parts) not in (3, 5):
            raise ValueError
        device = (float(parts[3]), float(parts[4])) if len(parts) == 5 else (0.0, 0.0)
        knobs = BatchKnobs(int(parts[0]), float(parts[1]), int(parts[2]), *device)
    except ValueError:
        raise ConfigError(
            f"{ENV_BATCH}={raw!r}: give max_batch_size,max_wait_ms,workers"
            "[,device_fixed_ms,device_per_request_ms], e.g. 16,20,1 or 16,20,1,10,12"
        ) from None
    values = (knobs.max_wait_ms, knobs.device_fixed_ms, knobs.device_per_request_ms)
    if knobs.max_batch_size < 1 or knobs.workers < 1 or not all(0 <= v < 60_000 for v in values):
        raise ConfigError(f"{ENV_BATCH}={raw!r}: sizes and workers >= 1, times >= 0 ms")
    return knobs


def build_parser(prog: str, description: str, *, downstream: bool) -> argparse.ArgumentParser:
    """Flags for a service; each default comes from its environment variable."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--host", help=f"address to bind [{ENV_HOST}, default 127.0.0.1]")
    parser.add_argument("--port", type=int, help=f"port, 0 = any free one [{ENV_PORT}]")
    parser.add_argument("--version", dest="version", help=f"release label [{ENV_VERSION}]")
    parser.add_argument("--regression", help=f"regression to run with [{ENV_REGRESSION}]")
    parser.add_argument("--trace-file", help=f"OTLP JSON-lines output [{ENV_TRACE_FILE}]")
    parser.add_argument("--otlp-endpoint", help=f"OTLP/HTTP endpoint [{ENV_OTLP_ENDPOINT}]")
    if downstream:
        parser.add_argument("--downstream-url", help=f"pricing service [{ENV_DOWNSTREAM_URL}]")
        parser.add_argument(
            "--batch",
            help="batcher as max_batch_size,max_wait_ms,workers[,device_fixed_ms,"
            f"device_per_request_ms] [{ENV_BATCH}]",
        )
    parser.add_argument("--seed", type=int, help=f"random seed [{ENV_SEED}]")
    return parser


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def parse_settings(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    regressions: Callable[[str], object] = knobs_for,
) -> Settings:
    """Settings from ``argv`` over ``env`` over the defaults; checks the regression name
    with ``regressions`` (the LLM service passes its own)."""
    env = os.environ if env is None else env
    args = parser.parse_args(argv)

    def pick(value: Any, name: str, default: str) -> str:
        return str(value) if value is not None else env.get(name, "") or default

    settings = Settings(
        host=pick(args.host, ENV_HOST, "127.0.0.1"),
        port=args.port if args.port is not None else _env_int(env, ENV_PORT, 0),
        version=pick(args.version, ENV_VERSION, "v1"),
        regression=pick(args.regression, ENV_REGRESSION, ""),
        trace_file=pick(args.trace_file, ENV_TRACE_FILE, ""),
        otlp_endpoint=pick(args.otlp_endpoint, ENV_OTLP_ENDPOINT, ""),
        downstream_url=pick(getattr(args, "downstream_url", None), ENV_DOWNSTREAM_URL, ""),
        seed=args.seed if args.seed is not None else _env_int(env, ENV_SEED, 0),
        batch=parse_batch(pick(getattr(args, "batch", None), ENV_BATCH, "")),
    )
    regressions(settings.regression)  # unknown names fail here, before anything starts
    return settings


def configure_tracing(service_name: str, settings: Settings) -> None:
    """Point tracekit at the trace file, the OTLP endpoint, or both."""
    exporters: list[str] = []
    options: dict[str, Any] = {}
    if settings.trace_file:
        exporters.append("file")
        options["path"] = settings.trace_file
    if settings.otlp_endpoint:
        exporters.append("otlp")
        options["endpoint"] = settings.otlp_endpoint
    if not exporters:
        raise ConfigError(
            f"{service_name}: no trace output: set {ENV_TRACE_FILE} or {ENV_OTLP_ENDPOINT}"
        )
    exporter: str | tuple[str, ...] = exporters[0] if len(exporters) == 1 else tuple(exporters)
    tracekit.configure(
        service_name=service_name,
        service_version=settings.version,
        exporter=exporter,
        **options,
    )


def instrument_app(app: FastAPI, settings: Settings) -> None:
    """Add the health route to a service's app and trace every other request with tracekit."""

    @app.get(HEALTH_PATH)
    async def health() -> dict[str, str]:
        return {"status": "ok", "version": settings.version}

    # The health route is for orchestrators (compose); it is not a request to analyse.
    tracekit.instrument_fastapi(app, excluded_urls=HEALTH_PATH.lstrip("/"))


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket; port 0 gets a free port from the OS."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted connections only then,
    # and without it Nagle plus delayed ACKs add ~40 ms to every response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


class SpansBeforeResponse:
    """ASGI wrapper: a response's last body message leaves only once the app, and every
    middleware inside it, has returned, so its server span is ended before the client
    has the whole response.

    The interleaved runs (:mod:`tracekit.demo.interleave`) freeze a release with SIGSTOP
    as soon as the last response of its block arrives. Sent as usual, the response is on
    the wire a few event-loop steps before the tracing middleware ends the request span;
    on a busy machine the freeze can land between the two, and the span then ends a whole
    round later: hundreds of milliseconds of time in no stage on a request that was done
    (on a 2-core machine with one core kept busy, 1 to 8 requests of a release's 240
    each run, which is the tail the diff reads). Holding the last message back costs the
    client the microseconds the span's end takes.
    """

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        held: list[Any] = []

        async def hold_last(message: Any) -> None:
            if message.get("type") == "http.response.body" and not message.get("more_body"):
                held.append(message)
                return
            await send(message)

        try:
            await self.app(scope, receive, hold_last)
        finally:
            # Also when the app raised after responding: the response was complete.
            for message in held:
                await send(message)


def serve(app: Any, settings: Settings) -> None:
    """Run ``app`` under uvicorn on its own socket; returns after SIGTERM/SIGINT.

    The app runs inside :class:`SpansBeforeResponse`: a service frozen right after a
    response has already ended that request's span.
    """
    import uvicorn

    sock = bind(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    # Printed before uvicorn starts: connections queue in the backlog meanwhile, and
    # the lifespan prints READY_MARKER once the app can serve them.
    print(f"{LISTENING_MARKER} {host} {port}", flush=True)
    config = uvicorn.Config(
        SpansBeforeResponse(app),
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=3,
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    uvicorn.Server(config).run(sockets=[sock])


def freeze_startup_heap() -> None:
    """Put every object start-up created out of the garbage collector's reach.

    The ranker imports torch and FastAPI and builds its model: some 200,000 objects that
    each full collection walks, ~120 ms on this project's 2-core machine (more with a
    core kept busy), while no thread of the process runs Python. Every request in flight
    then waits: a burst of slow requests that is neither release's doing, and with 240
    requests a release, one such burst is enough to swing a p95. Frozen (``gc.freeze``),
    they are never walked again (they live as long as the process anyway) and a full
    collection walks only what serving created. Production Python servers do the same
    after start-up; call it last, once the model is warm.
    """
    gc.collect()
    gc.freeze()


def announce_ready(service_name: str, settings: Settings) -> None:
    """Tell the starter that requests are served from now on."""
    print(f"{READY_MARKER} {service_name} {settings.version}", flush=True)


def run_main(main: Any) -> None:
    """Run a service ``main()``; a configuration error is one line and exit status 2."""
    try:
        main()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
