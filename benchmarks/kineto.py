"""Profiler-file ingest: one large Kineto rank file, or a directory of many.

Writes a rank file the way ``torch.profiler`` does (Kineto's layout: metadata, then
``traceEvents`` one object per event, ``baseTimeNanoseconds`` last; per step a
DataLoader fetch, forward, backward with DDP all-reduces, optimizer; every GPU kernel
with its ``cudaLaunchKernel`` and ``ac2g`` flow) of about ``--mb`` MB, then, each in a
fresh process so peak RSS is its own:

  (a) tracekit: ``ingest_paths`` into a fresh DuckDB file (spans, GPU time line);
  (b) json.load: the standard library loading the same file whole, nothing else;

It prints MB/s, peak RSS, and the peak's growth during the work (above what the
process held before it: imports, an open store), and tracekit's speed and memory
against (b), measured in the same run.

With ``--files N`` (default size then 20 MB) it writes N rank files of one job
(``rank-R.pt.trace.json``, each with its ``distributedInfo``) once, then times, each
in a fresh process: ``json.load`` of every file one after another; ``tracekit.ingest``
of the directory (what ``tracekit ingest DIR`` runs: parse, store, attribution) with
``jobs=1`` and ``jobs=--jobs``; and Holistic Trace Analysis loading the same directory
(``TraceAnalysis(trace_dir=DIR)``, which parses in a ``fork`` pool of one process per
CPU). It prints wall seconds and MB/s, the jobs speed-up, and each against json.load,
all measured in the same run; and the cost of starting the worker processes (two
small files with ``jobs=2`` against ``jobs=1``). Figures only; nothing is asserted.

    python benchmarks/kineto.py [--mb 100] [--keep DIR]
    python benchmarks/kineto.py --files 64 [--mb 20] [--jobs 8] [--rounds 3] [--no-hta] [--keep DIR]
    python benchmarks/kineto.py --files 8 --mb 5          # a quick run
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
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

_MANY = {
    "json.load": """
import json, sys, time
from pathlib import Path
files = sorted(Path(sys.argv[1]).iterdir())
t = time.perf_counter()
for f in files:
    with f.open() as fh:
        doc = json.load(fh)
    del doc
print(time.perf_counter() - t, 0)
""",
    "tracekit": """
import sys, time
from tracekit.analysis.facade import ingest
t = time.perf_counter()
outcome = ingest([sys.argv[1]], store=sys.argv[2], version="bench", jobs=int(sys.argv[3]))
print(time.perf_counter() - t, outcome.report.skipped)
""",
    "hta": """
import logging, sys, time
from hta.trace_analysis import TraceAnalysis
logging.disable(logging.CRITICAL)
t = time.perf_counter()
analysis = TraceAnalysis(trace_dir=sys.argv[1])
print(time.perf_counter() - t, len(analysis.t.traces) != int(sys.argv[2]))
""",
}


def _event(fh, first: list[bool], ev: dict) -> None:  # type: ignore[type-arg]
    fh.write("\n" if first[0] else ",\n")
    first[0] = False
    fh.write("  " + json.dumps(ev))


def _dist(rank: int, world: int) -> str:
    return f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}}},\n'


def generate(path: Path, target_mb: float, seed: int = 3, first_correlation: int = 0) -> int:
    """Write a rank file of about ``target_mb`` MB; returns the number of events."""
    rnd = random.Random(seed)
    limit = target_mb * 1e6
    first = [True]
    n = 0
    corr = first_correlation
    with path.open("w") as fh:
        fh.write('{\n  "schemaVersion": 1,\n  "deviceProperties": [],\n')
        fh.write(_dist(0, 8))
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


def write_ranks(folder: Path, files: int, target_mb: float) -> tuple[list[Path], int]:
    """``files`` rank files of one job in ``folder``: one generated, copied per rank with
    its own ``distributedInfo`` (tracekit's trace ids include the rank, so none collide)."""
    folder.mkdir(parents=True, exist_ok=True)
    template = folder.parent / "template.json"
    # Correlation ids past 32,767, as in real profiles: HTA 0.5.0 stores the event index
    # in the dtype of the correlation column, and with pandas 3 a file of more events
    # than that whose ids fit int16 fails to load (TypeError: Invalid value … int16).
    events = generate(template, target_mb, first_correlation=1_000_000)
    head = _dist(0, 8).encode()
    paths = []
    with template.open("rb") as src:
        text = src.read(4096)
        start = text.index(head)
        for rank in range(files):
            path = folder / f"rank-{rank}.pt.trace.json"
            with path.open("wb") as out:
                src.seek(0)
                out.write(src.read(start))
                out.write(_dist(rank, files).encode())
                src.seek(start + len(head))
                shutil.copyfileobj(src, out, 1 << 20)
            paths.append(path)
    template.unlink()
    return paths, events


def run_child(kind: str, *argv: object) -> list[str]:
    """Run ``_MANY[kind]`` in a fresh process: the last two words it prints (seconds and
    a flag); its stderr when it fails."""
    out = subprocess.run(
        [sys.executable, "-c", _MANY[kind], *map(str, argv)], capture_output=True, text=True
    )
    if out.returncode:
        sys.exit(f"{kind} failed:\n{out.stderr[-3000:]}")
    return out.stdout.split()[-2:]


def many(args: argparse.Namespace, work: Path) -> None:
    """The directory mode: json.load of each file, tracekit jobs 1 and N, HTA."""
    mb_each = args.mb if args.mb is not None else 20.0
    folder = work / "ranks"
    paths, events = write_ranks(folder, args.files, mb_each)
    mb = sum(p.stat().st_size for p in paths) / 1e6
    print(f"{len(paths)} rank files: {mb:,.1f} MB in all, {events:,} events each")

    # Starting the workers: two small files, so the parse itself is nothing.
    small = work / "small"
    write_ranks(small, 2, 0.2)
    start = {}
    for jobs in (1, 2):
        runs = [
            float(run_child("tracekit", small, work / f"small-{jobs}-{i}.duckdb", jobs)[0])
            for i in range(3)
        ]
        start[jobs] = min(runs)
    print(
        f"  worker start: {start[2] - start[1]:.2f} s (2 small files: jobs=2 "
        f"{start[2]:.2f} s, jobs=1 {start[1]:.2f} s; best of 3)"
    )

    # Each variant once per round, the order rotated, the best round kept: on a machine
    # shared with other work the quietest moment is the nearest to the code's own speed.
    variants = ["json.load", *(f"tracekit jobs={j}" for j in sorted({1, args.jobs}))]
    if not args.no_hta:
        variants.append("HTA load")
    runs: dict[str, list[float]] = {v: [] for v in variants}
    for round_no in range(args.rounds):
        shift = round_no % len(variants)
        for kind in variants[shift:] + variants[:shift]:
            if kind == "json.load":
                wall, _ = run_child("json.load", folder)
            elif kind == "HTA load":
                wall, short = run_child("hta", folder, len(paths))
                if short == "True":
                    print("  (HTA did not load every rank)")
            else:
                jobs = int(kind.rpartition("=")[2])
                store = work / f"jobs{jobs}-{round_no}.duckdb"
                wall, skipped = run_child("tracekit", folder, store, jobs)
                if skipped != "0":
                    print(f"  ({kind} skipped {skipped})")
            runs[kind].append(float(wall))
    seconds = {kind: min(walls) for kind, walls in runs.items()}
    if args.rounds > 1:
        print(f"  best of {args.rounds} rounds (range in brackets)")
    for kind, s in seconds.items():
        spread = f" [{s:.2f}-{max(runs[kind]):.2f}]" if args.rounds > 1 else ""
        print(
            f"  {kind:18s} {s:8.2f} s{spread}  {mb / s:7.1f} MB/s  "
            f"{seconds['json.load'] / s:5.2f}x json.load"
        )
    one, n = seconds["tracekit jobs=1"], seconds[f"tracekit jobs={args.jobs}"]
    line = f"tracekit jobs={args.jobs}: {one / n:.2f}x the speed of jobs=1"
    if "HTA load" in seconds:
        line += f"; jobs=1 {seconds['HTA load'] / one:.2f}x, jobs={args.jobs} "
        line += f"{seconds['HTA load'] / n:.2f}x HTA's load"
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mb", type=float, help="size of the rank file, MB (default 100; 20 with --files)"
    )
    ap.add_argument("--files", type=int, help="a directory of this many rank files (e.g. 64)")
    ap.add_argument("--jobs", type=int, default=2, help="with --files: jobs measured against 1")
    ap.add_argument("--no-hta", action="store_true", help="with --files: skip HTA's load")
    ap.add_argument("--rounds", type=int, default=1, help="with --files: best of this many")
    ap.add_argument("--keep", type=Path, help="write the files here and keep them")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tk-kineto-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.files:
        try:
            many(args, folder)
        finally:
            if not args.keep:
                shutil.rmtree(folder)
        return
    path = folder / "rank0.pt.trace.json"
    events = generate(path, args.mb if args.mb is not None else 100.0)
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
