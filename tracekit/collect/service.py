"""``tracekit collect`` as a process: serve until SIGTERM/SIGINT, then drain within a bound.

The first signal stops accepting, answers what is in flight and writes everything
accepted; the process exits within ``drain`` seconds whatever the writer does (a
watchdog), and a second signal exits at once (128 + the signal). Lines go through
:func:`say`, which survives a closed pipe: a pod whose log reader died still drains.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from tracekit.collect.server import Collector, CollectStatus
from tracekit.errors import ConfigError

StatusLine = Callable[[CollectStatus, bool], str]
"""``(status, final) -> line``: how the caller shows the live and the closing status."""


def say(text: str, stream: Any, *, end: str = "\n") -> None:
    """Write a line; a closed pipe or terminal must not stop the collector from flushing.

    After a failed write the stream is pointed at /dev/null, so neither a later print nor
    the interpreter's flush at exit raises again (Python's exit code would become 120).
    """
    try:
        stream.write(text + end)
        stream.flush()
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (OSError, ValueError):
        return False


def serve(
    collector: Collector,
    *,
    drain: float,
    banner: str,
    status_line: Callable[[CollectStatus, bool], str],
) -> CollectStatus:
    """Start ``collector``, print ``banner``, show ``status_line`` live on a terminal
    until a signal, then stop within ``drain`` seconds; returns the final status."""
    stop = threading.Event()
    signals = 0

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal signals
        signals += 1
        if signals > 1:  # a second signal: at once, whatever is left
            os._exit(128 + signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        collector.start()
        say(banner, sys.stdout)
        live = _isatty(sys.stderr)
        while not stop.wait(1.0):
            if live:
                say("\r\x1b[2K" + status_line(collector.status(), False), sys.stderr, end="")
        if live:
            say("\r\x1b[2K", sys.stderr, end="")
        say("stopping: answering requests in flight, writing what was accepted…", sys.stderr)
        # Whatever happens to the writer, the process is gone soon after the drain.
        watchdog = threading.Timer(drain + 2.0, lambda: os._exit(1))
        watchdog.daemon = True
        watchdog.start()
        collector.stop(timeout=drain)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return collector.status()


def run_collector(
    db: str,
    *,
    host: str,
    port: int,
    grpc_port: int | None,
    drain: float,
    status_line: StatusLine,
    tls_cert: str | None = None,
    **options: Any,
) -> CollectStatus:
    """``tracekit collect`` from start to exit: listen, serve until a signal, drain.

    ``options`` go to :class:`Collector`. A port that cannot be bound is a one-line
    :class:`ConfigError`; spans accepted but not written within ``drain`` are named on
    stderr (they stay in the write-ahead log for the next start).
    """
    try:
        collector = Collector(
            db,
            host=host,
            port=port,
            grpc_port=grpc_port,
            tls_cert=tls_cert,
            on_error=lambda message: say(f"tracekit collect: {message}", sys.stderr),
            **options,
        )
    except OSError as exc:
        ports = f"{port}" + ("" if grpc_port is None else f" or {grpc_port}")
        raise ConfigError(
            f"cannot listen on {host}:{ports}: {exc.strerror or exc}; pick free ports "
            "with --port/--grpc-port (0 picks one) or stop what holds them"
        ) from exc
    scheme = "https" if tls_cert else "http"
    banner = f"listening on {scheme}://{collector.address}/v1/traces (OTLP/HTTP)"
    if collector.grpc_address:
        banner += f" and {collector.grpc_address} (OTLP/gRPC)"
    status = serve(collector, drain=drain, banner=f"{banner} -> {db}", status_line=status_line)
    say(status_line(status, True), sys.stdout)
    if not collector.written_all:
        say(
            f"tracekit collect: {status.pending_spans:,} accepted spans were not written "
            f"within --drain {drain:g} s; they are kept in {collector.wal.directory} "
            "and written at the next `tracekit collect --db` of this store",
            sys.stderr,
        )
    return status
