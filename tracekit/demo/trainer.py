"""The demo's DDP trainer: a real ``torch.distributed`` job (gloo, 127.0.0.1), traced.

:func:`run_job` spawns ``world`` processes that each train a small MLP under
``DistributedDataParallel`` for a few steps, instrumented exactly as the README shows
(``train_steps``, ``instrument_ddp``, ``stage``), and write one OTLP JSON-lines file per
rank. :data:`TRAINING_REGRESSIONS` are the problems the demo can inject into a run.

Stand-ins, because this machine has neither GPUs nor a network between ranks:
``device_ms`` of sleep inside the model's forward and backward (through an autograd
function, so it sits *between* layers and DDP buckets launch while it runs) stands in
for GPU kernel time — a CPU shared by many processes would otherwise make the compute
time, and so the verdict, depend on whoever else is busy; the ``comm`` problem delays
each bucket's completion in a user comm hook, as a congested link would; the ``data``
problem sleeps per sample in the dataset, as slow decoding would.
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
    """One injected problem and the bottleneck ``tracekit diff`` must name for it."""

    name: str
    description: str
    expected: str
    data_ms_per_sample: float = 0.0
    straggler_ms: float = 0.0
    comm_delay_ms: float = 0.0


TRAINING_REGRESSIONS: dict[str, TrainingProblem] = {
    p.name: p
    for p in (
        TrainingProblem(
            "straggler",
            "rank 1's device is slower: +15 ms forward, +30 ms backward per step",
            "straggler",
            straggler_ms=15.0,
        ),
        TrainingProblem(
            "data",
            "the dataset takes 3 ms per sample to load (slow decoding, no workers)",
            "data_loading",
            data_ms_per_sample=3.0,
        ),
        TrainingProblem(
            "comm",
            "each gradient bucket's all-reduce takes 30 ms longer (a congested link)",
            "communication",
            comm_delay_ms=30.0,
        ),
        TrainingProblem("none", "the 2-rank run is the 1-rank run, twice", "none"),
    )
}
DEFAULT_TRAINING_REGRESSION = "straggler"


def get_problem(name: str) -> TrainingProblem:
    try:
        return TRAINING_REGRESSIONS[name]
    except KeyError:
        raise ConfigError(
            f"unknown training regression {name!r}; use one of {', '.join(TRAINING_REGRESSIONS)}"
        ) from None


@dataclass(frozen=True)
class JobSpec:
    """One training run: its label, size, injected problem and where its files go."""

    label: str
    world: int
    out_dir: Path
    problem: TrainingProblem = TRAINING_REGRESSIONS["none"]
    steps: int = 20
    batch: int = 16
    device_ms: float = 12.0
    """Simulated device time per step, split 1:2 between forward and backward."""
    seed: int = 0
    port: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)

    def trace_file(self, rank: int) -> Path:
        return self.out_dir / f"steps-{self.label}-rank{rank}.jsonl"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(spec: JobSpec, timeout_s: float = 90.0) -> list[Path]:
    """Run ``spec.world`` ranks to completion; returns the per-rank trace files."""
    import torch.multiprocessing as mp

    spec.out_dir.mkdir(parents=True, exist_ok=True)
    port = spec.port or free_port()
    ctx = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
        _rank_main, args=(spec, port), nprocs=spec.world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise ConfigError(f"training run {spec.label} did not finish in {timeout_s:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    return [spec.trace_file(r) for r in range(spec.world)]


# --- inside each rank ----------------------------------------------------------------


def _rank_main(rank: int, spec: JobSpec, port: int) -> None:
    os.environ.update(spec.extra_env)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(spec.world),
            "LOCAL_RANK": str(rank),
            # each rank one thread: the ranks share two cores with everyone else
            "OMP_NUM_THREADS": "1",
        }
    )
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=spec.world)
    try:
        _train(rank, spec)
    finally:
        dist.destroy_process_group()


def _train(rank: int, spec: JobSpec) -> None:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, Dataset

    from tracekit.instrumentation.ddp import instrument_ddp
    from tracekit.instrumentation.setup import configure, shutdown
    from tracekit.instrumentation.stages import stage
    from tracekit.instrumentation.training import resource_attributes, train_steps

    problem = spec.problem
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
            self.head = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256))
            self.tail = nn.Sequential(nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            half = spec.device_ms / 6
            device: Any = Device.apply
            h = device(self.head(x), half)
            h = device(h, half + extra)
            out: torch.Tensor = device(self.tail(h), half)
            return out

    class Samples(Dataset[tuple[torch.Tensor, torch.Tensor]]):
        def __len__(self) -> int:
            return spec.steps * spec.batch

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if problem.data_ms_per_sample:
                time.sleep(problem.data_ms_per_sample / 1000)
            g = torch.Generator().manual_seed(spec.seed * 100_003 + rank * 10_007 + i)
            return torch.randn(64, generator=g), torch.randint(0, 8, (), generator=g)

    configure(
        service_name="trainer",
        service_version=spec.label,
        exporter="file",
        path=spec.trace_file(rank),
        resource_attributes=resource_attributes(),
    )
    # small buckets: the tail's gradients go out while the head's are still computed
    ddp = DistributedDataParallel(Net(), bucket_cap_mb=0.25)
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
