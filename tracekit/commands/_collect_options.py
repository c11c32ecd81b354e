"""The flags of ``tracekit collect``: where it listens, who may write, sampling, limits."""

from __future__ import annotations

import argparse

from tracekit.commands._store import add_db


def add_collect_options(parser: argparse.ArgumentParser) -> None:
    """Every ``tracekit collect`` option, in the groups its ``--help`` shows."""
    add_db(parser)
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address both receivers listen on")
    add(
        "--port", type=int, default=4318, help="OTLP/HTTP port (4318 is OTLP's; 0 picks a free one)"
    )
    add(
        "--grpc-port",
        type=int,
        default=4317,
        help="OTLP/gRPC port (4317 is OTLP's; 0 picks a free one; -1 turns gRPC off)",
    )
    add = parser.add_argument_group("who may write").add_argument
    add(
        "--auth-token-file",
        metavar="FILE",
        help="require `Authorization: Bearer TOKEN` (TOKEN: the file's first line) on both protocols",
    )
    add("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    add("--tls-key", metavar="PEM", help="the certificate's private key")
    add(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host without a token (anyone reaching it can write)",
    )
    add = parser.add_argument_group("tail sampling").add_argument
    add(
        "--keep-slowest",
        type=float,
        metavar="PCT",
        help="keep every trace in the slowest PCT %% of its route and release",
    )
    add(
        "--sample-rest",
        type=float,
        metavar="FRACTION",
        help="keep this fraction (0..1] of the other traces, weighted 1/FRACTION",
    )
    add(
        "--decision-wait",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="wait this long after a trace's first span before deciding",
    )
    add("--window", type=int, default=1000, metavar="N", help="requests per route the PCT uses")
    add = parser.add_argument_group("limits").add_argument
    add(
        "--max-pending-spans",
        type=int,
        default=200_000,
        metavar="N",
        help="spans held in memory before clients are told to retry (429)",
    )
    add(
        "--flush-interval",
        type=float,
        default=0.2,
        metavar="SECONDS",
        help="longest an accepted span waits for its batch to start being written to the store",
    )
    add(
        "--max-body-mib",
        type=float,
        default=20.0,
        metavar="MIB",
        help="largest request body, before and after decompression (the OTel Collector's default)",
    )
    add(
        "--drain",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on SIGTERM/SIGINT: longest wait to answer requests in flight and write",
    )
