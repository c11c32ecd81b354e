"""The report's stylesheet: readable on a laptop screen, and on paper when printed."""

from __future__ import annotations

CSS = """
:root { --fg: #212529; --muted: #5c6670; --line: #dee2e6; --pass: #2b8a3e;
        --fail: #c92a2a; --inconclusive: #e67700; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #f8f9fa;
       font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 40px; background: #fff; }
h1 { font-size: 22px; margin: 0 0 10px; }
h2 { font-size: 17px; margin: 30px 0 8px; padding-bottom: 4px; border-bottom: 1px solid var(--line); }
h3 { font-size: 14px; margin: 18px 0 4px; font-family: ui-monospace, Menlo, monospace; }
header { border-bottom: 2px solid var(--fg); padding-bottom: 12px; }
.verdict { font-size: 17px; font-weight: 600; margin: 6px 0; }
.verdict-small { font-weight: 600; }
.gate { margin: 6px 0; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 4px; color: #fff;
         font-weight: 700; font-size: 12px; letter-spacing: .04em; }
.badge.pass { background: var(--pass); } .badge.fail { background: var(--fail); }
.badge.inconclusive { background: var(--inconclusive); }
p.fail { color: var(--fail); } p.inconclusive { color: var(--inconclusive); }
.note { color: var(--muted); font-size: 12.5px; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 12.5px;
        font-variant-numeric: tabular-nums; }
th, td { padding: 3px 10px; border-bottom: 1px solid var(--line); text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f1f3f5; font-weight: 600; }
.chart { width: 100%; min-height: 200px; }
.trace { break-inside: avoid; }
a.jaeger { font-family: system-ui, sans-serif; font-weight: 400; margin-left: 10px; }
pre { background: #f1f3f5; padding: 8px 10px; font-size: 12px; overflow-x: auto; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
@media print {
  body { background: #fff; }
  main { max-width: none; padding: 0; }
  section, .chart, table { break-inside: avoid; }
  .modebar-container { display: none !important; }
  a.jaeger::after { content: " (" attr(href) ")"; font-size: 10px; }
}
"""
