-- The top operations of a selection of requests (tracekit.analysis.store.operations):
-- request_operations rows of the selected requests, summed per (stage, service, operation)
-- with each request's sample weight. Every value is a bound parameter.
-- name: selection
SELECT trace_id, sample_weight AS w
FROM requests r
WHERE coalesce(r.release, '') = $release
  AND ($service IS NULL OR r.service_name = $service)
  AND ($route IS NULL OR r.route = $route OR r.name = $route)
  AND ($min_ns IS NULL OR r.duration_ns >= $min_ns)
  AND ($max_ns IS NULL OR r.duration_ns <= $max_ns)

-- name: totals
SELECT count(*), coalesce(sum(w), 0) FROM sel

-- name: operations
SELECT o.stage, o.service, o.operation,
       sum(s.w) AS requests,
       sum(s.w * o.critical_ns) AS path_ns,
       sum(s.w * o.calls) AS calls,
       sum(s.w * o.calls_on_path) AS calls_on_path,
       coalesce(sum(s.w) FILTER (WHERE o.calls > 1), 0) AS repeated,
       coalesce(sum(s.w) FILTER (WHERE o.calls > 1 AND o.overlapping = 0), 0) AS serial,
       sum(s.w * o.errors) AS errors,
       sum(s.w * o.critical_ns) / nullif(sum(sum(s.w * o.critical_ns)) OVER (), 0) AS share
FROM request_operations o JOIN sel s USING (trace_id)
GROUP BY o.stage, o.service, o.operation
ORDER BY path_ns DESC, o.stage, o.service, o.operation
LIMIT $limit
