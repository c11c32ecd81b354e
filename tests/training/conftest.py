"""A tracekit configured with an in-memory exporter (real SDK) for the training tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracekit
from tracekit.instrumentation import setup
from tracekit.instrumentation.training import SEQ


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracekit.configure(service_name="trainer", service_version="t1", exporter=exporter)
    SEQ.reset()
    yield exporter
    tracekit.shutdown()


def finished(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    setup.flush()
    return list(exporter.get_finished_spans())
