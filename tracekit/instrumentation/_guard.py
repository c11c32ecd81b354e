"""Keeps instrumentation failures out of serving code.

Every place where tracekit's own code could fail while a request is being served
calls :func:`report`. In production the failure is logged once per place and the
request goes on (untraced there). Under pytest — or with ``TRACEKIT_STRICT=1`` — it
is raised as :class:`~tracekit.errors.InstrumentationError`, so bugs surface in tests.
"""

from __future__ import annotations

import logging
import os
import threading

from tracekit.errors import InstrumentationError

ENV_STRICT = "TRACEKIT_STRICT"
"""``1`` raises internal failures, ``0`` only logs them; unset: raise under pytest only."""

logger = logging.getLogger("tracekit")

_reported: set[str] = set()
_lock = threading.Lock()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def strict() -> bool:
    """Whether internal failures are raised instead of logged."""
    value = os.environ.get(ENV_STRICT)
    if value is not None:
        return value.strip().lower() in ("1", "true", "yes")
    return "PYTEST_CURRENT_TEST" in os.environ


def report(where: str, exc: BaseException, detail: str = "") -> None:
    """Handle a failure of tracekit's own code at ``where``: log once, or raise when strict.

    ``where`` names the place (one log line per place per process); ``detail`` adds
    context to that line without making a new place.
    """
    if detail:
        exc_text = f"{detail}: {type(exc).__name__}: {exc}"
    else:
        exc_text = f"{type(exc).__name__}: {exc}"
    if strict():
        raise InstrumentationError(f"{where}: {exc_text}") from exc
    with _lock:
        if where in _reported:
            return
        _reported.add(where)
    logger.warning(
        "tracekit: %s failed (%s); serving goes on, untraced at this point. "
        "Further failures here are not logged.",
        where,
        exc_text,
    )
