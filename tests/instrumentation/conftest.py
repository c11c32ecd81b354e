"""Fixtures for the serving-side tests: a configured in-memory tracer and real servers."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tracekit
from tracekit.instrumentation import setup


class Spans:
    """The spans a test produced, read after a flush."""

    def __init__(self, exporter: InMemorySpanExporter) -> None:
        self.exporter = exporter

    def all(self) -> list[ReadableSpan]:
        setup.flush()
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name]

    def clear(self) -> None:
        setup.flush()
        self.exporter.clear()


@pytest.fixture
def spans() -> Iterator[Spans]:
    """tracekit configured with an in-memory exporter (real SDK, real batch processor)."""
    exporter = InMemorySpanExporter()
    tracekit.configure(service_name="test-svc", service_version="v1", exporter=exporter)
    yield Spans(exporter)
    tracekit.shutdown()


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` on a real uvicorn server on 127.0.0.1 (free port); yields its base URL."""
    import uvicorn

    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY on accepted connections only
    # when the listener's proto says TCP, and without it every response waits ~40 ms
    # for a delayed ACK (Nagle), which would swamp any latency a test compares.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="off", limit_concurrency=1000, backlog=512
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


@pytest.fixture
def serve_app() -> Any:
    """The :func:`serve` context manager, for tests that start real servers."""
    return serve


@pytest.fixture
def no_strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Production behaviour: internal failures are logged, not raised."""
    from tracekit.instrumentation import _guard

    monkeypatch.setenv("TRACEKIT_STRICT", "0")
    monkeypatch.setattr(_guard, "_reported", set())
