"""``tracekit demo --capacity``: two batcher configurations under bursty load.

Release ``A`` batches little and often (at most 2 requests, 1 ms wait, two workers);
release ``B`` batches big (16 requests, 20 ms wait, one worker). Both run at once, as
the serving demo's releases do (:mod:`tracekit.demo.interleave`), and are driven in
alternating blocks, the idle one frozen, so that a busy machine falls on both alike.
The load is open loop and bursty: a quiet base rate with a few spike blocks of
:data:`SPIKE_FACTOR` times that rate, the same blocks (arrival times and bodies) for
both releases. The batcher reaches the ranker through :data:`~tracekit.demo.settings.
ENV_BATCH`. After the load the traces are ingested and ``tracekit capacity`` says, per
release, which binds first: latency in the spikes or cost per request.

:func:`run_capacity_load` is the load and ingest alone (what the tests run);
:func:`run_capacity_demo` adds the verdict, through the front door only.
"""

from __future__ import annotations

import asyncio
import random
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from tracekit.demo import service
from tracekit.demo import settings as env
from tracekit.demo.interleave import Release, start_releases
from tracekit.demo.loadgen import Block, LoadResult, arrival_offsets, run_blocks
from tracekit.demo.processes import START_TIMEOUT_S
from tracekit.errors import ConfigError

if TYPE_CHECKING:
    from tracekit.analysis.facade import CapacityResult

DB_NAME = "tracekit.duckdb"


@dataclass(frozen=True)
class BatchConfig:
    """One release: its batcher, its stand-in accelerator and that accelerator's price."""

    label: str
    knobs: env.BatchKnobs
    price_per_h: float
    """What a replica of this release costs per hour (``--replica-cost LABEL=…``)."""
    name: str
    """What it stands for, in a few words (the result's ``injected in A: …`` line)."""
    expected: str
    """The verdict ``tracekit capacity`` should give it."""

    def describe(self) -> str:
        k = self.knobs
        workers = "one worker" if k.workers == 1 else f"{k.workers} workers"
        return (
            f"batches of ≤{k.max_batch_size}, {k.max_wait_ms:g} ms wait, {workers}; "
            f"device {k.device_fixed_ms:g} ms + {k.device_per_request_ms:g} ms a request, "
            f"${self.price_per_h:.2f}/h"
        )


RELEASES: tuple[BatchConfig, ...] = (
    BatchConfig(
        "A",
        env.BatchKnobs(2, 1.0, 2, 2.0, 1.0),
        price_per_h=4.00,
        name="small batches on a fast, dear accelerator",
        expected="cost_bound",
    ),
    BatchConfig(
        "B",
        env.BatchKnobs(16, 20.0, 1, 5.0, 40.0),
        price_per_h=1.20,
        name="big batches on a slow, cheap accelerator",
        expected="latency_bound",
    ),
)
"""A: small batches on two workers of a fast, dear accelerator — quick, and mostly idle.
B: big batches on one worker of a slow, cheap one — a full batch of 16 takes 645 ms, so
above ~25 requests/s (a spike is 40) it cannot keep up, while in the quiet blocks (10/s)
it runs batches of 1–2 at 45–85 ms, busy less than half the time. The accelerators are
stand-ins (the batch's execution waits fixed + per-request ms with the GIL released, as
a host thread waits for a GPU); tracekit sees them only as the model executions' wall
time. Sleeps cost no CPU, so a busy machine slows B's spikes no less and A's requests
little: the margins are in the stand-ins, not in the machine's speed."""
FIRST = "B"
"""The release the summary should say to fix first."""

BLOCK_S = 3.0
"""Seconds per block, and the capacity windows: each window holds one release's block."""
ALIGN_S = 0.25
"""Distance of each block from its window's edges (see ``loadgen.block_plan``): room for
requests sent late on a busy machine to stay in their block's window."""
ROUNDS = 7
"""Blocks per release: 7 × 3 s of load each, 42 s for both."""
BASE_RATE = 10.0
"""Requests per second outside the spikes: few, so that the demo's own processes leave a
busy 2-core machine room (each request costs ~10 ms of CPU across client and services);
with :data:`MIN_BLOCK_REQUESTS`, enough for a window's p95."""
SPIKE_FACTOR = 4.0
"""A spike block's rate ÷ the base rate."""
SPIKES = 2
"""Spike blocks per release; never the first block, so the run starts quiet."""
SLO = "p95<1000ms"
"""The objective, between the two with room on either side: A's p95 is tens of ms (a few
hundred on a loaded machine); B's is ~100–300 ms in quiet blocks and 1.5–2 s in the
spikes, where its one worker runs full batches of 16 at 645 ms each and its queue grows
by ~15 requests a second."""
WINDOW_S = BLOCK_S
MIN_BLOCK_REQUESTS = 24
"""A block with fewer arrivals is drawn again: a window's p95 needs 20 accepted requests."""


@dataclass(frozen=True)
class BurstPlan:
    """The blocks of a bursty run and which rounds spike."""

    blocks: list[Block]
    spike_rounds: tuple[int, ...]
    rates: tuple[float, ...]
    """Arrival rate of each round."""


def burst_plan(
    targets: int,
    *,
    rounds: int = ROUNDS,
    base_rate: float = BASE_RATE,
    spike_factor: float = SPIKE_FACTOR,
    spikes: int = SPIKES,
    block_s: float = BLOCK_S,
    align_s: float = ALIGN_S,
    seed: int = 0,
) -> BurstPlan:
    """Like :func:`tracekit.demo.loadgen.block_plan`, but ``spikes`` rounds (seeded, never
    round 0) run at ``spike_factor`` × ``base_rate``; every target gets the same arrivals
    and bodies in a round, in a seeded order per round."""
    if rounds < spikes + 1 or spikes < 0:
        raise ConfigError("capacity demo: need more rounds than spikes")
    if block_s <= 3 * align_s:
        raise ConfigError(f"capacity demo: blocks of {block_s:g} s are too short to align")
    rng = random.Random(seed)
    spike_rounds = tuple(sorted(rng.sample(range(1, rounds), spikes)))
    rates = tuple(base_rate * (spike_factor if r in spike_rounds else 1.0) for r in range(rounds))
    blocks: list[Block] = []
    for r in range(rounds):
        block_seed = rng.getrandbits(32)
        offsets = arrival_offsets(rates[r], block_s - 2 * align_s, block_seed)
        while len(offsets) < MIN_BLOCK_REQUESTS:
            # Too few for the window's p95 to be judged: draw this block again.
            block_seed = rng.getrandbits(32)
            offsets = arrival_offsets(rates[r], block_s - 2 * align_s, block_seed)
        if offsets:
            offsets = [o - offsets[0] + align_s for o in offsets]
        order = list(range(targets))
        rng.shuffle(order)
        for t in order:
            # Each target's first block starts at its slot's start: its windows (which
            # begin at its first arrival) then sit on the slots, and every later block
            # keeps align_s off both edges of its window, whatever the send jitter.
            first = offsets and not any(b.target == t for b in blocks)
            lead = align_s if first else 0.0
            blocks.append(Block(t, r, tuple(o - lead for o in offsets), block_seed))
    return BurstPlan(blocks=blocks, spike_rounds=spike_rounds, rates=rates)


@dataclass
class CapacityLoad:
    """What :func:`run_capacity_load` ran: the store, each release's load, the plan."""

    db: Path
    loads: dict[str, LoadResult]
    plan: BurstPlan
    trace_files: dict[str, list[Path]]
    pids: list[int]
    skipped: int
    """Inputs ingest skipped (0: all kept)."""


def run_capacity_load(
    workdir: Path,
    *,
    seed: int = 0,
    rounds: int = ROUNDS,
    base_rate: float = BASE_RATE,
    console: Console | None = None,
    start_timeout_s: float = START_TIMEOUT_S,
) -> CapacityLoad:
    """Serve A and B at once, drive them with the bursty plan, stop them, ingest.

    Every process started is stopped before this returns or raises (thawed first).
    """
    from tracekit.demo.runner import ingest

    console = console or Console(stderr=True, highlight=False)
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / DB_NAME
    db.unlink(missing_ok=True)
    releases = [Release.in_dir(workdir, c.label, "") for c in RELEASES]
    plan = burst_plan(len(releases), rounds=rounds, base_rate=base_rate, seed=seed)
    batch_env = {c.label: {env.ENV_BATCH: c.knobs.env_value()} for c in RELEASES}
    try:
        with console.status("starting pricing and ranker for A and B…"):
            start_releases(
                releases,
                seed=seed,
                otlp_endpoint="",
                timeout_s=start_timeout_s,
                ranker_env=batch_env,
            )
        for r, c in zip(releases, RELEASES, strict=True):
            console.print(f"[bold]{r.label}[/]: {r.ranker.name} on {r.ranker.url}: {c.describe()}")
        spikes = ", ".join(str(n + 1) for n in plan.spike_rounds)
        console.print(
            f"load: {rounds} blocks of {BLOCK_S:g} s per release at {base_rate:g}/s, "
            f"blocks {spikes} at {base_rate * SPIKE_FACTOR:g}/s; A and B in turn"
        )
        urls = [r.ranker.url + service.PREDICT_PATH for r in releases]
        with console.status("driving A and B in turns…"):
            results = asyncio.run(
                run_blocks(
                    urls,
                    plan.blocks,
                    block_s=BLOCK_S,
                    pause=lambda i: releases[i].pause(),
                    resume=lambda i: releases[i].resume(),
                )
            )
    finally:
        for r in releases:
            r.stop()
    for r, load in zip(releases, results, strict=True):
        r.check(load)
        s = load.summary()
        console.print(
            f"[bold]{r.label}[/]: {load.completed}/{load.scheduled} requests ok, "
            f"client p50 {s['p50_ms']:.1f} ms, p95 {s['p95_ms']:.1f} ms"
            + (f", [red]{load.failed} failed {load.errors}[/]" if load.failed else "")
        )
        lag_ms = s["max_send_lag_ms"]
        if lag_ms > ALIGN_S * 1000:
            # Sent later than a block's margin: it may spill into the next window, and
            # the windows no longer hold one block each, as the verdicts assume.
            console.print(
                f"[yellow]{r.label}: the machine was too busy for the load generator: "
                f"requests left up to {lag_ms / 1000:.1f} s late (a block's margin is "
                f"{ALIGN_S:g} s), so a block may have spilled out of its window[/]"
            )
    files = {r.label: [r.ranker_file, r.pricing_file] for r in releases}
    with console.status("ingesting traces…"):
        skipped = ingest(db, [f for fs in files.values() for f in fs])
    return CapacityLoad(
        db=db,
        loads={r.label: load for r, load in zip(releases, results, strict=True)},
        plan=plan,
        trace_files=files,
        pids=[p for r in releases for p in r.pids],
        skipped=skipped,
    )


def report(db: Path) -> CapacityResult | None:
    """Print ``tracekit capacity``'s table for A and B, through the front door; the result
    (None when the analysis failed, its error printed)."""
    from tracekit.analysis.facade import Analysis
    from tracekit.demo.runner import show, step

    labels = [c.label for c in RELEASES]
    prices = [f"{c.label}={c.price_per_h:.2f}/h" for c in RELEASES]
    Console(file=sys.stdout, highlight=False).rule(
        f'[bold]tracekit capacity --version A --version B --slo "{SLO}" --window {WINDOW_S:g}s '
        + " ".join(f"--replica-cost {p}" for p in prices)
        + "[/]"
    )
    sys.stdout.flush()
    with Analysis.open(db) as analysis:
        result = step(
            "capacity",
            lambda: analysis.capacity(labels, slo=SLO, window_s=WINDOW_S, replica_cost=prices),
        )
    if result is not None:
        show(result)
        for release in result.releases:
            print(f"{release.label}: {release.verdict} — {release.reason}", flush=True)
        print(f"summary: {result.summary}", flush=True)
    return result


def judge(result: CapacityResult | None) -> list[tuple[BatchConfig, str, str, bool]]:
    """Per release: its config, what was expected, what tracekit found, whether they agree.

    A is expected cost-bound; B latency-bound and the one the summary says to fix first.
    """
    first = re.match(r"fix (\S+) first", result.summary) if result is not None else None
    named = first.group(1) if first else None
    verdicts = {r.label: r.verdict for r in result.releases} if result is not None else {}
    out = []
    for c in RELEASES:
        found = verdicts.get(c.label, "nothing (the analysis failed)")
        expected, ok = c.expected, found == c.expected
        if c.label == FIRST:
            expected += f", fix {FIRST} first"
            found += f", fix {named} first" if named else ", no release to fix first"
            ok = ok and named == FIRST
        out.append((c, expected, found, ok))
    return out


def print_verdict(result: CapacityResult | None) -> bool:
    """The serving demo's result lines, one expectation per release; whether all held."""
    from tracekit.demo.runner import print_result

    judged = judge(result)
    for i, (c, expected, found, ok) in enumerate(judged):
        print_result(
            target=c.label,
            injected=c.name,
            description=c.describe(),
            expected=expected,
            found=found,
            ok=ok,
            command="capacity",
            heading=i == 0,
        )
    return all(ok for *_, ok in judged)


def run_capacity_demo(*, keep: Path | None = None, seed: int = 0) -> int:
    """The whole capacity demo; 0 once it ran, whatever the verdicts (they are printed)."""
    from tracekit.demo.runner import _terminate_as_interrupt, stderr_console

    console = stderr_console()
    workdir = keep if keep is not None else Path(tempfile.mkdtemp(prefix="tracekit-demo-"))
    began = time.monotonic()
    try:
        with _terminate_as_interrupt():
            a, b = RELEASES
            console.print(
                f"[bold]tracekit demo --capacity[/]: A = {a.describe()}, B = {b.describe()}"
            )
            load = run_capacity_load(workdir, seed=seed, console=console)
            if load.skipped:
                console.print(f"[yellow]tracekit ingest skipped {load.skipped:,} inputs[/]")
            print_verdict(report(load.db))
            kept = f"files kept in {workdir}" if keep is not None else "temporary files removed"
            console.print(f"[dim]run time {time.monotonic() - began:.0f} s; {kept}[/]")
        return 0
    finally:
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
