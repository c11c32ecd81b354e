"""``tracekit diff`` against the exporter's ClickHouse table (chDB) vs the DuckDB path.

Generates two releases of N requests each (default 1M: root + 6 stage spans, 14M spans
for both) straight into an ``otel_traces`` table created with the exporter's DDL, by
ClickHouse SQL, in chDB. Then:

* **ClickHouse path** — what ``tracekit diff --store chdb://…`` does: select v1 and v2
  inside ClickHouse, pull their spans as Arrow, attribute, diff. Prints the time of each
  part and the bytes that left the engine (Arrow buffers) against the table's size.
* **DuckDB path** — the same spans, already attributed in a DuckDB store (as
  ``tracekit ingest`` leaves it), diffed: the one-machine baseline of the same run.
* **Attributed path** — ``tracekit attribute`` over the whole table (spans/s per
  process), then ``--shard 0/2`` alone (its time against the unsharded run's), then
  ``diff`` reading the attributed rows: its time against the DuckDB path's and against
  merely reading the selected spans' ids, times and stage out of the engine as Arrow
  (the floor any span-pulling design pays), and the bytes that left the engine against
  the span pull's. Each ``attribute`` runs in a child process, which reports its peak
  RSS (compare ``--requests 100000`` with ``1000000``: bounded batches).

Prints ratios measured in the same run; asserts nothing. ``--requests 50000`` for a
quick look.

    .venv/bin/python benchmarks/clickhouse.py [--requests 1000000] [--dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tracekit.analysis.attribution import per_request
from tracekit.analysis.compare.diff import diff_releases
from tracekit.analysis.store.clickhouse import (
    Selection,
    connect,
    open_snapshot,
    traces_table_ddl,
)
from tracekit.analysis.store.url import parse_store_url

T = TypeVar("T")

# One row per span: the root, then six stages back to back (lognormal-ish times in ns).
# v2 misses the feature cache more often, so the diff has something to find.
_GENERATE = """
INSERT INTO {table}
  (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName,
   ResourceAttributes, SpanAttributes, Duration, StatusCode)
WITH
  lower(hex(MD5(concat({release:String}, toString(number))))) AS trace,
  substring(lower(hex(MD5(concat('root', {release:String}, toString(number))))), 1, 16) AS root,
  -- Per-request draws from hashes of the request number: every span row of a request
  -- (ARRAY JOIN below) sees the same values.
  (arraySum(arrayMap(k -> (sipHash64(number, {release:String}, k) % 1000000) / 1e6,
                     [1, 2, 3, 4])) - 2.0) * 1.7 AS z,
  (sipHash64(number, {release:String}, 5) % 1000000) / 1e6 < {miss:Float64} AS miss,
  [toUInt64(if(miss, 45e6, 3e6) * exp(0.2 * z)), toUInt64(5e6 * exp(0.2 * z)),
   toUInt64(8e6 * exp(0.5 * z)), toUInt64(15e6 * exp(0.15 * z)),
   toUInt64(3e6 * exp(0.2 * z)), toUInt64(40e6 * exp(0.3 * z))] AS d,
  ['feature_retrieval', 'preprocess', 'batch_queue', 'model_execute', 'postprocess',
   'downstream'] AS stages,
  1767225600000000000 + number * 10000000 AS t0,
  map('service.name', 'ranker', 'service.version', {release:String},
      'service.instance.id', concat('ranker-', toString(number % 4)),
      'host.name', concat('host-', toString(number % 4))) AS resource
SELECT
  fromUnixTimestamp64Nano(toInt64(t0 + if(i = 0, 0, arraySum(arraySlice(d, 1, i - 1))))),
  trace,
  if(i = 0, root, substring(lower(hex(MD5(concat(trace, toString(i))))), 1, 16)),
  if(i = 0, '', root),
  if(i = 0, 'POST /predict', stages[i]),
  if(i = 0, 'SPAN_KIND_SERVER', 'SPAN_KIND_INTERNAL'),
  'ranker',
  resource,
  if(i = 0,
     map('http.route', '/predict', 'http.response.status_code', '200',
         'tracekit.cpu.utilization', '0.35'),
     if(i = 1, map('tracekit.stage', stages[i], 'tracekit.cache.hit', if(miss, 'false', 'true')),
        map('tracekit.stage', stages[i]))),
  if(i = 0, arraySum(d), d[i]),
  'STATUS_CODE_UNSET'
FROM numbers({n:UInt64})
ARRAY JOIN range(7) AS i
"""


def timed(label: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> tuple[T, float]:
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    seconds = time.perf_counter() - t0
    print(f"  {label:<38} {seconds:8.2f} s")
    return result, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000, help="per release")
    parser.add_argument("--dir", default=None, help="chDB directory (default: a temp dir)")
    args = parser.parse_args(argv)
    work = Path(args.dir or tempfile.mkdtemp(prefix="tk-bench-ch-"))
    url = parse_store_url(f"chdb://{work / 'chdb'}")
    table = f"`{url.database}`.`{url.table}`"
    n = args.requests
    print(f"{n:,} requests per release, 7 spans each, in chDB at {url.path}")

    client = connect(url)
    client.command(f"DROP TABLE IF EXISTS {table}")
    client.command(traces_table_ddl(url.database, url.table))
    for release, miss in (("v1", 0.05), ("v2", 0.15)):
        timed(
            f"generate {release} (ClickHouse SQL)",
            client.command,
            _GENERATE.replace("{table}", table),
            parameters={"release": release, "miss": miss, "n": n},
        )
    rows, compressed, raw = client.query(
        "SELECT sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes) "
        "FROM system.parts WHERE active AND database = {db:String} AND table = {t:String}",
        parameters={"db": url.database, "t": url.table},
    ).result_rows[0]
    client.close()
    print(
        f"  table: {rows:,} spans, {compressed / 1e6:,.0f} MB compressed, {raw / 1e6:,.0f} MB raw"
    )

    print("ClickHouse path (tracekit diff --store chdb://…):")
    selection = Selection(releases=("v1", "v2"))
    store, pull_s = timed("select + pull as Arrow into DuckDB", open_snapshot, url, selection)
    _, attr_s = timed("attribution (critical path)", per_request.refresh, store)
    result, diff_s = timed("diff", diff_releases, store, "v1", "v2")
    total = pull_s + attr_s + diff_s
    left = store.pulled_bytes
    print(
        f"  data that left the engine: {store.pulled_rows:,} rows, {left / 1e6:,.0f} MB "
        f"({left / raw:.2f}× the table's raw bytes)"
    )
    print("DuckDB path (the same spans, attributed at ingest):")
    _, duck_s = timed("diff", diff_releases, store, "v1", "v2")
    store.close()
    print(f"verdict: {result.verdict.summary}")
    print(
        f"diff end to end: ClickHouse {total:.2f} s vs DuckDB {duck_s:.2f} s "
        f"({total / duck_s:.1f}×); data out of ClickHouse {left / 1e6:,.0f} MB, "
        "out of DuckDB 0 (in process)"
    )
    attributed(url, selection, duck_s, left, int(rows))
    return 0


def _attribute_child(path: str, prefix: str, shard: str) -> tuple[float, int, int]:
    """``tracekit attribute`` in a fresh process: (seconds, spans, peak RSS bytes)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, resource, time\n"
        "from tracekit.analysis.attribute import attribute, parse_shard\n"
        "from tracekit.analysis.store.attributed import AttributedNames\n"
        "from tracekit.analysis.store.url import parse_store_url\n"
        f"url = parse_store_url({path!r})\n"
        f"r = attribute(url, settle_s=0, shard=parse_shard({shard!r}), "
        f"names=AttributedNames({prefix!r}))\n"
        "print(json.dumps([r.seconds, r.spans, "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"attribute {shard} failed:\n{out.stderr[-2000:]}")
    seconds, spans, rss = json.loads(out.stdout.strip().splitlines()[-1])
    return float(seconds), int(spans), int(rss)


def attributed(url: Any, selection: Selection, duck_s: float, span_bytes: int, spans: int) -> None:
    from tracekit.analysis.store.attributed import open_attributed

    print("Attributed path (tracekit attribute, then tracekit diff --store chdb://…):")
    whole_s, whole_spans, whole_rss = _attribute_child(f"chdb://{url.path}", "tracekit_", "0/1")
    print(
        f"  attribute, whole table                {whole_s:8.2f} s   "
        f"{whole_spans / whole_s:,.0f} spans/s, peak RSS {whole_rss / 1e6:,.0f} MB"
    )
    shard_s, shard_spans, _ = _attribute_child(f"chdb://{url.path}", "tkshard_", "0/2")
    print(
        f"  attribute --shard 0/2 (fresh tables)  {shard_s:8.2f} s   "
        f"{shard_spans:,} spans, {shard_s / whole_s:.2f}× the unsharded run"
    )
    store, read_s = timed("read attributed rows as Arrow", open_attributed, url, selection)
    assert store is not None
    _, diff_s = timed("diff", diff_releases, store, "v1", "v2")
    out = store.pulled_bytes
    store.close()
    client = connect(url)
    table = f"`{url.database}`.`{url.table}`"
    floor_sql = (
        f"SELECT TraceId, SpanId, ParentSpanId, Timestamp, Duration, "
        f"SpanAttributes['tracekit.stage'] FROM {table} "
        "WHERE ResourceAttributes['service.version'] IN ('v1', 'v2')"
    )
    t0 = time.perf_counter()
    floor_bytes = 0
    with client.query_arrow_stream(floor_sql) as stream:
        for batch in stream:
            floor_bytes += batch.nbytes
    floor_s = time.perf_counter() - t0
    client.close()
    print(
        f"  floor: read ids, times, stage of the spans  {floor_s:8.2f} s ({floor_bytes / 1e6:,.0f} MB)"
    )
    end = read_s + diff_s
    print(
        f"attributed diff end to end {end:.2f} s: {end / duck_s:.2f}× the DuckDB path, "
        f"{end / floor_s:.2f}× the span-read floor; {out / 1e6:,.1f} MB left the engine "
        f"against {span_bytes / 1e6:,.0f} MB for the span pull ({out / span_bytes:.3f}×); "
        f"attribute {whole_spans / whole_s:,.0f} spans/s of {spans:,}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
