"""Renderers: analysis results (dataclasses) → table, json or markdown text.

Renderers never query the store; analysis functions never print. :func:`render` picks
the renderer by the result's type (:func:`tracekit.render.dispatch.renderers_for`, a
``functools.singledispatch`` over the result classes), so a command is parse → one
:class:`~tracekit.Analysis` call → ``render(result, fmt)``. The dispatch module and
each renderer are imported on first use: ``tracekit.render.text`` stays light.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

FORMATS: tuple[str, ...] = ("table", "json", "markdown")
"""Every analysis command's ``--format`` choices."""

Renderer = Callable[[Any], str]


def renderers_for(result: Any) -> Mapping[str, Renderer]:
    """The ``{format: renderer}`` table for ``result``'s type; TypeError if none."""
    from tracekit.render.dispatch import renderers_for as dispatch

    return dispatch(result)


def render(result: Any, fmt: str) -> str:
    """``result`` as text in ``fmt`` (one of :data:`FORMATS`)."""
    return renderers_for(result)[fmt](result)
