"""`tracekit autoscale`: would the scaling rule have fired when the latency objective broke?"""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import (
    add_command,
    add_filters,
    add_format,
    add_store,
    add_version,
    check_outputs,
    duration_type,
    emit,
    open_analysis_store,
    slo_type,
    store_input,
)
from tracekit.commands.report import add_html
from tracekit.errors import ConfigError

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
    add_version(parser, dest="release", multiple=True, help="release to audit (default: the one traced last); repeat it to audit a rollout as one time line, e.g. --version v1 --version v2")  # fmt: skip
    add_filters(parser, route=False)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--hpa", "--rule", dest="rule_file", metavar="FILE", help="HPA (autoscaling/v2), KEDA ScaledObject or Ray Serve config, YAML or JSON")  # fmt: skip
    source.add_argument("--signal", help="scale on this signal instead: cpu, gpu, inflight, queue_depth, request_rate, latency")  # fmt: skip
    parser.add_argument("--target", help="target for --signal: 0.7 or 70%% for utilisation, 200ms for latency, a number otherwise")  # fmt: skip
    parser.add_argument("--min-replicas", type=int, default=1, help="for --signal")
    parser.add_argument("--max-replicas", type=int, default=100, help="for --signal")
    parser.add_argument(
        "--slo", required=True, type=slo_type, help='latency objective per window, e.g. "p95<200ms"'
    )
    parser.add_argument(
        "--window",
        default="30s",
        type=duration_type(),
        help="window length (30s, 1m, 500ms; a bare number is seconds)",
    )
    add_html(parser, "the autoscaling time line")
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.autoscale import rules as sr
    from tracekit.analysis.autoscale.audit import audit_autoscaling
    from tracekit.analysis.autoscale.rule_files import load_rule

    if args.signal is not None and args.target is None:
        raise ConfigError("--signal needs --target (e.g. --signal inflight --target 5)")
    if args.target is not None and args.signal is None:
        raise ConfigError("--target needs --signal (or give the rule with --hpa FILE)")
    check_outputs({"--html": args.html}, {**store_input(args), "--hpa": args.rule_file})
    if args.rule_file:
        rule = load_rule(args.rule_file)
    elif args.signal:
        target = sr.parse_target(args.signal, args.target)
        rule = sr.rule_from_flags(args.signal, target, args.min_replicas, args.max_replicas)
    else:
        rule = sr.default_rule()
    with open_analysis_store(args, releases=args.release) as store:
        result = audit_autoscaling(
            store,
            release=args.release,
            rule=rule,
            slo=args.slo,
            window_s=args.window,
            service=args.service,
        )
        if args.html:
            from tracekit.commands.report import write_autoscale_html

            write_autoscale_html(args.html, store, result)
    emit(result, args.format)
    return 0
