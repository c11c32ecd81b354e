"""`tracekit gate`: the release gate for CI — pass, fail or inconclusive, with exit codes."""

from __future__ import annotations

import argparse
from typing import Any

from tracekit.commands._common import (
    add_command,
    add_confidence,
    add_filters,
    add_format,
    add_releases,
    add_store,
    check_outputs,
    duration_ms_type,
    emit,
    open_analysis_store,
    store_input,
    write_output,
)
from tracekit.commands.report import add_html

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


def _inputs(args: argparse.Namespace) -> dict[str, str | None]:
    """What the gate reads, which no output flag may overwrite."""
    return {**store_input(args), "--config": args.config}


def run(args: argparse.Namespace) -> int:
    from tracekit.analysis.gate.budgets import (
        GateConfig,
        load_config,
        parse_budgets,
    )
    from tracekit.analysis.gate.evaluate import DEFAULT_CONFIDENCE, run_gate
    from tracekit.render.gate import render_junit, render_markdown

    outputs = {"--html": args.html, "--junit": args.junit, "--markdown": args.markdown}
    check_outputs(outputs, _inputs(args))
    config = load_config(args.config) if args.config else GateConfig()
    # training budgets (samples_per_s, step_ms…) are parsed by the training gate
    training_budgets = bool(args.budget) and all(_is_training_budget(b) for b in args.budget)
    budgets = parse_budgets(args.budget) if args.budget and not training_budgets else config.budgets
    # Flags beat the config file, which beats the defaults.
    confidence = args.confidence or config.confidence or DEFAULT_CONFIDENCE
    min_effect = args.min_effect if args.min_effect is not None else config.min_effect_ms or 0.0
    with open_analysis_store(args, releases=(args.before, args.after)) as store:
        if _training(store, args.before, args.after):
            return _training_gate(store, args, confidence)
        result = run_gate(
            store,
            args.before,
            args.after,
            budgets=budgets or None,
            confidence=confidence,
            min_effect_ms=min_effect,
            seed=args.seed,
            service=args.service or config.service,
            route=args.route or config.route,
        )
        if args.html:
            from tracekit.commands.report import write_gate_html

            write_gate_html(
                args.html,
                store,
                result,
                service=args.service or config.service,
                route=args.route or config.route,
                seed=args.seed,
            )
    if args.junit:
        write_output(args.junit, render_junit(result), option="--junit", inputs=_inputs(args))
    if args.markdown:
        markdown = render_markdown(result)
        write_output(args.markdown, markdown, option="--markdown", inputs=_inputs(args))
    emit(result, args.format)
    return result.exit_code


def _is_training_budget(text: str) -> bool:
    from tracekit.analysis.training.gate import METRICS

    return text.strip().startswith(METRICS)


def _training(store: Any, before: str, after: str) -> bool:
    from tracekit.analysis.training.steps import training_runs

    runs = training_runs(store)
    return before in runs and after in runs


def _training_gate(store: Any, args: argparse.Namespace, confidence: float) -> int:
    """Training runs: budgets on samples/s, step time or efficiency (docs/training.md)."""
    from tracekit.analysis.training.gate import gate_runs
    from tracekit.render.training import GATE_RENDERERS

    result = gate_runs(
        store, args.before, args.after, args.budget, confidence=confidence, seed=args.seed
    )
    if args.markdown:
        markdown = GATE_RENDERERS["markdown"](result)
        write_output(args.markdown, markdown, option="--markdown", inputs=_inputs(args))
    emit(result, args.format)
    return result.exit_code
