"""tracekit.configure() honours OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL against either of
`tracekit collect`'s receivers: the real SDK exporters, a real Collector on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind

import tracekit
from tracekit import conventions as cv
from tracekit.analysis.store import open_store
from tracekit.collect import Collector
from tracekit.instrumentation import setup

_ENV = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_INSECURE",
)


@pytest.fixture
def both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Collector, Path]]:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    db = tmp_path / "live.duckdb"
    c = Collector(str(db), port=0, grpc_port=0, flush_interval=0.02)
    c.start()
    yield c, db
    tracekit.shutdown()
    c.stop()


def _send(n: int) -> None:
    provider = tracekit.configure(service_name="ranker", service_version="v7")
    tracer = provider.get_tracer("test")
    for i in range(n):
        with tracer.start_as_current_span("POST /predict", kind=SpanKind.SERVER) as root:
            root.set_attribute(cv.HTTP_ROUTE, "/predict")
            with tracer.start_as_current_span(cv.MODEL_EXECUTE) as child:
                child.set_attribute(cv.STAGE, cv.MODEL_EXECUTE)
                child.set_attribute("i", i)
    assert setup.flush()


def _stored(c: Collector, db: Path) -> tuple[int, int, set[str]]:
    c.stop()
    store = open_store(str(db), read_only=True)
    try:
        spans = int(store.run("SELECT count(*) FROM spans")[0][0])
        requests = int(store.run("SELECT count(*) FROM requests")[0][0])
        sources = {str(r[0]).split("#")[0] for r in store.run("SELECT source FROM spans")}
    finally:
        store.close()
    return spans, requests, sources


@pytest.mark.parametrize(
    "variable", ["OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]
)
def test_grpc_protocol_reaches_the_grpc_receiver(
    both: tuple[Collector, Path], monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    c, db = both
    monkeypatch.setenv(variable, "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{c.grpc_address}")
    _send(20)
    (pipeline,) = setup._STATE.pipelines
    assert pipeline.target.startswith("OTLP/gRPC")
    assert c.status().spans_accepted == 40
    spans, requests, _ = _stored(c, db)
    assert (spans, requests) == (40, 20)


def test_the_traces_protocol_overrides_the_general_one(
    both: tuple[Collector, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, db = both
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{c.address}")
    _send(10)
    (pipeline,) = setup._STATE.pipelines
    assert pipeline.target == f"OTLP/HTTP http://{c.address}/v1/traces"
    assert _stored(c, db)[:2] == (20, 10)


def test_grpc_without_a_scheme_follows_the_insecure_variable(
    both: tuple[Collector, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    c, db = both
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", str(c.grpc_address))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    _send(5)
    assert _stored(c, db)[:2] == (10, 5)
