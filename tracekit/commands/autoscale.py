"""`tracekit autoscale`: would the scaling rule have fired when the latency objective broke?"""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import add_command, emit
from tracekit.commands._options import (
    add_filters,
    add_format,
    add_html,
    add_slo,
    add_version,
    add_window,
)
from tracekit.commands._pages import write_page
from tracekit.commands._store import add_store, open_analysis, store_input
from tracekit.errors import ConfigError
from tracekit.outputs import check_outputs

DESCRIPTION = """\
Replay a scaling rule (Kubernetes HPA, KEDA ScaledObject, Ray Serve autoscaling_config,
or --signal/--target) over the traced time line, window by window. Reports the windows
that broke the latency objective while the rule would not have scaled up ("missed"),
ranks in-flight, queue depth, request rate, latency, GPU and CPU by how well and how
early they track the objective, and recommends one with a target and an HPA snippet.
Without a rule, a Kubernetes HPA on CPU at 70% is assumed (and the output says so).

Examples:
  tracekit autoscale --slo "p95<200ms"                       # default rule: HPA, CPU 70%
  tracekit autoscale --version v2 --hpa hpa.yaml --slo "p99<500ms" --window 1m
  tracekit autoscale --signal inflight --target 5 --slo "p95<200ms" --format json
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "autoscale",
        help="does the scaling rule see the latency problem? which signal would?",
        description=DESCRIPTION,
    )
    add_version(
        parser,
        dest="release",
        multiple=True,
        help="release to audit (default: the one traced last); repeat it to audit a rollout as one time line, e.g. --version v1 --version v2",
    )
    add_filters(parser, route=False)
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--hpa",
        "--rule",
        dest="rule_file",
        metavar="FILE",
        help="HPA (autoscaling/v2), KEDA ScaledObject or Ray Serve config, YAML or JSON",
    )
    source.add_argument(
        "--signal",
        help="scale on this signal instead: cpu, gpu, inflight, queue_depth, request_rate, latency",
    )
    parser.add_argument(
        "--target",
        help="target for --signal: 0.7 or 70%% for utilisation, 200ms for latency, a number otherwise",
    )
    parser.add_argument("--min-replicas", type=int, default=1, help="for --signal")
    parser.add_argument("--max-replicas", type=int, default=100, help="for --signal")
    add_slo(parser)
    add_window(
        parser, default="30s", help="window length (30s, 1m, 500ms; a bare number is seconds)"
    )
    add_html(parser, "the autoscaling time line")
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.signal is not None and args.target is None:
        raise ConfigError("--signal needs --target (e.g. --signal inflight --target 5)")
    if args.target is not None and args.signal is None:
        raise ConfigError("--target needs --signal (or give the rule with --hpa FILE)")
    check_outputs({"--html": args.html}, {**store_input(args), "--hpa": args.rule_file})
    with open_analysis(args, releases=args.release) as analysis:
        result = analysis.autoscale(
            args.release,
            slo=args.slo,
            rule=args.rule_file,
            signal=args.signal,
            target=args.target,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            window_s=args.window,
            service=args.service,
        )
        if args.html:
            write_page(args.html, analysis.autoscale_report(result), args, option="--html")
    emit(result, args.format)
    return 0
