"""Ingest speed: tracekit vs a plain ``json.loads`` loop vs DuckDB's own ``read_json``.

Generates an OTLP JSON-lines file the way the Collector's file exporter writes one
(a resource block per service on every line, 100-500 spans a line, 8-span requests
with tracekit's attributes), then prints spans/s for:

  (a) tracekit: ``ingest_paths`` into a fresh DuckDB file (parse, check every value,
      dedupe, orphans and skew, insert under the (trace_id, span_id) primary key);
  (b) plain: a Python loop of ``json.loads`` per line that only builds the row tuples,
      attributes decoded into a dict and ``json.dumps``-ed as tracekit stores them (it
      checks nothing, maps no enums and stores nothing: less work than (a));
  (c) duckdb read_json: DuckDB reading the same file into a table, nothing else;

and the ratio tracekit / plain (the issue's target is >= 4x). ``attribution.refresh``
is timed separately. Figures only; nothing is asserted.

    python benchmarks/ingest.py [--spans 500000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
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
                trace_id = rnd.getrandbits(128).to_bytes(16, "big").hex()
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


def duckdb_read_json(path: Path, db: Path) -> float:
    """(c): DuckDB's read_json of the same file into a table; returns seconds."""
    import duckdb

    con = duckdb.connect(str(db))
    t = time.perf_counter()
    con.execute(
        "CREATE TABLE raw AS SELECT * FROM read_json(?, format = 'newline_delimited')", [str(path)]
    ).fetchall()
    seconds = time.perf_counter() - t
    con.close()
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--spans", type=int, default=500_000)
    parser.add_argument("--keep", type=Path, help="write the files here and keep them")
    args = parser.parse_args(argv)

    from tracekit.analysis.ingest import ingest_paths
    from tracekit.analysis.store import open_store

    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = work / "spans.jsonl"
        t = time.perf_counter()
        n = generate(data, args.spans)
        print(
            f"generated {n:,} spans, {data.stat().st_size / 1e6:,.0f} MB in "
            f"{time.perf_counter() - t:.1f} s: {data}"
        )

        t = time.perf_counter()
        plain_rows = plain_loop(data)
        plain_s = time.perf_counter() - t

        db = work / "bench.duckdb"
        db.unlink(missing_ok=True)
        with open_store(db) as store:
            t = time.perf_counter()
            report = ingest_paths(store, [data])
            tk_s = time.perf_counter() - t
            refresh_s = None
            try:
                from tracekit.analysis.attribution import per_request as attribution
            except ImportError:
                attribution = None  # type: ignore[assignment]
            if attribution is not None:
                t = time.perf_counter()
                attribution.refresh(store, report.trace_ids)
                refresh_s = time.perf_counter() - t

        raw_db = work / "read_json.duckdb"
        raw_db.unlink(missing_ok=True)
        rj_s = duckdb_read_json(data, raw_db)

    if not plain_rows == report.spans_read == n:
        print(
            f"span counts differ: generated {n}, plain {plain_rows}, tracekit {report.spans_read}"
        )
        return 1
    print(
        f"(a) tracekit ingest_paths   {n / tk_s:>12,.0f} spans/s  ({tk_s:.2f} s; {report.summary_line()})"
    )
    print(f"(b) plain json.loads loop   {n / plain_s:>12,.0f} spans/s  ({plain_s:.2f} s)")
    print(f"(c) duckdb read_json        {n / rj_s:>12,.0f} spans/s  ({rj_s:.2f} s)")
    print(
        f"tracekit / plain = {plain_s / tk_s:.2f}x (target >= 4x); "
        f"tracekit / read_json = {rj_s / tk_s:.2f}x"
    )
    if refresh_s is not None:
        print(
            f"attribution.refresh         {report.traces / refresh_s:>12,.0f} traces/s ({refresh_s:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
