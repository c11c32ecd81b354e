"""Pulling traces from a running Jaeger, against a stand-in query service.

Jaeger itself cannot run here, so a real HTTP server (``http.server`` on 127.0.0.1, a
thread of this process) stands in for its query service: it serves corpus files as
Jaeger's api_v3 (``/api/v3/traces`` -> ``{"result": ...}``) and legacy (``/api/traces``
-> ``{"data": [...]}``) endpoints would, records the query parameters, and answers
404 like a Jaeger without api_v3. It proves tracekit's requests, its v3-then-legacy
fallback and the decoding of both bodies over real HTTP; not Jaeger's search semantics.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tracekit.analysis.ingest import ingest_jaeger
from tracekit.analysis.ingest.jaeger_api import parse_since
from tracekit.errors import ConfigError, IngestError


class StandIn:
    def __init__(self, corpus: Path) -> None:
        self.corpus = corpus
        self.v3 = True
        self.v3_empty = False
        self.requests: list[tuple[str, dict[str, list[str]]]] = []


@pytest.fixture
def jaeger(corpus_dir: Path) -> Iterator[tuple[str, StandIn]]:
    state = StandIn(corpus_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            state.requests.append((url.path, parse_qs(url.query)))
            if url.path == "/api/v3/traces" and state.v3:
                if state.v3_empty:
                    return self._send(
                        404, {"error": {"httpCode": 404, "message": "No traces found"}}
                    )
                body = json.loads(
                    (state.corpus / "otlp/jaegerv3_n_plus_one_full_serial.json").read_text()
                )
                return self._send(200, {"result": body})
            if url.path == "/api/traces":
                body = json.loads(
                    (state.corpus / "jaeger/tracecompass_jaeger_multiple_services.json").read_text()
                )
                return self._send(200, body)
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b"404 page not found\n")

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_api_v3_is_asked_first_with_its_query_parameters(store, jaeger) -> None:
    url, state = jaeger
    report = ingest_jaeger(store, url, "frontend", since="2h", limit=7)
    assert (report.spans_stored, report.traces, report.skipped) == (40, 1, 0)
    ((path, params),) = state.requests
    assert path == "/api/v3/traces"
    assert params["query.service_name"] == ["frontend"] and params["query.num_traces"] == ["7"]
    assert (
        params["query.start_time_min"][0].endswith("Z")
        and params["query.start_time_max"][0] > params["query.start_time_min"][0]
    )


def test_legacy_api_is_used_when_v3_is_absent(store, jaeger) -> None:
    url, state = jaeger
    state.v3 = False
    report = ingest_jaeger(store, url, "hello-world", since="30m", limit=5)
    assert [p for p, _ in state.requests] == ["/api/v3/traces", "/api/traces"]
    params = state.requests[1][1]
    assert (
        params["service"] == ["hello-world"]
        and params["lookback"] == ["30m"]
        and params["limit"] == ["5"]
    )
    assert report.spans_stored == 5 and report.traces == 1
    assert report.problems == [] or all(p.where.startswith(url) for p in report.problems)


def test_v3_no_traces_found_is_an_empty_pull_not_a_fallback(store, jaeger) -> None:
    url, state = jaeger
    state.v3_empty = True
    report = ingest_jaeger(store, url, "nobody")
    assert report.spans_read == 0 and [p for p, _ in state.requests] == ["/api/v3/traces"]


def test_unreachable_jaeger_is_a_one_line_error() -> None:
    with pytest.raises(IngestError, match="cannot reach Jaeger"):
        from tracekit.analysis.ingest.jaeger_api import fetch_traces

        fetch_traces("http://127.0.0.1:9", "x", timeout=2)


def test_since_parsing() -> None:
    assert parse_since("1h30m").total_seconds() == 5400
    with pytest.raises(ConfigError):
        parse_since("yesterday")


def test_a_pull_that_hits_the_limit_says_older_traces_were_left_out(
    jaeger, tmp_path, capsys
) -> None:
    from tracekit.cli import main

    url, _state = jaeger
    db = tmp_path / "t.duckdb"
    argv = ["ingest", "--jaeger", url, "--service", "frontend", "--limit", "1", "--db", str(db)]
    assert main(argv) == 0
    assert "pulled --limit 1 traces" in capsys.readouterr().err
    assert main([*argv[:-4], "--limit", "50", "--db", str(db)]) == 0
    assert "--limit" not in capsys.readouterr().err
