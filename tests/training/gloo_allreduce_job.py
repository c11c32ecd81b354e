"""One rank of the 2-process gloo job of ``test_bandwidth.py`` (run as a script, not collected).

``python gloo_allreduce_job.py RANK WORLD PORT OUT_DIR STEPS`` trains two runs in one
process group on 127.0.0.1, each exported by tracekit's file exporter:

- ``hand``: per step, ``dist.all_reduce`` by hand on float32 tensors of known size
  (:data:`HAND_SIZES`), each inside ``tracekit.communication``;
- ``ddp``: a small MLP under ``DistributedDataParallel`` with 1 MiB buckets, recorded by
  ``tracekit.instrument_ddp``.

Each rank also writes ``meta-rank<R>.json``: what torch itself says of the process group
and of DDP's buckets, for the test to compare the traces against. The process group
times out after :data:`TIMEOUT_S`, so a lost peer ends the job instead of hanging it.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

HAND_SIZES = (1 << 20, 8 << 20, 1 << 20)
"""Bytes of each hand-called all-reduce in a step (two of 1 MiB, one of 8 MiB)."""
TIMEOUT_S = 60
BUCKET_MB = 1


def trace_file(out: Path, label: str, rank: int) -> Path:
    return out / f"{label}-rank{rank}.jsonl"


def main(argv: list[str]) -> None:
    rank, world, port = int(argv[0]), int(argv[1]), int(argv[2])
    out, steps = Path(argv[3]), int(argv[4])
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=TIMEOUT_S),
    )
    try:
        pg = dist.group.WORLD
        meta = {"group_size": dist.get_world_size(pg), "group_desc": pg.group_desc}
        _hand(trace_file(out, "hand", rank), steps)
        meta.update(_ddp(trace_file(out, "ddp", rank), steps))
        (out / f"meta-rank{rank}.json").write_text(json.dumps(meta))
    finally:
        dist.destroy_process_group()


def _hand(path: Path, steps: int) -> None:
    import torch
    import torch.distributed as dist

    import tracekit

    tracekit.configure(service_name="trainer", service_version="hand", exporter="file", path=path)
    tensors = [torch.ones(n // 4, dtype=torch.float32) for n in HAND_SIZES]
    for _ in tracekit.train_steps(range(steps), samples=1):
        for t in tensors:
            with tracekit.communication("all_reduce", bytes=t.numel() * t.element_size()):
                dist.all_reduce(t)
    tracekit.shutdown()


def _ddp(path: Path, steps: int) -> dict[str, object]:
    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    import tracekit

    tracekit.configure(service_name="trainer", service_version="ddp", exporter="file", path=path)
    torch.manual_seed(0)
    # buckets in reverse order of the parameters: the tail's 1 MiB first, then the head's
    # 8 MiB, launched later and bigger, so it also ends later (gloo runs them concurrently)
    model = nn.Sequential(nn.Linear(2048, 1024), nn.ReLU(), nn.Linear(1024, 256))
    ddp = tracekit.instrument_ddp(DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for _ in tracekit.train_steps(range(steps), samples=4):
        with tracekit.stage("forward"):
            loss = ddp(torch.randn(4, 2048)).square().mean()
        with tracekit.stage("backward"):
            loss.backward()
        with tracekit.stage("optimizer"):
            opt.step()
            opt.zero_grad()
    tracekit.shutdown()
    # DDP's own account of the buckets it settled on after the first step
    logged = ddp._get_ddp_logging_data()
    return {
        "param_bytes": [p.numel() * p.element_size() for p in model.parameters()],
        "rebuilt_bucket_sizes": str(logged["rebuilt_bucket_sizes"]),
        "rebuilt_per_bucket_param_indices": str(logged["rebuilt_per_bucket_param_indices"]),
    }


if __name__ == "__main__":
    main(sys.argv[1:])
