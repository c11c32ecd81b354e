"""How long ``tracekit diff`` takes: load both releases and compute, < 5 s at 2 x 1M requests.

Generates two releases straight into the store with DuckDB bulk SQL — ``requests``,
``request_stages`` and one span per stage plus the root (1.4M spans, attributes as
JSON), the shape attribution leaves behind — then times :func:`diff_releases` end to
end and its parts. v2 misses the feature cache more often, so the verdict and the
attribute ranking have something to find. Prints; asserts nothing.

    .venv/bin/python benchmarks/diff.py [--requests 1000000] [--db DIR]

The issue's target: 2 x 1,000,000 requests (16 M spans) load and compute in under 5 s
on this 2-core machine; the line ``load + compute`` prints it (wall and CPU seconds).
Generating that store takes minutes: ``--db DIR`` keeps it (DIR/bench.duckdb) and a
later run with ``--reuse`` skips the generation.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tracekit import conventions as cv
from tracekit.analysis.cohorts.bubbleup import rank_attributes
from tracekit.analysis.cohorts.release import load_releases
from tracekit.analysis.compare.diff import compute_diff, diff_releases
from tracekit.analysis.gate.evaluate import run_gate
from tracekit.analysis.store import Store, open_store
from tracekit.render.diff import render_json, render_table

T = TypeVar("T")

# Per-request stage times: lognormal-ish (median ms × exp(sd · approx-normal draw)).
_GENERATE = """
CREATE OR REPLACE TEMP TABLE gen AS
WITH base AS (
    SELECT i, random() < $miss AS miss,
           (random() + random() + random() + random() - 2.0) * 1.7 AS z1,
           (random() + random() + random() + random() - 2.0) * 1.7 AS z2,
           (random() + random() + random() + random() - 2.0) * 1.7 AS z3,
           (random() + random() + random() + random() - 2.0) * 1.7 AS z4,
           random() AS u
    FROM range($n) t(i)
)
SELECT i, md5($release || '-' || i::VARCHAR) AS trace_id,
       substr(md5('root' || $release || i::VARCHAR), 1, 16) AS root_id, miss,
       CAST(CASE WHEN miss THEN 45e6 * exp(0.1 * z1) ELSE 3e6 * exp(0.25 * z1) END AS BIGINT) AS fr,
       CAST(5e6 * exp(0.2 * z2) AS BIGINT) AS pre,
       CAST(8e6 * exp(0.5 * z3) AS BIGINT) AS bq,
       CAST(15e6 * exp(0.15 * z4) AS BIGINT) AS me,
       CAST(3e6 * exp(0.2 * z2) AS BIGINT) AS pp,
       CAST(40e6 * exp(0.3 * z3 * u) AS BIGINT) AS ds,
       'host-' || (i % 4)::VARCHAR AS host,
       0.3 + 0.05 * u AS cpu
FROM base
"""

_REQUESTS = """
INSERT INTO requests
SELECT trace_id, root_id, 'ranker', $release, 'ranker-' || host, host, 'POST /predict', '/predict',
       1767225600000000000 + i * 10000000, fr + pre + bq + me + pp + ds, false, 1.0,
       NULL, NULL, cpu, NULL, 7, 0
FROM gen
"""

_STAGES = """
INSERT INTO request_stages
SELECT trace_id, stage, kind, ns, ns, NULL, NULL
FROM gen, (VALUES ($fr, 'wait', 1), ($pre, 'compute', 2), ($bq, 'wait', 3),
                  ($me, 'compute', 4), ($pp, 'compute', 5), ($ds, 'wait', 6)) s(stage, kind, k),
     LATERAL (SELECT CASE k WHEN 1 THEN fr WHEN 2 THEN pre WHEN 3 THEN bq
                            WHEN 4 THEN me WHEN 5 THEN pp ELSE ds END AS ns)
"""

_SPANS = """
INSERT INTO spans (trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code,
                   service_name, service_version, instance_id, host_name, stage, time_kind,
                   sample_weight, attributes, resource_attributes, source)
SELECT trace_id, substr(md5(trace_id || stage), 1, 16), root_id, stage, 'INTERNAL', 0, 1, 'UNSET',
       'ranker', $release, 'ranker-' || host, host, stage, kind, 1.0,
       CASE stage WHEN $fr THEN json_object($stage_key, stage, $kind_key, kind, $cache_key, NOT miss)
                  WHEN $ds THEN json_object($stage_key, stage, $kind_key, kind, $addr_key, 'pricing')
                  ELSE json_object($stage_key, stage, $kind_key, kind) END,
       json_object($host_key, host), 'benchmark'
FROM gen, (VALUES ($fr, 'wait'), ($pre, 'compute'), ($bq, 'wait'), ($me, 'compute'),
                  ($pp, 'compute'), ($ds, 'wait')) s(stage, kind)
UNION ALL
SELECT trace_id, root_id, NULL, 'POST /predict', 'SERVER', 0, 1, 'UNSET', 'ranker', $release,
       'ranker-' || host, host, NULL, NULL, 1.0,
       json_object($route_key, '/predict', $cpu_key, cpu), json_object($host_key, host), 'benchmark'
FROM gen
"""


def generate(store: Store, release: str, n: int, miss: float, seed: float) -> None:
    store.con.execute("SELECT setseed(?)", [seed])
    store.con.execute(_GENERATE, {"n": n, "release": release, "miss": miss})
    names = {
        "fr": cv.FEATURE_RETRIEVAL,
        "pre": cv.PREPROCESS,
        "bq": cv.BATCH_QUEUE,
        "me": cv.MODEL_EXECUTE,
        "pp": cv.POSTPROCESS,
        "ds": cv.DOWNSTREAM,
    }
    store.con.execute(_REQUESTS, {"release": release})
    store.con.execute(_STAGES, names)
    keys = {
        "stage_key": cv.STAGE,
        "kind_key": cv.TIME_KIND,
        "cache_key": cv.CACHE_HIT,
        "addr_key": cv.SERVER_ADDRESS,
        "host_key": cv.HOST_NAME,
        "route_key": cv.HTTP_ROUTE,
        "cpu_key": cv.CPU_UTILIZATION,
    }
    store.con.execute(_SPANS, {**names, **keys, "release": release})


def timed(label: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    print(f"  {label:<34} {time.perf_counter() - t0:7.3f} s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000, help="requests per release")
    parser.add_argument(
        "--db", default=None, help="folder for the store (default: a temporary one)"
    )
    parser.add_argument("--reuse", action="store_true", help="use the store already in --db")
    args = parser.parse_args()
    path = Path(args.db or tempfile.mkdtemp(prefix="tracekit-bench-")) / "bench.duckdb"
    if path.exists() and not args.reuse:
        os.remove(path)
    print(f"tracekit diff benchmark: {args.requests:,} requests per release, {os.cpu_count()} CPUs")
    if not (args.reuse and path.exists()):
        with open_store(path) as store:
            t0 = time.perf_counter()
            generate(store, "v1", args.requests, miss=0.03, seed=0.1)
            generate(store, "v2", args.requests, miss=0.30, seed=0.2)
            print(f"  generated {store.span_count():,} spans in {time.perf_counter() - t0:.1f} s")
    with open_store(path, read_only=True) as store:
        print("parts:")
        t0, c0 = time.perf_counter(), time.process_time()
        before, after = timed("load_releases v1, v2", load_releases, store, ["v1", "v2"])
        result = timed("compute_diff (bootstrap, counterfactual)", compute_diff, before, after)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        print(
            f"  load + compute ({before.n:,} + {after.n:,} requests) {wall:7.3f} s wall, "
            f"{cpu:.3f} s CPU (target < 5 s at 2 x 1M)"
        )
        timed(
            "rank_attributes (spans, json_each)",
            rank_attributes,
            store,
            "v2",
            result.tail.threshold_after_ms,
        )
        print("end to end:")
        t0 = time.perf_counter()
        result = diff_releases(store, "v1", "v2")
        render_json(result)
        text = render_table(result)
        elapsed = time.perf_counter() - t0
        print(f"  diff_releases + render             {elapsed:7.3f} s")
        t0, c0 = time.perf_counter(), time.process_time()
        gate = run_gate(store, "v1", "v2")
        print(
            f"  run_gate (default budgets)         {time.perf_counter() - t0:7.3f} s wall, "
            f"{time.process_time() - c0:.3f} s CPU: {gate.result}"
        )
    print(text.splitlines()[0])
    top = result.attributes[0] if result.attributes else None
    if top:
        print(
            f"top attribute: {top.attribute}={top.value} slow {top.slow_share:.0%} rest {top.rest_share:.0%}"
        )


if __name__ == "__main__":
    main()
