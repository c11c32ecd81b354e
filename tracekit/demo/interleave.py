"""Several releases served at once and loaded in alternating blocks, under equal conditions.

A release measured first and another measured a minute later see different machines:
whatever else runs there (a test suite, a compiler, another engineer) comes and goes, and
on a busy machine that swamps a real regression or invents one. So the releases a
comparison needs all run together: each one's pricing service and ranker start at once
(:func:`start_releases`), then every one but the release under load is frozen
(SIGSTOP), and the load generator visits them in short blocks, a seeded random order per
round (:func:`tracekit.demo.loadgen.run_blocks`). Noise lasting longer than a round
falls on every release alike; noise shorter than a block falls on single requests,
which is what the diff's confidence intervals are for. A frozen release burns no CPU, so
a CPU-hungry regression does not slow the release being measured, and every release's
r-th block gets the same arrivals and request bodies.

Every process is stopped on the way out (thawed first: a frozen process cannot act on
SIGTERM), on success, error or Ctrl-C alike.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tracekit.demo import downstream, service
from tracekit.demo import settings as env
from tracekit.demo.loadgen import Block, LoadResult, block_plan, run_blocks
from tracekit.demo.processes import POLL_S, START_TIMEOUT_S, ServiceProcess, child_environment
from tracekit.errors import TracekitError


@dataclass
class ReleaseRun:
    """One release served under load: its trace files and what the client measured."""

    label: str
    regression: str
    trace_files: list[Path]
    load: LoadResult
    pids: list[int] = field(default_factory=list)
    seconds: float = 0.0


def release_env(
    label: str,
    regression: str,
    seed: int,
    trace_file: Path,
    otlp_endpoint: str,
    otlp_protocol: str = "",
) -> dict[str, str]:
    """What a release's service processes read (see :mod:`tracekit.demo.settings`).

    ``otlp_protocol`` ``"grpc"`` makes ``tracekit.configure()`` export over OTLP/gRPC
    (``OTEL_EXPORTER_OTLP_PROTOCOL``, as any SDK reads it).
    """
    values = {
        env.ENV_HOST: "127.0.0.1",
        env.ENV_PORT: "0",
        env.ENV_VERSION: label,
        env.ENV_REGRESSION: regression,
        env.ENV_SEED: str(seed),
        env.ENV_TRACE_FILE: str(trace_file),
    }
    if otlp_endpoint:
        values[env.ENV_OTLP_ENDPOINT] = otlp_endpoint
    if otlp_protocol:
        values[env.ENV_OTLP_PROTOCOL] = otlp_protocol
    return values


def remove_stale(*paths: Path) -> None:
    """Delete trace files of an earlier run in a kept directory.

    The file exporter appends, and a stale file would mix with this run under the same
    label.
    """
    for path in paths:
        path.unlink(missing_ok=True)


@dataclass
class Release:
    """One release's two processes and trace files."""

    label: str
    regression: str
    pricing: ServiceProcess
    ranker: ServiceProcess
    pricing_file: Path
    ranker_file: Path

    @classmethod
    def in_dir(cls, workdir: Path, label: str, regression: str) -> Release:
        def proc(name: str, module: str) -> ServiceProcess:
            return ServiceProcess(f"{name} {label}", module, workdir / f"{name}-{label}.log")

        return cls(
            label=label,
            regression=regression,
            pricing=proc(downstream.SERVICE_NAME, "tracekit.demo.downstream"),
            ranker=proc(service.SERVICE_NAME, "tracekit.demo.service"),
            pricing_file=workdir / f"{downstream.SERVICE_NAME}-{label}.jsonl",
            ranker_file=workdir / f"{service.SERVICE_NAME}-{label}.jsonl",
        )

    @property
    def pids(self) -> list[int]:
        return [p for p in (self.pricing.pid, self.ranker.pid) if p is not None]

    def pause(self) -> None:
        self.ranker.pause()
        self.pricing.pause()

    def resume(self) -> None:
        self.pricing.resume()
        self.ranker.resume()

    def stop(self) -> None:
        # Ranker first: its last downstream calls finish before pricing goes away.
        self.ranker.stop()
        self.pricing.stop()

    def check(self, load: LoadResult) -> None:
        """Raise, quoting the ranker's log, if nothing was served or traced."""
        if load.completed == 0:
            raise TracekitError(
                f"{self.label}: no request succeeded ({load.errors}); "
                f"end of {self.ranker.log_path}:\n{self.ranker.log_tail()}"
            )
        files = (self.ranker_file, self.pricing_file)
        missing = [p for p in files if not p.exists() or p.stat().st_size == 0]
        if missing:
            raise TracekitError(
                f"{self.label}: no spans were written to {', '.join(map(str, missing))}; "
                f"end of {self.ranker.log_path}:\n{self.ranker.log_tail()}"
            )


def start_releases(
    releases: Sequence[Release],
    *,
    seed: int,
    otlp_endpoint: str,
    timeout_s: float,
    ranker_env: Mapping[str, Mapping[str, str]] | None = None,
    otlp_protocol: str = "",
) -> None:
    """Start every release at once and freeze each as soon as it serves.

    All pricing services first (a ranker's warm-up calls its pricing service), then all
    rankers. A ready release is frozen at once: the ``contention`` regression's thread
    would otherwise burn CPU that the releases still starting need.
    """
    for r in releases:
        remove_stale(r.pricing_file, r.ranker_file)
        values = release_env(
            r.label, r.regression, seed, r.pricing_file, otlp_endpoint, otlp_protocol
        )
        r.pricing.start(child_environment(values), wait=False)
    wait_all_ready([r.pricing for r in releases], timeout_s, on_ready=None)
    by_ranker: dict[int, Release] = {}
    for r in releases:
        values = release_env(
            r.label, r.regression, seed, r.ranker_file, otlp_endpoint, otlp_protocol
        )
        values[env.ENV_DOWNSTREAM_URL] = r.pricing.url
        values.update((ranker_env or {}).get(r.label, {}))
        r.ranker.start(child_environment(values), wait=False)
        by_ranker[id(r.ranker)] = r
    wait_all_ready(
        [r.ranker for r in releases], timeout_s, on_ready=lambda p: by_ranker[id(p)].pause()
    )


def wait_all_ready(
    procs: Sequence[ServiceProcess],
    timeout_s: float,
    on_ready: Callable[[ServiceProcess], None] | None,
) -> None:
    """Wait until every process of ``procs`` serves, calling ``on_ready`` on each as it
    does (``pause`` freezes it there); raises, quoting the first laggard's log, after
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    waiting = list(procs)
    while waiting:
        for p in [p for p in waiting if p.poll_ready()]:
            waiting.remove(p)
            if on_ready is not None:
                on_ready(p)
        if not waiting:
            return
        if time.monotonic() > deadline:
            names = ", ".join(p.name for p in waiting)
            raise TracekitError(
                f"{names} did not become ready within {timeout_s:.0f} s; "
                f"end of {waiting[0].log_path}:\n{waiting[0].log_tail()}"
            )
        time.sleep(POLL_S)


def run_interleaved(
    workdir: Path,
    releases: Sequence[tuple[str, str]],
    *,
    rate: float,
    duration_s: float,
    block_s: float,
    align_s: float = 0.0,
    seed: int = 0,
    otlp_endpoint: str = "",
    console: Console | None = None,
    on_started: Callable[[list[int]], None] | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
    ranker_env: Mapping[str, Mapping[str, str]] | None = None,
    before_stop: Callable[[], None] | None = None,
    otlp_protocol: str = "",
) -> list[ReleaseRun]:
    """Serve every ``(label, regression)`` at once and load each for ``duration_s`` in
    alternating blocks of about ``block_s``; returns one run per release, in order.

    Each slot of the time line (:func:`slot_seconds` long) holds one release's block;
    ``align_s`` keeps blocks that far from the slot edges (see
    :func:`tracekit.demo.loadgen.block_plan`). ``ranker_env`` adds variables to the
    ranker of the release with that label; ``before_stop`` runs after the load, with
    every release thawed (the demo scrapes a ranker's metrics there).
    """
    console = console or Console(stderr=True, highlight=False)
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    runs = [Release.in_dir(workdir, label, regression) for label, regression in releases]
    plan = block_plan(
        len(runs), rate=rate, duration_s=duration_s, block_s=block_s, seed=seed, align_s=align_s
    )
    slot = slot_seconds(duration_s, block_s)
    try:
        names = ", ".join(r.label for r in runs)
        with console.status(f"starting pricing and ranker for {names}…"):
            start_releases(
                runs,
                seed=seed,
                otlp_endpoint=otlp_endpoint,
                timeout_s=start_timeout_s,
                ranker_env=ranker_env,
                otlp_protocol=otlp_protocol,
            )
        for r in runs:
            console.print(
                f"[bold]{r.label}[/]: {r.ranker.name} on {r.ranker.url} → "
                f"{r.pricing.name} on {r.pricing.url}  [dim](regression: {r.regression or 'none'})[/]"
            )
        pids = [p for r in runs for p in r.pids]
        if on_started is not None:
            on_started(pids)
        setup_s = time.monotonic() - started

        rounds = len(plan) // len(runs)
        description = (
            f"load {rate:g}/s, {len(runs)} releases in turn, {rounds} blocks of {slot:g} s each"
        )
        urls = [r.ranker.url + service.PREDICT_PATH for r in runs]
        loads = _drive(urls, plan, slot, runs, description, console)
        if before_stop is not None:
            for r in runs:
                r.resume()
            before_stop()
    finally:
        for r in runs:
            r.stop()
    out = []
    for r, load in zip(runs, loads, strict=True):
        r.check(load)
        summary = load.summary()
        console.print(
            f"[bold]{r.label}[/]: {load.completed}/{load.scheduled} requests ok, "
            f"client p50 {summary['p50_ms']:.1f} ms, p99 {summary['p99_ms']:.1f} ms"
            + (f", [red]{load.failed} failed {load.errors}[/]" if load.failed else "")
        )
        out.append(
            ReleaseRun(
                label=r.label,
                regression=r.regression,
                trace_files=[r.ranker_file, r.pricing_file],
                load=load,
                pids=r.pids,
                seconds=setup_s / len(runs) + load.elapsed_s,
            )
        )
    return out


def slot_seconds(duration_s: float, block_s: float) -> float:
    """Length of one slot of the time line (see :func:`~tracekit.demo.loadgen.block_plan`)."""
    return min(block_s, duration_s)


def _drive(
    urls: Sequence[str],
    plan: Sequence[Block],
    slot_s: float,
    releases: Sequence[Release],
    description: str,
    console: Console,
) -> list[LoadResult]:
    columns = (
        TextColumn(description),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("load", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        return asyncio.run(
            run_blocks(
                urls,
                plan,
                block_s=slot_s,
                pause=lambda i: releases[i].pause(),
                resume=lambda i: releases[i].resume(),
                on_progress=advance,
            )
        )
