"""OTel metrics from the same instrumentation: what ``configure(metrics=...)`` exports.

Instruments (OTel semantic-convention names where one exists):

* ``http.server.request.duration`` — histogram, seconds, by ``http.route`` (and
  ``http.request.method``, ``http.response.status_code``), from each request span;
* ``tracekit.stage.duration`` — histogram, seconds, by ``tracekit.stage`` and
  ``tracekit.time_kind``, from each stage span;
* ``tracekit.batch.size`` — histogram of requests per executed batch, from batch spans;
* ``tracekit.inflight`` — gauge, requests this process is serving now;
* ``tracekit.queue.depth`` — gauge, requests waiting in this process's batch queues now.

Durations come from a :class:`~opentelemetry.sdk.trace.SpanProcessor` on the tracer
provider (no second timer on the request path); the gauges are read when scraped from
the counters the FastAPI wrapper and the batcher keep already. Spans a head sampler
dropped are not seen, so with ``sample_ratio`` < 1 the histograms hold that share of
requests (their quantiles stay right, their counts scale down).

``metrics="prometheus"`` serves ``/metrics`` on 127.0.0.1:``metrics_port`` (9464 by
default, the OTel Prometheus exporter's); the series names are in
:data:`PROMETHEUS_SERIES`. ``metrics="otlp"`` pushes over OTLP/HTTP every 10 s.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import SpanKind

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard, _state
from tracekit.instrumentation._recorder import RECORDER

MODES = ("prometheus", "otlp")
DEFAULT_PORT = 9464
DEFAULT_HOST = "127.0.0.1"

DURATION_BUCKETS_S: Sequence[float] = (
    0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
    0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
)  # fmt: skip
"""Bucket bounds that resolve milliseconds where inference latency lives (1 ms – 10 s)."""
BATCH_BUCKETS: Sequence[float] = (1, 2, 4, 8, 16, 32, 64, 128, 256)

PROMETHEUS_SERIES: dict[str, str] = {
    cv.METRIC_HTTP_SERVER_DURATION: "http_server_request_duration_seconds",
    cv.METRIC_STAGE_DURATION: "tracekit_stage_duration_seconds",
    cv.METRIC_BATCH_SIZE: "tracekit_batch_size",
    cv.METRIC_INFLIGHT: "tracekit_inflight",
    cv.METRIC_QUEUE_DEPTH: "tracekit_queue_depth",
}
"""OTel instrument → the Prometheus series the exporter serves (histograms add
``_bucket``/``_sum``/``_count``); ``tracekit autoscale`` names these."""


class MetricsProcessor(SpanProcessor):
    """Records the duration histograms from finished spans; never raises into the app."""

    def __init__(self, provider: MeterProvider) -> None:
        meter = provider.get_meter("tracekit")
        self._request = meter.create_histogram(
            cv.METRIC_HTTP_SERVER_DURATION,
            unit="s",
            description="Duration of HTTP server requests.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._stage = meter.create_histogram(
            cv.METRIC_STAGE_DURATION,
            unit="s",
            description="Wall time of one tracekit stage of a request.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS_S,
        )
        self._batch = meter.create_histogram(
            cv.METRIC_BATCH_SIZE,
            unit="{request}",
            description="Requests executed together in one batch.",
            explicit_bucket_boundaries_advisory=BATCH_BUCKETS,
        )
        meter.create_observable_gauge(
            cv.METRIC_INFLIGHT,
            callbacks=[_observe(lambda: _state.INFLIGHT.value)],
            unit="{request}",
            description="Requests this process is serving now.",
        )
        meter.create_observable_gauge(
            cv.METRIC_QUEUE_DEPTH,
            callbacks=[_observe(_state.queue_depth)],
            unit="{request}",
            description="Requests waiting in this process's batch queues.",
        )

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return

    def on_end(self, span: ReadableSpan) -> None:
        try:
            self._record(span)
        except Exception as exc:  # noqa: BLE001 - telemetry never breaks the host app
            _guard.report("metrics", exc)

    def _record(self, span: ReadableSpan) -> None:
        if span.start_time is None or span.end_time is None:
            return
        seconds = (span.end_time - span.start_time) / 1e9
        attrs = span.attributes or {}
        stage = attrs.get(cv.STAGE)
        if stage is not None:
            kind = attrs.get(cv.TIME_KIND) or cv.default_time_kind(str(stage))
            self._stage.record(seconds, {cv.STAGE: str(stage), cv.TIME_KIND: str(kind)})
        elif span.name == cv.BATCH_SPAN_NAME:
            size = attrs.get(cv.BATCH_REQUEST_COUNT)
            if isinstance(size, int):
                self._batch.record(size)
        elif span.kind == SpanKind.SERVER and (span.parent is None or span.parent.is_remote):
            labels: dict[str, Any] = {}
            for key in (cv.HTTP_ROUTE, cv.HTTP_REQUEST_METHOD, cv.HTTP_RESPONSE_STATUS_CODE):
                if (value := attrs.get(key)) is not None:
                    labels[key] = value
            self._request.record(seconds, labels)

    def shutdown(self) -> None:
        return

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def _observe(read: Any) -> Any:
    def callback(options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(read())

    return callback


SCRAPE_DRAIN_S = 0.2
"""The longest a scrape waits for the exporters' queues while it builds ended spans."""


_Reader = TypeVar("_Reader", bound=MetricReader)


def _current(reader: type[_Reader]) -> type[_Reader]:
    """``reader`` whose every collection first builds the spans that have ended.

    Durations are recorded when the span builder hands a span to
    :class:`MetricsProcessor`, up to one drain interval after it ended; a scrape taken
    right after a burst would miss the last requests. Draining the recorder at collect
    time makes a scrape count every request that completed before it.
    """

    class Current(reader):  # type: ignore[misc,valid-type]
        def collect(self, timeout_millis: float = 10_000) -> None:
            try:
                RECORDER.drain(SCRAPE_DRAIN_S)
            except Exception as exc:  # noqa: BLE001 - a scrape never breaks on tracing
                _guard.report("metrics (building ended spans)", exc)
            super().collect(timeout_millis=timeout_millis)

    Current.__name__ = Current.__qualname__ = f"Current{reader.__name__}"
    return Current


class Metrics:
    """A running metrics set-up: the meter provider, its reader, the scrape server."""

    def __init__(
        self,
        mode: str,
        *,
        resource: Resource,
        port: int = DEFAULT_PORT,
        host: str = DEFAULT_HOST,
        endpoint: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ConfigError(f"configure(): metrics must be one of {MODES} or None, got {mode!r}")
        self.mode = mode
        self._server: Any = None
        self._thread: threading.Thread | None = None
        reader: MetricReader
        if mode == "prometheus":
            try:
                from opentelemetry.exporter.prometheus import PrometheusMetricReader
                from prometheus_client import REGISTRY, start_http_server
            except ImportError as exc:
                raise ConfigError(
                    "configure(metrics='prometheus') needs opentelemetry-exporter-prometheus: "
                    "pip install 'tracekit[metrics]'"
                ) from exc
            reader = _current(PrometheusMetricReader)()
            try:
                self._server, self._thread = start_http_server(port, addr=host, registry=REGISTRY)
            except OSError as exc:
                reader.shutdown()
                raise ConfigError(f"configure(): metrics port {host}:{port}: {exc}") from exc
            self.port = int(self._server.server_address[1])
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            target = f"{endpoint.rstrip('/')}/v1/metrics" if endpoint else None
            reader = _current(PeriodicExportingMetricReader)(OTLPMetricExporter(endpoint=target))
            self.port = 0
        self.reader = reader
        self.provider = MeterProvider(resource=resource, metric_readers=[reader])
        self.processor = MetricsProcessor(self.provider)

    def shutdown(self) -> None:
        """Stop serving and flush; the port is free again afterwards."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.provider.shutdown()
