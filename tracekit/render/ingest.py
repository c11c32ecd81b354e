"""What ``tracekit ingest`` reports: the summary line, the problems, as text or JSON.

:func:`tracekit.analysis.loading.ingest` returns one
:class:`~tracekit.analysis.loading.IngestOutcome` (the readers'
:class:`~tracekit.analysis.ingest.IngestReport` plus what was done with it: the
requests attributed, where the spans went) and it is rendered here. In table
form the problems and warnings are the lines meant for stderr (:func:`problem_lines`)
and the summary the line for stdout; JSON puts everything in one document.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from tracekit.analysis.loading import IngestOutcome
from tracekit.render.common import markdown_cell
from tracekit.render.text import printable

LISTED = 20
"""Problems named one per line; the rest are counted."""


def _warnings(outcome: IngestOutcome) -> list[tuple[str, str, int]]:
    """(kind, first example, how many) for each kind of problem that dropped nothing."""
    first: dict[str, str] = {}
    count: dict[str, int] = {}
    for problem in outcome.report.problems:
        if not problem.skipped:
            first.setdefault(problem.kind, str(problem))
            count[problem.kind] = count.get(problem.kind, 0) + 1
    return [(kind, text, count[kind]) for kind, text in first.items()]


def problem_lines(outcome: IngestOutcome) -> list[str]:
    """The lines for stderr: skipped input by place, then one line per kind of warning.

    Raw text (file names and ids as found); pass each through :func:`printable` to show it.
    """
    r = outcome.report
    lines = [str(p) for p in r.skipping_problems[:LISTED]]
    if len(r.skipping_problems) > LISTED or r.skipped > LISTED:
        lines.append(f"… and more: {r.skipped:,} skipped in all")
    # Warnings (nothing dropped) are one line per kind with its first example: a normal
    # run can hold hundreds of server spans ending just after their client span.
    for kind, text, n in _warnings(outcome):
        more = f" (and {n - 1:,} more like it)" if n > 1 else ""
        lines.append(f"warning: {kind}: {text}{more}")
    if outcome.version_not_applied:
        # --version only labels spans without service.version; say so before a later
        # `--before LABEL` fails with "no requests for release".
        lines.append(
            f"warning: --version {outcome.version} was not applied: these spans carry "
            f"service.version ({', '.join(r.releases)}); select them by those labels"
        )
    if outcome.limit_reached:
        lines.append(
            f"warning: pulled --limit {outcome.jaeger_limit:,} traces, so older ones in the "
            "--since window were left out; raise --limit or narrow --since to compare whole "
            "releases"
        )
    return lines


def render_table(outcome: IngestOutcome) -> str:
    """The lines for stdout: how the pull stopped, the summary, where the spans went."""
    r = outcome.report
    lines = [r.stopped] if r.stopped else []
    # the time last, as its own clause: after "problems: none" a bracket reads as the
    # problems' duration
    n = outcome.requests_attributed
    lines.append(
        f"{r.summary_line()}; {n:,} request{'' if n == 1 else 's'} attributed; "
        f"took {r.seconds:.2f} s"
    )
    if outcome.store_discarded:
        lines.append(f"store: {outcome.store} not created (nothing could be stored)")
    elif outcome.written is None:
        lines.append(f"store: {outcome.store}")
    else:
        created = ", table created with the exporter's DDL" if outcome.created_table else ""
        lines.append(
            f"store: {outcome.store}: {outcome.written:,} spans written, "
            f"{outcome.already_present or 0:,} already there{created}"
        )
    return "\n".join(printable(line) for line in lines)


def render_markdown(outcome: IngestOutcome) -> str:
    r = outcome.report
    rows = [
        ("files", f"{r.files:,}"),
        ("spans read", f"{r.spans_read:,}"),
        ("spans new", f"{r.spans_stored:,}"),
        ("traces", f"{r.traces:,}"),
        ("requests attributed", f"{outcome.requests_attributed:,}"),
        ("releases", ", ".join(r.releases) or "none labelled"),
        ("skipped", f"{r.skipped:,}"),
    ]
    out = ["| | |", "|---|---|", *(f"| {k} | {markdown_cell(v)} |" for k, v in rows)]
    problems = problem_lines(outcome)
    if problems:
        out += ["", *(f"- {printable(line)}" for line in problems)]
    return "\n".join(out)


def to_dict(outcome: IngestOutcome) -> dict[str, Any]:
    """The JSON document of ``tracekit ingest --format json`` (docs/json.md)."""
    r = outcome.report
    return {
        "files": r.files,
        "spans_read": r.spans_read,
        "spans_stored": r.spans_stored,
        "traces": r.traces,
        "requests_attributed": outcome.requests_attributed,
        "stages_derived": r.stages_derived,
        "profiles": r.profiles,
        "profiles_stored": r.profiles_stored,
        "releases": list(r.releases),
        "skipped": r.skipped,
        "seconds": round(r.seconds, 3),
        "problem_counts": dict(sorted(r.counts.items())),
        "problems": [
            {"kind": p.kind, "where": p.where, "reason": p.reason, "skipped": p.skipped}
            for p in r.problems
        ],
        "warnings": [line for line in problem_lines(outcome) if line.startswith("warning: ")],
        "stopped": r.stopped or None,
        "store": outcome.store,
        "store_created": not outcome.store_discarded,
        "written": outcome.written,
        "already_present": outcome.already_present,
        "exit_code": outcome.exit_code,
    }


def render_json(outcome: IngestOutcome) -> str:
    return json.dumps(to_dict(outcome), indent=2)


RENDERERS: dict[str, Callable[[IngestOutcome], str]] = {
    "table": render_table,
    "json": render_json,
    "markdown": render_markdown,
}
"""Renderer per ``--format`` value."""
