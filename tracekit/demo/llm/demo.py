"""``tracekit demo --llm``: two releases of a token-streaming service, and what v2 broke.

Release v1 and release v2 (one injected change, :mod:`tracekit.demo.llm.regressions`)
of the ``llm`` service (:mod:`tracekit.demo.llm.service`) start together and are driven
in alternating blocks, the idle one frozen, as the serving demo's releases are
(:mod:`tracekit.demo.interleave`): whatever else the machine does falls on both alike.
The load (:mod:`tracekit.demo.llm.client`) is open loop, prompts and ``max_tokens``
varied, each answer read as a stream. Then the traces are ingested and the diff of v1
against v2 printed through the front door — time to first token and time per output
token beside end-to-end latency — and the serving demo's result lines say what was
injected, what the diff of its own metric should name, and what it named (✓ or ✗).

:func:`run_llm_load` is the load and ingest alone (what the tests run);
:func:`run_llm_demo` adds the diffs and the result.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from tracekit.demo.interleave import release_env, remove_stale, wait_all_ready
from tracekit.demo.llm import service
from tracekit.demo.llm.client import StreamLoad, run_stream_blocks
from tracekit.demo.llm.regressions import LlmRegression, get_llm_regression
from tracekit.demo.loadgen import block_plan
from tracekit.demo.processes import START_TIMEOUT_S, ServiceProcess, child_environment
from tracekit.errors import TracekitError

BEFORE, AFTER = "v1", "v2"
DB_NAME = "tracekit.duckdb"
BLOCK_S = 0.5
"""Seconds per block of load: short, so that a burst of the machine's other work lands
on both releases' blocks alike."""
ALIGN_S = 0.05
"""Distance of each block from its slot's edges (see ``loadgen.block_plan``)."""
ROUNDS = 30
"""Blocks per release in ``tracekit demo --llm``: 15 s of load each."""
RATE = 30.0
"""Requests per second (Poisson arrivals) within a block (each block's first and last
50 ms are free): prompts of 8–96 bytes, 4–24 tokens each. A request then holds a slot
for about 60 ms, so v1's 8 slots are a quarter busy, and ``kv``'s 2 about full: requests
queue within a block, and its end drains them. ``decode`` keeps the 8 slots and makes
each step slower."""
METRICS = ("e2e", "ttft", "tpot")
"""The diffs printed, in order: end to end, time to first token, time per output token."""


@dataclass
class LlmRelease:
    """One release: its service process and trace file."""

    label: str
    regression: str
    process: ServiceProcess
    trace_file: Path

    @classmethod
    def in_dir(cls, workdir: Path, label: str, regression: str) -> LlmRelease:
        name = f"{service.SERVICE_NAME}-{label}"
        return cls(
            label=label,
            regression=regression,
            process=ServiceProcess(
                f"{service.SERVICE_NAME} {label}",
                "tracekit.demo.llm.service",
                workdir / f"{name}.log",
            ),
            trace_file=workdir / f"{name}.jsonl",
        )

    def check(self, load: StreamLoad) -> None:
        """Raise, quoting the service's log, if nothing was served or traced."""
        if load.completed == 0:
            raise TracekitError(
                f"{self.label}: no request was served ({load.errors}); "
                f"end of {self.process.log_path}:\n{self.process.log_tail()}"
            )
        if not self.trace_file.exists() or self.trace_file.stat().st_size == 0:
            raise TracekitError(
                f"{self.label}: no spans were written to {self.trace_file}; "
                f"end of {self.process.log_path}:\n{self.process.log_tail()}"
            )


@dataclass
class LlmLoad:
    """What :func:`run_llm_load` ran: the store, each release's load, what it started."""

    db: Path
    loads: dict[str, StreamLoad]
    trace_files: list[Path]
    pids: list[int]
    skipped: int
    """Inputs ingest skipped (0: all kept)."""
    seconds: float


def run_llm_load(
    workdir: Path,
    regression: LlmRegression,
    *,
    seed: int = 0,
    rounds: int = ROUNDS,
    rate: float = RATE,
    console: Console | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> LlmLoad:
    """Serve v1 and v2 at once, drive them in turns, stop them, ingest their traces.

    Every process started is stopped before this returns or raises (thawed first).
    """
    from tracekit.demo.runner import ingest

    console = console or Console(stderr=True, highlight=False)
    began = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / DB_NAME
    db.unlink(missing_ok=True)
    releases = [
        LlmRelease.in_dir(workdir, BEFORE, ""),
        LlmRelease.in_dir(workdir, AFTER, regression.name),
    ]
    plan = block_plan(
        len(releases),
        rate=rate,
        duration_s=rounds * BLOCK_S,
        block_s=BLOCK_S,
        seed=seed,
        align_s=ALIGN_S,
    )
    procs = [r.process for r in releases]
    try:
        with console.status("starting the llm service for v1 and v2…"):
            for r in releases:
                remove_stale(r.trace_file)
                values = release_env(r.label, r.regression, seed, r.trace_file, "")
                r.process.start(child_environment(values), wait=False)
            wait_all_ready(procs, start_timeout_s, on_ready=lambda p: p.pause())
        for r in releases:
            console.print(
                f"[bold]{r.label}[/]: {r.process.name} on {r.process.url}  "
                f"[dim](regression: {r.regression or 'none'})[/]"
            )
        with console.status(
            f"load {rate:g}/s, v1 and v2 in turn, {rounds} blocks of {BLOCK_S:g} s each…"
        ):
            urls = [r.process.url + service.GENERATE_PATH for r in releases]
            loads = asyncio.run(
                run_stream_blocks(
                    urls,
                    plan,
                    block_s=BLOCK_S,
                    pause=lambda i: procs[i].pause(),
                    resume=lambda i: procs[i].resume(),
                )
            )
    finally:
        for p in procs:
            p.stop()
    for r, load in zip(releases, loads, strict=True):
        r.check(load)
        console.print(
            f"[bold]{r.label}[/]: {load.completed}/{load.scheduled} requests served "
            f"({load.tokens:,} tokens), client TTFT p50 {load.ttft_quantile(0.5):.1f} ms, "
            f"e2e p50 {load.quantile(0.5):.1f} ms, p95 {load.quantile(0.95):.1f} ms"
            + (f", [red]{load.failed} failed {load.errors}[/]" if load.failed else "")
        )
    files = [r.trace_file for r in releases]
    seconds = time.monotonic() - began
    with console.status("ingesting traces…"):
        skipped = ingest(db, files)
    return LlmLoad(
        db=db,
        loads={r.label: load for r, load in zip(releases, loads, strict=True)},
        trace_files=files,
        pids=[p for p in (proc.pid for proc in procs) if p is not None],
        skipped=skipped,
        seconds=seconds,
    )


@dataclass(frozen=True)
class Named:
    """What one diff's verdict named."""

    metric: str
    stage: str
    kind: str

    def __str__(self) -> str:
        found = self.kind if self.kind == "none" else f"{self.stage} ({self.kind})"
        return f"{found} in {self.metric}"


def report(db: Path) -> list[Named]:
    """Print the diff of v1 against v2 for each metric; what each one named."""
    from tracekit.analysis.facade import Analysis, DiffResult
    from tracekit.demo.runner import show, step

    named: list[Named] = []
    out = Console(file=sys.stdout, highlight=False)
    with Analysis.open(db) as analysis:
        for metric in METRICS:
            kwargs: dict[str, Any] = {} if metric == "e2e" else {"metric": metric}
            flag = "" if metric == "e2e" else f" --metric {metric}"
            out.rule(f"[bold]tracekit diff --before {BEFORE} --after {AFTER}{flag}[/]")
            sys.stdout.flush()
            diff = step("diff", functools.partial(analysis.diff, BEFORE, AFTER, **kwargs))
            if diff is None:
                continue
            assert isinstance(diff, DiffResult)  # v1 and v2 are releases, not training runs
            show(diff)
            named.append(Named(metric, diff.verdict.primary_stage or "", diff.verdict.kind))
    return named


def judge(regression: LlmRegression, named: Sequence[Named]) -> tuple[str, bool, str]:
    """(what the diff of the regression's own metric found, whether that is the expected
    stage and kind, what the other diffs found) for the result lines."""
    own = next((n for n in named if n.metric == regression.metric), None)
    ok = own is not None and (own.stage, own.kind) == (
        regression.expected_stage,
        regression.expected_kind,
    )
    found = str(own) if own is not None else f"nothing (the {regression.metric} diff failed)"
    others = ", ".join(str(n) for n in named if n is not own)
    return found, ok, f"also: {others}" if others else ""


def print_verdict(regression: LlmRegression, named: Sequence[Named]) -> None:
    """The serving demo's result lines: injected, expected, found with ✓ or ✗."""
    from tracekit.demo.runner import print_result

    found, ok, tail = judge(regression, named)
    print_result(
        target=AFTER,
        injected=regression.name,
        description=regression.description,
        expected=f"{regression.expected} in {regression.metric}",
        found=found,
        ok=ok,
        tail=tail,
    )


def run_llm_demo(
    regression: str,
    *,
    keep: Path | None = None,
    seed: int = 0,
    rounds: int | None = None,
    rate: float = RATE,
) -> int:
    """The whole LLM demo; 0 once it ran, whatever the verdict (it is printed).
    ``rounds``: blocks of load per release (default :data:`ROUNDS`)."""
    from tracekit.demo.runner import _terminate_as_interrupt, stderr_console

    change = get_llm_regression(regression)
    console = stderr_console()
    workdir = keep if keep is not None else Path(tempfile.mkdtemp(prefix="tracekit-llm-"))
    began = time.monotonic()
    try:
        with _terminate_as_interrupt():
            console.print(
                f"[bold]tracekit demo --llm[/]: v1 = baseline, v2 = [bold]{change.name}[/] "
                f"({change.description})"
            )
            rounds = ROUNDS if rounds is None else rounds
            load = run_llm_load(workdir, change, seed=seed, rounds=rounds, rate=rate)
            if load.skipped:
                console.print(f"[yellow]tracekit ingest skipped {load.skipped:,} inputs[/]")
            print_verdict(change, report(load.db))
            total = time.monotonic() - began
            kept = f"files kept in {workdir}" if keep is not None else "temporary files removed"
            console.print(
                f"[dim]run time {total:.0f} s: both releases {load.seconds:.0f} s, "
                f"ingest and analysis {total - load.seconds:.0f} s; {kept}[/]"
            )
        return 0
    finally:
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
