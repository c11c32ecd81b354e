"""`tracekit collect` under load on loopback: 200 concurrent clients over OTLP/HTTP and
OTLP/gRPC behind one writer lose nothing and stay within a memory bound; a client that
trickles its body, or never reads its responses, holds back no one else."""

from __future__ import annotations

import base64
import contextlib
import gc
import gzip
import json
import select
import socket
import ssl
import statistics
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.json_format import ParseDict
from google.rpc import error_details_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tracekit.analysis.store import open_store
from tracekit.collect import Collector

from .helpers import releases, running, split_documents

pytestmark = pytest.mark.slow

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
JSON = "application/json"
PROTOBUF = "application/x-protobuf"

Key = tuple[str, str]


# --- helpers --------------------------------------------------------------------------


def _docs(n_requests: int, seed: int) -> list[dict[str, Any]]:
    """One document per trace (a request and its three stages): ``2 * n_requests``."""
    return split_documents(releases(n_requests, seed=seed).to_otlp(), per_doc=4)


def _span_keys(doc: dict[str, Any]) -> set[Key]:
    return {
        (s["traceId"], s["spanId"])
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    }


def _stored_keys(db: Path) -> set[Key]:
    with open_store(db, read_only=True) as store:
        return {(r[0], r[1]) for r in store.run("SELECT trace_id, span_id FROM spans")}


def _hex_ids_to_base64(doc: dict[str, Any]) -> dict[str, Any]:
    """OTLP/JSON (hex ids) → the proto3 JSON mapping (base64 bytes) for ParseDict."""
    out = json.loads(json.dumps(doc))
    for rs in out["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return out


def _protobuf(doc: dict[str, Any]) -> bytes:
    request = ParseDict(_hex_ids_to_base64(doc), ExportTraceServiceRequest())
    return bytes(request.SerializeToString())


def _http_body(doc: dict[str, Any], i: int) -> tuple[bytes, dict[str, str]]:
    """JSON and protobuf in turn, every third body gzipped."""
    if i % 2:
        body, headers = _protobuf(doc), {"Content-Type": PROTOBUF}
    else:
        body, headers = json.dumps(doc).encode(), {"Content-Type": JSON}
    if i % 3 == 0:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


class _RssSampler:
    """The process's peak VmRSS, sampled every 20 ms on a thread while in the block."""

    def __init__(self) -> None:
        self.baseline = _rss_bytes()
        self.peak = self.baseline
        self.marked: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, _rss_bytes())

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, _rss_bytes())

    def mark(self) -> None:
        """Note the RSS now (the clients are ready, before they send)."""
        self.marked = _rss_bytes()

    @property
    def growth(self) -> int:
        return self.peak - self.baseline


def _grpc_retry_delay(exc: grpc.RpcError) -> float:
    """RetryInfo's delay from ``google.rpc.retryinfo-bin`` (1 s when absent)."""
    trailing = exc.trailing_metadata() or ()  # type: ignore[attr-defined]
    for key, value in trailing:
        if key == "google.rpc.retryinfo-bin":
            info = error_details_pb2.RetryInfo.FromString(value)
            return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return 1.0


def _head(port: int, length: int, content_type: str = PROTOBUF) -> bytes:
    return (
        f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {length}\r\n\r\n"
    ).encode("latin-1")


# --- 1. 200 concurrent clients, nothing lost -----------------------------------------

N_CLIENTS = 200
N_GRPC = 50
PER_CLIENT = 5
MAX_ATTEMPTS = 40
_SERVER_REFUSALS = ("429", "503", "RESOURCE_EXHAUSTED", "UNAVAILABLE")
"""What the clients count that the collector counts too (``requests_refused``)."""


def test_200_concurrent_clients_over_http_and_grpc_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "load.duckdb"
    docs = _docs(N_CLIENTS * PER_CLIENT // 2, seed=11)
    assert len(docs) == N_CLIENTS * PER_CLIENT
    sent_keys = set().union(*(_span_keys(d) for d in docs))
    assert len(sent_keys) == 4 * len(docs)
    parts = [docs[i::N_CLIENTS] for i in range(N_CLIENTS)]

    lock = threading.Lock()
    acked: set[Key] = set()
    acked_spans = 0
    refusals: dict[str, int] = {}
    failures: list[str] = []
    # One TLS context for all the HTTP clients (unused on http://; httpx would otherwise
    # load the CA bundle once per client, ~0.6 MiB each, which is not the collector's memory).
    tls = ssl.create_default_context()
    rss = _RssSampler()
    start = threading.Barrier(N_CLIENTS, action=rss.mark, timeout=60)

    most_attempts = 0

    def ack(doc: dict[str, Any], attempt: int) -> None:
        nonlocal acked_spans, most_attempts
        keys = _span_keys(doc)
        with lock:
            acked.update(keys)
            acked_spans += len(keys)
            most_attempts = max(most_attempts, attempt)

    def refused(why: str) -> None:
        with lock:
            refusals[why] = refusals.get(why, 0) + 1

    def http_client(c: Collector, n: int, part: list[dict[str, Any]]) -> None:
        endpoint = f"http://{c.address}/v1/traces"
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        with httpx.Client(timeout=30, limits=limits, verify=tls) as http:
            start.wait()
            for i, doc in enumerate(part):
                body, headers = _http_body(doc, n + i)
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    try:
                        r = http.post(endpoint, content=body, headers=headers)
                    except httpx.HTTPError as exc:
                        refused(type(exc).__name__)
                        time.sleep(0.2)
                        continue
                    if r.status_code == 200:
                        ack(doc, attempt)
                        break
                    if r.status_code in (429, 503):
                        refused(str(r.status_code))
                        time.sleep(float(r.headers["Retry-After"]))
                        continue
                    raise AssertionError(f"HTTP {r.status_code}: {r.text}")
                else:
                    raise AssertionError(f"not accepted after {MAX_ATTEMPTS} attempts")

    def grpc_client(c: Collector, n: int, part: list[dict[str, Any]]) -> None:
        assert c.grpc_address is not None
        # A channel of its own (no subchannel shared with the other clients' channels).
        options = [("grpc.use_local_subchannel_pool", 1)]
        with grpc.insecure_channel(c.grpc_address, options=options) as channel:
            export = channel.unary_unary(
                EXPORT, request_serializer=None, response_deserializer=None
            )
            start.wait()
            for i, doc in enumerate(part):
                body = _protobuf(doc)
                gz = grpc.Compression.Gzip if (n + i) % 3 == 0 else None
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    try:
                        export(body, timeout=30, compression=gz)
                    except grpc.RpcError as exc:
                        code = exc.code()  # type: ignore[attr-defined]
                        if code not in (
                            grpc.StatusCode.RESOURCE_EXHAUSTED,
                            grpc.StatusCode.UNAVAILABLE,
                            grpc.StatusCode.DEADLINE_EXCEEDED,
                        ):
                            raise AssertionError(f"gRPC {code}: {exc.details()}") from exc  # type: ignore[attr-defined]
                        refused(code.name)
                        time.sleep(_grpc_retry_delay(exc))
                        continue
                    ack(doc, attempt)
                    break
                else:
                    raise AssertionError(f"not accepted after {MAX_ATTEMPTS} attempts")

    def run(target: Any, c: Collector, n: int, part: list[dict[str, Any]]) -> None:
        try:
            target(c, n, part)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            with lock:
                failures.append(f"client {n}: {type(exc).__name__}: {exc}")
            start.abort()

    # A pending-span bound under what 200 clients send at once (800), so some of them are
    # told to come back (429 / RESOURCE_EXHAUSTED) and retry.
    c = Collector(str(db), port=0, grpc_port=0, flush_interval=0.05, max_pending_spans=600)
    c.start()
    t0 = time.monotonic()
    try:
        with rss:
            threads = [
                threading.Thread(
                    target=run,
                    args=(grpc_client if n < N_GRPC else http_client, c, n, parts[n]),
                    name=f"client-{n}",
                )
                for n in range(N_CLIENTS)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(90)
            assert not any(t.is_alive() for t in threads), "clients still running"
            sent_s = time.monotonic() - t0
    finally:
        c.stop(timeout=30)
    wall_s = time.monotonic() - t0
    status = c.status()
    print(
        f"\n{N_CLIENTS} clients ({N_GRPC} gRPC), {len(docs)} requests, {len(sent_keys)} spans: "
        f"sent in {sent_s:.1f}s, stopped at {wall_s:.1f}s; refusals {refusals} "
        f"(at most {most_attempts} attempts for a request); "
        f"RSS {rss.baseline / 2**20:.0f} MiB -> peak {rss.peak / 2**20:.0f} MiB "
        f"(+{rss.growth / 2**20:.1f} MiB; +{(rss.peak - (rss.marked or 0)) / 2**20:.1f} MiB "
        f"over the {(rss.marked or 0) / 2**20:.0f} MiB with all clients created)"
    )
    assert not failures, failures[:5]
    stored = _stored_keys(db)
    assert acked <= stored, f"{len(acked - stored)} acknowledged spans not stored"
    assert acked == sent_keys  # every request eventually succeeded
    assert stored == sent_keys
    assert status.spans_accepted == acked_spans == len(sent_keys)
    assert status.requests_refused == sum(refusals.get(k, 0) for k in _SERVER_REFUSALS)
    assert status.pending_spans == 0
    assert status.errors == []
    assert rss.growth < 300 * 2**20, f"RSS grew by {rss.growth / 2**20:.0f} MiB"


# --- 2. a slow client does not hold back others --------------------------------------

BODY_TIMEOUT = 5.0
N_SLOW = 3
TRICKLE_EVERY = 0.5


def _cut_off(sock: socket.socket) -> str | None:
    """How the server ended a connection ("408", "closed", …), or None while it is open."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return None
    try:
        data = sock.recv(65536)
    except OSError as exc:
        return type(exc).__name__
    if not data:
        return "closed"
    return data.split(b"\r\n", 1)[0].decode("latin-1", "replace")


def _post_each(c: Collector, docs: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """POST ``docs`` one after the other on one connection: (sent, answered) times; 200s."""
    times = []
    with httpx.Client(timeout=30) as http:
        for i, doc in enumerate(docs):
            body, headers = _http_body(doc, i)
            r0 = time.monotonic()
            r = http.post(f"http://{c.address}/v1/traces", content=body, headers=headers)
            times.append((r0, time.monotonic()))
            assert r.status_code == 200, (i, r.status_code, r.text)
    return times


def test_a_trickling_body_does_not_hold_back_other_clients(tmp_path: Path) -> None:
    db = tmp_path / "slow.duckdb"
    docs = _docs(13, seed=12)
    warm_docs, normal_docs = docs[:5], docs[5:25]
    with running(db, body_timeout=BODY_TIMEOUT, idle_timeout=BODY_TIMEOUT) as c:
        # What a request takes here with no slow client about (the store's write dominates).
        baseline = statistics.median(end - start for start, end in _post_each(c, warm_docs))
        slow = [socket.create_connection(("127.0.0.1", c.port), timeout=5) for _ in range(N_SLOW)]
        ended: dict[int, tuple[float, str]] = {}
        stop = threading.Event()
        trickle_error: list[BaseException] = []
        try:
            for s in slow:
                s.sendall(_head(c.port, 100_000))
            t0 = time.monotonic()
            give_up = t0 + BODY_TIMEOUT + 5.0

            def trickle() -> None:
                try:
                    while not stop.is_set() and time.monotonic() < give_up:
                        for n, s in enumerate(slow):
                            if n in ended:
                                continue
                            how = _cut_off(s)
                            if how is None:
                                try:
                                    s.send(b"\x0a")
                                except OSError as exc:
                                    how = type(exc).__name__
                            if how is not None:
                                ended[n] = (time.monotonic() - t0, how)
                        if len(ended) == len(slow):
                            return
                        stop.wait(TRICKLE_EVERY)
                except BaseException as exc:  # noqa: BLE001 - reported by the test
                    trickle_error.append(exc)

            trickler = threading.Thread(target=trickle, name="trickler")
            trickler.start()
            times = [(start - t0, end - t0) for start, end in _post_each(c, normal_docs)]
            trickler.join(BODY_TIMEOUT + 10)
            assert not trickler.is_alive()
        finally:
            stop.set()
            for s in slow:
                s.close()
    observed = time.monotonic() - t0
    took = [end - start for start, end in times]
    first_cut = min((at for at, _ in ended.values()), default=observed)
    answered_meanwhile = sum(end < first_cut for _, end in times)
    print(
        f"\nnormal client: {len(times)} requests in {times[-1][1]:.2f}s, median "
        f"{statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms "
        f"(alone: median {baseline * 1000:.0f} ms); {answered_meanwhile} answered while "
        f"all {N_SLOW} slow connections trickled; slow connections ended: {ended}"
    )
    assert not trickle_error, trickle_error
    # The normal client is not held back: its requests take what they take alone, none
    # waits anywhere near the body timeout the slow ones are subject to, and they are
    # answered while the slow connections are still trickling.
    assert statistics.median(took) < 2 * baseline + 0.1
    assert max(took) < BODY_TIMEOUT / 2
    assert answered_meanwhile >= min(len(times), 5)
    # Each slow connection is ended (408, or closed) a few seconds after body_timeout,
    # however steadily it trickles.
    assert len(ended) == N_SLOW, (
        f"{N_SLOW - len(ended)} of {N_SLOW} connections trickling a byte every "
        f"{TRICKLE_EVERY}s are still open {observed:.0f}s after their headers "
        f"(body_timeout={BODY_TIMEOUT}s); ended: {ended}"
    )
    for at, how in ended.values():
        assert at < BODY_TIMEOUT + 3.0, ended
        assert "200" not in how and ("408" in how or not how.startswith("HTTP/")), ended
    assert _stored_keys(db) == set().union(*(_span_keys(d) for d in warm_docs + normal_docs))


# --- 3. a client that never reads its responses --------------------------------------


DEAF_MAX_BYTES = 64 << 20
DEAF_MAX_S = 15.0
STALLED_FOR = 1.5


class _Deaf:
    """A client that pipelines requests and never reads an answer.

    First the export requests of ``docs``, then cheap ones (a 404, answered at once)
    until the server has taken none of its bytes for ``STALLED_FOR`` seconds: its answers
    fill this socket's (small) receive buffer and it stops reading. Bounded by
    ``DEAF_MAX_BYTES`` and ``DEAF_MAX_S``.
    """

    def __init__(self, port: int, docs: list[dict[str, Any]]) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.port = port
        self.docs = docs
        self.sent = 0
        self.requests = len(docs)
        self.stalled = False
        self.seconds = 0.0
        self.connected = False

    def __enter__(self) -> _Deaf:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def stall(self) -> None:
        """Send until the server stops taking bytes (again, when called again)."""
        s = self.sock
        if not self.connected:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
            s.connect(("127.0.0.1", self.port))
            self.connected = True
            s.settimeout(10)
            for doc in self.docs:
                body = json.dumps(doc).encode()
                s.sendall(_head(self.port, len(body), JSON) + body)
            s.setblocking(False)
        cheap = (
            f"POST /elsewhere HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nContent-Length: 0\r\n\r\n"
        )
        block = memoryview(cheap.encode() * (65536 // len(cheap)))
        offset = self.sent % len(block)
        blocked_since: float | None = None
        self.stalled = False
        t0 = time.monotonic()
        while self.sent < DEAF_MAX_BYTES and time.monotonic() - t0 < DEAF_MAX_S:
            try:
                n = s.send(block[offset:])
            except BlockingIOError:
                n = 0
            if n:
                self.sent += n
                offset = (offset + n) % len(block)
                blocked_since = None
                continue
            blocked_since = blocked_since or time.monotonic()
            if time.monotonic() - blocked_since > STALLED_FOR:
                self.stalled = True
                break
            time.sleep(0.02)
        self.requests = len(self.docs) + self.sent // len(cheap)
        self.seconds += time.monotonic() - t0


def _read_to_eof(sock: socket.socket, timeout: float) -> bool:
    """Read (and drop) what ``sock`` receives; True once the peer has closed it."""
    sock.setblocking(True)
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(1 << 20):
                return True
        except TimeoutError:
            return False
        except OSError:  # reset: closed as well
            return True
    return False


def _stuck_writing(c: Collector, *, within: float) -> bool:
    """Whether a server-side connection waits, mid-response, for its client to read."""
    deadline = time.monotonic() + within
    while True:
        for conn in list(c.http.server.server_state.connections):
            cycle = getattr(conn, "cycle", None)
            busy = cycle is not None and not cycle.response_complete
            if busy and conn.flow.write_paused:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _reap_open_connections(c: Collector) -> int:
    """Server-side HTTP connections still open after stop(); dropped without warnings.

    A connection uvicorn gave up on at its graceful-shutdown timeout keeps its transport
    (and socket) after the loop is gone; drop them here so that the finding is this
    test's assertion and not an unraisable ResourceWarning in some later test.
    """
    connections = c.http.server.server_state.connections
    left = len(connections)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for conn in list(connections):
            # What the transport would do on its loop: close its socket and tell the
            # protocol. The loop is closed, so call it directly.
            with contextlib.suppress(Exception):
                conn.transport._call_connection_lost(None)
        connections.clear()
        gc.collect()
    return left


def test_a_client_that_never_reads_its_responses_holds_back_no_one(tmp_path: Path) -> None:
    db = tmp_path / "deaf.duckdb"
    docs = _docs(18, seed=13)
    warm_docs, deaf_docs, normal_docs = docs[:5], docs[5:15], docs[15:35]
    more = _docs(2, seed=14)
    with running(db) as c:
        baseline = statistics.median(end - start for start, end in _post_each(c, warm_docs))
        with _Deaf(c.port, deaf_docs) as deaf, _RssSampler() as rss:
            for _ in range(5):
                deaf.stall()
                if _stuck_writing(c, within=2.0):
                    break
            stuck_before = deaf.stalled and _stuck_writing(c, within=0)
            print(
                f"\ndeaf client: ~{deaf.requests:,} pipelined requests ({deaf.sent:,} bytes) "
                f"taken in {deaf.seconds:.1f}s, then "
                f"{'stalled' if deaf.stalled else 'still taken'}; RSS +{rss.growth / 2**20:.1f} MiB"
            )
            # Meanwhile other clients are served as if it were not there.
            times = _post_each(c, normal_docs)
            took = [end - start for start, end in times]
            assert c.grpc_address is not None
            with grpc.insecure_channel(c.grpc_address) as channel:
                export = channel.unary_unary(
                    EXPORT, request_serializer=None, response_deserializer=None
                )
                for doc in more:
                    export(_protobuf(doc), timeout=10)
            stuck_after = _stuck_writing(c, within=0)
    print(
        f"normal client: {len(took)} requests, median {statistics.median(took) * 1000:.0f} ms, "
        f"max {max(took) * 1000:.0f} ms (alone: median {baseline * 1000:.0f} ms)"
    )
    assert statistics.median(took) < 2 * baseline + 0.1
    assert max(took) < 10 * baseline + 1.0
    assert stuck_before, (
        f"the server kept reading {deaf.sent:,} bytes of pipelined requests from a client "
        "that reads none of the answers"
    )
    assert stuck_after  # the others were served while it was held up
    assert rss.growth < 100 * 2**20, f"RSS grew by {rss.growth / 2**20:.0f} MiB"
    stored = _stored_keys(db)
    for doc in [*warm_docs, *deaf_docs, *normal_docs, *more]:
        assert _span_keys(doc) <= stored


def test_stop_is_bounded_while_a_client_never_reads(tmp_path: Path) -> None:
    """A connection stuck writing to a client that does not read holds stop() no longer
    than its timeout, and stop() leaves no connection open behind it."""
    db = tmp_path / "deaf-stop.duckdb"
    docs = _docs(1, seed=15)
    c = Collector(str(db), port=0, flush_interval=0.05)
    c.start()
    try:
        with _Deaf(c.port, docs) as deaf:
            # Until the server is stuck writing an answer (not merely slow to read on).
            for _ in range(5):
                deaf.stall()
                if _stuck_writing(c, within=2.0):
                    break
            assert deaf.stalled and _stuck_writing(c, within=0), "never stuck writing"
            t0 = time.monotonic()
            c.stop(timeout=6)
            took = time.monotonic() - t0
            closed = _read_to_eof(deaf.sock, timeout=5)
    finally:
        c.stop()
        left_open = _reap_open_connections(c)
    print(
        f"\nstop(timeout=6) with a deaf client stuck: {took:.1f}s; connection closed by "
        f"the server: {closed}; server-side connections left open: {left_open}"
    )
    assert took < 6 + 3
    stored = _stored_keys(db)
    for doc in docs:
        assert _span_keys(doc) <= stored
    assert closed and left_open == 0, (
        f"after stop() the server still holds {left_open} connection(s) open (its socket "
        "and transport are never closed: an fd leaked per stuck client, and the client is "
        "never told)"
    )
