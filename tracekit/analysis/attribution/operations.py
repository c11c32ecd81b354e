"""What a span *does*, as one name: the operation, the unit "downstream grew" is split by.

A stage says which part of a request a span belongs to (``downstream``); the operation
says what was called there: ``(service, operation)`` with ids masked, so the 13 calls of
``redis-manual GetDriver`` in one HotROD request are one operation called 13 times, and
``GET /users/123`` and ``GET /users/456`` are one.

A CLIENT span names what it calls, not itself: ``HTTP GET`` from HotROD's frontend to
the customer service and to the route service are two operations. When the called
service traced its side, the client span takes its child SERVER span's service and name
(``customer`` / ``GET /customer``); otherwise the server's address and the URL template
(``url.template``, :data:`tracekit.conventions.URL_TEMPLATE`, else the path of ``url.full`` with ids masked) stand in for them.
"""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit

from tracekit.analysis.attribution.critical_path import mask_ids

OPERATION_MAX: Final = 96
"""Longest operation name kept (masked names rarely come near it; ids are masked first)."""


def operation_name(name: str) -> str:
    """A span name as an operation: white space made one, ids masked, length bounded."""
    return mask_ids(name)[:OPERATION_MAX] or "(unnamed)"


def client_target(
    method: str | None,
    address: str | None,
    port: str | int | None,
    url_template: str | None,
    url_full: str | None,
) -> tuple[str, str] | None:
    """``(service, operation)`` of a CLIENT span whose callee left no SERVER span: the
    server's address (``host:port``) and the method with the URL template or the masked
    path. None when the span names no server at all."""
    path = url_template
    if not path and url_full:
        try:
            parts = urlsplit(url_full)
        except ValueError:
            parts = None
        if parts is not None:
            path = parts.path or "/"
            address = address or parts.hostname
            port = port or parts.port
    if not address:
        return None
    target = f"{address}:{port}" if port not in (None, "") else address
    what = " ".join(x for x in (method, path) if x) or ""
    return target[:OPERATION_MAX], operation_name(what) if what else "(call)"


def span_operation(
    service: str | None,
    name: str,
    kind: str,
    callee: tuple[str | None, str] | None = None,
    target: tuple[str, str] | None = None,
) -> tuple[str, str]:
    """``(service, operation)`` of one span.

    ``callee``: the (service, name) of the CLIENT span's child SERVER span, when the
    called service traced its side; ``target``: :func:`client_target` of the span. A
    CLIENT span takes the callee's names, else the target's, else its own; every other
    span is its service and its own name.
    """
    if kind == "CLIENT":
        if callee is not None:
            return (callee[0] or service or "(unknown)"), operation_name(callee[1])
        if target is not None:
            return target
    return (service or "(unknown)"), operation_name(name)
