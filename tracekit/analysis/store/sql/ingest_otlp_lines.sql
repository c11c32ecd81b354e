-- OTLP JSON lines -> _tk_stage: the SQL half of ingest's fast path.
-- Sections by name (`-- name: x` starts one; a section may hold several statements,
-- each ending with ";" and a newline), run by tracekit.analysis.ingest.fast.
--
-- msgspec has decoded each line into columns (_tk_cols: one row per span; each span's
-- attribute list is still the raw OTLP JSON text, `attrs`) and resources (_tk_res). The
-- stage statement maps the attribute lists to the stored JSON objects and the stage,
-- time-kind, CPU/GPU and weight columns on every DuckDB thread, and checks ids, times
-- and enums in bulk: a span this query would not store exactly as
-- tracekit/analysis/ingest/otlp.py does (padded or non-hex ids, missing or negative
-- times, unknown enums, repeated attribute keys, nested or oddly typed values, long
-- strings, floats Python spells with an exponent) is odd, and Python re-reads its
-- whole line, reports and decodes it.

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

-- An OTLP int64 as JSON text (a number or a decimal string): its value, else NULL.
CREATE OR REPLACE TEMP MACRO _tk_int(i) AS CASE
    WHEN regexp_full_match(i::VARCHAR, '"?-?[0-9]+"?') THEN TRY_CAST(trim(i::VARCHAR, '"') AS BIGINT)
END;

-- A JSON number's text as a double when Python would print it the same way, else NULL.
CREATE OR REPLACE TEMP MACRO _tk_double(d) AS CASE
    WHEN regexp_full_match(d::VARCHAR, '-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?')
    THEN TRY_CAST(d::VARCHAR AS DOUBLE)
END;

-- One AnyValue (its fields as JSON text) as the stored JSON text, in otlp.any_value's
-- order of fields; NULL when the reference decoder must decide (a nested value, a
-- string over 4,096 characters, a field of the wrong JSON type, a float with an
-- exponent in Python's spelling).
CREATE OR REPLACE TEMP MACRO _tk_value(v) AS CASE
    -- rows.MAX_ATTR_CHARS is 4,096 characters; the JSON text adds two quotes (and any
    -- escapes; counted in bytes, so a text within 4,098 never holds a longer string).
    WHEN nullif(v.stringValue, 'null') IS NOT NULL THEN CASE
        WHEN starts_with(v.stringValue::VARCHAR, '"') AND strlen(v.stringValue::VARCHAR) <= 4098
        THEN v.stringValue::VARCHAR END
    WHEN nullif(v.boolValue, 'null') IS NOT NULL THEN CASE
        WHEN v.boolValue::VARCHAR IN ('true', 'false') THEN v.boolValue::VARCHAR END
    WHEN nullif(v.intValue, 'null') IS NOT NULL THEN _tk_int(v.intValue)::VARCHAR
    WHEN nullif(v.doubleValue, 'null') IS NOT NULL THEN CASE
        WHEN _tk_double(v.doubleValue) = 0
          OR (abs(_tk_double(v.doubleValue)) >= 1e-4 AND abs(_tk_double(v.doubleValue)) < 1e16)
        THEN _tk_double(v.doubleValue)::VARCHAR END
    WHEN nullif(v.bytesValue, 'null') IS NOT NULL THEN CASE
        WHEN starts_with(v.bytesValue::VARCHAR, '"') THEN v.bytesValue::VARCHAR END
    WHEN nullif(v.arrayValue, 'null') IS NOT NULL OR nullif(v.kvlistValue, 'null') IS NOT NULL
    THEN NULL
    ELSE 'null'
END;

-- The value of the last of a repeated key (as a dict keeps it).
CREATE OR REPLACE TEMP MACRO _tk_last(keys, vals, k) AS
    vals[len(keys) + 1 - list_position(list_reverse(keys), k)];

-- The stored text of a string value, else NULL (tracekit.stage and time_kind are strings).
CREATE OR REPLACE TEMP MACRO _tk_string(t) AS CASE
    WHEN starts_with(t, '"') THEN json_extract_string(t, '$')
END;

-- name: stage
INSERT INTO _tk_stage
WITH cols AS (
    SELECT c.*, r.service_name, r.service_version, r.instance_id, r.host_name, r.ra_json,
           f.display,
           TRY_CAST(c.start_ns AS BIGINT) AS t0, TRY_CAST(c.end_ns AS BIGINT) AS t1,
           _tk_kind(c.kind::VARCHAR) AS kind_name,
           _tk_status(c.status::VARCHAR) AS status_name,
           decode(c.attrs::BLOB) AS attr_text
    FROM _tk_cols c JOIN _tk_res r ON r.res = c.res JOIN _tk_files f ON f.file_no = c.file_no
),
typed AS (
    -- Every AnyValue field as JSON text, so its JSON type can be checked.
    SELECT *, json_transform(attr_text, '[{"key": "VARCHAR", "value": {
        "stringValue": "JSON", "boolValue": "JSON", "intValue": "JSON", "doubleValue": "JSON",
        "bytesValue": "JSON", "arrayValue": "JSON", "kvlistValue": "JSON"}}]') AS kv
    FROM cols
),
pairs AS (
    SELECT *, list_transform(kv, lambda x: x.key) AS keys,
              list_transform(kv, lambda x: _tk_value(x.value)) AS vals
    FROM typed
),
keyed AS (
    SELECT *, len(list_distinct(keys)) < len(keys) AS repeated FROM pairs
),
mapped AS (
    SELECT *,
        '{' || array_to_string(CASE
            WHEN repeated THEN
                -- As a dict: a repeated key keeps its first place and its last value.
                list_transform(
                    list_filter(range(1, len(keys) + 1), lambda i: list_position(keys, keys[i]) = i),
                    lambda i: to_json(keys[i]) || ':' || _tk_last(keys, vals, keys[i]))
            ELSE list_transform(list_zip(keys, vals), lambda p: to_json(p[1]) || ':' || p[2])
        END, ',') || '}' AS attrs_json,
        -- A list that is not one of {key, value} objects, a key missing, a value the
        -- reference decoder must decide: Python takes the line.
        (kv IS NULL AND attr_text != '[]')
            OR list_count(keys) < len(keys) OR list_count(vals) < len(vals) AS odd_attrs,
        CASE WHEN repeated THEN _tk_last(keys, vals, $stage_key)
             ELSE vals[list_position(keys, $stage_key)] END AS v_stage,
        CASE WHEN repeated THEN _tk_last(keys, vals, $kind_key)
             ELSE vals[list_position(keys, $kind_key)] END AS v_kind,
        CASE WHEN repeated THEN _tk_last(keys, vals, $cpu_key)
             ELSE vals[list_position(keys, $cpu_key)] END AS v_cpu,
        CASE WHEN repeated THEN _tk_last(keys, vals, $gpu_key)
             ELSE vals[list_position(keys, $gpu_key)] END AS v_gpu,
        CASE WHEN repeated THEN _tk_last(keys, vals, $weight_key)
             ELSE vals[list_position(keys, $weight_key)] END AS v_weight
    FROM keyed
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
    _tk_string(v_stage),
    _tk_string(v_kind),
    -- As rows._int_or_none: integers only (a double is not a CPU time).
    CASE WHEN regexp_full_match(v_cpu, '-?[0-9]+') THEN TRY_CAST(v_cpu AS BIGINT) END,
    CASE WHEN regexp_full_match(v_gpu, '-?[0-9]+') THEN TRY_CAST(v_gpu AS BIGINT) END,
    -- rows.sample_weight: the attribute when it is a number, else the tracestate's
    -- threshold (computed in Python, ts_weight; NaN when none), else 1.
    coalesce(TRY_CAST(v_weight AS DOUBLE), CASE WHEN NOT isnan(ts_weight) THEN ts_weight END, 1.0),
    attrs_json,
    ra_json,
    links,
    display || ':' || lineno,
    nullif(trace_state, ''),
    file_no,
    lineno,
    seq,
    odd_attrs OR links IS NULL
        OR NOT _tk_trace_hex(trace_id) OR NOT _tk_span_hex(span_id)
        OR NOT (parent = '' OR _tk_span_hex(parent))
        OR coalesce(t0, 0) <= 0 OR coalesce(t1, 0) <= 0 OR t1 < t0
        OR kind_name IS NULL OR status_name IS NULL
FROM mapped;
