"""OpenTelemetry internals are touched in one module, checked at import, in a supported SDK."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest
from opentelemetry.instrumentation import _semconv
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace import Tracer
from opentelemetry.sdk.trace.sampling import ParentBased
from opentelemetry.trace import propagation
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import tracekit
from tracekit.instrumentation import _otel_internals

MODULE = "tracekit.instrumentation._otel_internals"
PACKAGE = Path(tracekit.__file__).parent
HOME = Path(_otel_internals.__file__)


# --- (a) private names appear only in _otel_internals ---------------------------------


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _names_home_touches() -> set[str]:
    """Every private name _otel_internals reads off an object, imports or looks up by string."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(HOME.read_text())):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            names.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.name for a in node.names if _is_private(a.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # a name or a dotted path; a docstring is neither
            parts = node.value.split(".") if re.fullmatch(r"[\w.]+", node.value) else []
            names.update(part for part in parts if _is_private(part))
    return names


OTEL_PRIVATE = _names_home_touches()


def private_otel_uses(source: str) -> list[str]:
    """Where ``source`` touches a private OpenTelemetry name, as ``line: code``.

    Caught: a private module or name imported from ``opentelemetry``; a private
    attribute of a name bound by an ``opentelemetry`` import; and any name that
    _otel_internals touches, read off anything but ``self``/``cls`` or passed to
    ``getattr`` and friends as a string.
    """
    tree = ast.parse(source)
    found: list[str] = []
    bound: set[str] = set()  # names bound to opentelemetry modules or their members

    def note(node: ast.AST) -> None:
        found.append(f"{getattr(node, 'lineno', '?')}: {ast.unparse(node)}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "opentelemetry":
                    bound.add(alias.asname or parts[0])
                    if any(_is_private(p) for p in parts):
                        note(node)
        elif isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            if parts[0] == "opentelemetry":
                bound.update(a.asname or a.name for a in node.names)
                if any(_is_private(p) for p in parts) or any(
                    _is_private(a.name) for a in node.names
                ):
                    note(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner in bound or (node.attr in OTEL_PRIVATE and owner not in ("self", "cls")):
                note(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in OTEL_PRIVATE
        ):
            note(node)
    return found


def test_the_scan_knows_the_internals_it_guards():
    assert {"_SPAN_KEY", "_Span", "_span_limits", "_update_resource", "_initialize"} <= (
        OTEL_PRIVATE
    )


@pytest.mark.parametrize(
    "code",
    [
        "from opentelemetry.sdk.trace import _Span",
        "from opentelemetry.trace.propagation import _SPAN_KEY as KEY",
        "from opentelemetry.instrumentation._semconv import Anything",
        "import opentelemetry.sdk._shared_internal",
        "from opentelemetry import context\nrt = context._RUNTIME_CONTEXT",
        "def build(t):\n    return t._span_limits",
        "def refresh(p, r):\n    getattr(p, '_update_resource')(r)",
    ],
)
def test_the_scan_catches_a_private_otel_name(code):
    assert private_otel_uses(code)


def test_the_scan_lets_tracekit_own_private_names_and_public_otel_pass():
    code = (
        "from opentelemetry.sdk.trace import Tracer\n"
        "from tracekit.instrumentation import _guard\n"
        "class P:\n"
        "    def __init__(self):\n"
        "        self._tracers = {}\n"
        "def f(span, t: Tracer):\n"
        "    return span._owner, t.resource, _guard.report\n"
    )
    assert private_otel_uses(code) == []


def test_no_tracekit_module_but_otel_internals_touches_a_private_otel_name():
    offenders = {
        str(path.relative_to(PACKAGE.parent)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HOME and (uses := private_otel_uses(path.read_text()))
    }
    assert offenders == {}, f"route these through {MODULE}: {offenders}"


# --- (b) an SDK that lacks an internal fails at import, naming it ----------------------


def _drop_init(cls: type) -> Callable[[pytest.MonkeyPatch], None]:
    """A release whose ``cls.__init__`` no longer sets the attributes tracekit reads."""

    def drop(monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(cls, "__init__", lambda self, *a, **kw: None)

    return drop


@pytest.mark.parametrize(
    ("remove", "missing"),
    [
        (
            lambda mp: mp.delattr(propagation, "_SPAN_KEY"),
            "opentelemetry.trace.propagation._SPAN_KEY",
        ),
        (lambda mp: mp.delattr(sdk_trace, "_Span"), "opentelemetry.sdk.trace._Span"),
        (_drop_init(Tracer), "opentelemetry.sdk.trace.Tracer()._span_limits"),
        (_drop_init(ParentBased), "ParentBased()._local_parent_sampled"),
    ],
    ids=["span-key", "span-class", "tracer-limits", "parent-based"],
)
def test_an_sdk_without_an_internal_fails_at_import_naming_it(monkeypatch, remove, missing):
    remove(monkeypatch)
    monkeypatch.delitem(sys.modules, MODULE)  # restored, with the module in use, afterwards
    with pytest.raises(ImportError) as raised:
        importlib.import_module(MODULE)
    message = str(raised.value)
    assert message.startswith(f"{MODULE}: ")
    assert missing in message
    assert f"opentelemetry-sdk {version('opentelemetry-sdk')}" in message
    assert f"opentelemetry-sdk{_otel_internals.SUPPORTED_SDK}" in message
    assert "install a supported version" in message
    assert raised.value.name == MODULE


def test_an_instrumentation_without_its_semconv_switch_fails_when_asked_naming_it(monkeypatch):
    monkeypatch.delattr(_semconv._OpenTelemetrySemanticConventionStability, "_initialize")
    with pytest.raises(ImportError) as raised:
        _otel_internals.initialize_semconv()
    message = str(raised.value)
    assert message.startswith(f"{MODULE}: ")
    assert "_OpenTelemetrySemanticConventionStability._initialize" in message
    assert f"opentelemetry-instrumentation {version('opentelemetry-instrumentation')}" in message
    assert f"opentelemetry-instrumentation{_otel_internals.SUPPORTED_INSTRUMENTATION}" in message


# --- (c) the installed OpenTelemetry is one tracekit supports ----------------------------


@pytest.mark.parametrize(
    ("dist", "supported"),
    [
        ("opentelemetry-sdk", _otel_internals.SUPPORTED_SDK),
        ("opentelemetry-api", _otel_internals.SUPPORTED_SDK),
        ("opentelemetry-instrumentation", _otel_internals.SUPPORTED_INSTRUMENTATION),
    ],
)
def test_the_installed_opentelemetry_is_in_the_supported_range(dist, supported):
    installed = Version(version(dist))
    assert SpecifierSet(supported).contains(installed, prereleases=True), (
        f"{dist} {installed} is outside {supported}: run the instrumentation tests against "
        f"it and widen {MODULE}'s range (and pyproject's) if they pass"
    )


def test_pyproject_declares_the_supported_ranges() -> None:
    # pip must refuse what the import-time check would refuse: the bounds are one fact.
    import tomllib
    from pathlib import Path

    from tracekit.instrumentation import _otel_internals as internals

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    declared = {r.split(">=")[0]: r[len(r.split(">=")[0]) :] for r in requirements if ">=" in r}
    for name in ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-proto"):
        assert declared[name] == internals.SUPPORTED_SDK, name
    for name in ("opentelemetry-instrumentation-fastapi", "opentelemetry-instrumentation-httpx"):
        assert declared[name] == internals.SUPPORTED_INSTRUMENTATION, name
