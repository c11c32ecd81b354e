-- OTLP JSON lines -> _tk_stage, parsed entirely inside DuckDB: the fast path of ingest.
--
-- One row per span of every clean line. A line that is not valid JSON, is not an OTLP
-- document, or holds anything this query would not decode exactly as the Python
-- reference decoder does (tracekit/analysis/ingest/otlp.py: padded or non-hex ids,
-- missing or negative times, nested or huge attribute values, unknown enums) yields
-- rows with odd = true instead; Python re-reads those lines, reports and decodes them.
--
-- Parameters: $path, $compression ('none' or 'gzip'), $file_no, $display.
-- {doc} is json_transform(line, <structure>), guarded by json_valid(line) when the
-- unguarded run hit a malformed line (one JSON parse per line instead of two).

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

-- "key":value texts of a key/value list (NULL entries mark what Python must decode).
CREATE OR REPLACE TEMP MACRO _tk_parts(kv) AS
    coalesce(list_transform(kv, lambda x: to_json(x.key)::VARCHAR || ':' || _tk_val(x.value)), []);

-- The object, or NULL when an entry needs Python. A string longer than 4096 characters
-- (truncated by Python) can only hide in an object longer than that: those go to Python.
CREATE OR REPLACE TEMP MACRO _tk_obj_of(parts) AS CASE
    WHEN list_count(parts) = len(parts) THEN '{' || array_to_string(parts, ',') || '}' END;

CREATE OR REPLACE TEMP MACRO _tk_obj(kv) AS _tk_obj_of(_tk_parts(kv));

CREATE OR REPLACE TEMP MACRO _tk_too_big(obj) AS obj IS NULL OR length(obj) > 4096;

CREATE OR REPLACE TEMP MACRO _tk_pick(kv, k) AS (list_filter(kv, lambda x: x.key = k)[1]).value;

CREATE OR REPLACE TEMP MACRO _tk_hex(s, n) AS length(s) = n AND ltrim(s, '0123456789abcdefABCDEF') = '';

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

INSERT INTO _tk_stage
WITH lines AS (
    SELECT line, ordinality AS lineno
    FROM read_csv(
        $path, columns = {'line': 'VARCHAR'}, delim = chr(1), quote = '', escape = '',
        header = false, auto_detect = false, new_line = '\n', compression = $compression,
        max_line_size = 1073741824
    ) WITH ORDINALITY
    WHERE line IS NOT NULL
),
docs AS (
    SELECT lineno, {doc} AS d FROM lines
),
resources AS (
    SELECT lineno, unnest(CASE
        WHEN coalesce(d.resourceSpans, d.result.resourceSpans) IS NULL THEN [NULL]
        ELSE coalesce(d.resourceSpans, d.result.resourceSpans) END) AS rs
    FROM docs
),
-- Resource columns are computed once per resource, before its spans are unnested.
res AS (
    SELECT
        lineno,
        rs IS NULL AS rs_odd,
        _tk_obj(rs.resource.attributes) AS ra_json,
        _tk_pick(rs.resource.attributes, 'service.name').stringValue AS service_name,
        _tk_pick(rs.resource.attributes, 'service.version').stringValue AS service_version,
        _tk_pick(rs.resource.attributes, 'service.instance.id').stringValue AS instance_id,
        _tk_pick(rs.resource.attributes, 'host.name').stringValue AS host_name,
        CASE WHEN rs IS NULL THEN [NULL]
             ELSE flatten(list_transform(rs.scopeSpans, lambda x: x.spans)) END AS spans
    FROM resources
),
sp AS (
    SELECT lineno, rs_odd, ra_json, service_name, service_version, instance_id,
           host_name, unnest(spans) AS s
    FROM res
),
cols AS (
    SELECT
        lineno, rs_odd, ra_json, service_name, service_version, instance_id, host_name,
        s,
        TRY_CAST(s.startTimeUnixNano AS BIGINT) AS start_ns,
        TRY_CAST(s.endTimeUnixNano AS BIGINT) AS end_ns,
        _tk_kind(s.kind) AS kind,
        _tk_status(s.status.code) AS status_code,
        _tk_obj(s.attributes) AS attributes
    FROM sp
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
    _tk_pick(s.attributes, 'tracekit.stage').stringValue AS stage,
    _tk_pick(s.attributes, 'tracekit.time_kind').stringValue AS time_kind,
    TRY_CAST(_tk_pick(s.attributes, 'tracekit.cpu_time_ns').intValue AS BIGINT) AS cpu_time_ns,
    TRY_CAST(_tk_pick(s.attributes, 'tracekit.gpu_time_ns').intValue AS BIGINT) AS gpu_time_ns,
    coalesce(
        _tk_pick(s.attributes, 'tracekit.sample.weight').doubleValue,
        TRY_CAST(_tk_pick(s.attributes, 'tracekit.sample.weight').intValue AS DOUBLE),
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
    0 AS seq,
    (
        rs_odd OR s IS NULL OR _tk_too_big(ra_json) OR _tk_too_big(attributes)
        OR NOT coalesce(_tk_hex(s.traceId, 32), false)
        OR NOT coalesce(_tk_hex(s.spanId, 16), false)
        OR NOT (s.parentSpanId IS NULL OR s.parentSpanId = '' OR coalesce(_tk_hex(s.parentSpanId, 16), false))
        OR coalesce(start_ns, 0) <= 0 OR coalesce(end_ns, 0) <= 0 OR end_ns < start_ns
        OR kind IS NULL OR status_code IS NULL
        OR (len(s.links) > 0 AND coalesce(list_bool_or(list_transform(s.links, lambda x:
            NOT coalesce(_tk_hex(x.traceId, 32) AND _tk_hex(x.spanId, 16), false)
            OR _tk_too_big(_tk_obj(x.attributes)))), false))
    ) AS odd
FROM cols;
