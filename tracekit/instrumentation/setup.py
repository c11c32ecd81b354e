"""Process-wide set-up: ``configure()``, ``shutdown()`` and the tracer everyone uses.

Owns the one SDK ``TracerProvider`` tracekit writes to, the resource that names the
service, its release and its replica, and the export pipelines. Every tracekit
instrumentation takes its tracer from :data:`PROVIDER`, a proxy that follows
re-configuration: an app instrumented before ``configure()`` (or reconfigured in a
test) still lands in the current provider, and before any ``configure()`` spans are
no-ops.

Precedence, per value: the ``configure()`` argument, then the standard variable
(``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``), then the
default.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading
import urllib.parse
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import _guard
from tracekit.instrumentation._otel_internals import (
    initialize_semconv,
    semconv_initialized,
    update_resource,
)
from tracekit.instrumentation._recorder import RECORDER
from tracekit.instrumentation.exporters import ExportPipeline, OTLPJsonFileExporter, quiet_repeats
from tracekit.instrumentation.job import job_resource

# --- environment: each variable declared once ----------------------------------
ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
ENV_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
ENV_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
ENV_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
ENV_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
ENV_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
ENV_OTLP_INSECURE = "OTEL_EXPORTER_OTLP_INSECURE"
ENV_OTLP_TRACES_INSECURE = "OTEL_EXPORTER_OTLP_TRACES_INSECURE"
ENV_SEMCONV_OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
ENV_TRACES_FILE = "TRACEKIT_TRACES_FILE"
"""Where the file exporter writes when ``path`` is not given."""
ENV_METRICS = "TRACEKIT_METRICS"
"""``prometheus`` or ``otlp``: export metrics when ``configure(metrics=...)`` is not given."""
ENV_METRICS_PORT = "TRACEKIT_METRICS_PORT"
"""Port of the Prometheus endpoint when ``metrics_port`` is not given (else 9464)."""

DEFAULT_TRACES_FILE = "traces.jsonl"
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
EXPORTERS = ("file", "otlp", "otlp-http", "otlp-grpc")
"""Exporter names ``configure(exporter=...)`` accepts, beside ``SpanExporter`` instances."""

_semconv_lock = threading.Lock()
_INSTANCE_ID = str(uuid.uuid4())
"""This process's ``service.instance.id`` when none is stated: one replica = one process,
stable across ``configure()`` calls, new in a forked child (:func:`_after_fork_in_child`)."""


# --- the proxy every instrumentation holds ---------------------------------------


class _ProxyTracer(trace.Tracer):
    """Delegates to a tracer of whichever provider is current."""

    def __init__(self, args: tuple[Any, ...]) -> None:
        self._args = args
        self._generation = -1
        self._tracer: trace.Tracer = trace.NoOpTracer()

    def _current(self) -> trace.Tracer:
        state = _STATE
        if self._generation != state.generation:
            provider = state.provider
            self._tracer = provider.get_tracer(*self._args) if provider else trace.NoOpTracer()
            self._generation = state.generation
        return self._tracer

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._current().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._current().start_as_current_span(*args, **kwargs)


class _ProxyTracerProvider(trace.TracerProvider):
    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        return _ProxyTracer(
            (instrumenting_module_name, instrumenting_library_version, schema_url, attributes)
        )


PROVIDER: trace.TracerProvider = _ProxyTracerProvider()
"""Pass this to OTel instrumentations: it always reaches the current configuration."""


def tracer(name: str) -> trace.Tracer:
    """A tracer that follows ``configure()`` / ``shutdown()``."""
    return PROVIDER.get_tracer(name)


# --- state -----------------------------------------------------------------------


@dataclass
class _State:
    generation: int = 0
    provider: TracerProvider | None = None
    key: tuple[Any, ...] | None = None
    pipelines: list[ExportPipeline] = field(default_factory=list)
    metrics: Any = None
    """The running :class:`tracekit.instrumentation.metrics.Metrics`, when asked for."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """The resource attributes ``configure()`` was given or defaulted (the key's first part)."""
    instance_stated: bool = False
    """Whether ``service.instance.id`` was stated (argument, variable, resource_attributes)."""


_STATE = _State()
_LOCK = threading.RLock()
_atexit_registered = False


class _SampleWeight(SpanProcessor):
    """Marks spans whose keep/drop decision this process made with 1/ratio."""

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if span.parent is None:
            span.set_attribute(cv.SAMPLE_WEIGHT, self.weight)


def _parse_resource_env(raw: str) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(
                f"{ENV_RESOURCE_ATTRIBUTES}: entry {item.strip()!r} is not key=value; "
                "write it as key1=value1,key2=value2"
            )
        attrs[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    return attrs


def _resource_attributes(
    service_name: str | None,
    service_version: str | None,
    instance_id: str | None,
    extra: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], bool]:
    """The resource's attributes, and whether ``service.instance.id`` was stated in them."""
    attrs: dict[str, Any] = {cv.HOST_NAME: socket.gethostname(), cv.SERVICE_INSTANCE_ID: None}
    attrs.update(_parse_resource_env(os.environ.get(ENV_RESOURCE_ATTRIBUTES, "")))
    if os.environ.get(ENV_SERVICE_NAME, "").strip():
        attrs[cv.SERVICE_NAME] = os.environ[ENV_SERVICE_NAME].strip()
    attrs.update(job_resource())  # tracekit.rank etc. in a training job; nothing otherwise
    attrs.update(extra or {})
    for key, value in (
        (cv.SERVICE_NAME, service_name),
        (cv.SERVICE_VERSION, service_version),
        (cv.SERVICE_INSTANCE_ID, instance_id),
    ):
        if value is not None:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"configure(): {key} must be a non-empty string, got {value!r}")
            attrs[key] = value
    attrs.setdefault(cv.SERVICE_NAME, "unknown_service")
    stated = attrs[cv.SERVICE_INSTANCE_ID] is not None
    if not stated:
        attrs[cv.SERVICE_INSTANCE_ID] = _INSTANCE_ID
    return attrs, stated


def _attrs_key(attrs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in attrs.items()))


def _http_endpoint(endpoint: str | None) -> str:
    """The full OTLP/HTTP traces URL, built as the OTel exporter spec says.

    A base endpoint (the ``endpoint`` argument, ``OTEL_EXPORTER_OTLP_ENDPOINT``, the
    default) always gets ``v1/traces`` appended to its path; the signal-specific
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is used as is.
    """
    if endpoint is None:
        signal = os.environ.get(ENV_OTLP_TRACES_ENDPOINT, "").strip()
        if signal:
            _check_http_url(signal, ENV_OTLP_TRACES_ENDPOINT)
            return signal
        endpoint = os.environ.get(ENV_OTLP_ENDPOINT, "").strip() or DEFAULT_HTTP_ENDPOINT
    parsed = _check_http_url(endpoint, "OTLP endpoint")
    if parsed.path.rstrip("/").endswith("/v1/traces"):
        _guard.logger.warning(
            "tracekit: OTLP endpoint %s is a base URL, so v1/traces is appended again; "
            "for a full traces URL set %s instead",
            endpoint,
            ENV_OTLP_TRACES_ENDPOINT,
        )
    return urllib.parse.urlunparse(parsed._replace(path=parsed.path.rstrip("/") + "/v1/traces"))


def _check_http_url(url: str, source: str) -> urllib.parse.ParseResult:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"{source} {url!r} is not an http(s) URL like {DEFAULT_HTTP_ENDPOINT}")
    return parsed


def otlp_protocol() -> str:
    """``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``, else ``OTEL_EXPORTER_OTLP_PROTOCOL``, else
    ``http/protobuf`` (the spec's default), lower-cased."""
    return (
        os.environ.get(ENV_OTLP_TRACES_PROTOCOL, "").strip()
        or os.environ.get(ENV_OTLP_PROTOCOL, "").strip()
        or "http/protobuf"
    ).lower()


def _grpc_endpoint(endpoint: str | None) -> str:
    if endpoint is None:
        endpoint = (
            os.environ.get(ENV_OTLP_TRACES_ENDPOINT, "").strip()
            or os.environ.get(ENV_OTLP_ENDPOINT, "").strip()
            or DEFAULT_GRPC_ENDPOINT
        )
    return endpoint


def _exporter_names(
    exporter: str | SpanExporter | Sequence[str | SpanExporter] | None,
    path: str | os.PathLike[str] | None,
    endpoint: str | None,
) -> list[str | SpanExporter]:
    if exporter is None:
        env_endpoint = os.environ.get(ENV_OTLP_TRACES_ENDPOINT) or os.environ.get(ENV_OTLP_ENDPOINT)
        names: list[str | SpanExporter] = []
        if path is not None or not (endpoint or env_endpoint):
            names.append("file")
        if endpoint or env_endpoint:
            names.append("otlp")
        return names
    if isinstance(exporter, str | SpanExporter):
        return [exporter]
    return list(exporter)


def _build(
    spec: str | SpanExporter, path: Any, endpoint: str | None, headers: Any
) -> tuple[SpanExporter, str]:
    if isinstance(spec, SpanExporter):
        return spec, type(spec).__name__
    if spec not in EXPORTERS:
        raise ConfigError(
            f"configure(): unknown exporter {spec!r}; use one of {', '.join(EXPORTERS)}"
        )
    if spec == "file":
        target = (
            os.fspath(path)
            if path is not None
            else os.environ.get(ENV_TRACES_FILE, DEFAULT_TRACES_FILE)
        )
        return OTLPJsonFileExporter(target), f"file {target}"
    protocol = otlp_protocol()
    if spec == "otlp-grpc" or (spec == "otlp" and protocol == "grpc"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        url = _grpc_endpoint(endpoint)
        quiet_repeats("opentelemetry.exporter.otlp.proto.grpc.exporter")
        # The exporter spec: an http:// endpoint is plain text, https:// is TLS, and
        # without a scheme OTEL_EXPORTER_OTLP[_TRACES]_INSECURE decides (default: TLS).
        if url.startswith(("http://", "https://")):
            insecure = url.startswith("http://")
        else:
            flag = os.environ.get(ENV_OTLP_TRACES_INSECURE) or os.environ.get(ENV_OTLP_INSECURE)
            insecure = (flag or "").strip().lower() == "true"
        return GrpcExporter(endpoint=url, insecure=insecure, headers=headers), f"OTLP/gRPC {url}"
    if protocol not in ("http/protobuf", "http/json"):
        _guard.logger.warning(
            "tracekit: %s=%r is not grpc, http/protobuf or http/json; exporting over http/protobuf",
            ENV_OTLP_PROTOCOL,
            protocol,
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    url = _http_endpoint(endpoint)
    quiet_repeats("opentelemetry.exporter.otlp.proto.http.trace_exporter")
    return HttpExporter(endpoint=url, headers=headers), f"OTLP/HTTP {url}"


def configure(
    *,
    service_name: str | None = None,
    service_version: str | None = None,
    exporter: str | SpanExporter | Sequence[str | SpanExporter] | None = None,
    path: str | os.PathLike[str] | None = None,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    instance_id: str | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    sample_ratio: float = 1.0,
    set_global: bool = True,
    metrics: str | None = None,
    metrics_port: int | None = None,
    profile_on: Mapping[str, Any] | Sequence[Mapping[str, Any]] | str | None = None,
    profile_dir: str | os.PathLike[str] | None = None,
) -> TracerProvider:
    """Set up tracing for this process; calling it again with the same values does nothing.

    ``exporter`` is ``"file"`` (OTLP JSON lines at ``path``, the default when no OTLP
    endpoint is set), ``"otlp"`` (HTTP unless ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``;
    the default when an endpoint is set), ``"otlp-http"``, ``"otlp-grpc"``, a
    ``SpanExporter`` instance, or a list of these — e.g. ``["file", "otlp"]`` writes a
    file and sends to Jaeger at once. ``sample_ratio`` < 1 keeps that share of traces
    and marks each kept root with ``tracekit.sample.weight`` = 1/ratio. With different
    values, the previous set-up is flushed and replaced. Returns the SDK provider.

    ``metrics`` also exports OTel metrics (request and stage duration histograms,
    in-flight and queue-depth gauges, batch sizes; :mod:`tracekit.instrumentation.metrics`):
    ``"prometheus"`` serves them on 127.0.0.1:``metrics_port``, ``"otlp"`` pushes them
    to the OTLP endpoint.

    ``profile_on`` (else ``TRACEKIT_PROFILE_ON``, JSON) is one rule or a list, e.g.
    ``{"stage": "model_execute", "above": "p99", "window": "5m"}`` or ``{"stage":
    "model_execute", "above_ms": 40}``: when the stage ends above it, ``torch.profiler``
    records its next few executions into ``profile_dir`` (else ``TRACEKIT_PROFILE_DIR``,
    else ``./tracekit-profiles``); see docs/profiling.md.
    """
    if not 0.0 < sample_ratio <= 1.0:
        raise ConfigError(f"configure(): sample_ratio must be in (0, 1], got {sample_ratio!r}")
    from tracekit.instrumentation import profiling

    profile = profiling.settings(profile_on, profile_dir)
    metrics = metrics or os.environ.get(ENV_METRICS) or None
    metrics_port = _metrics_port(metrics_port)
    attrs, instance_stated = _resource_attributes(
        service_name, service_version, instance_id, resource_attributes
    )
    specs = _exporter_names(exporter, path, endpoint)
    key = (
        _attrs_key(attrs),
        tuple(s if isinstance(s, str) else id(s) for s in specs),
        os.fspath(path) if path is not None else os.environ.get(ENV_TRACES_FILE),
        endpoint,
        os.environ.get(ENV_OTLP_ENDPOINT),
        os.environ.get(ENV_OTLP_TRACES_ENDPOINT),
        os.environ.get(ENV_OTLP_PROTOCOL),
        os.environ.get(ENV_OTLP_TRACES_PROTOCOL),
        os.environ.get(ENV_OTLP_INSECURE),
        os.environ.get(ENV_OTLP_TRACES_INSECURE),
        tuple(sorted((headers or {}).items())),
        sample_ratio,
        metrics,
        metrics_port,
    )
    with _LOCK:
        if _STATE.key == key and _STATE.provider is not None:
            profiling.apply(profile, _resource_now)
            return _STATE.provider
        built = [_build(s, path, endpoint, headers) for s in specs]
        if _STATE.provider is not None:
            _close(timeout_s=5.0)
        metrics_setup = _start_metrics(metrics, metrics_port, attrs, endpoint)
        sampler = ParentBased(TraceIdRatioBased(sample_ratio)) if sample_ratio < 1.0 else None
        provider = TracerProvider(
            resource=Resource.create(attrs), sampler=sampler, shutdown_on_exit=False
        )
        if sample_ratio < 1.0:
            provider.add_span_processor(_SampleWeight(1.0 / sample_ratio))
        pipelines = [ExportPipeline(exp, target) for exp, target in built]
        for pipeline in pipelines:
            provider.add_span_processor(pipeline)
        if metrics_setup is not None:
            provider.add_span_processor(metrics_setup.processor)
        _STATE.provider, _STATE.key, _STATE.pipelines = provider, key, pipelines
        _STATE.metrics = metrics_setup
        _STATE.attrs, _STATE.instance_stated = attrs, instance_stated
        _STATE.generation += 1
        _fork_hook(provider)
        RECORDER.backlog = _export_backlog
        RECORDER.start()  # builds tracekit's spans into this provider, off the request path
        _install_global(set_global)
        profiling.apply(profile, _resource_now)
        return provider


def _resource_now() -> dict[str, Any]:
    """The resource attributes in force (a forked worker's own ``service.instance.id``)."""
    return _STATE.attrs


def _metrics_port(port: int | None) -> int:
    if port is not None:
        return port
    raw = os.environ.get(ENV_METRICS_PORT, "").strip()
    try:
        return int(raw) if raw else 9464
    except ValueError as exc:
        raise ConfigError(f"{ENV_METRICS_PORT}={raw!r}: expected a port number") from exc


def _start_metrics(mode: str | None, port: int, attrs: dict[str, Any], endpoint: str | None) -> Any:
    if mode is None:
        return None
    from tracekit.instrumentation.metrics import Metrics

    return Metrics(mode, resource=Resource.create(attrs), port=port, endpoint=endpoint)


def _install_global(set_global: bool) -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(shutdown)
        _atexit_registered = True
    # OTel allows one global provider per process; ours is the proxy, so later
    # configure() calls need not touch it. A provider the user set stays theirs.
    if set_global and not isinstance(trace.get_tracer_provider(), _ProxyTracerProvider):
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            trace.set_tracer_provider(PROVIDER)
        else:
            _guard.logger.info("tracekit: a global TracerProvider is already set; leaving it")


# --- fork: one replica = one process -------------------------------------------------
# gunicorn workers (``--preload``, or configure() in gunicorn.conf.py) are forked after
# configure(): each inherits the provider, and with it the parent's resource. The analyzer counts
# replicas by service.instance.id, so a child whose id was not stated gets its own.


def _fork_hook(provider: TracerProvider) -> None:
    """Re-identify ``provider``'s resource in forked children (registered per provider).

    Registered after the SDK providers' own after-fork hooks (they are registered when
    the providers are built, and hooks run in registration order), so it runs after
    theirs: SDK 1.44+ merges a freshly *detected* ``service.instance.id`` into the
    resource in the child even when the user stated one; this puts back what
    ``configure()`` decided, and does the whole job on older SDKs, which refresh
    nothing. Weakly held, as the SDK's, so a replaced provider is freed.
    """
    if not hasattr(os, "register_at_fork"):
        return
    ref = weakref.ref(provider)
    os.register_at_fork(after_in_child=lambda: _after_fork_in_child(ref))


def _new_process_identity() -> None:
    """First after-fork step in the child: its own default id, and locks nobody holds."""
    global _INSTANCE_ID, _LOCK, _semconv_lock
    _INSTANCE_ID = str(uuid.uuid4())
    # another thread of the parent may have held them at the fork; it does not exist here
    _LOCK, _semconv_lock = threading.RLock(), threading.Lock()


def _after_fork_in_child(ref: weakref.ref[TracerProvider]) -> None:
    provider = ref()
    state = _STATE
    if provider is None or state.provider is not provider:
        return  # a provider configure() has since replaced; it exports nothing
    try:
        instance = state.attrs[cv.SERVICE_INSTANCE_ID] if state.instance_stated else _INSTANCE_ID
        update = Resource({cv.SERVICE_INSTANCE_ID: instance})
        if update_resource(provider, update):
            state.generation += 1  # tracekit's tracers are fetched again, with the new resource
        if state.metrics is not None:
            update_resource(state.metrics.provider, update)
        state.attrs = {**state.attrs, cv.SERVICE_INSTANCE_ID: instance}
        if state.key is not None:
            # so that the same configure() call in the worker keeps what it inherited
            state.key = (_attrs_key(state.attrs), *state.key[1:])
    except Exception as exc:  # pragma: no cover - never break a fork
        _guard.logger.warning("tracekit: service.instance.id after fork: %r", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_process_identity)


def _export_backlog() -> float:
    """How full the fullest exporter queue is (0..1): the span recorder paces itself on it."""
    return max((p.backlog for p in _STATE.pipelines), default=0.0)


def current_provider() -> TracerProvider | None:
    """The SDK provider ``configure()`` built, or None."""
    return _STATE.provider


def flush(timeout_s: float = 10.0) -> bool:
    """Export every finished span now; True when all pipelines flushed."""
    RECORDER.drain()
    RECORDER.check()
    provider = _STATE.provider
    return provider.force_flush(int(timeout_s * 1000)) if provider is not None else True


def shutdown(timeout_s: float = 5.0) -> None:
    """Flush every exporter and close them; spans started afterwards are no-ops."""
    from tracekit.instrumentation import sampler

    sampler.stop()
    RECORDER.stop(timeout_s / 2)  # half the budget for building, half for exporting
    _close(timeout_s)
    RECORDER.check()


def _close(timeout_s: float) -> None:
    with _LOCK:
        provider, pipelines = _STATE.provider, _STATE.pipelines
        _STATE.provider, _STATE.key, _STATE.pipelines = None, None, []
        metrics, _STATE.metrics = _STATE.metrics, None
        if metrics is not None:
            metrics.shutdown()
        _STATE.generation += 1
    if provider is None:
        return
    # spans that ended under this provider are built into it before its exporters close
    RECORDER.drain(timeout_s / 2)
    if RECORDER.dropped:
        _guard.logger.warning(
            "tracekit: %d spans were dropped before export because the span buffer was full.",
            RECORDER.dropped,
        )
        RECORDER.dropped = 0
    for pipeline in pipelines:
        # each pipeline bounds its own shutdown; the provider's would wait 30 s each
        pipeline.shutdown(timeout_s)


def use_stable_http_semconv() -> None:
    """Make OTel's HTTP instrumentations write the stable names (``http.request.method``…).

    They read ``OTEL_SEMCONV_STABILITY_OPT_IN`` once per process; unless the user set
    it, tracekit opts in to ``http`` for that one read and leaves the environment as it was.
    """
    with _semconv_lock:
        if semconv_initialized() or ENV_SEMCONV_OPT_IN in os.environ:
            initialize_semconv()
            return
        os.environ[ENV_SEMCONV_OPT_IN] = "http"
        try:
            initialize_semconv()
        finally:
            del os.environ[ENV_SEMCONV_OPT_IN]
