"""Profiler-file ingest: MB/s and peak memory on one large Kineto rank file.

Writes a rank file the way ``torch.profiler`` does (Kineto's layout: metadata, then
``traceEvents`` one object per event, ``baseTimeNanoseconds`` last; per step a
DataLoader fetch, forward, backward with DDP all-reduces, optimizer; every GPU kernel
with its ``cudaLaunchKernel`` and ``ac2g`` flow) of about ``--mb`` MB, then, each in a
fresh process so peak RSS is its own:

  (a) tracekit: ``ingest_paths`` into a fresh DuckDB file (spans, GPU time line);
  (b) json.load: the standard library loading the same file whole, nothing else;

It prints MB/s, peak RSS, and the peak's growth during the work (above what the
process held before it: imports, an open store), and tracekit's speed and memory
against (b), measured in the same run. Figures only; nothing is asserted.

    python benchmarks/kineto.py [--mb 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

BASE_NS = 1_700_000_000_000_000_000

_CHILD = {
    "tracekit": """
import resource, sys, time
from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import open_store
store = open_store(sys.argv[1] + ".duckdb")
floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
report = ingest_paths(store, [sys.argv[1]], version="bench")
print(time.perf_counter() - t, floor, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, report.skipped)
""",
    "json.load": """
import json, resource, sys, time
floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
with open(sys.argv[1]) as fh:
    doc = json.load(fh)
print(time.perf_counter() - t, floor, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, 0)
""",
}


def _event(fh, first: list[bool], ev: dict) -> None:  # type: ignore[type-arg]
    fh.write("\n" if first[0] else ",\n")
    first[0] = False
    fh.write("  " + json.dumps(ev))


def generate(path: Path, target_mb: float, seed: int = 3) -> int:
    """Write a rank file of about ``target_mb`` MB; returns the number of events."""
    rnd = random.Random(seed)
    limit = target_mb * 1e6
    first = [True]
    n = 0
    corr = 0
    with path.open("w") as fh:
        fh.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n')
        fh.write('  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},\n')
        fh.write('  "traceEvents": [')
        t = 1000.0
        step = 0
        gpu = t
        while fh.tell() < limit:
            step_start = t
            _event(
                fh,
                first,
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                    "pid": 7,
                    "tid": 7,
                    "ts": round(t, 3),
                    "dur": 150.0,
                    "args": {},
                },
            )
            t += 150
            for phase in ("## forward ##", "## backward ##"):
                phase_start = t
                for op in range(200):
                    corr += 1
                    dur = rnd.uniform(5, 40)
                    _event(
                        fh,
                        first,
                        {
                            "ph": "X",
                            "cat": "cpu_op",
                            "name": f"aten::op_{op % 37}",
                            "pid": 7,
                            "tid": 7,
                            "ts": round(t, 3),
                            "dur": round(dur, 3),
                            "args": {
                                "External id": corr,
                                "Record function id": 0,
                                "Ev Idx": corr,
                                "Input Dims": [[32, 1024], [1024, 1024]],
                                "Input type": ["float", "float"],
                            },
                        },
                    )
                    _event(
                        fh,
                        first,
                        {
                            "ph": "X",
                            "cat": "cuda_runtime",
                            "name": "cudaLaunchKernel",
                            "pid": 7,
                            "tid": 7,
                            "ts": round(t + 2, 3),
                            "dur": 4.5,
                            "args": {"External id": corr, "cbid": 211, "correlation": corr},
                        },
                    )
                    _event(
                        fh,
                        first,
                        {
                            "ph": "s",
                            "id": corr,
                            "pid": 7,
                            "tid": 7,
                            "ts": round(t + 2, 3),
                            "cat": "ac2g",
                            "name": "ac2g",
                        },
                    )
                    comm = phase == "## backward ##" and op % 50 == 49
                    name = (
                        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long)"
                        if comm
                        else f"void at::native::kernel_{op % 23}<float>(float*, int)"
                    )
                    gpu = max(gpu, t + 6) + rnd.uniform(0.5, 3)
                    kdur = rnd.uniform(3, 60) * (6 if comm else 1)
                    _event(
                        fh,
                        first,
                        {
                            "ph": "X",
                            "cat": "kernel",
                            "name": name,
                            "pid": 0,
                            "tid": 20 if comm else 7,
                            "ts": round(gpu, 3),
                            "dur": round(kdur, 3),
                            "args": {
                                "External id": corr,
                                "queued": 0,
                                "device": 0,
                                "context": 1,
                                "stream": 20 if comm else 7,
                                "correlation": corr,
                                "registers per thread": 32,
                                "shared memory": 0,
                                "grid": [128, 1, 1],
                                "block": [256, 1, 1],
                            },
                        },
                    )
                    _event(
                        fh,
                        first,
                        {
                            "ph": "f",
                            "id": corr,
                            "pid": 0,
                            "tid": 7,
                            "ts": round(gpu, 3),
                            "cat": "ac2g",
                            "name": "ac2g",
                            "bp": "e",
                        },
                    )
                    if not comm:
                        gpu += kdur
                    t += dur + 1
                    n += 5
                _event(
                    fh,
                    first,
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": phase,
                        "pid": 7,
                        "tid": 7,
                        "ts": round(phase_start, 3),
                        "dur": round(t - phase_start, 3),
                        "args": {},
                    },
                )
            _event(
                fh,
                first,
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "Optimizer.step#AdamW.step",
                    "pid": 7,
                    "tid": 7,
                    "ts": round(t, 3),
                    "dur": 300.0,
                    "args": {},
                },
            )
            t += 300
            # the step's own event once its length is known (Kineto does not sort events)
            _event(
                fh,
                first,
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": 7,
                    "tid": 7,
                    "ts": round(step_start, 3),
                    "dur": round(t - step_start, 3),
                    "args": {},
                },
            )
            n += 5
            step += 1
        fh.write('\n  ],\n  "traceName": "bench",\n  "displayTimeUnit": "ms",\n')
        fh.write(f'  "baseTimeNanoseconds": {BASE_NS}\n}}\n')
    return n


def measure(kind: str, path: Path) -> tuple[float, float, float, int]:
    """(seconds, peak RSS MB, growth of the peak during the work MB, skipped), fresh process."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD[kind], str(path)], check=True, capture_output=True, text=True
    ).stdout.split()
    floor, peak = int(out[1]) / 1024, int(out[2]) / 1024
    return float(out[0]), peak, peak - floor, int(out[3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="size of the rank file (MB)")
    ap.add_argument("--keep", type=Path, help="write the file here and keep it")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tk-kineto-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rank0.pt.trace.json"
    events = generate(path, args.mb)
    mb = path.stat().st_size / 1e6
    print(f"rank file: {mb:.1f} MB, {events:,} events")
    results = {kind: measure(kind, path) for kind in ("json.load", "tracekit")}
    for kind, (seconds, rss, grew, skipped) in results.items():
        note = f" (skipped {skipped})" if skipped else ""
        print(
            f"  {kind:10s} {mb / seconds:6.1f} MB/s  peak RSS {rss:6.1f} MB "
            f"(+{grew:.1f} MB during the work){note}"
        )
    tk_s, _, tk_grew, _ = results["tracekit"]
    js_s, _, js_grew, _ = results["json.load"]
    print(
        f"tracekit: {js_s / tk_s:.2f}x json.load's speed, "
        f"{tk_grew / max(js_grew, 0.1):.2f}x its memory growth"
    )
    if not args.keep:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
