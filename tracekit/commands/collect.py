"""`tracekit collect`: an OTLP/HTTP receiver that writes spans into the store as they come."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from tracekit.commands._common import add_command, add_db
from tracekit.errors import ConfigError

DESCRIPTION = """\
Receive spans over OTLP/HTTP (POST /v1/traces, protobuf or JSON, gzip or not) and write
them into the store in batches, attributing each request as it lands. Any OTel SDK or
Collector can export here; `tracekit summary`, `diff` and `gate` work on the same store
while it runs. SIGTERM or Ctrl-C writes everything accepted, then exits.

Tail sampling (optional): keep the slowest PCT % of each route and release (over the
last --window requests) and a FRACTION of the rest, deciding per whole trace after
--decision-wait seconds; kept traces carry tracekit.sample.weight, so quantiles stay
unbiased (docs/sampling.md).

examples:
  tracekit collect                                  # 127.0.0.1:4318 -> tracekit.duckdb
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python serve.py
  tracekit collect --db live.duckdb --keep-slowest 5 --sample-rest 0.1 --decision-wait 5
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub, "collect", help="receive OTLP/HTTP spans into the store", description=DESCRIPTION
    )
    add_db(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=4318, help="port (4318 is OTLP/HTTP's; 0 picks a free one)"
    )
    sampling = parser.add_argument_group("tail sampling")
    sampling.add_argument(
        "--keep-slowest",
        type=float,
        metavar="PCT",
        help="keep every trace in the slowest PCT %% of its route and release",
    )
    sampling.add_argument(
        "--sample-rest",
        type=float,
        metavar="FRACTION",
        help="keep this fraction (0..1] of the other traces, weighted 1/FRACTION",
    )
    sampling.add_argument(
        "--decision-wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait this long after a trace's first span before deciding",
    )
    sampling.add_argument(
        "--window", type=int, default=1000, metavar="N", help="requests per route the PCT uses"
    )
    limits = parser.add_argument_group("limits")
    limits.add_argument(
        "--max-pending-spans",
        type=int,
        default=200_000,
        metavar="N",
        help="spans held in memory before clients are told to retry (429)",
    )
    limits.add_argument(
        "--flush-interval",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="write a batch at least this often",
    )
    parser.set_defaults(handler=run)


def _policy(args: argparse.Namespace) -> Any:
    from tracekit.collect import SamplingPolicy

    if args.keep_slowest is None and args.sample_rest is None:
        return None
    if args.sample_rest is None:
        raise ConfigError(
            "--keep-slowest needs --sample-rest FRACTION too: without some of the other "
            "traces no quantile below the kept tail can be estimated"
        )
    keep = 0.0 if args.keep_slowest is None else args.keep_slowest
    if not 0 <= keep <= 100:
        raise ConfigError(f"--keep-slowest {keep}: a percentage from 0 to 100")
    if not 0 < args.sample_rest <= 1:
        raise ConfigError(f"--sample-rest {args.sample_rest}: a fraction above 0, at most 1")
    if args.decision_wait < 0:
        raise ConfigError("--decision-wait: seconds, 0 or more")
    return SamplingPolicy(keep, args.sample_rest, args.decision_wait, args.window)


def run(args: argparse.Namespace) -> int:
    from tracekit.collect import Collector
    from tracekit.render.collect import status_line

    policy = _policy(args)
    try:
        collector = Collector(
            args.db,
            host=args.host,
            port=args.port,
            sampling=policy,
            max_pending_spans=args.max_pending_spans,
            flush_interval=args.flush_interval,
            on_error=lambda message: print(f"tracekit collect: {message}", file=sys.stderr),
        )
    except OSError as exc:
        raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        collector.start()
        print(f"listening on http://{collector.address}/v1/traces -> {args.db}", flush=True)
        live = sys.stderr.isatty()
        while not stop.wait(1.0):
            if live:
                sys.stderr.write("\r\x1b[2K" + status_line(collector.status()))
                sys.stderr.flush()
        if live:
            sys.stderr.write("\r\x1b[2K")
        print("stopping: writing what was accepted…", file=sys.stderr, flush=True)
        collector.stop()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(status_line(collector.status(), final=True), flush=True)
    return 0
