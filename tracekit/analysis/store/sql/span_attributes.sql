-- The attributes of every span of the traces $ids, as JSON text: what explain and the
-- patterns read beyond the walk's columns (tracekit.analysis.store.span_attributes).
SELECT trace_id, span_id, attributes::VARCHAR FROM spans WHERE list_contains($ids, trace_id)
