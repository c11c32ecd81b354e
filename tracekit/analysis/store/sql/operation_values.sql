-- Per-request path time of a few operations of one stage (tracekit.analysis.store.operation_values):
-- the request_operations rows of one release's selected requests, for the (service, operation)
-- pairs asked, with the request's sample weight. Every value is a bound parameter.
-- name: values
SELECT o.trace_id,
       (list_position($pairs, [o.service, o.operation]) - 1)::INTEGER AS op,
       o.critical_ns,
       r.sample_weight
FROM request_operations o JOIN requests r USING (trace_id)
WHERE o.stage = $stage
  AND list_position($pairs, [o.service, o.operation]) IS NOT NULL
  AND coalesce(r.release, '') = $release
  AND ($service IS NULL OR r.service_name = $service)
  AND ($route IS NULL OR r.route = $route OR r.name = $route)
