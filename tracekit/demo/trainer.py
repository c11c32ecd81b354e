"""The demo's DDP trainer: a real ``torch.distributed`` job (gloo, 127.0.0.1), traced.

:func:`run_job` spawns processes that train a tiny MLP under
``DistributedDataParallel`` for a few steps per run (a 1-rank run, then 2-rank runs, in
the same processes), instrumented exactly as the README shows (``train_steps``,
``instrument_ddp``, ``stage``), and write one OTLP JSON-lines file per rank and run.
:data:`TRAINING_REGRESSIONS` are the problems the demo can inject into a run.

Stand-ins, because this machine has neither GPUs nor a network between ranks:
``device_ms`` of sleep inside the model's forward and backward (through an autograd
function, so it sits *between* layers and DDP buckets launch while it runs) stands in
for GPU kernel time — a CPU shared by many processes would otherwise make the compute
time, and so the verdict, depend on whoever else is busy; the ``comm`` problem delays
each bucket's completion in a user comm hook, as a congested link would; the ``data``
problem sleeps in the dataset at each batch's first sample, as slow decoding would.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracekit.errors import ConfigError


@dataclass(frozen=True)
class TrainingProblem:
    """One injected problem and the bottleneck ``tracekit diff`` must name for it.

    Each is a sleep (which a busy CPU barely stretches) of at least a simulated device
    step (:attr:`JobSpec.device_ms`): on two cores shared with other work, scheduling
    alone adds tens of ms per step, spread over ranks and stages, and the injected
    problem must stand well clear of that.
    """

    name: str
    description: str
    expected: str
    data_ms_per_batch: float = 0.0
    straggler_ms: float = 0.0
    comm_delay_ms: float = 0.0


TRAINING_REGRESSIONS: dict[str, TrainingProblem] = {
    p.name: p
    for p in (
        TrainingProblem(
            "straggler",
            "rank 1's device is slower: +100 ms forward, +200 ms backward per step, all of it "
            "before its first gradient bucket is ready",
            "straggler",
            straggler_ms=100.0,
        ),
        TrainingProblem(
            "data",
            "each batch takes 120 ms to load (slow decoding, no loader workers)",
            "data_loading",
            data_ms_per_batch=120.0,
        ),
        TrainingProblem(
            "comm",
            "each gradient bucket's all-reduce takes 100 ms longer (a congested link)",
            "communication",
            comm_delay_ms=100.0,
        ),
        TrainingProblem("none", "the 2-rank run is the 1-rank run, twice", "none"),
    )
}
DEFAULT_TRAINING_REGRESSION = "straggler"
NOISE_BOTTLENECKS = ("compute", "straggler")
"""What a shared machine's noise alone can make a verdict name: compute that ran slower,
or ranks taking turns being late (a straggler without one rank)."""


def verdict_matches(
    problem: TrainingProblem, bottleneck: str, ranks: list[int], efficiency: float | None
) -> bool:
    """Whether a diff's verdict names ``problem``.

    With nothing injected the verdict is ``none`` only when the 2-rank run did scale close
    to ideal; on a busy machine it did not, and the verdict must then name what noise
    makes (:data:`NOISE_BOTTLENECKS`, no one rank), never a loader, a link or a rank.
    """
    if problem.expected == "none" and efficiency is not None and efficiency < 0.9:
        return bottleneck in NOISE_BOTTLENECKS and not ranks
    return bottleneck == problem.expected


NO_PROBLEM = TRAINING_REGRESSIONS["none"]

FEATURES = 16
BUCKET_MB = 0.01
"""About 10 KB: the model's 40 KB of gradients go out in a few buckets during backward."""


def get_problem(name: str) -> TrainingProblem:
    try:
        return TRAINING_REGRESSIONS[name]
    except KeyError:
        raise ConfigError(
            f"unknown training regression {name!r}; use one of {', '.join(TRAINING_REGRESSIONS)}"
        ) from None


@dataclass(frozen=True)
class Run:
    """One training run of a job: its label (``service.version``), size and problem."""

    label: str
    world: int
    problem: TrainingProblem = NO_PROBLEM


@dataclass(frozen=True)
class JobSpec:
    """Training runs done one after another by the same processes, and where files go.

    Starting a process that imports torch costs seconds on a busy machine (more than a
    run's steps), so one set of processes trains every run: each run sets up its own
    process group (``world`` of the processes take part, the rest wait for the next
    run), model, DDP wrapper, ``configure()`` and trace files. Put runs with fewer
    ranks last: a process left idle through a run starts the next one ahead of the
    others for a while (the scheduler favours a task that slept), a straggler in reverse.
    """

    runs: tuple[Run, ...]
    out_dir: Path
    steps: int = 16
    batch: int = 16
    device_ms: float = 100.0
    """Simulated device time per step, split 1:2 between forward and backward."""
    seed: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def processes(self) -> int:
        return max(r.world for r in self.runs)

    def trace_file(self, rank: int, label: str) -> Path:
        return self.out_dir / f"steps-{label}-rank{rank}.jsonl"

    def trace_files(self) -> list[Path]:
        return [self.trace_file(k, r.label) for r in self.runs for k in range(r.world)]


def free_ports(n: int) -> list[int]:
    """``n`` distinct free ports on 127.0.0.1 (all held open until all are chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def run_job(spec: JobSpec, timeout_s: float = 180.0) -> list[Path]:
    """Run every process to completion; returns the per-rank trace files of every run.

    Plain ``multiprocessing`` with spawn: this process never imports torch itself.
    A rank that fails writes its traceback next to the traces; the others are stopped.
    """
    import multiprocessing

    spec.out_dir.mkdir(parents=True, exist_ok=True)
    ports = free_ports(len(spec.runs))
    ctx = multiprocessing.get_context("spawn")
    procs = [
        ctx.Process(target=_rank_main, args=(rank, spec, ports), daemon=True)
        for rank in range(spec.processes)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.is_alive() for p in procs):
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:
                raise ConfigError(_failure(spec, procs))
            if time.monotonic() > deadline:
                raise ConfigError(f"training job did not finish in {timeout_s:.0f} s")
            procs[0].join(0.2)
        if any(p.exitcode != 0 for p in procs):
            raise ConfigError(_failure(spec, procs))
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    return spec.trace_files()


def _failure(spec: JobSpec, procs: list[Any]) -> str:
    for rank in range(len(procs)):
        err = spec.out_dir / f"rank{rank}.error"
        if err.exists():
            last = err.read_text().strip().splitlines()[-1:] or ["?"]
            return f"training rank {rank} failed: {last[0]} (traceback in {err})"
    codes = ", ".join(f"rank {k}: {p.exitcode}" for k, p in enumerate(procs))
    return f"training job failed ({codes})"


# --- inside each rank ----------------------------------------------------------------


def _rank_main(rank: int, spec: JobSpec, ports: list[int]) -> None:
    try:
        _rank_runs(rank, spec, ports)
    except BaseException:
        import traceback

        (spec.out_dir / f"rank{rank}.error").write_text(traceback.format_exc())
        raise SystemExit(1) from None


def _share_one_core() -> None:
    """Put every rank on the same core: stand-in devices must be alike.

    On a machine busy with other work, a rank whose core also runs a busy process is
    woken late after every simulated kernel and becomes a real straggler for as long as
    the scheduler leaves it there (seconds). Sharing one core, the ranks meet whatever
    else runs there alike; their own CPU work is a few ms a step.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0]})
    except (AttributeError, OSError):  # not Linux, or not allowed: run unpinned
        pass


def _rank_runs(rank: int, spec: JobSpec, ports: list[int]) -> None:
    # each rank one thread: the ranks share two cores with everyone else
    os.environ.update({"OMP_NUM_THREADS": "1", **spec.extra_env})
    _share_one_core()
    import torch
    import torch.distributed as dist

    from tracekit.instrumentation.training import SEQ

    torch.set_num_threads(1)
    for run, port in zip(spec.runs, ports, strict=True):
        if rank >= run.world:
            continue  # not in this run: on to the next one, whose group waits for us
        # torchrun's variables, as a real job has them (configure() reads them)
        os.environ.update(
            {"RANK": str(rank), "WORLD_SIZE": str(run.world), "LOCAL_RANK": str(rank)}
        )
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=run.world
        )
        SEQ.reset()  # a new process group numbers its collectives from 0 on every rank
        try:
            _train(rank, spec, run.label, run.problem)
        finally:
            dist.destroy_process_group()


def _train(rank: int, spec: JobSpec, label: str, problem: TrainingProblem) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    from tracekit.instrumentation.ddp import instrument_ddp
    from tracekit.instrumentation.setup import configure, shutdown
    from tracekit.instrumentation.stages import stage
    from tracekit.instrumentation.training import train_steps

    torch.manual_seed(spec.seed)

    class Device(torch.autograd.Function):
        """Stand-in for kernel time: sleeps in forward and (twice as long) in backward."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, ms: float) -> torch.Tensor:
            ctx.ms = ms
            time.sleep(ms / 1000)
            return x.view_as(x)

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            time.sleep(2 * ctx.ms / 1000)
            return grad, None

    extra = problem.straggler_ms if rank == 1 else 0.0

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # tiny on purpose: real CPU work stretches with the machine's load, sleeps do not
            self.head = nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64))
            self.tail = nn.Sequential(nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            half = spec.device_ms / 6
            device: Any = Device.apply
            h = device(self.head(x), half)
            h = device(h, half)
            # the straggler's extra time sits last in forward, so first in backward: every
            # bucket it launches is late, as on a slow GPU
            out: torch.Tensor = device(self.tail(h), half + extra)
            return out

    class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
        def __len__(self) -> int:
            return spec.steps * spec.batch

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if problem.data_ms_per_batch and i % spec.batch == 0:
                time.sleep(problem.data_ms_per_batch / 1000)  # the batch's first fetch
            g = torch.Generator().manual_seed(spec.seed * 100_003 + rank * 10_007 + i)
            return torch.randn(FEATURES, generator=g), torch.randint(0, 8, (), generator=g)

    # configure() finds the rank on its own (RANK/WORLD_SIZE, or the process group)
    configure(
        service_name="trainer",
        service_version=label,
        exporter="file",
        path=spec.trace_file(rank, label),
    )
    # small buckets: the tail's gradients go out while the head's are still computed
    ddp = DistributedDataParallel(Net(), bucket_cap_mb=BUCKET_MB)
    hook, state = None, None
    if problem.comm_delay_ms:
        hook = _slow_link_hook(problem.comm_delay_ms)
    instrument_ddp(ddp, hook=hook, state=state)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(Samples(), batch_size=spec.batch)
    for x, y in train_steps(loader, samples=lambda b: len(b[0])):
        with stage("forward"):
            loss = loss_fn(ddp(x), y)
        with stage("backward"):
            loss.backward()
        with stage("optimizer"):
            opt.step()
            opt.zero_grad()
    shutdown()


def _slow_link_hook(delay_ms: float) -> Any:
    """The default all-reduce, finishing ``delay_ms`` later: a congested link."""
    import torch.distributed as dist

    def slow_link(state: Any, bucket: Any) -> Any:
        group = state if state is not None else dist.group.WORLD
        tensor = bucket.buffer()
        tensor.div_(dist.get_world_size(group))
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()

        def arrive(f: Any) -> Any:
            time.sleep(delay_ms / 1000)
            return f.value()[0]

        return fut.then(arrive)

    slow_link.__annotations__ = {}  # DDP checks annotations as objects: none will do
    return slow_link
