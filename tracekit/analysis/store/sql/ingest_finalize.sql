-- Statements of tracekit.analysis.ingest.staging, by name (`-- name: x` starts one).
-- _tk_stage holds every span the input carried (both decoding paths); these move the
-- new ones into `spans` and find the problems that need the whole input: duplicates,
-- orphans (parent in neither the input nor the store) and clock skew against the parent.

-- name: create_stage
CREATE OR REPLACE TEMP TABLE _tk_stage (
    trace_id VARCHAR, span_id VARCHAR, parent_span_id VARCHAR, name VARCHAR, kind VARCHAR,
    start_ns BIGINT, end_ns BIGINT, status_code VARCHAR,
    service_name VARCHAR, service_version VARCHAR, instance_id VARCHAR, host_name VARCHAR,
    stage VARCHAR, time_kind VARCHAR, cpu_time_ns BIGINT, gpu_time_ns BIGINT,
    sample_weight DOUBLE, attributes VARCHAR, resource_attributes VARCHAR, links VARCHAR,
    source VARCHAR, trace_state VARCHAR, file_no INTEGER, lineno BIGINT, seq BIGINT, odd BOOLEAN
)

-- name: odd_lines
SELECT DISTINCT lineno FROM _tk_stage WHERE file_no = $file_no AND odd ORDER BY lineno

-- name: drop_odd_lines
DELETE FROM _tk_stage WHERE file_no = $file_no AND lineno IN (
    SELECT lineno FROM _tk_stage WHERE file_no = $file_no AND odd
)

-- name: odd_lines_all
SELECT DISTINCT file_no, lineno FROM _tk_stage WHERE odd ORDER BY 1, 2

-- name: drop_odd_lines_all
DELETE FROM _tk_stage WHERE (file_no, lineno) IN (
    SELECT (file_no, lineno) FROM _tk_stage WHERE odd
)

-- name: count_file
SELECT count(*) FROM _tk_stage WHERE file_no = $file_no

-- name: duplicate_count
SELECT count(*) - (SELECT count(*) FROM (SELECT DISTINCT trace_id, span_id FROM _tk_stage))
FROM _tk_stage

-- name: duplicates
SELECT source, trace_id, span_id, file_no FROM (
    SELECT source, trace_id, span_id, file_no, lineno, seq,
           row_number() OVER (PARTITION BY trace_id, span_id
                              ORDER BY file_no, lineno, seq, start_ns, name) AS rn
    FROM _tk_stage
-- In input order (a line holds many spans: seq is the place within it), so the report
-- repeats from run to run.
) WHERE rn > 1 ORDER BY file_no, lineno, seq, trace_id, span_id

-- name: keep_first
-- Only run when the input repeats a key: keep the first occurrence in input order.
CREATE OR REPLACE TEMP TABLE _tk_stage AS
SELECT * EXCLUDE (rn) FROM (
    SELECT *, row_number() OVER (PARTITION BY trace_id, span_id
                                 ORDER BY file_no, lineno, seq, start_ns, name) AS rn
    FROM _tk_stage
) WHERE rn = 1

-- name: insert_spans
-- The stage holds each key once (keep_first), so the keys not yet in `spans` can be
-- inserted plainly: INSERT OR IGNORE would probe the primary-key index once a row, which
-- costs more than this anti-join (and a plain INSERT) on a fresh or a full store alike.
INSERT INTO spans
SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code,
       service_name, coalesce(service_version, $version), instance_id, host_name,
       stage, time_kind, cpu_time_ns, gpu_time_ns, sample_weight,
       attributes::JSON, resource_attributes::JSON, links::JSON, source, trace_state
FROM _tk_stage s
WHERE NOT EXISTS (
    SELECT 1 FROM spans p WHERE p.trace_id = s.trace_id AND p.span_id = s.span_id
)

-- name: orphans
SELECT s.source, s.trace_id, s.span_id, s.parent_span_id, s.file_no
FROM _tk_stage s
WHERE s.parent_span_id IS NOT NULL
  AND NOT EXISTS (
      SELECT 1 FROM spans p WHERE p.trace_id = s.trace_id AND p.span_id = s.parent_span_id
  )
ORDER BY s.file_no, s.lineno, s.seq

-- name: skew
-- Children outside their parent's span, per (across hosts?, input file): how many, and
-- the one that overlaps most (first in input order on a tie). On one host, overlaps up
-- to $tolerance_ns are left out. Hosts compare by the most precise attribute both spans
-- carry: host.name, else service.instance.id, else service.name
-- (tracekit.analysis.ingest.skew owns this definition).
WITH o AS (
    SELECT c.source, c.trace_id, c.span_id, p.span_id AS parent_id,
           c.service_name AS service, p.service_name AS parent_service,
           coalesce(c.host_name, c.instance_id, c.service_name) AS host,
           coalesce(p.host_name, p.instance_id, p.service_name) AS parent_host,
           CASE WHEN c.host_name IS NOT NULL AND p.host_name IS NOT NULL
                    THEN c.host_name <> p.host_name
                WHEN c.instance_id IS NOT NULL AND p.instance_id IS NOT NULL
                    THEN c.instance_id <> p.instance_id
                ELSE c.service_name IS DISTINCT FROM p.service_name END AS cross_host,
           greatest(p.start_ns - c.start_ns, 0) AS early,
           greatest(c.end_ns - p.end_ns, 0) AS late,
           c.file_no, c.lineno, c.seq
    FROM _tk_stage c
    JOIN spans p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id
    WHERE c.start_ns < p.start_ns OR c.end_ns > p.end_ns
)
SELECT cross_host, file_no, count(*),
       first({'source': source, 'trace_id': trace_id, 'span_id': span_id,
              'parent_id': parent_id, 'service': service, 'parent_service': parent_service,
              'host': host, 'parent_host': parent_host, 'early': early, 'late': late}
             ORDER BY greatest(early, late) DESC, lineno, seq)
FROM o
WHERE cross_host OR greatest(early, late) > $tolerance_ns
GROUP BY cross_host, file_no
ORDER BY cross_host, file_no

-- name: trace_ids
SELECT DISTINCT trace_id FROM _tk_stage ORDER BY trace_id

-- name: releases
SELECT DISTINCT service_version FROM spans
WHERE parent_span_id IS NULL AND service_version IS NOT NULL
  AND trace_id IN (SELECT trace_id FROM _tk_stage)
ORDER BY service_version

-- name: log_file
INSERT INTO ingest_log (source, spans, problems) VALUES ($source, $spans, $problems)

-- name: drop_stage
DROP TABLE IF EXISTS _tk_stage
