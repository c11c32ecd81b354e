"""`tracekit report`: one self-contained HTML file — verdict, gate, charts, waterfalls.

The command gathers analysis results (the diff, the gate, the autoscaling audit, the
exemplar traces' waterfalls) and hands them to :func:`tracekit.render.html.render_report`;
the renderer never queries. ``gate``, ``slow``, ``autoscale`` and the demo reuse
:func:`gather_report`, :func:`slow_report` and :func:`write_html` for their ``--html``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.commands._common import (
    add_command,
    add_confidence,
    add_filters,
    add_releases,
    add_store,
    check_outputs,
    duration_type,
    http_url_type,
    open_analysis_store,
    slo_type,
    store_input,
    write_output,
)
from tracekit.render.text import printable

if TYPE_CHECKING:
    from tracekit.analysis.autoscale.audit import AutoscaleResult
    from tracekit.analysis.autoscale.model import Slo
    from tracekit.analysis.compare.diff import Exemplar
    from tracekit.analysis.compare.summary import SlowFast
    from tracekit.analysis.gate.evaluate import GateResult
    from tracekit.analysis.store import Store
    from tracekit.render.html import Report, Waterfall

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

MIN_WINDOWS = 3
"""Fewer windows than this make no time line worth drawing."""


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
    parser.add_argument(
        "--slo",
        default=None,
        type=slo_type,
        help='latency objective per window, e.g. "p95<60ms": adds the autoscaling time line',
    )
    parser.add_argument(
        "--window",
        default="30s",
        type=duration_type(),
        help="autoscaling window (30s, 1m; a bare number is seconds)",
    )
    parser.add_argument(
        "--budget",
        action="append",
        default=None,
        metavar="BUDGET",
        help="gate budget such as 'p99<=+10%%' (repeatable; default p95 and p99 <= +10%%)",
    )
    parser.add_argument(
        "--jaeger-url",
        default=None,
        type=http_url_type,
        metavar="URL",
        help="Jaeger UI base URL for trace links",
    )
    add_filters(parser)
    add_confidence(parser)
    add_store(parser)
    parser.set_defaults(handler=run)


def write_html(path: str | Path, text: str, *, store: Store | None = None) -> Path:
    """Write the page atomically; the store's own file or an unwritable path is a
    one-line :class:`ConfigError` (:func:`~tracekit.commands._common.write_output`)."""
    inputs = {"--db": store.path} if store is not None else None
    return write_output(path, text, option="--html", inputs=inputs)


def add_html(parser: argparse.ArgumentParser, what: str) -> None:
    """``--html FILE`` for a command that can draw its part of the report."""
    parser.add_argument(
        "--html",
        default=None,
        metavar="FILE",
        help=f"also write {what} as a self-contained HTML page (as `tracekit report` does)",
    )


def write_gate_html(
    path: str,
    store: Store,
    result: GateResult,
    *,
    service: str | None = None,
    route: str | None = None,
    seed: int = 0,
) -> None:
    """``tracekit gate --html``: the whole release report around the gate's own result."""
    from tracekit.render.html import render_report

    report = gather_report(
        store,
        result.before.label,
        result.after.label,
        gate=result,
        service=service,
        route=route,
        confidence=result.confidence,
        seed=seed,
    )
    write_html(path, render_report(report), store=store)


def write_slow_html(path: str, store: Store, result: SlowFast, args: argparse.Namespace) -> None:
    """``tracekit slow --html``: slow vs fast, the release's curve and its exemplars."""
    from tracekit.render.html import render_report

    check_outputs({"--html": path}, store_input(args))
    report = slow_report(
        store, result, service=getattr(args, "service", None), route=getattr(args, "route", None)
    )
    write_html(path, render_report(report), store=store)


def write_autoscale_html(path: str, store: Store, result: AutoscaleResult) -> None:
    """``tracekit autoscale --html``: the time line and the recommendation alone."""
    from tracekit.render.html import Report, render_report

    report = Report(
        title=f"tracekit autoscale: {result.release}", source=str(store.path), autoscale=result
    )
    write_html(path, render_report(report), store=store)


def waterfalls(
    store: Store, exemplars: Sequence[Exemplar], note: str
) -> tuple[list[Waterfall], list[str]]:
    """Explain each exemplar trace; a trace that cannot be drawn becomes a note."""
    from tracekit.analysis.attribution.explain import explain_trace
    from tracekit.errors import QueryError
    from tracekit.render.html import Waterfall

    drawn, notes = [], []
    for ex in exemplars:
        try:
            drawn.append(Waterfall(explain_trace(store, ex.trace_id), ex.url, note))
        except QueryError as exc:
            notes.append(f"trace {ex.trace_id}: {exc}")
    return drawn, notes


def gather_report(
    store: Store,
    before: str,
    after: str,
    *,
    gate: GateResult | None = None,
    budgets: Sequence[str] | None = None,
    slo: Slo | None = None,
    window_s: float = 30.0,
    jaeger_url: str | None = None,
    service: str | None = None,
    route: str | None = None,
    confidence: float = 0.95,
    seed: int = 0,
) -> Report:
    """Every part of the release report, from the store: diff, gate (``gate`` when the
    caller already ran it), exemplar waterfalls and, given ``slo``, the autoscaling audit
    of both releases as one time line."""
    from tracekit.analysis.autoscale.audit import audit_autoscaling
    from tracekit.analysis.cohorts.release import load_release
    from tracekit.analysis.compare.diff import diff_releases
    from tracekit.analysis.gate.budgets import parse_budgets
    from tracekit.analysis.gate.evaluate import run_gate
    from tracekit.analysis.training.steps import training_runs
    from tracekit.errors import QueryError
    from tracekit.render.html import Report

    runs = training_runs(store)
    if before in runs and after in runs:
        return training_report(store, before, after)
    diff = diff_releases(
        store,
        before,
        after,
        service=service,
        route=route,
        confidence=confidence,
        seed=seed,
        jaeger_url=jaeger_url,
    )
    if gate is None:
        gate = run_gate(
            store,
            before,
            after,
            budgets=parse_budgets(list(budgets)) if budgets else None,
            confidence=confidence,
            seed=seed,
            service=service,
            route=route,
        )
    primary = diff.verdict.primary_stage
    note = f"From the {after} tail (≥ {diff.tail.cohort})" + (
        f", most {primary} time first." if primary else ", slowest first."
    )
    drawn, notes = waterfalls(store, diff.exemplars, note)
    report = Report(
        title=f"tracekit report: {before} → {after}",
        source=str(store.path),
        diff=diff,
        gate=gate,
        before=load_release(store, before, service=service, route=route),
        after=load_release(store, after, service=service, route=route),
        waterfalls=drawn,
        notes=notes,
    )
    if slo is None:
        report.autoscale_note = (
            'No autoscaling time line: give the latency objective with --slo "p95<200ms".'
        )
        return report
    try:
        audit = audit_autoscaling(
            store, release=[before, after], slo=slo, window_s=window_s, service=service
        )
    except QueryError as exc:
        report.autoscale_note = f"No autoscaling time line: {exc}"
        return report
    if len(audit.windows) < MIN_WINDOWS:
        report.autoscale_note = (
            f"No autoscaling time line: the traces span {len(audit.windows)} window(s) of "
            f"{window_s:g} s; give a shorter --window."
        )
    else:
        report.autoscale = audit
    return report


def training_report(store: Store, before: str, after: str) -> Report:
    """Two training runs: the scaling diff and each run's steps per rank."""
    from tracekit.analysis.training.diff import compare_runs
    from tracekit.analysis.training.steps import load_run
    from tracekit.render.html import Report
    from tracekit.render.html.model import TrainingPart

    b, a = load_run(store, before), load_run(store, after)
    return Report(
        title=f"tracekit report: training {before} → {after}",
        source=str(store.path),
        training=TrainingPart(compare_runs(b, a), [b, a]),
    )


def slow_report(
    store: Store, result: SlowFast, *, service: str | None, route: str | None
) -> Report:
    """``tracekit slow``'s part alone: the gap per stage, the curve, the exemplars."""
    from tracekit.analysis.cohorts.release import load_release
    from tracekit.render.html import Report

    drawn, notes = waterfalls(
        store, result.exemplars, f"From the {result.label} slow cohort (≥ {result.cohort})."
    )
    return Report(
        title=f"tracekit slow: {result.label}",
        source=str(store.path),
        slow=result,
        slow_release=load_release(store, result.label, service=service, route=route),
        waterfalls=drawn,
        notes=notes,
    )


def run(args: argparse.Namespace) -> int:
    from tracekit.render.html import render_report

    check_outputs({"-o/--output": args.output}, store_input(args))
    with open_analysis_store(args, releases=(args.before, args.after)) as store:
        report = gather_report(
            store,
            args.before,
            args.after,
            budgets=args.budget,
            slo=args.slo,
            window_s=args.window,
            jaeger_url=args.jaeger_url,
            service=args.service,
            route=args.route,
            confidence=args.confidence,
        )
    out = write_output(
        args.output, render_report(report), option="-o/--output", inputs=store_input(args)
    )
    size = out.stat().st_size / 1e6
    verdict = (
        report.diff.verdict.summary
        if report.diff
        else report.training.diff.verdict.summary
        if report.training
        else ""
    )
    print(printable(f"wrote {out} ({size:.1f} MB): {verdict}"))
    return 0
