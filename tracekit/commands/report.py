"""`tracekit report`: one self-contained HTML file — verdict, gate, charts, waterfalls."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command
from tracekit.commands._options import (
    add_confidence,
    add_filters,
    add_jaeger_url,
    add_metric,
    add_releases,
    add_slo,
    add_window,
)
from tracekit.commands._pages import write_page
from tracekit.commands._store import add_store, open_analysis, store_input
from tracekit.outputs import check_outputs
from tracekit.render.text import printable

DESCRIPTION = """\
Write one self-contained HTML report (plotly.js inlined: it opens with no network, from
a CI artifact or an e-mail) comparing two releases: the verdict sentence and the release
gate's outcome at the top, latency quantile curves of both releases with p50/p95/p99 and
the intervals of their changes, the counterfactual share of each stage (wait, compute,
hidden wait), per-stage distributions, the slowest traces as waterfalls with the critical
path in red (linked to Jaeger with --jaeger-url) and, with --slo, the autoscaling time line.

Example:
  tracekit report --before v1 --after v2 -o report.html
  tracekit report --before v1 --after v2 --slo "p95<60ms" --jaeger-url http://localhost:16686
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "report",
        help="a self-contained HTML report of a release diff",
        description=DESCRIPTION,
    )
    add_releases(parser)
    parser.add_argument(
        "-o", "--output", default="report.html", metavar="FILE", help="where to write the page"
    )
    add_slo(
        parser,
        required=False,
        help='latency objective per window, e.g. "p95<60ms": adds the autoscaling time line',
    )
    add_window(parser, default="30s", help="autoscaling window (30s, 1m; a bare number is seconds)")
    parser.add_argument(
        "--budget",
        action="append",
        default=None,
        metavar="BUDGET",
        help="gate budget such as 'p99<=+10%%' (repeatable; default p95 and p99 <= +10%%)",
    )
    add_jaeger_url(parser, links="trace links")
    add_filters(parser)
    add_metric(parser)
    add_confidence(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_outputs({"-o/--output": args.output}, store_input(args))
    with open_analysis(args, releases=(args.before, args.after)) as analysis:
        report = analysis.report(
            args.before,
            args.after,
            budgets=args.budget,
            slo=args.slo,
            window_s=args.window,
            jaeger_url=args.jaeger_url,
            service=args.service,
            route=args.route,
            confidence=args.confidence,
            metric=args.metric,
        )
    out = write_page(args.output, report, args, option="-o/--output")
    size = out.stat().st_size / 1e6
    print(printable(f"wrote {out} ({size:.1f} MB): {report.verdict}"))
    return 0
