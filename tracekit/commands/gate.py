"""`tracekit gate`: the release gate for CI — pass, fail or inconclusive, with exit codes."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from tracekit.commands._common import EXIT_CODES, add_command, emit
from tracekit.commands._options import (
    add_confidence,
    add_filters,
    add_format,
    add_html,
    add_metric,
    add_releases,
)
from tracekit.commands._pages import write_page
from tracekit.commands._store import add_store, open_analysis, store_input
from tracekit.commands._types import duration_ms_type
from tracekit.outputs import check_outputs, write_output

DESCRIPTION = """\
Check the after release's latency against budgets relative to the before release (or
absolute), with bootstrap confidence intervals Holm-corrected across budgets. Each
budget passes, fails (the whole interval is beyond it) or is inconclusive (the interval
straddles it, or too few requests lie beyond the quantile to estimate it).
Without budgets: p95 <= +10% and p99 <= +10%.

Budgets: [stage.NAME.]pNN OP VALUE, OP one of < <=, VALUE absolute (200ms, 0.2s,
150us), a change in ms (+5ms) or relative (+10%). On training runs (train_step
traces): samples_per_s, step_ms.p50|p95|mean or efficiency, e.g. 'samples_per_s>=-10%'
(default) or 'step_ms.p95<=120ms'.

Exit codes: 0 pass, 1 fail, 3 inconclusive, 2 usage or input error.

Example:
  tracekit gate --before v1 --after v2
  tracekit gate --before v1 --after v2 --budget 'p99<=+10%' \\
      --budget 'stage.batch_queue.p99<40ms' --min-effect 1ms \\
      --junit gate.xml --markdown "$GITHUB_STEP_SUMMARY"
  tracekit gate --before v1 --after v2 --config tracekit-gate.toml --format json
"""


def register(sub: Any) -> None:
    parser = add_command(
        sub,
        "gate",
        help="release gate for CI: exit 0 pass, 1 fail, 3 inconclusive",
        description=DESCRIPTION,
    )
    add_releases(parser)
    parser.add_argument(
        "--budget",
        action="append",
        default=None,
        metavar="BUDGET",
        help="a budget such as 'p99<=+10%%' or 'stage.batch_queue.p99<40ms' (repeatable; "
        "replaces the config file's budgets)",
    )
    parser.add_argument(
        "--config", default=None, metavar="FILE", help="gate config (TOML, [gate] table)"
    )
    parser.add_argument(
        "--min-effect",
        type=duration_ms_type,
        default=None,
        metavar="DURATION",
        help="changes smaller than this never fail a relative or delta budget (default 0ms)",
    )
    add_confidence(parser, default=None)
    add_filters(parser)
    add_metric(parser)
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (results repeat)")
    parser.add_argument("--junit", default=None, metavar="FILE", help="also write JUnit XML")
    parser.add_argument(
        "--markdown",
        default=None,
        metavar="FILE",
        help="also write a markdown report, e.g. to $GITHUB_STEP_SUMMARY",
    )
    add_html(parser, "the release report (verdict, charts, waterfalls) as a CI artifact")
    add_format(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.facade import TrainingGateResult
    from tracekit.render import render
    from tracekit.render.gate import render_junit

    inputs = {**store_input(args), "--config": args.config}
    check_outputs({"--html": args.html, "--junit": args.junit, "--markdown": args.markdown}, inputs)
    options: dict[str, Any] = dict(
        budgets=args.budget,
        config=args.config,
        confidence=args.confidence,
        seed=args.seed,
        service=args.service,
        route=args.route,
        metric=args.metric,
    )
    with open_analysis(args, releases=(args.before, args.after)) as analysis:
        result = analysis.gate(args.before, args.after, min_effect_ms=args.min_effect, **options)
        if args.html:  # two training runs: their report (steps per rank, scaling)
            serving = None if isinstance(result, TrainingGateResult) else result
            page = analysis.report(args.before, args.after, gate=serving, **options)
            write_page(args.html, page, args, option="--html", inputs=inputs)
    code = EXIT_CODES[result.result]
    if isinstance(result, TrainingGateResult):  # its JSON carries the exit code
        result = dataclasses.replace(result, exit_code=code)
    if args.junit:
        write_output(args.junit, render_junit(result), option="--junit", inputs=inputs)
    if args.markdown:
        write_output(args.markdown, render(result, "markdown"), option="--markdown", inputs=inputs)
    emit(result, args.format)
    return code
