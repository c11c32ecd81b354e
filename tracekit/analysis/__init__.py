"""The analyzer: ingest → DuckDB store → attribution → diff / gate / autoscale → renderers.

Needs the ``analysis`` extra (duckdb, numpy, rich). Analysis functions return
dataclasses and never print; renderers in ``tracekit.render`` turn them into text.
"""
