"""Renderers: analysis results (dataclasses) → table, json or markdown text.

Renderers never query the store; analysis functions never print.
"""
