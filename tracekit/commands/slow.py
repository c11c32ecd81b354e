"""`tracekit slow`: where slow requests (≥ p99) spend the time fast ones (≤ p50) do not."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import (
    add_command,
    add_filters,
    add_format,
    add_store,
    add_version,
    emit,
    http_url_type,
    open_analysis_store,
)
from tracekit.commands.report import add_html

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
    parser.add_argument(
        "--jaeger-url",
        default=None,
        type=http_url_type,
        metavar="URL",
        help="Jaeger UI base URL for exemplar links",
    )
    add_html(parser, "slow vs fast with the exemplars' waterfalls")
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.compare.summary import slow_vs_fast

    with open_analysis_store(args, releases=args.version) as store:
        result = slow_vs_fast(
            store, args.version, service=args.service, route=args.route, jaeger_url=args.jaeger_url
        )
        if args.html:
            from tracekit.commands.report import write_slow_html

            write_slow_html(args.html, store, result, args)
    emit(result, args.format)
    return 0
