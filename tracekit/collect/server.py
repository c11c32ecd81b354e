"""The collector: two receivers (OTLP/HTTP, OTLP/gRPC) in front of one writer.

:class:`Collector` owns what both protocols share — the limits, who may write, the
decoding slots, the tail sampler and the :class:`~tracekit.collect.writer.BatchWriter` —
and answers each export request with an :class:`Outcome`; :mod:`.otlp_http` and
:mod:`.otlp_grpc` only frame it. The rules, the same on both protocols:

* success only once the spans are in the write-ahead log, synced to disk (with the tail
  sampler: once it holds them); the store is written behind it (:mod:`.writer`), and
  what the log holds survives a crash; ``partial_success`` counts the spans rejected,
  with each reason and the place of its first span;
* a body that cannot be read or decoded, or breaks a request-wide limit: rejected whole,
  not retryable (HTTP 400/413/415, gRPC ``INVALID_ARGUMENT``);
* pending spans at their memory bound: retryable (HTTP 429 + ``Retry-After``, gRPC
  ``RESOURCE_EXHAUSTED`` with ``RetryInfo``); the collector stopping or its log not
  writable: retryable (HTTP 503 + ``Retry-After``, gRPC ``UNAVAILABLE``);
* nothing of a refused request was acknowledged.

Security: both receivers bind 127.0.0.1 unless told otherwise. Listening beyond loopback
needs a bearer token (``auth_token``: every request must carry ``Authorization: Bearer
TOKEN``, as the Collector's ``bearertokenauth`` checks) unless ``insecure`` says so, and
takes TLS (``tls_cert``/``tls_key``) for both protocols.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tracekit.collect import decode
from tracekit.collect.decode import Limits
from tracekit.collect.outcome import BAD, BUSY, OK, UNAVAILABLE, Outcome, Security
from tracekit.collect.pool import PoolBroken, default_workers, shared_pool
from tracekit.collect.sampler import SamplerFull, SamplerStats, TailSampler
from tracekit.collect.store_worker import FlushStats
from tracekit.collect.wal import WriteAheadLog, wal_dir_for
from tracekit.collect.writer import Backpressure, BatchWriter, Unavailable
from tracekit.errors import ConfigError


@dataclass(frozen=True)
class SamplingPolicy:
    """``--keep-slowest``, ``--sample-rest``, ``--decision-wait`` of ``tracekit collect``."""

    keep_slowest: float
    sample_rest: float
    decision_wait: float = 5.0
    window: int = 1000

    @classmethod
    def from_options(
        cls,
        keep_slowest: float | None,
        sample_rest: float | None,
        decision_wait: float = 5.0,
        window: int = 1000,
    ) -> SamplingPolicy | None:
        """The policy the options ask for (None: keep every trace); a combination that
        cannot estimate quantiles, or a value out of range, is a :class:`ConfigError`."""
        if keep_slowest is None and sample_rest is None:
            return None
        if sample_rest is None:
            raise ConfigError(
                "--keep-slowest needs --sample-rest FRACTION too: without some of the other "
                "traces no quantile below the kept tail can be estimated"
            )
        keep = 0.0 if keep_slowest is None else keep_slowest
        if not 0 <= keep <= 100:
            raise ConfigError(f"--keep-slowest {keep}: a percentage from 0 to 100")
        if not 0 < sample_rest <= 1:
            raise ConfigError(f"--sample-rest {sample_rest}: a fraction above 0, at most 1")
        if decision_wait < 0:
            raise ConfigError("--decision-wait: seconds, 0 or more")
        return cls(keep, sample_rest, decision_wait, window)


@dataclass
class CollectStatus:
    """A snapshot for the status line and for tests."""

    address: str
    spans_received: int
    spans_accepted: int
    spans_rejected: int
    requests_refused: int
    """Retryable refusals (429/503, RESOURCE_EXHAUSTED/UNAVAILABLE): nothing acknowledged."""
    spans_per_s: float
    requests_stored: int
    releases: list[str]
    pending_spans: int
    sampler: SamplerStats | None
    errors: list[str] = field(default_factory=list)
    grpc_address: str | None = None
    requests_bad: int = 0
    """Requests rejected whole (undecodable, over a limit, unauthenticated)."""


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_token(path: str | Path) -> str:
    """The bearer token in ``path`` (its first line); :class:`ConfigError` when unusable."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip().splitlines()
    except OSError as exc:
        raise ConfigError(f"--auth-token-file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--auth-token-file {path}: not UTF-8 text") from exc
    if not token or len(token[0].strip()) < 16:
        raise ConfigError(f"--auth-token-file {path}: the token must be 16 characters or more")
    return token[0].strip()


class Collector:
    """``tracekit collect`` as a library: start, watch :meth:`status`, :meth:`stop`.

    ``port`` serves OTLP/HTTP; ``grpc_port`` OTLP/gRPC (None: no gRPC receiver — the CLI
    passes 4317). ``decode_workers`` processes decode request bodies (None: one per core,
    at most 4; 0: in the receiving thread). ``wal_dir`` holds the write-ahead log
    (default ``DB.collect-wal``); ``sync=False`` skips its fsync (tests, benchmarks). Port 0 picks a free port; :attr:`address` and :attr:`grpc_address` say
    which.
    """

    def __init__(
        self,
        db: str,
        *,
        host: str = "127.0.0.1",
        port: int = 4318,
        grpc_port: int | None = None,
        sampling: SamplingPolicy | None = None,
        max_pending_spans: int = 200_000,
        batch_spans: int = 100_000,
        flush_interval: float = 0.2,
        limits: Limits | None = None,
        wal_dir: str | Path | None = None,
        sync: bool = True,
        idle_timeout: float = 30.0,
        body_timeout: float = 30.0,
        decode_workers: int | None = None,
        max_buffered_bytes: int = 256 << 20,
        auth_token: str | None = None,
        tls_cert: str | Path | None = None,
        tls_key: str | Path | None = None,
        insecure: bool = False,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        if not is_loopback(host) and auth_token is None and not insecure:
            raise ConfigError(
                f"listening on {host} (beyond loopback) lets anyone who reaches it write "
                "spans, and claim any release: give --auth-token-file FILE (and "
                "--tls-cert/--tls-key), or say --insecure"
            )
        if (tls_cert is None) != (tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together")
        for tls_file in (tls_cert, tls_key):
            if tls_file is not None and not Path(tls_file).is_file():
                raise ConfigError(f"TLS file {tls_file} does not exist")
        self.limits = limits or Limits()
        self.max_body_bytes = self.limits.max_body_bytes
        self.idle_timeout = idle_timeout
        self.body_timeout = body_timeout
        self.max_buffered_bytes = max_buffered_bytes
        self.security = Security(
            auth_token,
            Path(tls_cert) if tls_cert is not None else None,
            Path(tls_key) if tls_key is not None else None,
        )
        self._lock = threading.Lock()
        self._received = self._accepted = self._rejected = self._refused = self._bad = 0
        self._buffered = 0
        self._recent: deque[tuple[float, int]] = deque()
        self._last_flush: FlushStats | None = None
        self._errors: list[str] = []
        self._on_error = on_error
        self._inflight = 0
        self.decode_workers = default_workers() if decode_workers is None else decode_workers
        # Requests decoding at once: the workers busy and as many queued behind them.
        self._decode_slots = threading.BoundedSemaphore(2 * max(1, self.decode_workers))
        self._pool = shared_pool(self.decode_workers) if self.decode_workers > 0 else None
        self.wal = WriteAheadLog(Path(wal_dir) if wal_dir else wal_dir_for(db), fsync=sync)
        self.writer = BatchWriter(
            db,
            self.wal,
            max_pending_spans=max_pending_spans,
            batch_spans=batch_spans,
            flush_interval=flush_interval,
            on_flush=self._flushed,
            on_error=self._error,
        )
        self.sampler: TailSampler | None = None
        if sampling is not None:
            self.sampler = TailSampler(
                keep_slowest=sampling.keep_slowest,
                sample_rest=sampling.sample_rest,
                decision_wait=sampling.decision_wait,
                window=sampling.window,
                max_spans=max_pending_spans,
                emit=lambda doc, n: self.writer.submit(doc, n, force=True),
            )
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self.written_all = True
        """After :meth:`stop`: False when the drain ran out of time (the log keeps the rest)."""
        self._threads: list[threading.Thread] = []
        # Bind both ports now, so a busy port is an error of the constructor.
        from tracekit.collect.otlp_http import HttpReceiver

        try:
            self.http = HttpReceiver(self, host, port)
        except BaseException:
            self.wal.close()
            raise
        self.grpc = None
        if grpc_port is not None:
            from tracekit.collect.otlp_grpc import GrpcReceiver

            try:
                self.grpc = GrpcReceiver(self, host, grpc_port)
            except BaseException:
                self.http.close()
                self.wal.close()
                raise
        self.address = self.http.address
        self.grpc_address = self.grpc.address if self.grpc is not None else None
        self.writer.source = f"collect:{self.address}"  # the bound port, also for --port 0

    @property
    def port(self) -> int:
        return self.http.port

    @property
    def grpc_port(self) -> int | None:
        return self.grpc.port if self.grpc is not None else None

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def start(self) -> None:
        if self._pool is not None:
            self._pool.warm()
        self.writer.start()
        self.http.start()
        if self.grpc is not None:
            self.grpc.start()
        if self.sampler is not None:
            tick = threading.Thread(
                target=self._decide_loop, name="tracekit-collect-sampler", daemon=True
            )
            self._threads.append(tick)
            tick.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop accepting, answer the requests in flight, write everything accepted.

        Within ``timeout`` seconds whatever the clients do: requests still being read are
        dropped unanswered (nothing of them was acknowledged), the writer gets the rest.
        """
        if self._stop.is_set():
            self._stopped.wait(timeout)
            return
        self._stop.set()
        deadline = time.monotonic() + timeout
        # Both receivers stop accepting at once; in-flight requests wait for the writer,
        # which keeps writing until they are answered.
        stoppers = [threading.Thread(target=self.http.stop, args=(timeout * 0.5,), daemon=True)]
        if self.grpc is not None:
            stoppers.append(
                threading.Thread(target=self.grpc.stop, args=(timeout * 0.5,), daemon=True)
            )
        for t in stoppers:
            t.start()
        if self.sampler is not None:
            self.sampler.decide_due(everything=True)
        for t in stoppers:
            t.join(max(0.0, deadline - time.monotonic()))
        for t in self._threads:  # the sampler's decisions: none may emit after the last
            t.join(max(0.0, deadline - time.monotonic()))
        if self.sampler is not None:
            self.sampler.decide_due(everything=True)
        self.written_all = self.writer.close(max(0.1, deadline - time.monotonic()))
        self._stopped.set()

    def status(self) -> CollectStatus:
        now = time.monotonic()
        with self._lock:
            while self._recent and self._recent[0][0] < now - 5.0:
                self._recent.popleft()
            span = max(now - self._recent[0][0], 1.0) if self._recent else 1.0
            rate = sum(n for _, n in self._recent) / span
            flush = self._last_flush
            return CollectStatus(
                address=self.address,
                grpc_address=self.grpc_address,
                spans_received=self._received,
                spans_accepted=self._accepted,
                spans_rejected=self._rejected,
                requests_refused=self._refused,
                requests_bad=self._bad,
                spans_per_s=rate,
                requests_stored=flush.requests_total if flush else 0,
                releases=list(flush.releases) if flush else [],
                pending_spans=self.writer.pending_spans
                + (self.sampler.held_spans if self.sampler else 0),
                sampler=self.sampler.stats if self.sampler else None,
                errors=list(self._errors[-5:]),
            )

    # --- what both receivers call ---------------------------------------------------

    def reserve_body(self, n: int) -> bool:
        """Count ``n`` more body bytes being read; False past ``max_buffered_bytes``."""
        with self._lock:
            if self._buffered + n > self.max_buffered_bytes and self._buffered > 0:
                return False
            self._buffered += n
            return True

    def release_body(self, n: int) -> None:
        with self._lock:
            self._buffered -= n

    def refuse(self, kind: str, message: str, http_status: int) -> Outcome:
        """An outcome that is not a decoded request (auth, framing, limits), counted."""
        with self._lock:
            if kind == BAD:
                self._bad += 1
            else:
                self._refused += 1
        return Outcome(kind, message, http_status=http_status)

    def receive(self, body: bytes, content_type: str | None, encoding: str | None) -> Outcome:
        """Decode one export request and hand its spans over; blocks (a worker thread)."""
        if self._stop.is_set():
            return self.refuse(UNAVAILABLE, "collector stopping; retry", 503)
        with self._lock:
            self._inflight += 1
        try:
            keep_doc = self.sampler is not None
            with self._decode_slots:
                try:
                    if self._pool is None:
                        decoded = decode.decode_request(
                            body, content_type, encoding, self.limits, keep_doc=keep_doc
                        )
                    else:
                        decoded = self._pool.decode(
                            body, content_type, encoding, self.limits, keep_doc=keep_doc
                        )
                except decode.BadBody as exc:
                    return self.refuse(BAD, exc.reason, exc.status)
                except PoolBroken as exc:
                    return self.refuse(UNAVAILABLE, str(exc), 503)
            return self._hand_over(decoded)
        finally:
            with self._lock:
                self._inflight -= 1

    def _hand_over(self, decoded: decode.Decoded) -> Outcome:
        with self._lock:
            self._received += decoded.accepted + decoded.rejected
            self._rejected += decoded.rejected
        message = decoded.message
        if not decoded.accepted:
            return Outcome(OK, message, 0, decoded.rejected)
        try:
            if self.sampler is not None:
                assert decoded.doc is not None
                self.sampler.add(decoded.doc, decoded.accepted)
            else:
                self.writer.submit_line(decoded.line, decoded.accepted)
        except (SamplerFull, Backpressure) as exc:
            if self._stop.is_set():
                return self.refuse(UNAVAILABLE, f"collector stopping: {exc}", 503)
            return self.refuse(BUSY, f"collector busy: {exc}", 429)
        except Unavailable as exc:
            return self.refuse(UNAVAILABLE, f"collector unavailable: {exc}", 503)
        self._count_accepted(decoded.accepted)
        return Outcome(OK, message, decoded.accepted, decoded.rejected)

    def _count_accepted(self, n: int) -> None:
        with self._lock:
            self._accepted += n
            self._recent.append((time.monotonic(), n))

    def _decide_loop(self) -> None:
        assert self.sampler is not None
        while not self._stop.wait(0.1):
            try:
                self.sampler.decide_due()
            except Exception as exc:  # noqa: BLE001 - this thread must not die
                self._error(f"tail sampler: {type(exc).__name__}: {exc}")

    def _flushed(self, stats: FlushStats) -> None:
        with self._lock:
            self._last_flush = stats

    def _error(self, message: str) -> None:
        with self._lock:
            self._errors.append(message)
            del self._errors[:-50]
        if self._on_error:
            self._on_error(message)
