"""``tracekit capacity``: which binds first — latency under bursts or cost per request —
and how to batch (docs/capacity.md)."""
