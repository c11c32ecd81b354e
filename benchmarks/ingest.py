"""Ingest speed: ``tracekit ingest`` as a whole process vs a plain ``json.loads`` loop.

Generates an OTLP JSON-lines file the way the Collector's file exporter writes one
(a resource block per service on every line, 100-500 spans a line, 8-span requests
with tracekit's attributes), then prints, from one run on that one file:

  plain:    a Python loop of ``json.loads`` per line that only builds the row tuples
            (attributes decoded into a dict and dumped as tracekit stores them); it
            checks nothing, maps no enums and stores nothing: less work than tracekit;
  tracekit: ``python -m tracekit.cli ingest FILE --db NEW`` as a child process: import,
            parse, check, dedupe, store under the primary key, and the attribution of
            every request (``requests``/``request_stages``) that later commands read;

the ratio plain / tracekit (target >= 4x), spans/s, and the child's peak RSS and CPU
seconds (CPU time is the fairer figure on a shared machine: wall time there includes
waiting for a core). Then the same spans cut into per-rank files (a directory of
``--ranks`` files: each file must not add a fixed cost), and with ``--big-gb N`` an
N GB file built by repeating the generated lines under new trace ids (peak RSS must
stay bounded by the batch size, not the file). Figures only; nothing is asserted.

    python benchmarks/ingest.py [--spans 320000] [--ranks 64] [--big-gb 2] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracekit import conventions as cv
from tracekit.instrumentation.exporters import encode_attributes

T0 = 1_700_000_000_000_000_000
STAGES = (
    (cv.FEATURE_RETRIEVAL, cv.WAIT),
    (cv.PREPROCESS, cv.COMPUTE),
    (cv.BATCH_QUEUE, cv.WAIT),
    (cv.MODEL_EXECUTE, cv.COMPUTE),
    (cv.POSTPROCESS, cv.COMPUTE),
)


def generate(path: Path, n_spans: int, seed: int = 7) -> int:
    """Write about ``n_spans`` spans of 8-span requests; return the exact count."""
    rnd = random.Random(seed)
    ranker = {
        "attributes": encode_attributes(
            {
                cv.SERVICE_NAME: "ranker",
                cv.SERVICE_VERSION: "v2",
                cv.SERVICE_INSTANCE_ID: "ranker-1",
                cv.HOST_NAME: "node-a",
            }
        )
    }
    features = {
        "attributes": encode_attributes(
            {
                cv.SERVICE_NAME: "features",
                cv.SERVICE_VERSION: "v7",
                cv.SERVICE_INSTANCE_ID: "features-1",
                cv.HOST_NAME: "node-b",
            }
        )
    }
    written = 0
    request = 0
    with path.open("w") as fh:
        while written < n_spans:
            ranker_spans: list[dict[str, Any]] = []
            feature_spans: list[dict[str, Any]] = []
            for _ in range(rnd.randint(100, 500) // 8):
                request += 1
                # The first 8 digits are zero: --big-gb copies replace them per copy.
                trace_id = "00000000" + rnd.getrandbits(96).to_bytes(12, "big").hex()
                ids = [rnd.getrandbits(64).to_bytes(8, "big").hex() for _ in range(8)]

                def span(
                    i: int,
                    parent: str,
                    name: str,
                    kind: int,
                    start: int,
                    end: int,
                    attrs: dict[str, Any],
                    trace_id: str = trace_id,
                    ids: list[str] = ids,
                ) -> dict[str, Any]:
                    return {
                        "traceId": trace_id,
                        "spanId": ids[i],
                        "parentSpanId": parent,
                        "name": name,
                        "kind": kind,
                        "startTimeUnixNano": str(start),
                        "endTimeUnixNano": str(end),
                        "attributes": encode_attributes(attrs),
                        "status": {},
                    }

                start = T0 + request * 1_000_000
                t = start + 100_000
                children = []
                for i, (stage, kind) in enumerate(STAGES, start=1):
                    d = rnd.randint(1, 10) * 1_000_000
                    a: dict[str, Any] = {cv.STAGE: stage, cv.TIME_KIND: kind}
                    if kind == cv.COMPUTE:
                        a[cv.CPU_TIME_NS] = d // 2
                    if stage == cv.MODEL_EXECUTE:
                        a[cv.GPU_TIME_NS] = d // 3
                        a[cv.GPU_SYNC] = cv.SYNC_EVENT
                    if stage == cv.FEATURE_RETRIEVAL:
                        a[cv.CACHE_HIT] = rnd.random() < 0.8
                    if stage == cv.BATCH_QUEUE:
                        a[cv.BATCH_ID] = f"b{request // 8}"
                        a[cv.BATCH_SIZE] = 8
                    children.append(span(i, ids[0], stage, 1, t, t + d, a))
                    t += d
                down = 5_000_000
                children.append(
                    span(
                        6,
                        ids[0],
                        "GET /features",
                        3,
                        t,
                        t + down,
                        {
                            cv.STAGE: cv.DOWNSTREAM,
                            cv.SERVER_ADDRESS: "features",
                            cv.SAMPLE_WEIGHT: 1.0,
                        },
                    )
                )
                end = t + down + 200_000
                ranker_spans.append(
                    span(
                        0,
                        "",
                        "POST /predict",
                        2,
                        start,
                        end,
                        {
                            cv.HTTP_ROUTE: "/predict",
                            cv.HTTP_REQUEST_METHOD: "POST",
                            cv.HTTP_RESPONSE_STATUS_CODE: 200,
                            cv.INFLIGHT: rnd.randint(1, 20),
                        },
                    )
                )
                ranker_spans.extend(children)
                feature_spans.append(
                    span(
                        7,
                        ids[6],
                        "GET /features",
                        2,
                        t + 500_000,
                        t + 4_500_000,
                        {cv.HTTP_ROUTE: "/features"},
                    )
                )
                written += 8
            doc = {
                "resourceSpans": [
                    {
                        "resource": ranker,
                        "scopeSpans": [{"scope": {"name": "tracekit"}, "spans": ranker_spans}],
                    },
                    {
                        "resource": features,
                        "scopeSpans": [{"scope": {"name": "tracekit"}, "spans": feature_spans}],
                    },
                ]
            }
            fh.write(json.dumps(doc, separators=(",", ":")) + "\n")
    return written


def plain_loop(path: Path) -> int:
    """(b): json.loads per line, rows built as tuples in the store's column order."""

    def value(v: dict[str, Any]) -> Any:
        for k, x in v.items():
            return int(x) if k == "intValue" else x
        return None

    # One encoder for the loop: json.dumps with options would build one per call.
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    rows = []
    source = str(path)
    with path.open() as fh:
        for number, line in enumerate(fh, start=1):
            doc = json.loads(line)
            for rs in doc["resourceSpans"]:
                ra = {a["key"]: value(a["value"]) for a in rs["resource"]["attributes"]}
                ra_json = dumps(ra)
                for ss in rs["scopeSpans"]:
                    for s in ss["spans"]:
                        a = {x["key"]: value(x["value"]) for x in s.get("attributes", ())}
                        rows.append(
                            (
                                s["traceId"].lower(),
                                s["spanId"].lower(),
                                s.get("parentSpanId") or None,
                                s["name"],
                                s["kind"],
                                int(s["startTimeUnixNano"]),
                                int(s["endTimeUnixNano"]),
                                s.get("status", {}).get("code", 0),
                                ra.get(cv.SERVICE_NAME),
                                ra.get(cv.SERVICE_VERSION),
                                ra.get(cv.SERVICE_INSTANCE_ID),
                                ra.get(cv.HOST_NAME),
                                a.get(cv.STAGE),
                                a.get(cv.TIME_KIND),
                                a.get(cv.CPU_TIME_NS),
                                a.get(cv.GPU_TIME_NS),
                                a.get(cv.SAMPLE_WEIGHT, 1.0),
                                dumps(a),
                                ra_json,
                                "[]",
                                f"{source}:{number}",
                            )
                        )
    return len(rows)


def run_tracekit(args: list[str], work: Path) -> tuple[float, float, float, str]:
    """Run ``tracekit`` as a child process: (wall s, CPU s, peak RSS MB, first stdout line)."""
    out_path, err_path = work / "child.out", work / "child.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        t = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tracekit.cli", *args], stdout=out, stderr=err
        )
        # wait4 gives this child's own resource use (peak RSS, CPU), not all children's.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code not in (0, 2):
        raise SystemExit(f"tracekit {' '.join(args)} failed ({code}):\n{err_path.read_text()}")
    lines = out_path.read_text().splitlines()
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, lines[0] if lines else ""


def ingest_child(target: Path, db: Path) -> tuple[float, float, float, str]:
    for p in (db, db.with_name(db.name + ".wal")):
        p.unlink(missing_ok=True)
    return run_tracekit(["ingest", str(target), "--db", str(db)], db.parent)


def split_ranks(data: Path, folder: Path, ranks: int) -> int:
    """The file's lines dealt round-robin into ``ranks`` files (one per training rank)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = data.read_bytes().splitlines(keepends=True)
    for k in range(ranks):
        (folder / f"rank{k:04d}.jsonl").write_bytes(b"".join(lines[k::ranks]))
    return len(lines)


def write_big(data: Path, big: Path, gigabytes: float) -> int:
    """Copies of the file's lines under new trace ids until ``gigabytes`` are written."""
    base = data.read_bytes()
    copies = max(1, int(gigabytes * 1e9 // len(base)))
    with big.open("wb") as fh:
        for k in range(copies):
            fh.write(base.replace(b'"traceId":"00000000', b'"traceId":"%08x' % (k + 1)))
    return copies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spans", type=int, default=320_000)
    parser.add_argument("--ranks", type=int, default=64, help="per-rank files (0: skip)")
    parser.add_argument("--big-gb", type=float, default=0.0, help="also ingest an N GB file")
    parser.add_argument("--keep", type=Path, help="write the files here and keep them")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = work / "spans.jsonl"
        t = time.perf_counter()
        n = generate(data, args.spans)
        size_mb = data.stat().st_size / 1e6
        print(f"generated {n:,} spans, {size_mb:,.0f} MB in {time.perf_counter() - t:.1f} s")

        t, c = time.perf_counter(), time.process_time()
        plain_rows = plain_loop(data)
        plain_s, plain_cpu = time.perf_counter() - t, time.process_time() - c
        if plain_rows != n:
            print(f"span counts differ: generated {n}, plain loop {plain_rows}")
            return 1

        wall, cpu, rss, line = ingest_child(data, work / "bench.duckdb")
        print(f"plain json.loads loop      {plain_s:7.2f} s wall {plain_cpu:7.2f} s CPU")
        print(
            f"tracekit ingest (process)  {wall:7.2f} s wall {cpu:7.2f} s CPU  "
            f"peak RSS {rss:,.0f} MB"
        )
        print(f"  {line}")
        print(
            f"ratio plain / tracekit: {plain_s / wall:.2f}x wall, {plain_cpu / cpu:.2f}x CPU "
            f"(target >= 4x); tracekit {n / wall:,.0f} spans/s wall, {n / cpu:,.0f} spans/s "
            "per CPU second"
        )

        if args.ranks:
            folder = work / "ranks"
            split_ranks(data, folder, args.ranks)
            r_wall, r_cpu, r_rss, r_line = ingest_child(folder, work / "ranks.duckdb")
            print(
                f"{args.ranks} per-rank files (same spans): {r_wall:.2f} s wall {r_cpu:.2f} s CPU, "
                f"peak RSS {r_rss:,.0f} MB; per span {r_cpu / cpu:.2f}x one file's CPU"
            )
            shutil.rmtree(folder)

        if args.big_gb:
            big = work / "big.jsonl"
            copies = write_big(data, big, args.big_gb)
            gb = big.stat().st_size / 1e9
            b_wall, b_cpu, b_rss, b_line = ingest_child(big, work / "big.duckdb")
            spans = n * copies
            print(
                f"{gb:.2f} GB file ({spans:,} spans): {b_wall:.1f} s wall {b_cpu:.1f} s CPU, "
                f"{spans / b_wall:,.0f} spans/s, peak RSS {b_rss:,.0f} MB"
            )
            print(f"  {b_line}")
            big.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
