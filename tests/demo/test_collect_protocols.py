"""`tracekit demo --collect` with either protocol: the demo's own collector process
(`running_collector`, `tracekit collect --port 0 --grpc-port 0`) and a real demo service
configured the way the demo configures it (OTEL_EXPORTER_OTLP_PROTOCOL for gRPC)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tracekit.analysis.store import open_store
from tracekit.demo import collect_loop
from tracekit.demo.interleave import release_env
from tracekit.demo.processes import ServiceProcess, child_environment


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_demo_service_exports_to_the_demo_collector_over_either_protocol(
    tmp_path: Path, protocol: str
) -> None:
    db = tmp_path / "live.duckdb"
    with collect_loop.running_collector(db, tmp_path / "collect.log") as (urls, final):
        assert urls.http.startswith("http://127.0.0.1:") and urls.grpc.startswith("http://")
        endpoint = urls.grpc if protocol == "grpc" else urls.http
        values = release_env(
            "v9", "", 0, tmp_path / "p.jsonl", endpoint, "grpc" if protocol == "grpc" else ""
        )
        pricing = ServiceProcess("pricing v9", "tracekit.demo.downstream", tmp_path / "p.log")
        pricing.start(child_environment(values), timeout_s=60)
        try:
            with httpx.Client(timeout=30) as http:
                for i in range(5):
                    body = {"user_id": i, "items": [1, 2, 3]}
                    assert http.post(f"{pricing.url}/price", json=body).status_code == 200
        finally:
            pricing.stop(timeout_s=20)  # SIGTERM: the service flushes its exporter
    assert final and final[-1].startswith("collected:"), final
    with open_store(db, read_only=True) as store:
        releases = store.run("SELECT release, count(*) FROM requests GROUP BY 1")
    assert releases == [("v9", 5)]
