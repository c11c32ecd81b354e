"""Collect speed: spans received *and stored* by ``tracekit collect``, against ``tracekit
ingest`` of the same spans from a file, in the same run.

Generates the ingest benchmark's OTLP JSON-lines file (8-span requests with tracekit's
attributes), cuts the same spans into export requests of ``--batch`` (512) spans, as an
SDK's BatchSpanProcessor sends them, and prints:

  ingest:    ``tracekit ingest FILE --db NEW`` as a child process, wall time from start
             to exit (imports and the attribution of every request included);
  http:      ``tracekit collect`` as a child process; ``--clients`` (4) threads here post
             the requests as OTLP/HTTP protobuf over keep-alive connections, each waiting
             for its answer before the next, as an exporter does (a 200 means the spans
             are in the collector's write-ahead log); when the last is answered the
             collector gets SIGTERM, which writes the rest; timed from the first request
             to the collector's exit, so every span is stored and every request
             attributed in the time (the collector's start-up is not counted; the time
             to the last answer is printed too);
  grpc:      the same over OTLP/gRPC (``TraceService/Export``, one channel a client);

spans/s for each and the ratio collect / ingest (target >= 0.7), the collector's CPU
seconds (its children, the decoding workers and the store writer, included) and peak
RSS, and a check that the store holds every span sent. The three run in turn
``--rounds`` times, so noise of a shared machine falls on all of them, and the median
ratio is printed last. Figures only; nothing is asserted. The clients run on the same cores as the collector (their bodies
are encoded before the clock starts).

    python benchmarks/collect.py [--spans 200000] [--batch 512] [--clients 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ingest import generate, ingest_child  # noqa: E402

COLLECT = ["-m", "tracekit.cli"]
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def requests_of(path: Path, batch: int) -> list[bytes]:
    """The file's spans as protobuf ExportTraceServiceRequests of ``batch`` spans each."""
    from google.protobuf.json_format import ParseDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    out: list[bytes] = []
    pending: list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = []

    def emit() -> None:
        by_resource: dict[str, dict[str, Any]] = {}
        for resource, scope, span in pending:
            key = json.dumps(resource, sort_keys=True)
            rs = by_resource.setdefault(
                key, {"resource": resource, "scopeSpans": [{"scope": scope, "spans": []}]}
            )
            rs["scopeSpans"][0]["spans"].append(span)
        doc = {"resourceSpans": list(by_resource.values())}
        out.append(ParseDict(doc, ExportTraceServiceRequest()).SerializeToString())
        pending.clear()

    with path.open() as fh:
        for line in fh:
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        pending.append((rs["resource"], ss.get("scope", {}), _b64_ids(span)))
                        if len(pending) == batch:
                            emit()
    if pending:
        emit()
    return out


def _b64_ids(span: dict[str, Any]) -> dict[str, Any]:
    """The protobuf JSON mapping writes bytes as base64 (OTLP/JSON writes ids as hex)."""
    span = copy.copy(span)
    for key in ("traceId", "spanId", "parentSpanId"):
        if span.get(key):
            span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        else:
            span.pop(key, None)
    return span


def start_collector(db: Path, work: Path) -> tuple[subprocess.Popen[str], str, str]:
    err = (work / "collect.err").open("w")
    proc = subprocess.Popen(
        [sys.executable, *COLLECT, "collect", "--db", str(db)]
        + ["--port", "0", "--grpc-port", "0"],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    assert proc.stdout is not None
    words = proc.stdout.readline().split()
    if len(words) < 6:
        proc.kill()
        raise SystemExit(f"tracekit collect did not start: {(work / 'collect.err').read_text()}")
    return proc, words[2], words[5]


def stop_collector(proc: subprocess.Popen[str]) -> tuple[float, float]:
    """SIGTERM, then (CPU s, peak RSS MB) of the child once it has exited."""
    proc.send_signal(signal.SIGTERM)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"tracekit collect exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def drive(bodies: list[bytes], clients: int, send_one: Any, make: Any) -> float:
    """Send ``bodies`` from ``clients`` threads, each one request at a time; wall seconds."""
    errors: list[str] = []
    start = threading.Barrier(clients + 1)

    def client(part: list[bytes]) -> None:
        conn = make()
        try:
            start.wait()
            for body in part:
                for _ in range(50):  # a retryable refusal (429/503) is retried, bounded
                    if send_one(conn, body):
                        break
                    time.sleep(0.05)
                else:
                    errors.append("a request was refused 50 times")
                    return
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(bodies[i::clients],)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(errors[0])
    return wall


def http_run(url: str, bodies: list[bytes], clients: int) -> float:
    headers = {"Content-Type": "application/x-protobuf"}

    def send(conn: httpx.Client, body: bytes) -> bool:
        r = conn.post(f"{url}", content=body, headers=headers)
        if r.status_code == 200:
            return True
        if r.status_code in (429, 503):
            return False
        raise SystemExit(f"HTTP {r.status_code}: {r.text[:200]}")

    return drive(bodies, clients, send, lambda: httpx.Client(timeout=60))


def grpc_run(address: str, bodies: list[bytes], clients: int) -> float:
    import grpc

    class Conn:
        def __init__(self) -> None:
            self.channel = grpc.insecure_channel(address)
            self.call = self.channel.unary_unary(
                EXPORT, request_serializer=None, response_deserializer=None
            )

        def close(self) -> None:
            self.channel.close()

    def send(conn: Conn, body: bytes) -> bool:
        try:
            conn.call(body, timeout=60)
            return True
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                return False
            raise SystemExit(f"gRPC {code}: {exc.details()}") from None  # type: ignore[attr-defined]

    return drive(bodies, clients, send, Conn)


def stored(db: Path) -> int:
    from tracekit.analysis.store import open_store

    with open_store(db, read_only=True) as store:
        return int(store.run("SELECT count(*) FROM spans")[0][0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spans", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=512, help="spans per export request")
    parser.add_argument("--clients", type=int, default=4, help="concurrent exporters")
    parser.add_argument(
        "--rounds", type=int, default=3, help="ingest, http, grpc in turn, this many times"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = work / "spans.jsonl"
        n = generate(data, args.spans)
        bodies = requests_of(data, args.batch)
        mb = sum(map(len, bodies)) / 1e6
        print(f"{n:,} spans; {len(bodies):,} requests of {args.batch} ({mb:.1f} MB protobuf)")
        ratios: dict[str, list[float]] = {"http": [], "grpc": []}
        for round_no in range(1, args.rounds + 1):
            print(f"round {round_no}")
            wall, cpu, rss, _ = ingest_child(data, work / "ingest.duckdb")
            base = n / wall
            print(
                f"  ingest {wall:6.2f} s wall {cpu:6.2f} s CPU {rss:6.0f} MB {base:9,.0f} spans/s"
            )
            for name, run in (("http", http_run), ("grpc", grpc_run)):
                db = work / f"{name}.duckdb"
                for p in (db, db.with_name(db.name + ".wal")):
                    p.unlink(missing_ok=True)
                proc, http_url, grpc_address = start_collector(db, work)
                target = http_url if name == "http" else grpc_address
                t0 = time.perf_counter()
                try:
                    answered = run(target, bodies, args.clients)
                except BaseException:
                    proc.kill()
                    raise
                cpu, rss = stop_collector(proc)
                wall = time.perf_counter() - t0
                rate = n / wall
                kept = stored(db)
                check = "all stored" if kept == n else f"STORED {kept:,} OF {n:,}"
                ratios[name].append(rate / base)
                print(
                    f"  {name:6} {wall:6.2f} s wall {cpu:6.2f} s CPU {rss:6.0f} MB {rate:9,.0f} "
                    f"spans/s  {rate / base:.2f}x ingest  (last answer at {answered:.2f} s; "
                    f"{check})"
                )
        for name, values in ratios.items():
            shown = ", ".join(f"{v:.2f}" for v in values)
            print(f"{name}: {statistics.median(values):.2f}x ingest (median of {shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
