"""`tracekit collect`: OTLP/HTTP and OTLP/gRPC receivers that write spans into the store."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._collect_options import add_collect_options
from tracekit.commands._common import add_command
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
    add_collect_options(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.collect import Limits, SamplingPolicy, read_token
    from tracekit.collect.service import run_collector
    from tracekit.render.collect import status_line

    policy = SamplingPolicy.from_options(
        args.keep_slowest, args.sample_rest, args.decision_wait, args.window
    )
    if args.max_body_mib <= 0 or args.drain <= 0:
        raise ConfigError("--max-body-mib and --drain must be above 0")
    run_collector(
        args.db,
        host=args.host,
        port=args.port,
        grpc_port=None if args.grpc_port < 0 else args.grpc_port,
        drain=args.drain,
        status_line=lambda st, final: status_line(st, final=final),
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        insecure=args.insecure,
        sampling=policy,
        max_pending_spans=args.max_pending_spans,
        flush_interval=args.flush_interval,
        limits=Limits(max_body_bytes=int(args.max_body_mib * (1 << 20))),
        auth_token=read_token(args.auth_token_file) if args.auth_token_file else None,
    )
    return 0
