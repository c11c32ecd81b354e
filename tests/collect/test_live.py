"""`tracekit collect` under load, beside readers, and when stopped mid-stream (real
subprocesses: DuckDB's file lock is per process)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tracekit.analysis.store import open_store
from tracekit.collect import Collector

from .helpers import file_held, releases, split_documents

CLI = [sys.executable, "-m", "tracekit.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _docs(n_requests: int, seed: int) -> list[dict]:
    """One document per trace (a request and its three stages)."""
    return split_documents(releases(n_requests, seed=seed).to_otlp(), per_doc=4)


def _span_keys(doc: dict) -> set[tuple[str, str]]:
    return {
        (s["traceId"], s["spanId"])
        for rs in doc["resourceSpans"]
        for ss in rs["scopeSpans"]
        for s in ss["spans"]
    }


def _stored_keys(db: Path) -> set[tuple[str, str]]:
    with open_store(db, read_only=True) as store:
        return {(r[0], r[1]) for r in store.run("SELECT trace_id, span_id FROM spans")}


def _start_cli_collector(db: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*CLI, "collect", "--db", str(db), "--port", "0", "--grpc-port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on http://"), line + proc.stderr.read()  # type: ignore[union-attr]
    return proc, line.split()[2]


def test_sigterm_mid_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    proc, endpoint = _start_cli_collector(db, "--flush-interval", "0.1")
    docs = _docs(100, seed=3)
    acked: set[tuple[str, str]] = set()
    lock = threading.Lock()
    sent = threading.Semaphore(0)

    def client(part: list[dict]) -> None:
        with httpx.Client(timeout=20) as http:
            for doc in part:
                try:
                    r = http.post(endpoint, json=doc)
                except httpx.HTTPError:
                    return  # the server went away: nothing more is acknowledged
                if r.status_code == 200:
                    with lock:
                        acked.update(_span_keys(doc))
                sent.release()

    threads = [threading.Thread(target=client, args=(docs[i::6],)) for i in range(6)]
    for t in threads:
        t.start()
    for _ in range(30):  # some requests are through, many are still coming
        assert sent.acquire(timeout=20)
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(30)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "collected:" in out
    assert len(acked) >= 30 * 4
    assert acked <= _stored_keys(db)


def test_sigterm_exits_0_after_the_reader_of_its_output_is_gone(tmp_path: Path) -> None:
    """stdout and stderr on pipes nobody reads any more (a pod's log shipper died): the
    first SIGTERM still writes what was accepted and exits 0; nothing is left running."""
    db = tmp_path / "live.duckdb"
    proc, endpoint = _start_cli_collector(db, "--drain", "5")
    doc = _docs(3, seed=4)[0]
    assert httpx.post(endpoint, json=doc, timeout=20).status_code == 200
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    assert _span_keys(doc) <= _stored_keys(db)


def test_a_second_signal_exits_at_once(tmp_path: Path) -> None:
    """The first SIGTERM waits for the writer (here held back by a reader holding the
    file); a second one ends the process without waiting."""
    db = tmp_path / "live.duckdb"
    proc, endpoint = _start_cli_collector(db, "--drain", "60")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print('held', flush=True); time.sleep(60)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with httpx.Client(timeout=2) as http, contextlib.suppress(httpx.HTTPError):
            http.post(endpoint, json=_docs(2, seed=6)[0])  # accepted, not writable now
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)  # draining: waits for the file
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        holder.kill()
        holder.communicate()
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_overload_gets_429_with_retry_after_and_memory_stays_bounded(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    c = Collector(str(db), port=0, max_pending_spans=10, flush_interval=0.05)
    c.start()
    # A reader in another process holds the file, as a long `tracekit diff` would:
    # the writer cannot flush, so accepted spans pile up to their bound.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print('held', flush=True); time.sleep(2.5)",
            str(db),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    codes: list[int] = []
    retry_after: set[str] = set()
    peak = 0
    acked: set[tuple[str, str]] = set()
    try:
        with httpx.Client(timeout=10) as http:
            for doc in _docs(10, seed=5):
                r = http.post(f"http://{c.address}/v1/traces", json=doc)
                codes.append(r.status_code)
                if r.status_code in (429, 503):
                    retry_after.add(r.headers["Retry-After"])
                elif r.status_code == 200:
                    acked.update(_span_keys(doc))
                peak = max(peak, c.status().pending_spans)
    finally:
        holder.communicate(timeout=30)
        c.stop()
    assert 429 in codes
    assert retry_after == {"1"}
    assert peak <= 10 + 4
    assert set(codes) <= {200, 429, 503}
    assert acked <= _stored_keys(db)
    assert c.status().requests_refused == sum(code != 200 for code in codes)


@pytest.mark.slow
def test_analysis_commands_run_while_collect_writes(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    proc, endpoint = _start_cli_collector(db, "--flush-interval", "0.05")
    stop = threading.Event()
    some_sent = threading.Event()
    docs = _docs(300, seed=9)

    def client() -> None:
        with httpx.Client(timeout=20) as http:
            for i, doc in enumerate(docs):
                if stop.is_set():
                    return
                http.post(endpoint, json=doc)
                if i == 20:
                    some_sent.set()

    sender = threading.Thread(target=client)
    sender.start()
    try:
        assert some_sent.wait(60)
        for command in (["summary"], ["diff", "--before", "v1", "--after", "v2"]):
            deadline = time.monotonic() + 30
            while True:
                r = subprocess.run(
                    [*CLI, *command, "--db", str(db), "--format", "json"],
                    capture_output=True,
                    text=True,
                    env=ENV,
                    timeout=120,
                )
                # Acknowledged spans reach the store a batch later: until the first batch
                # is written a summary finds no requests (never a lock error).
                if "no requests in" not in r.stderr or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            if command[0] == "diff" and "no requests for release 'v2'" in r.stderr:
                continue  # v2 not sent yet; the point is that the store opened
            assert r.returncode == 0, r.stderr
            assert "lock" not in r.stderr.lower()
            json.loads(r.stdout)
    finally:
        stop.set()
        sender.join(60)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 0


def test_kill_9_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """Acknowledged means in the write-ahead log: a collector killed before it wrote the
    store (a reader held the file) loses nothing; the next one writes it all."""
    db = tmp_path / "live.duckdb"
    proc, endpoint = _start_cli_collector(db)
    acked: set[tuple[str, str]] = set()
    with file_held(db):
        with httpx.Client(timeout=20) as http:
            for doc in _docs(20, seed=8):
                if http.post(endpoint, json=doc).status_code == 200:
                    acked.update(_span_keys(doc))
        proc.kill()  # SIGKILL: no drain, no clean-up
        proc.communicate(timeout=30)
    assert len(acked) == 2 * 20 * 4  # both releases
    assert not acked & _stored_keys(db)
    again, _ = _start_cli_collector(db)
    again.send_signal(signal.SIGTERM)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert "replaying 160 spans" in err
    assert acked <= _stored_keys(db)


def test_a_record_torn_by_a_crash_is_skipped_and_the_rest_replayed(tmp_path: Path) -> None:
    from tracekit.collect.wal import WriteAheadLog, wal_dir_for

    db = tmp_path / "live.duckdb"
    docs = _docs(3, seed=9)[:3]
    log = WriteAheadLog(wal_dir_for(db))
    for doc in docs:
        log.append(json.dumps(doc).encode(), 4)
    log._outstanding[log._current] += 1  # keep the segment: as if the process died here
    log.close()
    (segment,) = wal_dir_for(db).glob("*.wal")
    whole = segment.read_bytes()
    segment.write_bytes(whole[:-10])  # the last record lost its tail mid-write
    errors: list[str] = []
    c = Collector(str(db), port=0, flush_interval=0.05, on_error=errors.append)
    c.start()
    c.stop()
    assert c.writer.replayed_spans == 8
    assert any("torn by a crash" in e for e in errors), errors
    stored = _stored_keys(db)
    assert _span_keys(docs[0]) | _span_keys(docs[1]) <= stored
    assert not _span_keys(docs[2]) & stored
    assert not list(wal_dir_for(db).glob("*.wal"))


def test_a_second_collector_on_the_same_store_is_refused(tmp_path: Path) -> None:
    from tracekit.errors import ConfigError

    db = tmp_path / "live.duckdb"
    c = Collector(str(db), port=0)
    try:
        with pytest.raises(ConfigError, match="another `tracekit collect` writes this store"):
            Collector(str(db), port=0)
    finally:
        c.stop()
    Collector(str(db), port=0).stop()  # free again once the first has stopped
