"""Self-contained HTML reports: charts (plotly.js inlined) and tables from analysis results.

:func:`render_report` turns a :class:`Report` — results a command gathered: diff, gate,
slow vs fast, autoscaling audit, exemplar waterfalls — into one HTML file that opens
without a network. Like every renderer it never queries the store.
"""

from __future__ import annotations

from tracekit.analysis.report import Report, Waterfall
from tracekit.render.html.page import render_report

__all__ = ["Report", "Waterfall", "render_report"]
