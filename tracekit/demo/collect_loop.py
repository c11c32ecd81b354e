"""``tracekit demo --collect``: the live loop — spans over OTLP into a running
``tracekit collect``, and the ranker's Prometheus endpoint scraped once.

The collector is its own process (``tracekit collect --port 0 --grpc-port 0``), as in
production: the services export to it over OTLP/HTTP or OTLP/gRPC while the demo's analysis later opens the same
store. The ranker serves ``configure(metrics="prometheus")`` on a free loopback port
(set through ``TRACEKIT_METRICS``/``TRACEKIT_METRICS_PORT``); :func:`metrics_lines`
condenses one scrape to the series ``tracekit autoscale``'s snippets name.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from tracekit.errors import TracekitError
from tracekit.instrumentation.setup import ENV_METRICS, ENV_METRICS_PORT

_TRACEKIT_SERIES = (
    "tracekit_inflight",
    "tracekit_queue_depth",
    "http_server_request_duration_seconds",
    "tracekit_stage_duration_seconds",
    "tracekit_batch_size",
)


def free_port() -> int:
    """A port the OS says is free on 127.0.0.1 now (the ranker binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def metrics_env(port: int) -> dict[str, str]:
    """Environment that makes a demo service serve Prometheus metrics on ``port``."""
    return {ENV_METRICS: "prometheus", ENV_METRICS_PORT: str(port)}


@dataclass(frozen=True)
class CollectorUrls:
    """Where a running ``tracekit collect`` listens: OTLP/HTTP and OTLP/gRPC endpoints."""

    http: str
    grpc: str


@contextlib.contextmanager
def running_collector(db: Path, log_path: Path) -> Iterator[tuple[CollectorUrls, list[str]]]:
    """Run ``tracekit collect`` on free ports for the block; yields (endpoints, final lines).

    On the way out it is stopped with SIGTERM, which writes everything it accepted; its
    last status line is appended to the list.
    """
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracekit.cli", "collect", "--db", str(db)]
        + ["--port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    final: list[str] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on http://"):
            proc.kill()
            raise TracekitError(f"tracekit collect did not start; see {log_path}")
        # "listening on http://H:P/v1/traces (OTLP/HTTP) and H:P (OTLP/gRPC) -> DB"
        words = line.split()
        http = words[2].removesuffix("/v1/traces")
        grpc = f"http://{words[5]}" if len(words) > 5 and words[4] == "and" else ""
        yield CollectorUrls(http, grpc), final
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        log.close()
        final.extend(x for x in out.splitlines() if x.strip())


def scrape(port: int) -> str:
    """One scrape of the metrics endpoint (empty text when it does not answer)."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return ""


def metrics_lines(text: str) -> list[str]:
    """The scrape in a few lines: gauges as values, histograms as count and mean."""
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for family in text_string_to_metric_families(text):
        if family.name not in _TRACEKIT_SERIES:
            continue
        if family.type == "gauge":
            for s in family.samples:
                out.append(f"{s.name} {s.value:g}")
            continue
        counts = {
            tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")): s.value
            for s in family.samples
            if s.name.endswith("_count")
        }
        sums = {
            tuple(sorted(s.labels.items())): s.value
            for s in family.samples
            if s.name.endswith("_sum")
        }
        for labels, count in counts.items():
            if not count:
                continue
            shown = ",".join(
                f'{k}="{v}"' for k, v in labels if k.startswith(("http_route", "tracekit_"))
            )
            mean = sums.get(labels, 0.0) / count
            value = (
                f"mean {mean * 1000:.1f} ms"
                if family.name.endswith("_seconds")
                else f"mean {mean:.1f}"
            )
            out.append(f"{family.name}{{{shown}}} count {count:g}, {value}")
    return out
