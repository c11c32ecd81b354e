"""Reading the attributes of the spans of a few traces, as ``explain`` and the patterns need.

The walk's own columns come with the spans it reads; the pattern rules also look at
attributes the walk does not (``http.request.resend_count``, ``error.type``, the HTTP and
gRPC status codes). :func:`span_attributes` returns each span's attributes as the JSON
text the store holds; the caller keeps what it reads. The SQL is
``sql/span_attributes.sql``.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Sequence
from functools import cache

from tracekit.analysis.store import DatabaseError, Store
from tracekit.errors import QueryError


@cache
def _sql() -> str:
    return (
        importlib.resources.files("tracekit.analysis.store")
        .joinpath("sql/span_attributes.sql")
        .read_text()
    )


def span_attributes(store: Store, trace_ids: Sequence[str]) -> dict[tuple[str, str], str | None]:
    """``{(trace_id, span_id): attributes JSON}`` of every span of ``trace_ids``.

    >>> span_attributes(store, ["4bf92f3577b34da6a3ce929d0e0e4736"])  # doctest: +SKIP
    {('4bf92f3577b34da6a3ce929d0e0e4736', '00f067aa0ba902b7'): '{"http.route": "/"}', ...}

    Raises :class:`QueryError` when the store cannot be read.
    """
    if not trace_ids:
        return {}
    try:
        rows = store.run(_sql(), {"ids": list(trace_ids)})
    except DatabaseError as exc:
        raise QueryError(f"cannot read span attributes from {store.path}: {exc}") from exc
    return {(str(tid), str(sid)): text for tid, sid, text in rows}
