-- A Map(String, String) of the exporter as the JSON object tracekit stores, with the
-- value types the exporter's AsString() dropped read back: true/false, integers that
-- fit int64, plain decimals and JSON arrays/objects stay bare; the rest are strings.
-- {m} is a column expression chosen by tracekit (never user text).
concat('{', arrayStringConcat(arrayMap((k, v) -> concat(toJSONString(k), ':', multiIf(
    v IN ('true', 'false'), v,
    match(v, '^-?(0|[1-9][0-9]{0,17})$'), v,
    match(v, '^-?(0|[1-9][0-9]*)\\.[0-9]+$'), v,
    (startsWith(v, '[') OR startsWith(v, '{')) AND isValidJSON(v), v,
    toJSONString(v))), mapKeys({m}), mapValues({m})), ','), '}')
