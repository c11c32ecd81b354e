"""`tracekit slow`: where slow requests (≥ p99) spend the time fast ones (≤ p50) do not."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import (
    add_filters,
    add_format,
    add_html,
    add_jaeger_url,
    add_version,
)
from tracekit.commands._pages import write_page
from tracekit.commands._store import add_store, open_analysis, store_input
from tracekit.outputs import check_outputs

DESCRIPTION = """\
Compare the slow (≥ p99, widened to ≥ p95 when thin) and fast (≤ p50) requests of one
release stage by stage, rank attribute values over-represented in slow traces, and
list exemplar traces.

Example:
  tracekit slow --version v2 --jaeger-url http://localhost:16686
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub, "slow", help="slow vs fast requests of one release", description=DESCRIPTION
    )
    add_version(parser, help="the release to read (needed when several are stored)")
    add_filters(parser)
    add_jaeger_url(parser)
    add_html(parser, "slow vs fast with the exemplars' waterfalls")
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_outputs({"--html": args.html}, store_input(args))
    with open_analysis(args, releases=args.version) as analysis:
        result = analysis.slow(
            args.version, service=args.service, route=args.route, jaeger_url=args.jaeger_url
        )
        if args.html:
            page = analysis.slow_report(result, service=args.service, route=args.route)
            write_page(args.html, page, args, option="--html")
    emit(result, args.format)
    return 0
