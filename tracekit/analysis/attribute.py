"""``tracekit attribute``: attribute each trace once, inside the fleet's ClickHouse.

A run takes the traces whose request span (the root) ended in a window — from the
shard's watermark (or ``since``; the whole table on a first run) to ``until`` and at
most ``now - settle`` — and, one slice of at most ``batch_traces`` requests at a time,
pulls only those traces' spans, attributes them with the same code as ``tracekit
ingest`` (:func:`tracekit.analysis.attribution.per_request.refresh`) and writes the
per-request rows back next to the spans (:mod:`tracekit.analysis.store.attributed`).

- **Idempotent**: a trace is skipped when its attributed row saw as many spans as the
  table holds now; so a second run over the same window writes nothing, and a trace
  whose late spans arrived after it was attributed is attributed again (its new rows
  replace the old: ReplacingMergeTree, read FINAL).
- **Incremental**: the shard's watermark moves to the window's end; the next run starts
  there, re-checking the last ``recheck`` seconds before it for late spans.
- **Shardable**: ``shard=K/N`` takes the traces with ``cityHash64(TraceId) % N = K``.
- **Bounded memory**: a slice is at most ``batch_traces`` requests (a single second
  holding more is one slice), whatever the table's size.
- **LLM stages**: an LLM engine's request span with latency attributes gets its
  queue/prefill/decode stages derived in the pulled snapshot before it is attributed, as
  ``tracekit ingest`` derives them (:mod:`tracekit.analysis.ingest.genai`); they reach the
  stage table, never the spans table.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from tracekit.analysis.attribution import per_request
from tracekit.analysis.cohorts.bubbleup import SPAN_PAIRS, pair_parameters
from tracekit.analysis.ingest import genai
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.store.attributed import (
    AttributedNames,
    create_tables,
    set_watermark,
    watermarks,
)
from tracekit.analysis.store.clickhouse import (
    ClickHouseSnapshot,
    check_table,
    connect,
    driver_errors,
    open_snapshot,
    run,
)
from tracekit.analysis.store.url import StoreURL
from tracekit.errors import ConfigError

MAX_NS = 2**63 - 1
MAX_REQUEST_NS = 3600 * 10**9
"""Requests are looked for among root spans that started at most this long before the
window: the spans table's partitions and time key prune the rest (a request longer than
an hour that ends in the window is attributed by a run whose window reaches its start)."""
SLACK_NS = 300 * 10**9
"""Spans are looked for from this long before their slice's first request started to
this long after its last ended: a span further from its request is not attributed."""


@dataclass(frozen=True)
class Shard:
    """``K/N``: the traces with ``cityHash64(TraceId) % N = K``."""

    k: int = 0
    n: int = 1

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


def parse_shard(text: str) -> Shard:
    """``"0/2"`` → Shard(0, 2); ``3/2``, ``-1/2``, ``x`` are a :class:`ConfigError`."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not m or int(m[2]) < 1 or int(m[1]) >= int(m[2]):
        raise ConfigError(
            f"--shard {text!r}: write K/N with 0 <= K < N, e.g. --shard 0/4 for the first "
            "of four workers"
        )
    return Shard(int(m[1]), int(m[2]))


@dataclass
class AttributeReport:
    """What one run did."""

    shard: str
    window: tuple[int, int]
    """[from, to) on request end, ns."""
    requests: int = 0
    """Requests attributed and written (re-attributed ones included)."""
    reattributed: int = 0
    """Of those, traces attributed before whose spans grew since."""
    spans: int = 0
    already: int = 0
    """Requests in the window attributed before, with nothing new: not written again."""
    orphans: int = 0
    """Traces pulled whose spans hold no request span (skipped, counted here)."""
    batches: int = 0
    """Traces rooted at a batch span (a batcher's work, not a request): not written."""
    rootless: int = 0
    """Traces with spans in the window and no request span anywhere in the table (their
    root was never exported, or not yet): skipped, and counted here."""
    slices: int = 0
    pulled_bytes: int = 0
    seconds: float = 0.0
    watermark: int | None = None
    """Where the shard's watermark stands after the run (None: not moved)."""
    stages_derived: int = 0
    """Requests whose queue/prefill/decode were derived from latency attributes."""
    problems: dict[str, int] = field(default_factory=dict)
    """What deriving them found, by kind (``llm_missing``, ``llm_invalid``, …)."""
    notes: list[str] = field(default_factory=list)

    @property
    def spans_per_s(self) -> float:
        return self.spans / self.seconds if self.seconds > 0 else 0.0


_ROOT = "ParentSpanId IN ('', '0000000000000000')"
_END = (
    "(toUnixTimestamp64Nano(Timestamp) + if(Duration > 4611686018427387904, 0, toInt64(Duration)))"
)
_WINDOW = (
    "Timestamp >= fromUnixTimestamp64Nano(greatest({lo:Int64} - "
    + str(MAX_REQUEST_NS)
    + ", 0)) AND Timestamp < fromUnixTimestamp64Nano({hi:Int64})"
)
_ENDED_IN = f"""{_ROOT} AND {_WINDOW} AND {_END} >= {{lo:Int64}} AND {_END} < {{hi:Int64}}
  AND cityHash64(TraceId) % {{n:UInt64}} = {{k:UInt64}}"""
"""A request span of the shard that ended in ``[lo, hi)``."""

_SLICES = f"""
SELECT intDiv({_END}, 1000000000) AS second, uniqExact(TraceId) AS requests,
       min(toUnixTimestamp64Nano(Timestamp)) AS first_start, max({_END}) AS last_end
FROM {{table}} WHERE {_ENDED_IN}
GROUP BY second ORDER BY second
"""

_SLICE_ROOTS = "SELECT TraceId FROM {table} WHERE " + _ENDED_IN.replace(
    "{lo:Int64}", "{slo:Int64}"
).replace("{hi:Int64}", "{shi:Int64}")
"""The traces of one slice: requests that ended in ``[slo, shi)``."""

_ROOTLESS = f"""
SELECT count() FROM (
    SELECT TraceId FROM {{table}}
    WHERE Timestamp >= fromUnixTimestamp64Nano({{lo:Int64}})
      AND Timestamp < fromUnixTimestamp64Nano({{hi:Int64}})
      AND cityHash64(TraceId) % {{n:UInt64}} = {{k:UInt64}}
    GROUP BY TraceId
    HAVING countIf({_ROOT}) = 0
)
WHERE TraceId NOT IN (SELECT TraceId FROM {{table}} WHERE {_ROOT}
                      AND Timestamp >= fromUnixTimestamp64Nano(greatest({{lo:Int64}} - {MAX_REQUEST_NS}, 0))
                      AND cityHash64(TraceId) % {{n:UInt64}} = {{k:UInt64}})
"""

# The slice's traces that need attributing: never attributed, or attributed when fewer
# of their spans were in the table than are now (late spans). Spans are counted in the
# same time bounds the pull uses, so a trace seen whole is never attributed twice.
_PENDING = f"""
SELECT c.TraceId FROM (
    SELECT TraceId, uniqExact(SpanId) AS seen FROM {{table}}
    WHERE TraceId IN ({_SLICE_ROOTS})
      AND Timestamp >= fromUnixTimestamp64Nano({{ts_lo:Int64}})
      AND Timestamp < fromUnixTimestamp64Nano({{ts_hi:Int64}})
    GROUP BY TraceId
) AS c
LEFT JOIN (
    SELECT TraceId, SpansSeen FROM {{requests}} FINAL
    WHERE TraceId IN ({_SLICE_ROOTS})
) AS a ON a.TraceId = c.TraceId
WHERE a.TraceId = '' OR a.SpansSeen != c.seen
"""

_GROWN = (
    "SELECT count() FROM ("
    + _PENDING.replace("SELECT c.TraceId FROM", "SELECT a.TraceId AS before FROM", 1)
    + ") WHERE before != ''"
)
"""Of the slice's traces to attribute, those attributed before: their spans grew."""


def _slices(rows: list[Any], batch: int) -> list[tuple[int, int, int, int, int]]:
    """Consecutive seconds grouped into slices of at most ``batch`` requests:
    (end from, end to, first span start, last end, requests)."""
    out: list[tuple[int, int, int, int, int]] = []
    cur: list[Any] = []
    count = 0
    for row in rows:
        if cur and count + int(row[1]) > batch:
            out.append(_slice(cur, count))
            cur, count = [], 0
        cur.append(row)
        count += int(row[1])
    if cur:
        out.append(_slice(cur, count))
    return out


def _slice(rows: list[Any], count: int) -> tuple[int, int, int, int, int]:
    lo = int(rows[0][0]) * 10**9
    hi = (int(rows[-1][0]) + 1) * 10**9
    return lo, hi, min(int(r[2]) for r in rows), max(int(r[3]) for r in rows), count


def attribute(
    url: StoreURL,
    *,
    since_ns: int | None = None,
    until_ns: int | None = None,
    settle_s: float = 120.0,
    shard: Shard = Shard(),
    batch_traces: int = 50_000,
    recheck_s: float = 900.0,
    names: AttributedNames | None = None,
    cluster: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    now_ns: int | None = None,
) -> AttributeReport:
    """Attribute the window's new (or grown) traces of ``shard``; see the module doc."""
    if batch_traces < 1:
        raise ConfigError(f"--batch-traces must be 1 or more, got {batch_traces}")
    if settle_s < 0 or recheck_s < 0:
        raise ConfigError("--settle and --recheck are durations, 0 or more")
    names = names or AttributedNames.for_table(url.table)
    t0 = time.perf_counter()
    now = time.time_ns() if now_ns is None else now_ns
    client = connect(url)
    try:
        check_table(client, url)
        create_tables(client, url, names, cluster=cluster)
        mark = watermarks(client, url, names).get(str(shard))
        start = since_ns if since_ns is not None else (mark or 0)
        # Late spans of traces attributed just before the watermark: checked again.
        lo = max(0, start - int(recheck_s * 1e9)) if since_ns is None and mark else start
        hi = min(until_ns if until_ns is not None else MAX_NS, now - int(settle_s * 1e9))
        report = AttributeReport(str(shard), (start, hi))
        if hi > lo:
            _run_window(client, url, names, shard, lo, hi, batch_traces, now, report, progress)
        # The watermark moves only over a window that starts where it stands.
        if hi > start and (mark is None and since_ns is None or mark is not None and start <= mark):
            report.watermark = max(hi, mark or 0)
            set_watermark(client, url, names, str(shard), report.watermark, report.requests)
    finally:
        client.close()
    if report.stages_derived:
        report.notes.append(
            f"queue/prefill/decode derived from latency attributes for "
            f"{report.stages_derived:,} requests"
        )
    for kind, n in sorted(report.problems.items()):
        report.notes.append(f"{n:,} {kind}: LLM latency attributes (docs/llm.md)")
    report.seconds = time.perf_counter() - t0
    return report


def _run_window(
    client: Any,
    url: StoreURL,
    names: AttributedNames,
    shard: Shard,
    lo: int,
    hi: int,
    batch: int,
    now: int,
    report: AttributeReport,
    progress: Callable[[int, int], None] | None,
) -> None:
    table = f"`{url.database}`.`{url.table}`"
    base = {"lo": lo, "hi": hi, "n": shard.n, "k": shard.k}
    seconds = run(client, url, _SLICES.replace("{table}", table), base)
    slices = _slices(seconds, batch)
    total = sum(s[4] for s in slices)
    done = 0
    requests = f"`{url.database}`.`{names.requests}`"
    pending_sql = _PENDING.replace("{table}", table).replace("{requests}", requests)
    for s_lo, s_hi, first_start, last_end, count in slices:
        params = {
            **base,
            "slo": max(s_lo, lo),
            "shi": min(s_hi, hi),
            "ts_lo": max(0, first_start - SLACK_NS),
            "ts_hi": last_end + SLACK_NS,
        }
        trace_filter = (
            f"TraceId IN ({pending_sql}) "
            "AND Timestamp >= fromUnixTimestamp64Nano({ts_lo:Int64}) "
            "AND Timestamp < fromUnixTimestamp64Nano({ts_hi:Int64})"
        )
        grown = run(
            client, url, _GROWN.replace("{table}", table).replace("{requests}", requests), params
        )
        report.reattributed += int(grown[0][0]) if grown else 0
        snapshot = open_snapshot(
            url, trace_filter=trace_filter, params=params, client=client, checked=True
        )
        try:
            _attribute_slice(client, url, names, snapshot, now, report)
        finally:
            snapshot.close()
        report.slices += 1
        done += count
        if progress is not None:
            progress(done, total)
    report.already = max(0, total - report.requests - report.orphans - report.batches)
    rows = run(client, url, _ROOTLESS.replace("{table}", table), base)
    report.rootless = int(rows[0][0]) if rows else 0


def _attribute_slice(
    client: Any,
    url: StoreURL,
    names: AttributedNames,
    snapshot: ClickHouseSnapshot,
    now: int,
    report: AttributeReport,
) -> None:
    """Attribute the pulled traces and write their rows (all three tables, one version)."""
    report.pulled_bytes += snapshot.pulled_bytes
    con = snapshot.con
    row = con.execute("SELECT count(DISTINCT trace_id) FROM spans").fetchone()
    traces = int(row[0]) if row else 0
    if not traces:
        return
    # SpansSeen is what the table holds: counted before any stage is derived here.
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _tk_seen AS "
        "SELECT trace_id, count(*) AS n FROM spans GROUP BY trace_id"
    ).fetchall()
    log = ProblemLog(strict=False)
    derived = genai.derive(snapshot, log, staged=False)
    report.stages_derived += derived.requests
    for kind, n in log.counts.items():
        report.problems[kind] = report.problems.get(kind, 0) + n
    done = per_request.refresh(snapshot)
    report.spans += done.spans - derived.spans_added
    report.batches += done.batch_traces
    report.orphans += max(0, traces - done.requests - done.batch_traces)
    if not done.requests:
        return
    stamp = {"now": now}
    requests = con.sql(_REQUESTS_OUT, params=stamp).to_arrow_table()
    stages = con.sql(_STAGES_OUT, params=stamp).to_arrow_table()
    operations = con.sql(_OPERATIONS_OUT, params=stamp).to_arrow_table()
    pairs = con.sql(
        "WITH req AS (SELECT trace_id FROM requests) "
        "SELECT trace_id AS TraceId, attribute AS Attribute, value AS Value, "
        f"make_timestamp_ns($now) AS AttributedAt FROM ({SPAN_PAIRS})",
        params={**pair_parameters(), **stamp},
    ).to_arrow_table()
    _insert(client, url, names.requests, requests)
    _insert(client, url, names.stages, stages)
    _insert(client, url, names.operations, operations)
    _insert(client, url, names.attributes, pairs)
    report.requests += len(requests)


_REQUESTS_OUT = """
SELECT trace_id AS TraceId, root_span_id AS RootSpanId,
       coalesce(service_name, '') AS ServiceName, coalesce(release, '') AS Release,
       coalesce(instance_id, '') AS InstanceId, coalesce(host_name, '') AS HostName,
       coalesce(name, '') AS Name, coalesce(route, '') AS Route,
       start_ns AS StartNs, duration_ns AS DurationNs, is_error AS IsError,
       sample_weight AS SampleWeight, inflight AS Inflight, queue_depth AS QueueDepth,
       cpu_utilization AS CpuUtilization, gpu_utilization AS GpuUtilization,
       span_count::UINTEGER AS SpanCount, skewed_spans::UINTEGER AS SkewedSpans,
       (SELECT n FROM _tk_seen s WHERE s.trace_id = r.trace_id)::UINTEGER AS SpansSeen,
       make_timestamp_ns($now) AS AttributedAt
FROM requests r
"""

_STAGES_OUT = """
SELECT trace_id AS TraceId, stage AS Stage, time_kind AS TimeKind, critical_ns AS CriticalNs,
       wall_ns AS WallNs, cpu_time_ns AS CpuTimeNs, gpu_time_ns AS GpuTimeNs,
       make_timestamp_ns($now) AS AttributedAt
FROM request_stages
"""


_OPERATIONS_OUT = """
SELECT trace_id AS TraceId, stage AS Stage, service AS Service, operation AS Operation,
       critical_ns AS CriticalNs, calls::UINTEGER AS Calls,
       calls_on_path::UINTEGER AS CallsOnPath, overlapping::UINTEGER AS Overlapping,
       errors::UINTEGER AS Errors, make_timestamp_ns($now) AS AttributedAt
FROM request_operations
"""


def _insert(client: Any, url: StoreURL, table: str, rows: pa.Table) -> None:
    if len(rows):
        # "cannot write db.t in URL: …": attribute needs CREATE TABLE and INSERT on its tables.
        with driver_errors(url, f"cannot write {url.database}.{table} (CREATE/INSERT) in"):
            client.insert_arrow(table, rows, database=url.database)


def follow(
    url: StoreURL,
    *,
    interval_s: float,
    stop: Any,
    on_report: Callable[[AttributeReport], None],
    on_error: Callable[[Exception], None],
    **options: Any,
) -> int:
    """:func:`attribute` every ``interval_s`` until ``stop`` (a ``threading.Event``) is
    set; returns the runs made. A run that fails (the server away for a moment) is
    reported through ``on_error`` and the next one tries again."""
    from tracekit.errors import TracekitError

    runs = 0
    while not stop.is_set():
        try:
            on_report(attribute(url, **options))
        except TracekitError as exc:
            on_error(exc)
        runs += 1
        stop.wait(interval_s)
    return runs
