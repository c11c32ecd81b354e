"""Workers forked after configure() (gunicorn, ``uvicorn --workers N``, ``--preload``):
one replica = one process, in spans and in metrics. Real ``os.fork``; spans read back
from the file exporter, metrics received over OTLP/HTTP by a real server on loopback."""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response
from opentelemetry import trace
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation import _state, sampler, setup

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(body: Callable[[], None]) -> None:
    """Fork; the child runs ``body`` (configured by inheritance, as a worker) and exits."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:
            traceback.print_exc(file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked worker failed (see stderr)"


def _spans(path: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Span name → (service.instance.id of its resource, its attributes), from the file."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            res = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
            instance = res[cv.SERVICE_INSTANCE_ID]["stringValue"]
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    attrs = {
                        a["key"]: next(iter(a["value"].values())) for a in s.get("attributes", [])
                    }
                    out[s["name"]] = (instance, attrs)
    return out


@pytest.fixture
def otlp_metrics(serve_app: Any) -> Iterator[tuple[str, dict[str, list[float]]]]:
    """A real OTLP/HTTP metrics receiver: yields its base URL and, per service.instance.id,
    the ``tracekit.inflight`` gauge values it received."""
    inflight: dict[str, list[float]] = {}
    app = FastAPI()

    @app.post("/v1/metrics")
    async def receive(request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics:
            res = {a.key: a.value.string_value for a in rm.resource.attributes}
            values = inflight.setdefault(res[cv.SERVICE_INSTANCE_ID], [])
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == cv.METRIC_INFLIGHT:
                        values += [p.as_int or p.as_double for p in metric.gauge.data_points]
        return Response(
            ExportMetricsServiceResponse().SerializeToString(), media_type="application/x-protobuf"
        )

    with serve_app(app) as url:
        yield url, inflight


def test_a_forked_worker_has_its_own_instance_id_and_in_flight_count(
    tmp_path: Path, serve_app: Any, otlp_metrics: tuple[str, dict[str, list[float]]]
) -> None:
    metrics_url, inflight = otlp_metrics
    path = tmp_path / "traces.jsonl"
    app = FastAPI()

    @app.get("/work")
    async def work() -> dict[str, str]:
        with tracekit.stage(cv.PREPROCESS):
            return {}

    tracekit.configure(
        service_name="svc", exporter="file", path=path, metrics="otlp", endpoint=metrics_url
    )
    tracekit.instrument_fastapi(app)  # before the fork, as with --preload
    user = trace.get_tracer("user.code")  # taken before the fork, as a module does at import
    parent_id = setup._STATE.attrs[cv.SERVICE_INSTANCE_ID]

    def worker() -> None:
        assert _state.INFLIGHT.value == 0  # the parent's requests are not this worker's
        with serve_app(app) as url:
            assert httpx.get(f"{url}/work").status_code == 200
        with tracekit.stage("in-child"), user.start_as_current_span("user-span"):
            pass
        tracekit.shutdown()  # exports the worker's spans and its metrics

    try:
        with tracekit.stage("in-parent"):
            pass
        _state.INFLIGHT.enter()
        _state.INFLIGHT.enter()  # two requests in flight in the parent at the fork
        try:
            with _state.INFLIGHT._lock:  # held across the fork, as a serving thread might
                _in_child(worker)
            assert _state.INFLIGHT.value == 2
            with tracekit.stage("after-fork"):
                pass
            tracekit.shutdown()  # the parent's gauge reads its own 2
        finally:
            _state.INFLIGHT.leave()
            _state.INFLIGHT.leave()
    finally:
        tracekit.shutdown()

    spans = _spans(path)
    assert spans["in-parent"][0] == spans["after-fork"][0] == parent_id
    child_ids = {spans[n][0] for n in ("in-child", "user-span", "GET /work", cv.PREPROCESS)}
    (child_id,) = child_ids
    assert child_id != parent_id and len(child_id) == 36
    assert spans["GET /work"][1][cv.INFLIGHT] == "1"  # its own count: itself, not the parent's 2
    assert inflight == {child_id: [0], parent_id: [2]}


@pytest.mark.parametrize("how", ["argument", "variable"])
def test_a_stated_instance_id_is_kept_in_a_forked_worker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    otlp_metrics: tuple[str, dict[str, list[float]]],
    how: str,
) -> None:
    metrics_url, inflight = otlp_metrics
    path = tmp_path / "traces.jsonl"
    stated: dict[str, str] = {}
    if how == "argument":
        stated["instance_id"] = "pod-7"
    else:
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.instance.id=pod-7")

    def worker() -> None:
        with tracekit.stage("in-child"):
            pass
        tracekit.shutdown()

    tracekit.configure(exporter="file", path=path, metrics="otlp", endpoint=metrics_url, **stated)
    try:
        with tracekit.stage("in-parent"):
            pass
        _in_child(worker)
    finally:
        tracekit.shutdown()
    spans = _spans(path)
    assert spans["in-parent"][0] == spans["in-child"][0] == "pod-7"
    assert list(inflight) == ["pod-7"]


def test_the_same_configure_call_in_a_worker_keeps_the_inherited_set_up(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    provider = tracekit.configure(service_name="svc", exporter="file", path=path)

    def worker() -> None:
        # a post_fork hook, or an app module imported again in the worker
        assert tracekit.configure(service_name="svc", exporter="file", path=path) is provider
        with tracekit.stage("in-child"):
            pass
        tracekit.shutdown()

    try:
        _in_child(worker)
    finally:
        tracekit.shutdown()
    assert _spans(path)["in-child"][0] != setup._STATE.attrs.get(cv.SERVICE_INSTANCE_ID)


def test_a_worker_that_configures_after_the_fork_gets_its_own_id(tmp_path: Path) -> None:
    # gunicorn without --preload: tracekit imported in the master, configure() in each worker
    path = tmp_path / "traces.jsonl"
    tracekit.shutdown()
    parent_default = setup._INSTANCE_ID

    def worker() -> None:
        tracekit.configure(service_name="svc", exporter="file", path=path)
        with tracekit.stage("in-child"):
            pass
        tracekit.shutdown()

    _in_child(worker)
    assert _spans(path)["in-child"][0] not in ("", parent_default)
    assert parent_default == setup._INSTANCE_ID  # the parent keeps its own


def test_an_sdk_without_its_own_fork_refresh_still_gets_a_new_id_in_the_worker(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    otlp_metrics: tuple[str, dict[str, list[float]]],
) -> None:
    """A stand-in for OTel SDKs before 1.44, which refresh no resource after a fork."""
    for cls in (TracerProvider, MeterProvider):
        monkeypatch.setattr(cls, "_handle_fork", lambda self: None, raising=False)
        monkeypatch.delattr(cls, "_update_resource", raising=False)
    metrics_url, inflight = otlp_metrics
    path = tmp_path / "traces.jsonl"
    tracekit.configure(exporter="file", path=path, metrics="otlp", endpoint=metrics_url)
    user = trace.get_tracer("user.code")
    parent_id = setup._STATE.attrs[cv.SERVICE_INSTANCE_ID]

    def worker() -> None:
        with tracekit.stage("in-child"), user.start_as_current_span("user-span"):
            pass
        tracekit.shutdown()

    try:
        with tracekit.stage("in-parent"):
            pass
        _in_child(worker)
    finally:
        tracekit.shutdown()
    spans = _spans(path)
    child_id = spans["in-child"][0]
    assert spans["user-span"][0] == child_id and child_id != spans["in-parent"][0] == parent_id
    assert set(inflight) == {parent_id, child_id}


def test_a_forked_worker_samples_its_own_cpu() -> None:
    sampler.stop()
    running = sampler.start(interval_s=3600)  # no window closes during the test
    assert running.cpu is not None  # the parent's first reading
    forked_at = time.monotonic()

    def worker() -> None:
        s = sampler.current()
        assert s is running and s._thread is not None
        assert s._thread.is_alive()  # a thread of its own: the parent's is not in this process
        assert s.cpu is None  # the parent's reading is not this process's
        assert s._last[0] >= forked_at  # its first window starts at the fork

    try:
        _in_child(worker)
    finally:
        sampler.stop()
