"""``tracekit demo`` end to end: run v1 and v2 (with a regression), let tracekit find it.

The runner starts each release's pricing service and ranker as subprocesses on loopback
(ports from the OS), all at once, and drives the rankers with the open-loop load
generator in alternating blocks of :data:`BLOCK_S`, the release not under load frozen
meanwhile (:mod:`tracekit.demo.interleave`): whatever else the machine does falls on
both releases alike, so a busy machine can neither hide v2's regression nor invent one.
Then it stops them all, which flushes their OTLP JSON-lines trace files, ingests the
files into a DuckDB store and prints what ``tracekit summary``, ``diff``,
``gate`` and ``autoscale`` say (autoscale windows of one block each), through the same
front door (:class:`tracekit.Analysis`) and renderers the commands use. Every process it started is stopped on the way out,
on success, error or Ctrl-C alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tracekit.demo import downstream, service
from tracekit.demo import settings as env
from tracekit.demo.interleave import (
    ReleaseRun,
    release_env,
    remove_stale,
    run_interleaved,
    slot_seconds,
)
from tracekit.demo.loadgen import LoadResult, run_load
from tracekit.demo.processes import ServiceProcess, child_environment
from tracekit.demo.regressions import DEFAULT_REGRESSION, Regression, get_regression
from tracekit.errors import TracekitError
from tracekit.outputs import claim_output_dir
from tracekit.units import parse_duration_ms

DEFAULT_DURATION_S = env.DEFAULT_DURATION_S
DEFAULT_RATE = env.DEFAULT_RATE
BEFORE, AFTER = "v1", "v2"
DB_NAME = "tracekit.duckdb"
BLOCK_S = env.DEFAULT_BLOCK_S
ALIGN_S = 0.05
"""Distance of each block from its window's edges (see ``loadgen.block_plan``)."""


@dataclass(frozen=True)
class DemoOptions:
    """What ``tracekit demo`` was asked to do."""

    regression: str = DEFAULT_REGRESSION
    duration_s: float = DEFAULT_DURATION_S
    rate: float = DEFAULT_RATE
    otlp_endpoint: str = ""
    keep: Path | None = None
    seed: int = 0
    collect: bool = False
    """Send the spans to a ``tracekit collect`` started for the run instead of files."""
    collect_protocol: str = "http"
    """``http`` (OTLP/HTTP protobuf) or ``grpc``: how the services export to it."""


def stderr_console() -> Console:
    return Console(stderr=True, highlight=False)


def run_release(
    workdir: Path,
    label: str,
    regression: str,
    *,
    rate: float,
    duration_s: float,
    seed: int = 0,
    otlp_endpoint: str = "",
    console: Console | None = None,
    on_started: Callable[[list[int]], None] | None = None,
    ranker_env: dict[str, str] | None = None,
    before_stop: Callable[[], None] | None = None,
) -> ReleaseRun:
    """Start pricing and ranker for ``label``, drive them, stop them; returns the traces.

    One release alone, as ``docker compose`` runs each; the demo itself runs both
    releases interleaved (:func:`tracekit.demo.interleave.run_interleaved`).

    ``ranker_env`` is added to the ranker's environment; ``before_stop`` runs after the
    load, while both services still run (the demo scrapes the ranker's metrics there).
    """
    extra_env = ranker_env or {}
    console = console or stderr_console()
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    pricing_file = workdir / f"{downstream.SERVICE_NAME}-{label}.jsonl"
    ranker_file = workdir / f"{service.SERVICE_NAME}-{label}.jsonl"
    remove_stale(pricing_file, ranker_file)
    pricing = ServiceProcess(
        f"{downstream.SERVICE_NAME} {label}",
        "tracekit.demo.downstream",
        workdir / f"{downstream.SERVICE_NAME}-{label}.log",
    )
    ranker = ServiceProcess(
        f"{service.SERVICE_NAME} {label}",
        "tracekit.demo.service",
        workdir / f"{service.SERVICE_NAME}-{label}.log",
    )
    try:
        with console.status(f"[bold]{label}[/]: starting {pricing.name} and {ranker.name}…"):
            pricing.start(
                child_environment(release_env(label, regression, seed, pricing_file, otlp_endpoint))
            )
            ranker_vars = release_env(label, regression, seed, ranker_file, otlp_endpoint)
            ranker_vars[env.ENV_DOWNSTREAM_URL] = pricing.url
            ranker_vars.update(extra_env)
            ranker.start(child_environment(ranker_vars))
        pids = [p for p in (pricing.pid, ranker.pid) if p is not None]
        console.print(
            f"[bold]{label}[/]: {ranker.name} on {ranker.url} → {pricing.name} on {pricing.url}"
            f"  [dim](regression: {regression or 'none'})[/]"
        )
        if on_started is not None:
            on_started(pids)
        load = _drive(ranker.url + service.PREDICT_PATH, label, rate, duration_s, seed, console)
        if before_stop is not None:
            before_stop()
    finally:
        # Ranker first: its last downstream calls finish before pricing goes away.
        ranker.stop()
        pricing.stop()
    if load.completed == 0:
        raise TracekitError(
            f"{label}: no request succeeded ({load.errors}); end of {ranker.log_path}:\n"
            f"{ranker.log_tail()}"
        )
    missing = [p for p in (ranker_file, pricing_file) if not p.exists() or p.stat().st_size == 0]
    if missing:
        raise TracekitError(
            f"{label}: no spans were written to {', '.join(map(str, missing))}; "
            f"end of {ranker.log_path}:\n{ranker.log_tail()}"
        )
    summary = load.summary()
    console.print(
        f"[bold]{label}[/]: {load.completed}/{load.scheduled} requests ok, "
        f"client p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms"
        + (f", [red]{load.failed} failed {load.errors}[/]" if load.failed else "")
    )
    return ReleaseRun(
        label=label,
        regression=regression,
        trace_files=[ranker_file, pricing_file],
        load=load,
        pids=pids,
        seconds=time.monotonic() - started,
    )


def _drive(
    url: str, label: str, rate: float, duration_s: float, seed: int, console: Console
) -> LoadResult:
    columns = (
        TextColumn(f"[bold]{label}[/]: load {rate:g}/s for {duration_s:g} s"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("load", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return asyncio.run(
            run_load(url, rate=rate, duration_s=duration_s, seed=seed, on_progress=advance)
        )


# --- analysis: the front door, in-process ------------------------------------------


def show(result: Any) -> None:
    """Print ``result`` as its command's table does (the renderers the CLI uses)."""
    from tracekit.render import render

    text = render(result, "table")
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


T = TypeVar("T")


def step(command: str, run: Callable[[], T]) -> T | None:
    """One step of the analysis; an error in it is printed as its command prints it,
    and the demo goes on with the next (None stands for the missing result)."""
    from tracekit.render.text import printable

    try:
        return run()
    except TracekitError as exc:
        print(printable(f"tracekit {command}: error: {exc}"), file=sys.stderr, flush=True)
        return None


def ingest(db: Path, files: Sequence[Path]) -> int:
    """Ingest the trace files into ``db``; the number of inputs skipped (0: all kept)."""
    from tracekit.analysis.facade import ingest as ingest_files
    from tracekit.render.ingest import problem_lines
    from tracekit.render.text import printable

    outcome = ingest_files(files, store=db)
    for line in problem_lines(outcome):
        print(printable(line), file=sys.stderr)
    show(outcome)
    return outcome.report.skipped


def slo_for(baseline: LoadResult) -> int:
    """An SLO for the autoscale audit: v1's client p95 with 10% headroom, in 5 ms steps.

    v1 meets it by construction; whether v2 does is what the audit looks at.
    """
    p95 = baseline.quantile(0.95)
    if math.isnan(p95):
        return 100
    return max(10, int(math.ceil(p95 * 1.1 / 5.0)) * 5)


def window_for(duration_s: float) -> float:
    """Autoscale windows (seconds) of one block each: each holds one release's load."""
    return slot_seconds(duration_s, BLOCK_S)


def _heading(text: str) -> None:
    Console(file=sys.stdout, highlight=False).rule(f"[bold]{text}[/]")
    sys.stdout.flush()


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM ends the demo like Ctrl-C does: through the clean-up path."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _workdir(keep: Path | None) -> tuple[Path, bool]:
    if keep is not None:
        # Only a directory the demo may fill: it replaces the store and traces it finds.
        claim_output_dir(keep, option="--keep", owner="tracekit demo")
        return keep, False
    return Path(tempfile.mkdtemp(prefix="tracekit-demo-")), True


def run_demo(options: DemoOptions) -> int:
    """The whole demo; returns 0 when every step ran (whatever the gate decided)."""
    regression: Regression = get_regression(options.regression)
    console = stderr_console()
    workdir, temporary = _workdir(options.keep)
    db = workdir / DB_NAME
    began = time.monotonic()
    try:
        with _terminate_as_interrupt():
            db.unlink(missing_ok=True)
            console.print(
                f"[bold]tracekit demo[/]: v1 = baseline, v2 = [bold]{regression.name}[/] "
                f"({regression.description})"
            )
            scraped: list[str] = []
            with contextlib.ExitStack() as stack:
                endpoint, ranker_vars, scrape_v2 = options.otlp_endpoint, None, None
                protocol = ""
                if options.collect:
                    from tracekit.demo import collect_loop

                    urls, collected = stack.enter_context(
                        collect_loop.running_collector(db, workdir / "collect.log")
                    )
                    grpc = options.collect_protocol == "grpc"
                    endpoint = urls.grpc if grpc else urls.http
                    protocol = "grpc" if grpc else ""
                    port = collect_loop.free_port()
                    ranker_vars = collect_loop.metrics_env(port)
                    shown = "OTLP/gRPC" if grpc else "OTLP/HTTP"
                    console.print(f"spans go to [bold]tracekit collect[/] at {endpoint} ({shown})")

                    def scrape_v2() -> None:
                        scraped.extend(collect_loop.metrics_lines(collect_loop.scrape(port)))

                runs = run_interleaved(
                    workdir,
                    ((BEFORE, ""), (AFTER, regression.name)),
                    rate=options.rate,
                    duration_s=options.duration_s,
                    block_s=BLOCK_S,
                    align_s=ALIGN_S,
                    seed=options.seed,
                    otlp_endpoint=endpoint,
                    console=console,
                    # Only v2's ranker serves metrics: both run at once, on one port.
                    ranker_env={AFTER: ranker_vars} if ranker_vars else None,
                    before_stop=scrape_v2,
                    otlp_protocol=protocol,
                )
            if options.collect:
                console.print(collected[-1] if collected else "tracekit collect stopped")
            analysed = time.monotonic()
            html = None if temporary else workdir / "report.html"
            report(
                db,
                runs,
                regression,
                console,
                options.duration_s,
                html=html,
                collected=options.collect,
                scraped=scraped,
            )
            console.print(
                f"[dim]run time {time.monotonic() - began:.0f} s: "
                + f"both releases {analysed - began:.0f} s, "
                + f"analysis {time.monotonic() - analysed:.0f} s; "
                + (f"files kept in {workdir}" if not temporary else "temporary files removed")
                + "[/]"
            )
        return 0
    finally:
        if temporary:
            shutil.rmtree(workdir, ignore_errors=True)


def report(
    db: Path,
    runs: Sequence[ReleaseRun],
    regression: Regression,
    console: Console,
    duration_s: float,
    *,
    html: Path | None = None,
    collected: bool = False,
    scraped: Sequence[str] = (),
) -> None:
    """Ingest both releases and print summary, diff, gate and autoscale, then the check;
    with ``html``, also write the HTML report there and print its path. ``collected``:
    the store was filled by ``tracekit collect``; ``scraped`` is the ranker's metrics
    endpoint in a few lines, printed beside the scaling recommendation."""
    from tracekit.analysis.facade import Analysis, DiffResult

    files = [f for run in runs for f in run.trace_files]
    if not collected:
        with console.status("ingesting traces…"):
            skipped = ingest(db, files)
        if skipped:
            console.print(
                f"[yellow]tracekit ingest skipped {skipped:,} inputs; analysing what it stored[/]"
            )
    slo, window = slo_for(runs[0].load), window_for(duration_s)
    with Analysis.open(db) as analysis:
        _heading(f"tracekit summary --version {AFTER}")
        step("summary", lambda: show(analysis.summary(AFTER)))
        _heading(f"tracekit diff --before {BEFORE} --after {AFTER}")
        diff = analysis.diff(BEFORE, AFTER)  # no verdict, no demo: this one may raise
        assert isinstance(diff, DiffResult)  # v1 and v2 are releases, not training runs
        show(diff)
        budgets = " ".join(f"--budget '{b}'" for b in env.GATE_BUDGETS)
        _heading(
            f"tracekit gate --before {BEFORE} --after {AFTER} {budgets} "
            f"--min-effect {env.GATE_MIN_EFFECT}"
        )
        gate = step(
            "gate",
            lambda: analysis.gate(
                BEFORE,
                AFTER,
                budgets=env.GATE_BUDGETS,
                min_effect_ms=parse_duration_ms(env.GATE_MIN_EFFECT),
            ),
        )
        if gate is not None:
            show(gate)
        objective = f"p95<{slo}ms"
        _heading(
            f'tracekit autoscale --version {BEFORE} --version {AFTER} --slo "{objective}" --window {window:g}s'
        )
        audit = step(
            "autoscale", lambda: analysis.autoscale([BEFORE, AFTER], slo=objective, window_s=window)
        )
        if audit is not None:
            show(audit)
        if scraped:
            _heading(
                f"ranker {AFTER} metrics endpoint, scraped once (the series the snippets name)"
            )
            print("\n".join(scraped), flush=True)
        if html is not None:
            _heading(f"tracekit report --before {BEFORE} --after {AFTER} -o {html}")
            step(
                "report", lambda: write_report(analysis, html, gate, slo=objective, window_s=window)
            )
    stage, kind = diff.verdict.primary_stage, diff.verdict.kind
    gate_word = "error" if gate is None else str(gate.result)
    expected = (
        "none"
        if not regression.expected_stages
        else f"{' or '.join(regression.expected_stages)} ({regression.expected_kind})"
    )
    matched = kind == regression.expected_kind and (
        not regression.expected_stages or stage in regression.expected_stages
    )
    found = kind if kind == "none" else f"{stage} ({kind})"
    tail = f"gate: {gate_word}"
    if not regression.expected_stages:  # no change: the gate must pass it, too
        expected, found, tail = f"{expected}, gate pass", f"{found}, gate {gate_word}", ""
        matched = matched and gate_word == "pass"
    print_result(
        target=AFTER,
        injected=regression.name,
        description=regression.description,
        expected=expected,
        found=found,
        ok=matched,
        tail=tail,
    )


def print_result(
    *,
    target: str,
    injected: str,
    description: str,
    expected: str,
    found: str,
    ok: bool,
    command: str = "diff",
    tail: str = "",
    heading: bool = True,
) -> None:
    """Every demo's closing lines: what it injected, what it expected, what tracekit found.

    ``injected in v2: batch — …`` / ``expected: batch_queue (wait)`` / ``tracekit diff
    found: batch_queue (wait) ✓   gate: fail`` under a ``result`` rule, ✗ where it missed;
    ``tail`` follows the mark. The texts are plain (escaped here, never markup). A demo
    with an expectation per target calls it once each, ``heading=False`` after the first.
    """
    from rich.markup import escape

    if heading:
        _heading("result")
    out = Console(file=sys.stdout, highlight=False)
    out.print(f"injected in {escape(target)}: [bold]{escape(injected)}[/] — {escape(description)}")
    out.print(f"expected: {escape(expected)}")
    mark = "[green]✓[/]" if ok else "[red]✗[/]"
    out.print(
        f"tracekit {escape(command)} found: [bold]{escape(found)}[/] {mark}"
        + (f"   {escape(tail)}" if tail else "")
    )
    sys.stdout.flush()


def write_report(analysis: Any, html: Path, gate: Any | None, *, slo: str, window_s: float) -> None:
    """The release report of the run, as ``tracekit report`` writes it."""
    from tracekit.outputs import write_output
    from tracekit.render.html import render_report
    from tracekit.render.text import printable

    page = analysis.report(BEFORE, AFTER, gate=gate, slo=slo, window_s=window_s)
    out = write_output(html, render_report(page), option="-o/--output")
    size = out.stat().st_size / 1e6
    print(printable(f"wrote {out} ({size:.1f} MB): {page.verdict}"), flush=True)
