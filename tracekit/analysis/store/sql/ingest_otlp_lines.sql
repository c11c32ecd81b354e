-- OTLP JSON lines -> _tk_stage, parsed entirely inside DuckDB: the fast path of ingest.
-- Sections by name (`-- name: x` starts one; a section may hold several statements,
-- each ending with ";" and a newline), run in this order by tracekit.analysis.ingest.fast.
--
-- One row per span of every clean line. A line that is not valid JSON, is not an OTLP
-- document, or holds anything this query would not decode exactly as the Python
-- reference decoder does (tracekit/analysis/ingest/otlp.py: padded or non-hex ids,
-- missing or negative times, nested, repeated or huge attribute values, unknown enums,
-- api_v3's {"result": ...} wrapper) yields rows with odd = true instead; Python re-reads
-- those lines, reports and decodes them.

-- name: macros
-- An AnyValue as JSON text; NULL when Python must decode it (nested, not an int64,
-- not finite), which makes the span odd. An empty value is JSON null, as in Python.
CREATE OR REPLACE TEMP MACRO _tk_val(v) AS CASE
    WHEN v.stringValue IS NOT NULL THEN to_json(v.stringValue)::VARCHAR
    WHEN v.boolValue IS NOT NULL THEN CASE WHEN v.boolValue THEN 'true' ELSE 'false' END
    WHEN v.intValue IS NOT NULL THEN TRY_CAST(v.intValue AS BIGINT)::VARCHAR
    WHEN v.doubleValue IS NOT NULL THEN
        CASE WHEN isfinite(v.doubleValue) THEN to_json(v.doubleValue)::VARCHAR END
    WHEN v.bytesValue IS NOT NULL THEN to_json(v.bytesValue)::VARCHAR
    WHEN v.arrayValue IS NOT NULL OR v.kvlistValue IS NOT NULL THEN NULL
    ELSE 'null'
END;

-- The object of a key/value list, or NULL when an entry needs Python. A string longer
-- than 4096 characters (truncated by Python) can only hide in an object longer than
-- that: those go to Python.
CREATE OR REPLACE TEMP MACRO _tk_obj_of(parts) AS CASE
    WHEN list_count(parts) = len(parts) THEN '{' || array_to_string(parts, ',') || '}' END;

CREATE OR REPLACE TEMP MACRO _tk_obj(kv) AS _tk_obj_of(coalesce(list_transform(kv, lambda x:
    to_json(x.key)::VARCHAR || ':' || _tk_val(x.value)), []));

CREATE OR REPLACE TEMP MACRO _tk_too_big(obj) AS obj IS NULL OR length(obj) > 4096;

-- The value under key k. Python keeps the last of repeated keys, so a list that repeats
-- a key makes its span odd (`_tk_unique`) and the first match here is the only one.
CREATE OR REPLACE TEMP MACRO _tk_at(kv, keys, k) AS kv[list_position(keys, k)].value;

CREATE OR REPLACE TEMP MACRO _tk_keys(kv) AS list_transform(kv, lambda x: x.key);

CREATE OR REPLACE TEMP MACRO _tk_unique(keys) AS list_unique(keys) = len(keys);

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

-- name: spans_of
-- Step 1: lines first_line..last_line -> one row per span, its struct as json_transform
-- made it. {doc} is json_transform(line, <structure>), guarded by json_valid(line) when
-- the unguarded run hit a malformed line (one JSON parse per line instead of two).
-- Only plain UNNESTs: a CASE or flatten over the nested lists copies every span, and
-- expressions over the spans an UNNEST yields run several times slower than over the
-- same spans read back from a table, so they wait for step 2.
-- A line without a resourceSpans list, and a resource that is not an object or is odd
-- itself, still yield a row (the `pad` UNNEST of each level makes it) whose NULL span
-- or rs_odd makes the line odd.
CREATE OR REPLACE TEMP MACRO _tk_spans_of(file, codec, first_line, last_line) AS TABLE
WITH lines AS (
    SELECT line, ordinality AS lineno
    FROM (
        -- The LIMIT stops reading the file after the range.
        SELECT * FROM read_csv(
            file, columns = {'line': 'VARCHAR'}, delim = chr(1), quote = '', escape = '',
            header = false, auto_detect = false, new_line = '\n', compression = codec,
            max_line_size = 1073741824
        ) WITH ORDINALITY
        LIMIT last_line
    )
    WHERE line IS NOT NULL AND ordinality >= first_line
),
docs AS (
    SELECT lineno, ({doc}).resourceSpans AS rss FROM lines
),
resources AS (
    SELECT lineno, unnest(rss) AS rs, unnest(range(len(rss))) AS r_i,
           unnest(CASE WHEN rss IS NULL THEN [1] END) AS pad
    FROM docs
),
-- Resource columns are computed once per resource, before its spans are unnested.
res AS (
    SELECT lineno, r_i, rs, rs.resource.attributes AS kv, _tk_keys(kv) AS keys
    FROM resources
),
res_cols AS (
    SELECT
        lineno, r_i, rs, ra_json,
        rs IS NULL OR NOT _tk_unique(keys) OR _tk_too_big(ra_json) AS rs_odd,
        _tk_at(kv, keys, 'service.name').stringValue AS service_name,
        _tk_at(kv, keys, 'service.version').stringValue AS service_version,
        _tk_at(kv, keys, 'service.instance.id').stringValue AS instance_id,
        _tk_at(kv, keys, 'host.name').stringValue AS host_name
    FROM (SELECT *, _tk_obj(kv) AS ra_json FROM res)
),
scopes AS (
    SELECT lineno, r_i, rs_odd, ra_json, service_name, service_version, instance_id,
           host_name, unnest(rs.scopeSpans) AS ss, unnest(range(len(rs.scopeSpans))) AS s_i,
           unnest(CASE WHEN rs_odd THEN [1] END) AS pad
    FROM res_cols
)
SELECT lineno, r_i, s_i, rs_odd, ra_json, service_name, service_version, instance_id,
       host_name, unnest(ss.spans) AS s, unnest(range(len(ss.spans))) AS i,
       unnest(CASE WHEN rs_odd THEN [1] END) AS pad
FROM scopes;

-- name: spans
-- {parts}: one `SELECT * FROM _tk_spans_of($path, $compression, $first_k, $last_k)` per
-- range of lines, joined by UNION ALL. A file has few, long lines, and a vector of lines
-- is DuckDB's unit of parallel work, so one range would be parsed on one thread; DuckDB
-- runs the branches side by side (when it need not keep their order).
CREATE OR REPLACE TEMP TABLE _tk_spans AS {parts};

-- name: stage
-- Step 2: spans -> rows of _tk_stage (a parallel scan of _tk_spans).
INSERT INTO _tk_stage
WITH cols AS (
    SELECT
        lineno, rs_odd, ra_json, service_name, service_version, instance_id,
        host_name, s,
        -- The order in which Python numbers the spans of a line (resource, scope, span):
        -- it decides the first of repeated keys. No list in a line of at most 1 GB holds
        -- 2^21 entries.
        (coalesce(r_i, 0) * 2097152 + coalesce(s_i, 0)) * 2097152 + coalesce(i, 0) AS seq,
        s.attributes AS kv,
        _tk_keys(kv) AS keys,
        TRY_CAST(s.startTimeUnixNano AS BIGINT) AS start_ns,
        TRY_CAST(s.endTimeUnixNano AS BIGINT) AS end_ns,
        _tk_kind(s.kind) AS kind,
        _tk_status(s.status.code) AS status_code,
        _tk_obj(kv) AS attributes
    FROM _tk_spans
)
SELECT
    lower(s.traceId) AS trace_id,
    lower(s.spanId) AS span_id,
    CASE WHEN s.parentSpanId = '' OR s.parentSpanId = '0000000000000000' THEN NULL
         ELSE lower(s.parentSpanId) END AS parent_span_id,
    coalesce(s.name, '') AS name,
    kind,
    start_ns,
    end_ns,
    status_code,
    service_name,
    service_version,
    instance_id,
    host_name,
    _tk_at(kv, keys, 'tracekit.stage').stringValue AS stage,
    _tk_at(kv, keys, 'tracekit.time_kind').stringValue AS time_kind,
    TRY_CAST(_tk_at(kv, keys, 'tracekit.cpu_time_ns').intValue AS BIGINT) AS cpu_time_ns,
    TRY_CAST(_tk_at(kv, keys, 'tracekit.gpu_time_ns').intValue AS BIGINT) AS gpu_time_ns,
    coalesce(
        _tk_at(kv, keys, 'tracekit.sample.weight').doubleValue,
        TRY_CAST(_tk_at(kv, keys, 'tracekit.sample.weight').intValue AS DOUBLE),
        1.0
    ) AS sample_weight,
    attributes,
    ra_json AS resource_attributes,
    -- Most spans have no links; CASE keeps the lambdas off those rows.
    CASE WHEN len(s.links) > 0 THEN '[' || array_to_string(list_transform(s.links, lambda x:
        '{"trace_id":' || to_json(lower(x.traceId))::VARCHAR
        || ',"span_id":' || to_json(lower(x.spanId))::VARCHAR
        || ',"attributes":' || _tk_obj(x.attributes) || '}'), ',') || ']'
        ELSE '[]' END AS links,
    $display || ':' || lineno AS source,
    $file_no AS file_no,
    lineno,
    seq,
    (
        rs_odd OR s IS NULL OR _tk_too_big(attributes)
        OR NOT _tk_unique(keys)
        OR NOT coalesce(_tk_trace_hex(s.traceId), false)
        OR NOT coalesce(_tk_span_hex(s.spanId), false)
        OR NOT (s.parentSpanId IS NULL OR s.parentSpanId = ''
                OR coalesce(_tk_span_hex(s.parentSpanId), false))
        OR coalesce(start_ns, 0) <= 0 OR coalesce(end_ns, 0) <= 0 OR end_ns < start_ns
        OR kind IS NULL OR status_code IS NULL
        OR (len(s.links) > 0 AND coalesce(list_bool_or(list_transform(s.links, lambda x:
            NOT coalesce(_tk_trace_hex(x.traceId) AND _tk_span_hex(x.spanId), false)
            OR NOT _tk_unique(_tk_keys(x.attributes))
            OR _tk_too_big(_tk_obj(x.attributes)))), false))
    ) AS odd
FROM cols;

-- name: cleanup
-- Runs even when a step before it failed.
DROP TABLE IF EXISTS _tk_spans;
