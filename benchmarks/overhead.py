"""Cost of tracing: none vs plain OpenTelemetry SDK spans vs tracekit, in one run.

Part 1, the request path. The same 6-span request (a request span and five stages
around trivial work) runs in one process three ways, interleaved over several
rounds: no tracing, OTel SDK spans, and tracekit (the request span an SDK span, as
opentelemetry-instrumentation-fastapi makes it; the five stages tracekit stages). What
a request pays is the CPU time of the thread that serves it, so that is what is
timed; tracekit builds its spans into SDK spans on a background thread, and the
process CPU including that work is printed too. Per span, the stages are timed under
an already open request span. Both export through a ``BatchSpanProcessor`` into an
exporter that discards.

Part 2, a real service. A FastAPI app (an async stage, a sync stage, a batched model
call, a postprocess stage) served by uvicorn on 127.0.0.1 in a subprocess, driven at
a fixed request rate for a fixed count: the server's CPU time per request without
tracing, with OTel's FastAPI instrumentation alone, and with tracekit's full
instrumentation (both writing OTLP JSON lines to a file, flushed before the reading).

    .venv/bin/python benchmarks/overhead.py [--requests 5000] [--rounds 7] [--rate 100] [--served 600]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import setup

TARGET_SPAN_RATIO = 1 / 5
MOONSHOT_SPAN_RATIO = 1 / 8
STAGE_NAMES = (cv.FEATURE_RETRIEVAL, cv.PREPROCESS, cv.MODEL_EXECUTE, cv.POSTPROCESS, cv.DOWNSTREAM)
DATA = list(range(32))


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def work() -> int:
    return sum(DATA)


# --- part 1: the request path -------------------------------------------------------


def make_variants() -> tuple[dict[str, Callable[[], None]], TracerProvider]:
    provider = TracerProvider()
    # a queue as large as a round, so neither side drops spans while being timed
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 17))
    otel = provider.get_tracer("bench")
    tracekit.configure(service_name="bench", exporter=Discard())
    request_tracer = setup.tracer("bench")  # an SDK span, as the FastAPI instrumentation's
    stages = [tracekit.stage(name) for name in STAGE_NAMES]

    def plain() -> None:
        for _ in range(6):
            work()

    def otel_request() -> None:
        with otel.start_as_current_span("request"):
            work()
            for name in STAGE_NAMES:
                with otel.start_as_current_span(name, attributes={cv.STAGE: name}):
                    work()

    def tk_request() -> None:
        with request_tracer.start_as_current_span("request"):
            work()
            for st in stages:
                with st:
                    work()

    def plain_5() -> None:
        for _ in range(5):
            work()

    def otel_5() -> None:  # under a request span opened outside the timing
        for name in STAGE_NAMES:
            with otel.start_as_current_span(name, attributes={cv.STAGE: name}):
                work()

    def tk_5() -> None:
        for st in stages:
            with st:
                work()

    return {
        "no tracing": plain,
        "OTel SDK spans": otel_request,
        "tracekit stages": tk_request,
        "5 spans: none": plain_5,
        "5 spans: OTel": otel_5,
        "5 spans: tracekit": tk_5,
    }, provider


def timed(fn: Callable[[], None], n: int) -> tuple[float, float]:
    """(request-thread CPU ns, process CPU ns) per call, over ``n`` calls."""
    t0, p0 = time.thread_time_ns(), time.process_time_ns()
    for _ in range(n):
        fn()
    thread = time.thread_time_ns() - t0
    setup.flush()  # tracekit's background building of these spans, charged to the process
    return thread / n, (time.process_time_ns() - p0) / n


def request_path(requests: int, rounds: int) -> None:
    variants, provider = make_variants()
    otel_tracer, tk_tracer = provider.get_tracer("bench"), setup.tracer("bench")
    thread: dict[str, list[float]] = {k: [] for k in variants}
    process: dict[str, list[float]] = {k: [] for k in variants}
    for rnd in range(rounds + 1):  # round 0 warms up
        for name, fn in variants.items():
            parent = otel_tracer if "OTel" in name else tk_tracer
            if name.startswith("5 spans"):
                with parent.start_as_current_span("outer request"):
                    t, p = timed(fn, requests)
            else:
                t, p = timed(fn, requests)
            provider.force_flush()
            if rnd:
                thread[name].append(t)
                process[name].append(p)
    provider.shutdown()
    tracekit.shutdown()
    med = {k: statistics.median(v) / 1000 for k, v in thread.items()}
    pmed = {k: statistics.median(v) / 1000 for k, v in process.items()}

    print(
        f"request path: median of {rounds} rounds x {requests} requests, CPU of the request's thread"
    )
    print(f"{'variant':<20}{'us/request':>12}{'overhead us':>13}{'process CPU us':>16}")
    base, pbase = med["no tracing"], pmed["no tracing"]
    for name in ("no tracing", "OTel SDK spans", "tracekit stages"):
        print(f"{name:<20}{med[name]:>12.2f}{med[name] - base:>13.2f}{pmed[name] - pbase:>16.2f}")
    otel_span = (med["5 spans: OTel"] - med["5 spans: none"]) / 5
    tk_span = (med["5 spans: tracekit"] - med["5 spans: none"]) / 5
    per_request = (med["tracekit stages"] - base) / (med["OTel SDK spans"] - base)
    per_span = tk_span / otel_span
    verdict = "ok" if per_span <= TARGET_SPAN_RATIO else "OVER TARGET"
    moon = "met" if per_span <= MOONSHOT_SPAN_RATIO else "not met"
    print(f"per span: OTel SDK span {otel_span:.2f} us, tracekit stage {tk_span:.2f} us")
    print(
        f"ratio tracekit/OTel per span: {per_span:.3f} (1/{1 / per_span:.1f}; target <= 1/5: "
        f"{verdict}; moonshot <= 1/8: {moon})"
    )
    print(
        f"ratio tracekit/OTel per request: {per_request:.3f} (the request span is an SDK span in both)"
    )
    print(f"tracekit's hook on the SERVER span (load attributes): {hook_cost_us():.2f} us/request")
    tk_all = pmed["tracekit stages"] - pbase
    otel_all = pmed["OTel SDK spans"] - pbase
    print(
        f"process CPU incl. background span building, per request: tracekit {tk_all:.2f} us, "
        f"OTel {otel_all:.2f} us (ratio {tk_all / otel_all:.2f})"
    )


def hook_cost_us(n: int = 20000) -> float:
    """CPU of the hook that puts tracekit's load attributes on each request span."""
    from tracekit.instrumentation import fastapi as tk_fastapi
    from tracekit.instrumentation import sampler

    provider = TracerProvider()  # no processor: only the hook's own work is timed
    span = provider.get_tracer("bench").start_span("GET /predict")
    sampler.start(60.0)  # a reading to copy, as in a running service
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time_ns()
        for _ in range(n):
            tk_fastapi._on_request(span, {})
        best = min(best, (time.thread_time_ns() - t0) / n / 1000)
    sampler.stop()
    return best


# --- part 2: a real service on uvicorn -------------------------------------------------

SERVED_VARIANTS = ("no tracing", "OTel FastAPI instrumentation", "tracekit full")


def build_app(variant: str, trace_path: str) -> object:
    """The service, instrumented as ``variant`` says; a ``/_cpu`` route flushes and reads CPU."""
    from fastapi import FastAPI

    flush: Callable[[], object] = lambda: None  # noqa: E731
    app = FastAPI()
    if variant == "tracekit full":
        tracekit.configure(service_name="bench", exporter="file", path=trace_path)
        flush = setup.flush
    elif variant == "OTel FastAPI instrumentation":
        from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

        from tracekit.instrumentation.exporters import OTLPJsonFileExporter

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPJsonFileExporter(trace_path)))
        FastAPIInstrumentor.instrument_app(app, tracer_provider=provider)
        flush = provider.force_flush

    # without configure() the stage calls below are no-ops, as they are untraced
    def run_batch(xs: list[int]) -> list[int]:
        with tracekit.model_execution(sync="none"):
            return [x * 2 for x in xs]

    batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=4, max_wait_ms=0.5)

    @tracekit.stage(cv.FEATURE_RETRIEVAL)
    async def fetch(rid: int) -> list[int]:
        await asyncio.sleep(0)
        return [rid] * 8

    @app.get("/predict/{rid}")
    async def predict(rid: int) -> dict[str, int]:
        features = await fetch(rid)
        with tracekit.stage(cv.PREPROCESS):
            x = sum(features)
        y = await batcher.submit(x)
        with tracekit.stage(cv.POSTPROCESS):
            return {"rid": rid, "y": y}

    @app.get("/_cpu")
    def cpu() -> dict[str, float]:
        flush()
        return {"cpu_s": time.process_time()}

    if variant == "tracekit full":
        tracekit.instrument_fastapi(app)
    return app


def serve(variant: str, port: int, trace_path: str) -> None:
    import uvicorn

    app = build_app(variant, trace_path)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)  # type: ignore[arg-type]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _drive(base: str, rate: float, count: int, timeout_s: float) -> tuple[float, int]:
    """Send ``count`` requests at ``rate`` per second (open loop, stopping after ``timeout_s``).

    Returns (server CPU seconds per request sent, requests that failed). A busy machine
    may let requests pile up: the client waits for a connection rather than failing.
    """
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    timeout = httpx.Timeout(60.0, pool=None)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits) as client:
        for i in range(100):  # warm up every path first
            (await client.get(f"/predict/{i}")).raise_for_status()
        cpu0 = (await client.get("/_cpu")).json()["cpu_s"]
        t0 = time.monotonic()
        tasks = []
        for i in range(count):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if time.monotonic() - t0 > timeout_s:
                break
            tasks.append(asyncio.create_task(client.get(f"/predict/{i}")))
        results = await asyncio.gather(*tasks, return_exceptions=True)
        failed = sum(1 for r in results if not isinstance(r, httpx.Response) or r.is_error)
        cpu1 = (await client.get("/_cpu")).json()["cpu_s"]
        return float(cpu1 - cpu0) / len(tasks), failed


def served(rate: float, count: int) -> None:
    print(f"\nFastAPI on uvicorn, 127.0.0.1, {rate:g} requests/s x {count}: server CPU per request")
    results: dict[str, float] = {}
    failed: dict[str, int] = {}
    spans: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in SERVED_VARIANTS:
            port = _free_port()
            path = str(Path(tmp) / f"{SERVED_VARIANTS.index(variant)}.jsonl")
            cmd = [
                sys.executable,
                __file__,
                "--serve",
                variant,
                "--port",
                str(port),
                "--path",
                path,
            ]
            proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": os.getcwd()})
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        httpx.get(f"http://127.0.0.1:{port}/_cpu", timeout=1)
                        break
                    except httpx.TransportError:
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise RuntimeError(f"{variant}: server did not start") from None
                        time.sleep(0.1)
                base = f"http://127.0.0.1:{port}"
                results[variant], failed[variant] = asyncio.run(
                    _drive(base, rate, count, 4 * count / rate)
                )
            finally:
                proc.terminate()
                proc.wait(timeout=30)
            spans[variant] = _count_spans(Path(path)) / (count + 100 + 2)
    base = results["no tracing"]
    print(f"{'variant':<32}{'CPU ms/request':>16}{'overhead ms':>13}{'spans/req':>11}{'failed':>8}")
    for variant, value in results.items():
        print(
            f"{variant:<32}{value * 1000:>16.3f}{(value - base) * 1000:>13.3f}"
            f"{spans[variant]:>11.1f}{failed[variant]:>8}"
        )
    otel = results["OTel FastAPI instrumentation"] - base
    full = results["tracekit full"] - base
    print(
        f"overhead ratio tracekit full / OTel FastAPI instrumentation alone: {full / otel:.2f}"
        if otel > 0
        else "OTel overhead not measurable"
    )


def _count_spans(path: Path) -> int:
    """Spans a variant exported (the OTel FastAPI variant includes its ASGI send spans)."""
    if not path.exists():
        return 0
    return sum(
        len(ss["spans"])
        for line in path.open()
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000, help="requests per variant per round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--rate", type=float, default=100.0, help="requests/s sent to the service")
    ap.add_argument("--served", type=int, default=600, help="requests sent to each service")
    ap.add_argument("--skip-served", action="store_true", help="part 1 only")
    ap.add_argument("--serve", choices=SERVED_VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port, args.path)
        return 0
    request_path(args.requests, args.rounds)
    if not args.skip_served:
        served(args.rate, args.served)
    return 0


if __name__ == "__main__":
    sys.exit(main())
