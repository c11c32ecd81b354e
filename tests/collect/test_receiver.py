"""`tracekit collect`'s receiver on loopback: real OTel SDK exporter, real JSON bodies,
responses as the OTLP/HTTP specification has them, rows identical to a file ingest."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from google.rpc import status_pb2
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from tracekit import conventions as cv
from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import open_store
from tracekit.collect import Collector
from tracekit.instrumentation.exporters import OTLPJsonFileExporter

from .helpers import post_json, releases, split_documents, url

_ROWS = "SELECT * EXCLUDE (source) FROM spans ORDER BY trace_id, span_id"
_REQUESTS = "SELECT * FROM requests ORDER BY trace_id"
_STAGES = "SELECT * FROM request_stages ORDER BY trace_id, stage"


def _file_store(tmp_path: Path, jsonl: Path) -> dict[str, list[Any]]:
    with open_store(tmp_path / "files.duckdb") as store:
        report = ingest_paths(store, [jsonl])
        per_request.refresh(store, report.trace_ids)
        return {q: store.run(q) for q in (_ROWS, _REQUESTS, _STAGES)}


def _live_store(c: Collector) -> dict[str, list[Any]]:
    c.stop()
    with open_store(c.writer.db, read_only=True) as store:
        return {q: store.run(q) for q in (_ROWS, _REQUESTS, _STAGES)}


def test_json_and_gzip_bodies_store_the_rows_a_file_ingest_stores(
    collector: Collector, tmp_path: Path
) -> None:
    b = releases(15)
    docs = split_documents(b.to_otlp(), per_doc=7)
    # Concurrent exports, as from several replicas: they share batches.
    with ThreadPoolExecutor(8) as pool:
        responses = list(
            pool.map(lambda i: post_json(collector, docs[i], gz=i % 2 == 1), range(len(docs)))
        )
    for response in responses:
        assert response.status_code == 200, response.text
        assert response.json() == {}
    live = _live_store(collector)
    files = _file_store(tmp_path, b.write_jsonl(tmp_path / "spans.jsonl"))
    assert len(live[_ROWS]) == len(b.spans)
    assert live == files
    assert len(live[_REQUESTS]) == 30


def test_otel_sdk_protobuf_exporter_lands_as_the_file_exporter_writes(
    collector: Collector, tmp_path: Path
) -> None:
    exporter = OTLPSpanExporter(endpoint=url(collector))
    jsonl = tmp_path / "sdk.jsonl"
    provider = TracerProvider(
        resource=Resource.create({cv.SERVICE_NAME: "ranker", cv.SERVICE_VERSION: "v7"})
    )
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(SimpleSpanProcessor(OTLPJsonFileExporter(jsonl)))
    tracer = provider.get_tracer("test")
    for _ in range(3):
        with (
            tracer.start_as_current_span(
                "POST /predict", kind=SpanKind.SERVER, attributes={cv.HTTP_ROUTE: "/predict"}
            ),
            tracer.start_as_current_span(
                "model", attributes={cv.STAGE: cv.MODEL_EXECUTE, cv.GPU_TIME_NS: 12}
            ),
        ):
            pass
    provider.shutdown()
    live = _live_store(collector)
    assert len(live[_ROWS]) == 6
    assert live == _file_store(tmp_path, jsonl)
    assert {r[3] for r in live[_REQUESTS]} == {"v7"}


def test_spans_without_valid_ids_are_a_partial_success_with_the_count_and_why(
    collector: Collector,
) -> None:
    doc = releases(1).to_otlp()
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[0]["traceId"] = "0" * 32
    spans[1]["spanId"] = "xyz"
    answer = post_json(collector, doc).json()
    assert answer["partialSuccess"]["rejectedSpans"] == "2"
    assert "all zeros" in answer["partialSuccess"]["errorMessage"]
    assert "spanId is not 16 hex digits" in answer["partialSuccess"]["errorMessage"]
    assert collector.status().spans_rejected == 2

    # The same in protobuf: the response is an ExportTraceServiceResponse.
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans  # noqa: F401

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id = bytes(16)
    span.span_id = bytes.fromhex("00000000000000aa")
    span.name = "bad"
    r = httpx.post(
        url(collector),
        content=request.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
    )
    parsed = ExportTraceServiceResponse.FromString(r.content)
    assert r.status_code == 200
    assert parsed.partial_success.rejected_spans == 1


def test_undecodable_bodies_get_400_with_a_status_and_no_retry_after(collector: Collector) -> None:
    bad_json = httpx.post(
        url(collector), content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert bad_json.status_code == 400
    assert "invalid JSON" in bad_json.json()["message"]
    assert "Retry-After" not in bad_json.headers
    bad_pb = httpx.post(
        url(collector),
        content=b"\xff\xff\xff\xff",
        headers={"Content-Type": "application/x-protobuf"},
    )
    assert bad_pb.status_code == 400
    assert "protobuf" in status_pb2.Status.FromString(bad_pb.content).message
    bad_gzip = httpx.post(
        url(collector),
        content=b"not gzip",
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert bad_gzip.status_code == 400
    assert httpx.post(url(collector).replace("traces", "logs"), content=b"{}").status_code == 404
    assert (
        httpx.post(
            url(collector), content=b"{}", headers={"Content-Type": "text/plain"}
        ).status_code
        == 415
    )


def test_empty_export_is_a_plain_success(collector: Collector) -> None:
    r = httpx.post(
        url(collector), content=json.dumps({}), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 200
    assert r.json() == {}
