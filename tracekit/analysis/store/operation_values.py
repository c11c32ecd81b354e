"""Reading ``request_operations`` per request: a few operations' path time in each request.

:func:`operation_values` answers, for one release's selected requests and a handful of
operations beneath one stage, each request's critical-path time in each operation: what
the diff's counterfactual needs to put one operation back to its before distribution
(:mod:`tracekit.analysis.compare.operations`). Only requests that called an operation
have a row; the others spent 0 ms in it. Bounded by design: the caller asks for the top
few operations of one stage, so what leaves the engine is at most a few rows per
request. The same function answers on a DuckDB file and on a ClickHouse store (its
attributed rows are pulled into the same table). The SQL is ``sql/operation_values.sql``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tracekit.analysis.store import DatabaseError, Store, named_statements
from tracekit.errors import QueryError

NS_PER_MS = 1_000_000.0


@dataclass(frozen=True)
class OperationValues:
    """Rows of :func:`operation_values`: one per (request, operation) that occurred."""

    pairs: tuple[tuple[str, str], ...]
    """The (service, operation) pairs asked, in order; ``op`` indexes them."""
    trace_ids: npt.NDArray[np.object_]
    op: npt.NDArray[np.int64]
    path_ms: npt.NDArray[np.float64]
    """The operation's own critical-path milliseconds in that request."""
    weights: npt.NDArray[np.float64]
    """The request's sample weight."""


def _statements() -> dict[str, str]:
    return named_statements("operation_values.sql")


def operation_values(
    store: Store,
    release: str,
    stage: str,
    pairs: Sequence[tuple[str, str]],
    *,
    service: str | None = None,
    route: str | None = None,
) -> OperationValues:
    """Per request of ``release`` (of ``service`` and ``route`` when given), the path time
    of each (service, operation) in ``pairs`` beneath ``stage``.

    >>> v = operation_values(store, "v2", "downstream", [("redis-manual", "GetDriver")])  # doctest: +SKIP
    >>> v.path_ms[v.op == 0].mean()
    15.7

    Empty when nothing is asked or the store predates ``request_operations``. Raises
    :class:`QueryError` when the store cannot be read.
    """
    asked = tuple((str(s), str(o)) for s, o in pairs)
    empty = OperationValues(
        asked,
        np.zeros(0, dtype=object),
        np.zeros(0, dtype=np.int64),
        np.zeros(0),
        np.zeros(0),
    )
    if not asked:
        return empty
    params = {
        "release": release,
        "stage": stage,
        "pairs": [list(p) for p in asked],
        "service": service,
        "route": route,
    }
    try:
        if not store.has_table("request_operations"):
            return empty
        got = store.con.execute(_statements()["values"], params).fetchnumpy()
    except DatabaseError as exc:
        raise QueryError(f"cannot read operations from {store.path}: {exc}") from exc
    return OperationValues(
        asked,
        np.asarray(got["trace_id"], dtype=object),
        np.asarray(got["op"], dtype=np.int64),
        np.asarray(got["critical_ns"], dtype=np.float64) / NS_PER_MS,
        np.asarray(got["sample_weight"], dtype=np.float64),
    )
