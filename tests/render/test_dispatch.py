"""Renderers are found by the result's type, and every public result type has one in
each format (table, JSON, markdown)."""

from __future__ import annotations

import types
import typing

import pytest

from tracekit.analysis.facade import Analysis, IngestOutcome, attribute, ingest
from tracekit.analysis.report import Report
from tracekit.render import FORMATS, render, renderers_for
from tracekit.render.dispatch import renderers_for as dispatch


def public_result_types() -> set[type]:
    """Every type an :class:`Analysis` method, :func:`ingest` or :func:`attribute`
    returns (lists unpacked)."""
    found: set[type] = set()

    def add(hint: object) -> None:
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            for arg in typing.get_args(hint):
                add(arg)
        elif origin is list:
            found.add(list)
        elif isinstance(hint, type):
            found.add(hint)

    methods = [getattr(Analysis, n) for n in dir(Analysis) if not n.startswith("_")]
    for fn in [*methods, ingest, attribute]:
        if callable(fn) and not isinstance(fn, property):
            hint = typing.get_type_hints(fn).get("return")
            if hint is not None:
                add(hint)
    # Not results: the object itself, plain values, and the HTML page's bundle (drawn
    # by tracekit.render.html.render_report).
    return {t for t in found if t not in (Analysis, str, bool, type(None), Report)}


def test_the_public_results_are_the_ones_expected() -> None:
    names = {t.__name__ for t in public_result_types()}
    assert names == {
        "list",  # Analysis.summary: list[Summary]
        "DiffResult",
        "TrainingDiff",
        "CapacityResult",
        "SlowFast",
        "Explanation",
        "GateResult",
        "TrainingGateResult",
        "AutoscaleResult",
        "StepsResult",
        "IngestOutcome",
        "AttributeReport",
    }


@pytest.mark.parametrize("result_type", sorted(public_result_types(), key=lambda t: t.__name__))
def test_every_public_result_type_renders_in_every_format(result_type: type) -> None:
    impl = dispatch.dispatch(result_type)
    assert impl is not dispatch.dispatch(object), f"no renderer for {result_type.__name__}"
    table = impl([] if result_type is list else None)
    assert set(FORMATS) <= set(table), result_type.__name__
    assert all(callable(table[fmt]) for fmt in FORMATS)


def test_an_unknown_result_is_a_type_error_naming_it() -> None:
    class Unregistered:
        pass

    with pytest.raises(TypeError, match="no renderer for a Unregistered"):
        render(Unregistered(), "json")
    with pytest.raises(TypeError, match="no renderer for a list other than"):
        renderers_for([1, 2])


def test_a_subclass_is_rendered_as_its_base() -> None:
    # singledispatch follows the class hierarchy; a table keyed by class name would not.
    class Derived(IngestOutcome):
        pass

    assert dispatch.dispatch(Derived) is dispatch.dispatch(IngestOutcome)
