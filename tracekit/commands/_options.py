"""Options several commands take, declared once so they mean the same everywhere.

``--before`` / ``--after`` and ``--version`` name releases (``service.version``) or
training runs, ``--service`` / ``--route`` select requests, ``--confidence`` is a
two-sided level. Where the traces are (``--store``) is :mod:`tracekit.commands._store`.
"""

from __future__ import annotations

import argparse

from tracekit.commands._types import (
    confidence_type,
    duration_type,
    http_url_type,
    link_gbps_type,
    slo_type,
)
from tracekit.render import FORMATS


def add_releases(parser: argparse.ArgumentParser, *, what: str = "release") -> None:
    """``--before V1 --after V2``: the baseline and the candidate release (or run)."""
    parser.add_argument(
        "--before", required=True, metavar="V1", help=f"baseline {what} (service.version)"
    )
    parser.add_argument(
        "--after", required=True, metavar="V2", help=f"candidate {what} (service.version)"
    )


def add_version(
    parser: argparse.ArgumentParser, *, help: str, dest: str = "version", multiple: bool = False
) -> None:
    """``--version V``: always a release label (``service.version``); ``help`` says its role."""
    action = "append" if multiple else "store"
    parser.add_argument("--version", dest=dest, metavar="V", action=action, default=None, help=help)


def add_metric(parser: argparse.ArgumentParser) -> None:
    """``--metric e2e|ttft|tpot``: which latency of a request the command reads."""
    parser.add_argument(
        "--metric", choices=("e2e", "ttft", "tpot"), default="e2e",
        help="latency to read: e2e (the request, default), ttft (time to first token: the "
        "engine's, else queue + prefill) or tpot (time per output token) (docs/llm.md)",
    )  # fmt: skip


def add_filters(parser: argparse.ArgumentParser, *, route: bool = True) -> None:
    """``--service`` and ``--route``: which requests a command reads."""
    parser.add_argument("--service", metavar="NAME", help="only requests entering this service")
    if route:
        parser.add_argument(
            "--route", metavar="ROUTE", help="only this route (http.route or span name)"
        )


def add_confidence(parser: argparse.ArgumentParser, *, default: float | None = 0.95) -> None:
    """``--confidence``: the two-sided level of every interval the command reports."""
    parser.add_argument(
        "--confidence",
        type=confidence_type,
        default=default,
        help="two-sided confidence of the intervals, in [0.5, 1) (0.95 or 95%%)",
    )


def add_jaeger_url(parser: argparse.ArgumentParser, *, links: str = "exemplar links") -> None:
    parser.add_argument(
        "--jaeger-url", type=http_url_type, metavar="URL", help=f"Jaeger UI base URL for {links}"
    )


def add_html(parser: argparse.ArgumentParser, what: str) -> None:
    """``--html FILE`` for a command that can draw its part of the report."""
    parser.add_argument(
        "--html",
        metavar="FILE",
        help=f"also write {what} as a self-contained HTML page (as `tracekit report` does)",
    )


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=FORMATS, default="table",
        help="table for people, json for scripts (schema in docs/json.md), markdown for PRs",
    )  # fmt: skip


def add_link_gbps(parser: argparse.ArgumentParser) -> None:
    """``--link-gbps``: the network link's peak, for the share of it collectives reach."""
    parser.add_argument(
        "--link-gbps",
        type=link_gbps_type,
        default=None,
        metavar="GBPS",
        help="training: the inter-node link's rate in Gb/s as sold (400 for 400G "
        "InfiniBand); collectives' bus bandwidth is shown as a share of it (default: the "
        "tracekit.link.gbps resource attribute, if the run set one)",
    )


def add_slo(
    parser: argparse.ArgumentParser, *, required: bool = True, help: str | None = None
) -> None:
    """``--slo "p95<200ms"``: the latency objective each window is judged against."""
    parser.add_argument(
        "--slo",
        required=required,
        default=None,
        type=slo_type,
        help=help or 'latency objective per window, e.g. "p95<200ms"',
    )


def add_window(parser: argparse.ArgumentParser, *, default: str, help: str) -> None:
    """``--window 30s``: the length of the windows a time line is cut into."""
    parser.add_argument("--window", default=default, type=duration_type(), help=help)
