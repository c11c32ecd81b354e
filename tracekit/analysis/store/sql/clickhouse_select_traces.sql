-- Which traces a command reads: every trace with at least one span that matches the
-- selection (release = resource service.version, entry service, route = http.route or
-- span name, trace-id prefix, time range). It is a superset of the requests the command
-- keeps — the request span itself matches — and the exact rule (root span's resource,
-- route or name) is applied again by the shared analysis on the pulled spans.
-- {table} is an allow-listed identifier; everything else is a bound parameter.
SELECT DISTINCT TraceId
FROM {table}
WHERE TraceId != ''
  AND ({prefix:String} = '' OR startsWith(TraceId, {prefix:String}))
  AND (empty({releases:Array(String)})
       OR has({releases:Array(String)}, ResourceAttributes['service.version']))
  AND ({service:String} = '' OR ServiceName = {service:String})
  AND ({route:String} = ''
       OR SpanAttributes['http.route'] = {route:String} OR SpanName = {route:String})
  AND Timestamp >= fromUnixTimestamp64Nano({since_ns:Int64})
  AND Timestamp < fromUnixTimestamp64Nano({until_ns:Int64})
