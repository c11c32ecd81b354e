"""configure(): environment handling, idempotence, exporter choice, drops with a dead endpoint."""

from __future__ import annotations

import logging
import random
import socket
import statistics
import threading
import time

import httpx
import pytest
from fastapi import FastAPI
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracekit
from tracekit import conventions as cv
from tracekit.errors import ConfigError
from tracekit.instrumentation import setup
from tracekit.instrumentation.exporters import OTLPJsonFileExporter

OTEL_VARS = (
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "TRACEKIT_TRACES_FILE",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in OTEL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # the default file exporter writes into the cwd
    yield
    tracekit.shutdown()


def _resource() -> dict:
    provider = setup.current_provider()
    assert provider is not None
    return dict(provider.resource.attributes)


def _exporters() -> list:
    return [p.exporter for p in setup._STATE.pipelines]


def test_resource_from_arguments_and_defaults():
    tracekit.configure(service_name="ranker", service_version="v2", exporter=InMemorySpanExporter())
    r = _resource()
    assert r[cv.SERVICE_NAME] == "ranker" and r[cv.SERVICE_VERSION] == "v2"
    assert r[cv.HOST_NAME] == socket.gethostname()
    assert len(r[cv.SERVICE_INSTANCE_ID]) == 36  # a uuid per process


def test_resource_from_standard_environment(monkeypatch):
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "service.name=from-attrs,service.version=v9,deployment.environment=prod%20eu,service.instance.id=pod-3",
    )
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    tracekit.configure(exporter=InMemorySpanExporter())
    r = _resource()
    assert r[cv.SERVICE_NAME] == "from-env"  # OTEL_SERVICE_NAME beats OTEL_RESOURCE_ATTRIBUTES
    assert r[cv.SERVICE_VERSION] == "v9"
    assert r["deployment.environment"] == "prod eu"
    assert r[cv.SERVICE_INSTANCE_ID] == "pod-3"


def test_arguments_beat_environment(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.version=v9")
    tracekit.configure(service_name="ranker", service_version="v2", exporter=InMemorySpanExporter())
    assert (_resource()[cv.SERVICE_NAME], _resource()[cv.SERVICE_VERSION]) == ("ranker", "v2")


def test_malformed_resource_variable_names_the_variable(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.version=v1,oops")
    with pytest.raises(ConfigError, match="OTEL_RESOURCE_ATTRIBUTES.*'oops'"):
        tracekit.configure()


def test_configure_is_idempotent_and_replaces_on_change():
    mem = InMemorySpanExporter()
    first = tracekit.configure(service_name="a", exporter=mem)
    assert tracekit.configure(service_name="a", exporter=mem) is first
    with tracekit.stage(cv.PREPROCESS):
        pass
    second = tracekit.configure(service_name="b", exporter=InMemorySpanExporter())
    assert second is not first
    assert [s.name for s in mem.get_finished_spans()] == [cv.PREPROCESS]  # flushed on replace


def test_default_exporter_is_the_file(tmp_path):
    tracekit.configure(service_name="a")
    (exp,) = _exporters()
    assert isinstance(exp, OTLPJsonFileExporter) and exp.path.name == "traces.jsonl"


def test_endpoint_variable_selects_otlp_http_with_signal_path(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    tracekit.configure(service_name="a")
    (pipeline,) = setup._STATE.pipelines
    assert isinstance(pipeline.exporter, HttpExporter)
    assert pipeline.target == "OTLP/HTTP http://collector:4318/v1/traces"


def test_signal_endpoint_is_used_as_is(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/custom")
    tracekit.configure(service_name="a", exporter="otlp")
    assert setup._STATE.pipelines[0].target.endswith("http://collector:4318/custom")


def test_grpc_protocol_variable_selects_grpc(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    tracekit.configure(service_name="a", endpoint="http://localhost:4317")
    (exp,) = _exporters()
    assert isinstance(exp, GrpcExporter)


def test_file_and_jaeger_together(tmp_path):
    tracekit.configure(
        service_name="a",
        exporter=["file", "otlp"],
        path=tmp_path / "t.jsonl",
        endpoint="http://jaeger:4318",
    )
    kinds = [type(e) for e in _exporters()]
    assert kinds == [OTLPJsonFileExporter, HttpExporter]
    assert setup._STATE.pipelines[1].target.endswith("http://jaeger:4318/v1/traces")


def test_two_exporters_both_receive_every_span(tmp_path):
    a, b = InMemorySpanExporter(), InMemorySpanExporter()
    tracekit.configure(service_name="a", exporter=[a, b])
    with tracekit.stage(cv.PREPROCESS):
        pass
    setup.flush()
    assert len(a.get_finished_spans()) == len(b.get_finished_spans()) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"exporter": "zipkin"}, "unknown exporter"),
        ({"sample_ratio": 0.0}, "sample_ratio"),
        ({"service_version": ""}, "service.version"),
        ({"exporter": "otlp", "endpoint": "collector:4318"}, "not an http"),
    ],
)
def test_bad_configuration_is_a_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        tracekit.configure(service_name="a", **kwargs)


def test_sampling_marks_kept_roots_with_their_weight():
    mem = InMemorySpanExporter()
    tracekit.configure(service_name="a", exporter=mem, sample_ratio=0.25)
    random.seed(7)  # trace ids, and so the ratio sampler's choices, come from `random`
    for _ in range(200):
        with tracekit.stage("request"), tracekit.stage(cv.PREPROCESS):
            pass
    setup.flush()
    got = mem.get_finished_spans()
    roots = [s for s in got if s.parent is None]
    assert 0 < len(roots) < 200  # 1 in 4 kept: P(0 or 200 of 200) is negligible
    assert all(s.attributes[cv.SAMPLE_WEIGHT] == 4.0 for s in roots)
    assert all(cv.SAMPLE_WEIGHT not in s.attributes for s in got if s.parent is not None)


def test_dead_endpoint_drops_are_counted_and_logged_once(caplog):
    """Nothing listens on the port: every span is dropped, requests go on, one summary line."""
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tracekit.configure(service_name="a", exporter="otlp", endpoint=f"http://127.0.0.1:{port}")
    caplog.set_level(logging.WARNING, logger="tracekit")
    n = 3000  # more than the batch processor's queue holds (2048)
    for _ in range(n):
        with tracekit.stage(cv.PREPROCESS):
            pass
    (pipeline,) = setup._STATE.pipelines
    tracekit.shutdown(timeout_s=1.0)
    assert pipeline.dropped == n
    ours = [r.getMessage() for r in caplog.records if r.name == "tracekit"]
    assert sum("failed" in m for m in ours) == 1
    (summary,) = [m for m in ours if "dropped" in m]
    assert f"{n} spans were dropped" in summary and f"127.0.0.1:{port}" in summary


def test_shutdown_without_configure_is_harmless():
    tracekit.shutdown()
    tracekit.shutdown()


@pytest.mark.parametrize(
    "argument, env, url",
    [
        (None, {}, "http://localhost:4318/v1/traces"),
        ("http://collector:4318", {}, "http://collector:4318/v1/traces"),
        ("http://collector:4318/", {}, "http://collector:4318/v1/traces"),
        ("http://collector:4318/otlp", {}, "http://collector:4318/otlp/v1/traces"),
        ("http://collector:4318/otlp/", {}, "http://collector:4318/otlp/v1/traces"),
        ("https://collector/a/b", {}, "https://collector/a/b/v1/traces"),
        (
            None,
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/otlp"},
            "http://c:4318/otlp/v1/traces",
        ),
        (
            None,
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/otlp/"},
            "http://c:4318/otlp/v1/traces",
        ),
        (
            None,
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom"},
            "http://c:4318/custom",
        ),
        (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/"}, "http://c:4318/"),
        (
            None,
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://signal:4318/x/traces",
            },
            "http://signal:4318/x/traces",
        ),
        (
            "http://arg:4318/otlp",
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://signal:4318/x/traces"},
            "http://arg:4318/otlp/v1/traces",
        ),
    ],
)
def test_otlp_http_url_follows_the_spec(monkeypatch, argument, env, url):
    """A base endpoint always gets v1/traces appended to its path; the signal variable is as is."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    tracekit.configure(service_name="a", exporter="otlp-http", endpoint=argument)
    (pipeline,) = setup._STATE.pipelines
    assert pipeline.target == f"OTLP/HTTP {url}"
    assert setup._http_endpoint(argument) == url


def test_bad_signal_endpoint_names_the_variable(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318/v1/traces")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        tracekit.configure(service_name="a", exporter="otlp")


def _busy_app() -> FastAPI:
    """Twenty stage spans per request, so the exporter has plenty to (fail to) send."""
    app = FastAPI()

    @app.get("/work/{i}")
    async def work(i: int) -> dict[str, int]:
        for name in (cv.FEATURE_RETRIEVAL, cv.PREPROCESS, cv.MODEL_EXECUTE, cv.POSTPROCESS) * 5:
            with tracekit.stage(name):
                pass
        return {"i": i}

    tracekit.instrument_fastapi(app)
    return app


def _median_latency_s(url: str, n: int) -> float:
    with httpx.Client(base_url=url, timeout=10) as client:
        client.get("/work/0").raise_for_status()  # connect and warm up outside the sample
        times = []
        for i in range(n):
            t0 = time.perf_counter()
            client.get(f"/work/{i}").raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _bounded_shutdown() -> None:
    done = threading.Thread(target=tracekit.shutdown, kwargs={"timeout_s": 1.0}, daemon=True)
    done.start()
    done.join(timeout=30)  # a hang detector, far above the 1 s asked for
    assert not done.is_alive(), "tracekit.shutdown() hung with the endpoint down"


def test_requests_keep_their_latency_with_the_otlp_endpoint_down(monkeypatch, tmp_path, serve_app):
    """Must hold (issue 2): a dead collector costs requests nothing.

    The same app on a real uvicorn server, first exporting to a file, then to an OTLP
    endpoint where nothing listens; the batch processor exports every 10 ms, so the
    exporter is failing (and its queue overflowing) while the requests run. Medians of
    sequential requests are compared, generously, since the box is noisy.
    """
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    with socket.socket() as s:  # a port that was free a moment ago: connection refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n = 200
    medians: dict[str, float] = {}
    dropped = 0
    for variant, kwargs in (
        ("file", {"exporter": "file", "path": tmp_path / "baseline.jsonl"}),
        ("down", {"exporter": "otlp", "endpoint": f"http://127.0.0.1:{port}"}),
    ):
        tracekit.configure(service_name="latency", **kwargs)
        (pipeline,) = setup._STATE.pipelines
        try:
            with serve_app(_busy_app()) as url:
                medians[variant] = _median_latency_s(url, n)
        finally:
            _bounded_shutdown()
        dropped = pipeline.dropped
    assert dropped > 0  # the endpoint really was down while the requests ran
    assert medians["down"] < 3 * medians["file"] + 0.005, medians
