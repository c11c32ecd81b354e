"""`tracekit collect`: OTLP/HTTP and OTLP/gRPC receivers that write spans into the store."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tracekit.commands._common import add_command, add_db
from tracekit.errors import ConfigError

DESCRIPTION = """\
Receive spans over OTLP and write them into the store in batches, attributing each
request as it lands: OTLP/HTTP (POST /v1/traces, protobuf or JSON, gzip or deflate,
chunked or not) on --port, OTLP/gRPC (TraceService/Export, gzip) on --grpc-port. Any OTel
SDK (Python, Node, Java, Go, .NET) or Collector can export here with its default exporter;
`tracekit summary`, `diff` and `gate` work on the same store while it runs. A request is
acknowledged once its spans are in the write-ahead log on disk; the store is written
behind it in batches. SIGTERM or Ctrl-C stops accepting,
answers what is in flight, writes everything accepted and exits 0 within --drain seconds
(what it could not write by then stays in its write-ahead log, STORE.collect-wal/, and is
written at the next start); a second signal exits at once.

Both ports bind 127.0.0.1. To listen beyond loopback give a bearer token
(--auth-token-file; clients send `Authorization: Bearer TOKEN`) and TLS (--tls-cert,
--tls-key), or say --insecure. Anyone who can write can claim any release label.

Tail sampling (optional): keep the slowest PCT % of each route and release (over the
last --window requests) and a FRACTION of the rest, deciding per whole trace after
--decision-wait seconds; kept traces carry tracekit.sample.weight, so quantiles stay
unbiased (docs/sampling.md).

examples:
  tracekit collect                                  # :4318 (HTTP) and :4317 (gRPC) -> tracekit.duckdb
  OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python serve.py
  OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 node app.js
  tracekit collect --host 0.0.0.0 --auth-token-file token.txt --tls-cert c.pem --tls-key k.pem
  tracekit collect --db live.duckdb --keep-slowest 5 --sample-rest 0.1 --decision-wait 5
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "collect",
        help="receive OTLP spans (HTTP and gRPC) into the store",
        description=DESCRIPTION,
    )
    add_db(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address both receivers listen on")
    parser.add_argument(
        "--port", type=int, default=4318, help="OTLP/HTTP port (4318 is OTLP's; 0 picks a free one)"
    )
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=4317,
        help="OTLP/gRPC port (4317 is OTLP's; 0 picks a free one; -1 turns gRPC off)",
    )
    security = parser.add_argument_group("who may write")
    security.add_argument(
        "--auth-token-file",
        metavar="FILE",
        help="require `Authorization: Bearer TOKEN` (TOKEN: the file's first line) on both protocols",
    )
    security.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    security.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    security.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without a token (anyone reaching it can write)",
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
        default=0.2,
        metavar="SECONDS",
        help="longest an accepted span waits for its batch to start being written to the store",
    )
    limits.add_argument(
        "--max-body-mib",
        type=float,
        default=20.0,
        metavar="MIB",
        help="largest request body, before and after decompression (the OTel Collector's default)",
    )
    limits.add_argument(
        "--drain",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT: longest wait to answer requests in flight and write",
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
    from tracekit.collect import Collector, Limits, read_token
    from tracekit.collect.service import say, serve
    from tracekit.render.collect import status_line

    policy = _policy(args)
    if args.max_body_mib <= 0 or args.drain <= 0:
        raise ConfigError("--max-body-mib and --drain must be above 0")
    token = read_token(args.auth_token_file) if args.auth_token_file else None
    grpc_port = None if args.grpc_port < 0 else args.grpc_port
    try:
        collector = Collector(
            args.db,
            host=args.host,
            port=args.port,
            grpc_port=grpc_port,
            sampling=policy,
            max_pending_spans=args.max_pending_spans,
            flush_interval=args.flush_interval,
            limits=Limits(max_body_bytes=int(args.max_body_mib * (1 << 20))),
            auth_token=token,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            insecure=args.insecure,
            on_error=lambda message: say(f"tracekit collect: {message}", sys.stderr),
        )
    except OSError as exc:
        ports = f"{args.port}" + ("" if grpc_port is None else f" or {grpc_port}")
        raise ConfigError(
            f"cannot listen on {args.host}:{ports}: {exc.strerror or exc}; pick free ports "
            "with --port/--grpc-port (0 picks one) or stop what holds them"
        ) from exc
    scheme = "https" if args.tls_cert else "http"
    banner = f"listening on {scheme}://{collector.address}/v1/traces (OTLP/HTTP)"
    if collector.grpc_address:
        banner += f" and {collector.grpc_address} (OTLP/gRPC)"
    status = serve(
        collector,
        drain=args.drain,
        banner=f"{banner} -> {args.db}",
        status_line=lambda st, final: status_line(st, final=final),
    )
    say(status_line(status, final=True), sys.stdout)
    if not collector.written_all:
        say(
            f"tracekit collect: {status.pending_spans:,} accepted spans were not written "
            f"within --drain {args.drain:g} s; they are kept in {collector.wal.directory} "
            "and written at the next `tracekit collect --db` of this store",
            sys.stderr,
        )
    return 0
