"""The staging table an ingest fills, and the step that moves it into ``spans``.

Both decoding paths write into the temporary table ``_tk_stage``: the SQL fast path
with one ``INSERT … SELECT``, the Python decoders in batches of rows handed to DuckDB
as numpy columns (``executemany`` would be a hundred times slower). Once the whole
input is read, :func:`finalize` keeps the first of any duplicate keys, inserts the keys
``spans`` does not hold yet (so re-ingesting stores nothing), derives the stages of LLM
request spans from their latency attributes (:mod:`.genai`) and finds, in SQL, the
problems that need the whole input: orphans and children that overflow their parent
(:mod:`.skew` says when that is clock skew).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tracekit.analysis.ingest import cycles, genai, skew
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.problems import IngestReport, ProblemLog
from tracekit.analysis.ingest.rows import STAGE_COLUMNS
from tracekit.analysis.store import DatabaseError, Store, named_statements

BATCH_ROWS = 50_000
"""Python-decoded rows handed to DuckDB at a time."""

_CASTS = {
    "start_ns": "BIGINT",
    "end_ns": "BIGINT",
    "cpu_time_ns": "BIGINT",
    "gpu_time_ns": "BIGINT",
    "sample_weight": "DOUBLE",
    "file_no": "INTEGER",
    "lineno": "BIGINT",
    "seq": "BIGINT",
}


def statements() -> dict[str, str]:
    """The named statements of ``sql/ingest_finalize.sql``."""
    return named_statements("ingest_finalize.sql")


def sql(name: str) -> str:
    return statements()[name]


def run(store: Store, statement: str, params: dict[str, Any] | None = None) -> list[Any]:
    """Execute and drain: DuckDB refuses new work while a result is left unfetched."""
    return store.run(statement, params or {})


def create(store: Store) -> None:
    run(store, sql("create_stage"))


def insert_rows(store: Store, rows: Sequence[Sequence[Any]]) -> None:
    """Append Python-decoded rows (tuples in :data:`STAGE_COLUMNS` order) to the stage."""
    if not rows:
        return
    select = ", ".join(f"CAST({c} AS {_CASTS.get(c, 'VARCHAR')})" for c in STAGE_COLUMNS)
    store.register_rows("_tk_rows", STAGE_COLUMNS, rows)
    try:
        run(
            store,
            f"INSERT INTO _tk_stage ({', '.join(STAGE_COLUMNS)}, odd) "
            f"SELECT {select}, false FROM _tk_rows",
        )
    finally:
        store.con.unregister("_tk_rows")


def finalize(
    store: Store,
    log: ProblemLog,
    report: IngestReport,
    *,
    version: str | None,
    file_names: dict[int, str],
    file_spans: dict[int, int],
) -> None:
    """Dedupe, insert, detect whole-input problems; fill ``report``'s totals."""
    con = store.con
    log.current_file = ""  # problems found here are tallied per file by file_no below
    report.spans_read = int(run(store, "SELECT count(*) FROM _tk_stage")[0][0])

    per_file: dict[int, int] = {}
    if run(store, sql("duplicate_count"))[0][0]:
        cur = con.execute(sql("duplicates"))
        while batch := cur.fetchmany(10_000):
            for source, trace_id, span_id, file_no in batch:
                per_file[file_no] = per_file.get(file_no, 0) + 1
                log.add(
                    source,
                    f"span {span_id} of trace {trace_id} repeats an earlier one; kept the first",
                    pk.DUPLICATE,
                )
        run(store, sql("keep_first"))
    cycles.break_cycles(store, log)

    before = store.span_count()
    run(store, "BEGIN")
    try:
        store.insert_keyed("spans", sql("insert_spans"), {"version": version})
        report.spans_stored = store.span_count() - before
        # With the input's spans in, a stage child from this input or an earlier one is
        # seen; every format and `tracekit collect` pass here.
        report.stages_derived = genai.derive(store, log, per_file=per_file).requests
        run(store, "COMMIT")
    except DatabaseError:
        store.rollback()
        raise
    report.every_trace = before == 0

    cur = con.execute(sql("orphans"))
    while batch := cur.fetchmany(10_000):
        for source, trace_id, span_id, parent, file_no in batch:
            per_file[file_no] = per_file.get(file_no, 0) + 1
            log.add(
                source, f"span {span_id}: parent {parent} is not in trace {trace_id}", pk.ORPHAN
            )
    skew.check(store, sql("skew"), log, per_file)

    report.trace_ids = [r[0] for r in run(store, sql("trace_ids"))]
    report.traces = len(report.trace_ids)
    report.releases = [r[0] for r in run(store, sql("releases"))]
    for file_no, display in file_names.items():
        problems = log.by_file.get(display, 0) + per_file.get(file_no, 0)
        run(
            store,
            sql("log_file"),
            {"source": display, "spans": file_spans.get(file_no, 0), "problems": problems},
        )
    report.problems = sorted(log.problems, key=lambda p: (p.skipped == 0, p.kind))
    report.counts = dict(sorted(log.counts.items()))
    report.skipped = log.skipped
