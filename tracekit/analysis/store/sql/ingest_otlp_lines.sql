-- OTLP JSON lines -> _tk_stage: the SQL half of ingest's fast path.
-- Sections by name (`-- name: x` starts one; a section may hold several statements,
-- each ending with ";" and a newline), run by tracekit.analysis.ingest.fast.
--
-- msgspec has decoded each line into columns (_tk_cols: one row per span, attributes
-- already mapped, odd = true where the mapping must be left to the reference decoder)
-- and resources (_tk_res). The stage statement checks ids, times and enums in bulk:
-- a span this query would not store exactly as tracekit/analysis/ingest/otlp.py does
-- (padded or non-hex ids, missing or negative times, unknown enums) is odd too, and
-- Python re-reads its whole line, reports and decodes it.

-- name: macros
CREATE OR REPLACE TEMP MACRO _tk_trace_hex(s) AS regexp_full_match(s, '[0-9a-fA-F]{32}');

CREATE OR REPLACE TEMP MACRO _tk_span_hex(s) AS regexp_full_match(s, '[0-9a-fA-F]{16}');

CREATE OR REPLACE TEMP MACRO _tk_kind(k) AS CASE upper(replace(coalesce(k, '0'), 'SPAN_KIND_', ''))
    WHEN '0' THEN 'UNSPECIFIED' WHEN 'UNSPECIFIED' THEN 'UNSPECIFIED'
    WHEN '1' THEN 'INTERNAL' WHEN 'INTERNAL' THEN 'INTERNAL'
    WHEN '2' THEN 'SERVER' WHEN 'SERVER' THEN 'SERVER'
    WHEN '3' THEN 'CLIENT' WHEN 'CLIENT' THEN 'CLIENT'
    WHEN '4' THEN 'PRODUCER' WHEN 'PRODUCER' THEN 'PRODUCER'
    WHEN '5' THEN 'CONSUMER' WHEN 'CONSUMER' THEN 'CONSUMER'
END;

CREATE OR REPLACE TEMP MACRO _tk_status(c) AS CASE upper(replace(coalesce(c, '0'), 'STATUS_CODE_', ''))
    WHEN '0' THEN 'UNSET' WHEN 'UNSET' THEN 'UNSET'
    WHEN '1' THEN 'OK' WHEN 'OK' THEN 'OK'
    WHEN '2' THEN 'ERROR' WHEN 'ERROR' THEN 'ERROR'
END;

-- name: stage
INSERT INTO _tk_stage
WITH cols AS (
    SELECT c.*, r.service_name, r.service_version, r.instance_id, r.host_name, r.ra_json,
           f.display,
           TRY_CAST(c.start_ns AS BIGINT) AS t0, TRY_CAST(c.end_ns AS BIGINT) AS t1,
           _tk_kind(c.kind::VARCHAR) AS kind_name,
           _tk_status(c.status::VARCHAR) AS status_name
    FROM _tk_cols c JOIN _tk_res r ON r.res = c.res JOIN _tk_files f ON f.file_no = c.file_no
)
SELECT
    lower(trace_id),
    lower(span_id),
    CASE WHEN parent = '' OR parent = '0000000000000000' THEN NULL ELSE lower(parent) END,
    name,
    kind_name,
    t0,
    t1,
    status_name,
    service_name,
    service_version,
    instance_id,
    host_name,
    stage,
    time_kind,
    cpu_ns::BIGINT,
    gpu_ns::BIGINT,
    weight,
    decode(attrs::BLOB),
    ra_json,
    links,
    display || ':' || lineno,
    nullif(trace_state, ''),
    file_no,
    lineno,
    seq,
    odd OR links IS NULL
        OR NOT _tk_trace_hex(trace_id) OR NOT _tk_span_hex(span_id)
        OR NOT (parent = '' OR _tk_span_hex(parent))
        OR coalesce(t0, 0) <= 0 OR coalesce(t1, 0) <= 0 OR t1 < t0
        OR kind_name IS NULL OR status_name IS NULL
FROM cols;
