"""A real 2-rank DDP job on CPU (gloo, 127.0.0.1), traced by tracekit and profiled by torch.

Run as ``python ddp_profile_job.py OUT_DIR PORT``: each rank trains a small MLP under
``DistributedDataParallel`` inside ``train_steps``/``instrument_ddp`` (one OTLP
JSON-lines file per rank) and under ``torch.profiler`` (one Kineto file per rank,
steps 2-5 recorded), so the two views of the same steps can be compared.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

WORLD = 2
STEPS = 8
PROFILED = dict(wait=1, warmup=1, active=4, repeat=1)


def rank_main(rank: int, out: str, port: int) -> None:
    os.environ.update(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
         "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"}
    )  # fmt: skip
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    from tracekit.instrumentation.ddp import instrument_ddp
    from tracekit.instrumentation.setup import configure, shutdown
    from tracekit.instrumentation.stages import stage
    from tracekit.instrumentation.training import resource_attributes, train_steps

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    configure(
        service_name="trainer",
        service_version="spans",
        exporter="file",
        path=Path(out) / f"steps-rank{rank}.jsonl",
        resource_attributes=resource_attributes(),
    )
    net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 8))  # fmt: skip
    ddp = instrument_ddp(DistributedDataParallel(net, bucket_cap_mb=0.5))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(
        torch.randn(STEPS * 32, 128), torch.randint(0, 8, (STEPS * 32,))
    )
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    profile_file = Path(out) / f"rank{rank}.pt.trace.json"
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(**PROFILED),
        on_trace_ready=lambda p: p.export_chrome_trace(str(profile_file)),
    ) as prof:
        for x, y in train_steps(loader, samples=lambda b: len(b[0])):
            with stage("forward"):
                loss = nn.functional.cross_entropy(ddp(x), y)
            with stage("backward"):
                loss.backward()
            with stage("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
    shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    mp.spawn(rank_main, args=(sys.argv[1], int(sys.argv[2])), nprocs=WORLD)
