"""Per-request cost of tracing: none vs plain OpenTelemetry spans vs tracekit stages.

The same 6-span request (a request span and five stages around trivial work) runs
in one process three ways, interleaved over several rounds; the median of each is
printed with the tracing overhead over no tracing and the ratio tracekit/OTel of
those overheads. Both tracers export through a ``BatchSpanProcessor`` into an
exporter that discards, so what is measured is span creation on the request path.

    .venv/bin/python benchmarks/overhead.py [--requests 5000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import tracekit
from tracekit import conventions as c
from tracekit.instrumentation import setup

TARGET_RATIO = 1.2
STAGE_NAMES = (c.FEATURE_RETRIEVAL, c.PREPROCESS, c.MODEL_EXECUTE, c.POSTPROCESS, c.DOWNSTREAM)
DATA = list(range(32))


class Discard(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def work() -> int:
    return sum(DATA)


def request_plain() -> None:
    for _ in range(6):
        work()


def make_otel() -> tuple[Callable[[], None], TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = provider.get_tracer("bench")

    def request() -> None:
        with tracer.start_as_current_span("request"):
            work()
            for name in STAGE_NAMES:
                with tracer.start_as_current_span(name, attributes={c.STAGE: name}):
                    work()

    return request, provider


def make_tracekit() -> Callable[[], None]:
    tracekit.configure(service_name="bench", exporter=Discard())
    tracer = setup.tracer("bench")

    def request() -> None:
        with tracer.start_as_current_span("request"):
            work()
            for name in STAGE_NAMES:
                with tracekit.stage(name):
                    work()

    return request


def per_request_ns(fn: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    return (time.perf_counter_ns() - t0) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000, help="requests per variant per round")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)

    otel_request, otel_provider = make_otel()
    tk_request = make_tracekit()
    variants = {
        "no tracing": request_plain,
        "OTel SDK spans": otel_request,
        "tracekit stages": tk_request,
    }
    for fn in variants.values():  # warm-up
        per_request_ns(fn, 500)
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            samples[name].append(per_request_ns(fn, args.requests))
    otel_provider.shutdown()
    tracekit.shutdown()

    med = {k: statistics.median(v) for k, v in samples.items()}
    base = med["no tracing"]
    print(f"6-span request, median of {args.rounds} rounds x {args.requests} requests")
    print(f"{'variant':<18}{'us/request':>12}{'overhead us':>14}")
    for name, value in med.items():
        print(f"{name:<18}{value / 1000:>12.2f}{(value - base) / 1000:>14.2f}")
    ratio = (med["tracekit stages"] - base) / (med["OTel SDK spans"] - base)
    verdict = "ok" if ratio <= TARGET_RATIO else "OVER TARGET"
    print(f"overhead ratio tracekit/OTel: {ratio:.2f} (target <= {TARGET_RATIO}: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
