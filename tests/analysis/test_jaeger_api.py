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
        self.paged: list[tuple[str, int]] | None = None
        """(trace id, start ns): answer searches over these as Jaeger does (most recent
        first, at most as many as asked, start within the window)."""

    def search(self, lo_ns: int, hi_ns: int, n: int) -> list[tuple[str, int]]:
        assert self.paged is not None
        hits = [(t, s) for t, s in self.paged if lo_ns <= s <= hi_ns]
        return sorted(hits, key=lambda ts: -ts[1])[:n]


def _rfc_ns(text: str) -> int:
    from datetime import datetime

    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1e6) * 1000


def _v3_body(hits: list[tuple[str, int]]) -> dict[str, Any]:
    spans = [
        {
            "traceId": t,
            "spanId": t[:16],
            "name": "GET /x",
            "kind": 2,
            "startTimeUnixNano": str(s),
            "endTimeUnixNano": str(s + 1000),
        }
        for t, s in hits
    ]
    resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "svc"}}]}
    return {"result": {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}}


def _legacy_body(hits: list[tuple[str, int]]) -> dict[str, Any]:
    data = [
        {
            "traceID": t,
            "spans": [
                {
                    "traceID": t,
                    "spanID": t[:16],
                    "operationName": "GET /x",
                    "startTime": s // 1000,
                    "duration": 1,
                    "processID": "p1",
                }
            ],
            "processes": {"p1": {"serviceName": "svc", "tags": []}},
        }
        for t, s in hits
    ]
    return {"data": data}


@pytest.fixture
def jaeger(corpus_dir: Path) -> Iterator[tuple[str, StandIn]]:
    state = StandIn(corpus_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            url = urlparse(self.path)
            state.requests.append((url.path, parse_qs(url.query)))
            q = parse_qs(url.query)
            if state.paged is not None and url.path == "/api/v3/traces" and state.v3:
                hits = state.search(
                    _rfc_ns(q["query.start_time_min"][0]),
                    _rfc_ns(q["query.start_time_max"][0]),
                    int(q["query.num_traces"][0]),
                )
                if not hits:
                    return self._send(404, {"error": {"httpCode": 404, "message": "none"}})
                return self._send(200, _v3_body(hits))
            if state.paged is not None and url.path == "/api/traces":
                lo, hi = int(q["start"][0]) * 1000, int(q["end"][0]) * 1000
                return self._send(200, _legacy_body(state.search(lo, hi, int(q["limit"][0]))))
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


def _traces(n: int) -> list[tuple[str, int]]:
    import time

    now = int(time.time() * 1e6) * 1000
    # Two traces share a start at every fifth step: a page boundary may fall between them.
    return [
        (f"{i + 1:032x}", now - 1_000_000_000 * (i + 1) // (2 if i % 5 else 1)) for i in range(n)
    ]


@pytest.mark.parametrize("v3", [True, False])
def test_a_pull_pages_through_the_window_until_it_holds_no_more(
    store, jaeger, monkeypatch, v3: bool
) -> None:
    from tracekit.analysis.ingest import jaeger_api

    url, state = jaeger
    state.v3 = v3
    state.paged = _traces(47)
    monkeypatch.setattr(jaeger_api, "PAGE_TRACES", 10)
    report = ingest_jaeger(store, url, "svc", since="2h")
    assert report.traces == 47 and report.counts.get("duplicate", 0) == 0
    searches = [p for p, _ in state.requests if p == ("/api/v3/traces" if v3 else "/api/traces")]
    assert len(searches) >= 5
    assert report.stopped.startswith("Jaeger returned 47 traces in ")
    assert report.stopped.endswith("stopped: no more traces in the --since window")


def test_a_pull_stops_at_the_limit_and_says_so(store, jaeger, monkeypatch, capsys) -> None:
    from tracekit.analysis.ingest import jaeger_api
    from tracekit.cli import main

    url, state = jaeger
    state.paged = _traces(47)
    monkeypatch.setattr(jaeger_api, "PAGE_TRACES", 10)
    report = ingest_jaeger(store, url, "svc", since="2h", limit=23)
    assert report.traces == 23
    assert report.stopped == "Jaeger returned 23 traces in 3 requests; stopped: reached --limit 23"
    db = str(store.path) + ".cli.duckdb"
    argv = ["ingest", "--jaeger", url, "--service", "svc", "--limit", "23", "--db", db]
    assert main(argv) == 0
    assert "Jaeger returned 23 traces in 3 requests; stopped: reached --limit 23" in (
        capsys.readouterr().out
    )
