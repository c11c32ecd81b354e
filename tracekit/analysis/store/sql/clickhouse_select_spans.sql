-- The spans of the selected traces in the shape of tracekit's `spans` table
-- (sql/schema.sql), computed inside ClickHouse so that only these columns leave it:
-- ids lower-case with "no parent" as NULL, kind and status as OTLP enum names,
-- nanosecond times, tracekit's stage columns pulled out of SpanAttributes, the sample
-- weight (tracekit.sample.weight, else the OTel probability-sampling adjusted count
-- 2^56 / (2^56 - T) from `ot=th:T` in TraceState, else 1), attributes as JSON.
-- Duplicate rows (exporter retries) are dropped here: one row per (TraceId, SpanId).
-- {table}, {trace_filter} and the *_json expressions are built by tracekit from
-- allow-listed identifiers and clickhouse_map_json.sql; values are bound parameters.
WITH extract(lower(extract(TraceState, '(?:^|,)\\s*ot=([^,]*)')),
             '(?:^|;)th:([0-9a-f]{1,14})(?:;|$)') AS th
SELECT
    lower(TraceId) AS trace_id,
    lower(SpanId) AS span_id,
    if(ParentSpanId IN ('', '0000000000000000'), NULL, lower(ParentSpanId)) AS parent_span_id,
    toLowCardinality(toString(SpanName)) AS name,
    multiIf(upper(replaceRegexpOne(toString(SpanKind), '^SPAN_KIND_', '')) AS k IN
                ('INTERNAL', 'SERVER', 'CLIENT', 'PRODUCER', 'CONSUMER'), k,
            'UNSPECIFIED') AS kind,
    nullIf(toInt64(toUnixTimestamp64Nano(Timestamp)), 0) AS start_ns,
    -- A negative duration wrapped round UInt64 reads as zero, as the DuckDB path clamps.
    start_ns + if(Duration > 4611686018427387904, 0, toInt64(Duration)) AS end_ns,
    multiIf(upper(replaceRegexpOne(toString(StatusCode), '^STATUS_CODE_', '')) AS s IN
                ('OK', 'ERROR'), s,
            'UNSET') AS status_code,
    if(mapContains(ResourceAttributes, 'service.name'),
       ResourceAttributes['service.name'], nullIf(toString(ServiceName), '')) AS service_name,
    if(mapContains(ResourceAttributes, 'service.version'),
       ResourceAttributes['service.version'], NULL) AS service_version,
    if(mapContains(ResourceAttributes, 'service.instance.id'),
       ResourceAttributes['service.instance.id'], NULL) AS instance_id,
    if(mapContains(ResourceAttributes, 'host.name'),
       ResourceAttributes['host.name'], NULL) AS host_name,
    if(mapContains(SpanAttributes, 'tracekit.stage'),
       SpanAttributes['tracekit.stage'], NULL) AS stage,
    if(mapContains(SpanAttributes, 'tracekit.time_kind'),
       SpanAttributes['tracekit.time_kind'], NULL) AS time_kind,
    if(match(SpanAttributes['tracekit.cpu_time_ns'], '^-?[0-9]{1,18}$'),
       toInt64(SpanAttributes['tracekit.cpu_time_ns']), NULL) AS cpu_time_ns,
    if(match(SpanAttributes['tracekit.gpu_time_ns'], '^-?[0-9]{1,18}$'),
       toInt64(SpanAttributes['tracekit.gpu_time_ns']), NULL) AS gpu_time_ns,
    multiIf(
        isFinite(toFloat64OrNull(SpanAttributes['tracekit.sample.weight']) AS w), w,
        th != '',
        pow(2, 56) / (pow(2, 56) - toFloat64(reinterpretAsUInt64(reverse(unhex(
            leftPad(rightPad(th, 14, '0'), 16, '0')))))),
        1.0) AS sample_weight,
    {span_attributes_json} AS attributes,
    toLowCardinality({resource_attributes_json}) AS resource_attributes,
    concat('[', arrayStringConcat(arrayMap((lt, ls, la) -> concat(
        '{"trace_id":', toJSONString(lower(lt)), ',"span_id":', toJSONString(lower(ls)),
        ',"attributes":', {link_attributes_json}, '}'),
        Links.TraceId, Links.SpanId, Links.Attributes), ','), ']') AS links,
    toLowCardinality({source:String}) AS source,
    TraceState AS trace_state
FROM {table}
WHERE TraceId != '' AND SpanId != '' AND ({trace_filter})
LIMIT 1 BY TraceId, SpanId
