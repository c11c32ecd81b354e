"""The OpenTelemetry internals tracekit rests on, all in one place.

tracekit reaches past OTel's public API in a few places: to record spans for a few
microseconds and build the SDK spans later (:mod:`._spans`, :mod:`._tracer`,
:mod:`.stages`), to count spans dropped on a full export queue (:mod:`.exporters`),
to give a forked worker its own resource (:mod:`.setup`) and to opt in to the stable
HTTP semantic conventions. Each private name involved is resolved here, once, and
nothing else in tracekit touches an OTel name that starts with ``_``
(``tests/instrumentation/test_otel_internals.py`` checks this).

The SDK's names are checked when this module is imported, i.e. when tracekit's
instrumentation is imported, before ``configure()`` returns. If a release has renamed
one, that import fails with one ``ImportError`` naming each missing internal, the
installed versions and the supported range. That is the loud failure we want: the
alternative is broken spans on the recorder thread or an error inside a request.
An attribute the SDK sets on its objects is checked in the code of the ``__init__``
that sets it, so this import builds no SDK object: a provider registers fork hooks
and a batch processor starts a thread.

The semantic-convention switch belongs to ``opentelemetry-instrumentation``, whose
import costs about 60 ms, so it is resolved only when ``instrument_fastapi()`` or
``instrument_httpx()`` first asks for it. Those calls are made at set-up too.

:data:`SUPPORTED_SDK` is the range the test suite passes on (1.42.0, 1.43.0, 1.44.0
and 1.45.2 were tried). The floor comes from public API, not from these internals:
``TraceFlags.RANDOM_TRACE_ID`` and ``IdGenerator.is_trace_id_random()`` are new in
1.42. The ceiling is the newest release tried.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence, Sized
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import context as context_api
from opentelemetry.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Span, Tracer, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler
from opentelemetry.trace import Link, SpanContext, SpanKind
from opentelemetry.trace import propagation as propagation_api

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider

SUPPORTED_SDK = ">=1.42,<1.46"
"""The ``opentelemetry-sdk`` releases tracekit works with; ``opentelemetry-api`` alike
(each SDK release pins the API release of the same number)."""

SUPPORTED_INSTRUMENTATION = ">=0.63b0,<0.67"
"""The ``opentelemetry-instrumentation`` releases whose semantic-convention switch
tracekit drives (the releases that go with :data:`SUPPORTED_SDK`)."""

_ABSENT = object()
_missing: list[str] = []


def _unsupported(dists: Sequence[str], supported: str, missing: Sequence[str]) -> ImportError:
    """The one error an unsupported OTel release gets: what is missing and what to install."""
    from importlib.metadata import PackageNotFoundError, version  # ~15 ms: only on failure

    installed = []
    for dist in dists:
        try:
            installed.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            installed.append(f"{dist} (not installed)")
    return ImportError(
        f"{__name__}: {' / '.join(installed)} has no {', '.join(missing)}, which tracekit's "
        f"instrumentation relies on. tracekit supports {dists[0]}{supported}; install a "
        f"supported version: pip install '{dists[0]}{supported}'",
        name=__name__,
    )


def _resolve(owner: object, name: str, where: str) -> Any:
    """``owner.<name>``; noted as missing (and None) when the release has no such name."""
    value = getattr(owner, name, _ABSENT)
    if value is _ABSENT:
        _missing.append(f"{where}.{name}")
        return None
    return value


def _init_code(cls: type) -> Any:
    """The code object of ``cls.__init__`` (under any ``functools.wraps`` decorator), or None."""
    init = getattr(cls, "__init__", None)
    return getattr(getattr(init, "__wrapped__", init), "__code__", None)


def _init_stores(cls: type, *names: str) -> None:
    """Note each of ``names`` that ``cls.__init__`` does not set on the instance."""
    code = _init_code(cls)
    stored = set(code.co_names) if code is not None else set()
    where = f"{cls.__module__}.{cls.__qualname__}()"
    _missing.extend(f"{where}.{name}" for name in names if name not in stored)


def _init_takes(cls: type, *names: str) -> None:
    """Note each of ``names`` that ``cls.__init__`` takes no keyword argument of."""
    code = _init_code(cls)
    params = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]) if code else set()
    where = f"{cls.__module__}.{cls.__qualname__}({{}}=)"
    _missing.extend(where.format(name) for name in names if name not in params)


# --- the current span in the OTel context --------------------------------------------

SPAN_KEY: str = _resolve(propagation_api, "_SPAN_KEY", "opentelemetry.trace.propagation")
"""The context key under which ``trace.set_span_in_context`` stores the current span
(``opentelemetry.trace.propagation._SPAN_KEY``). tracekit reads the current span
with one lookup and builds a context holding a span in one step, without the
API's call chain; both run on every stage enter and exit."""

_runtime = _resolve(context_api, "_RUNTIME_CONTEXT", "opentelemetry.context")
CONTEXT_VAR: ContextVar[Context] | None = (
    _resolve(_runtime, "_current_context", "opentelemetry.context._RUNTIME_CONTEXT")
    if isinstance(_runtime, ContextVarsRuntimeContext)
    else None
)
"""The ``ContextVar`` that holds the current OTel context when the runtime is the
default, contextvars one (``opentelemetry.context._RUNTIME_CONTEXT._current_context``);
None under another runtime (``OTEL_PYTHON_CONTEXT``). Setting and resetting it is what
the API's attach and detach do, without their two layers of calls and a try/except
each."""


# --- building an SDK span from a recorded one ---------------------------------------

_SdkSpan: type[Span] = _resolve(sdk_trace, "_Span", "opentelemetry.sdk.trace")
if _SdkSpan is not None:
    _init_takes(
        _SdkSpan, "name", "context", "parent", "sampler", "resource", "attributes",
        "span_processor", "kind", "links", "instrumentation_info", "record_exception",
        "set_status_on_exception", "limits", "instrumentation_scope",
    )  # fmt: skip
_init_stores(Tracer, "_span_limits", "_instrumentation_scope")


def new_sdk_span(
    tracer: Tracer,
    name: str,
    context: SpanContext,
    *,
    parent: SpanContext | None,
    attributes: Mapping[str, Any] | None,
    kind: SpanKind,
    links: Sequence[Link],
    record_exception: bool,
    set_status_on_exception: bool,
) -> Span:
    """An SDK span of ``tracer`` with the given ids, not yet started.

    Made as ``Tracer.start_span`` makes its own: the SDK's span class
    (``opentelemetry.sdk.trace._Span``) with the tracer's span limits and
    instrumentation scope (``Tracer._span_limits``, ``Tracer._instrumentation_scope``).
    The public ``start_span`` cannot be used because it draws new ids and asks the
    sampler again, and a recorded span must keep the ids its children and the
    ``traceparent`` headers already carry.
    """
    return _SdkSpan(
        name=name,
        context=context,
        parent=parent,
        sampler=tracer.sampler,
        resource=tracer.resource,
        attributes=attributes,
        span_processor=tracer.span_processor,
        kind=kind,
        links=links,
        instrumentation_info=tracer.instrumentation_info,
        record_exception=record_exception,
        set_status_on_exception=set_status_on_exception,
        limits=tracer._span_limits,
        instrumentation_scope=tracer._instrumentation_scope,
    )


# --- sampling ------------------------------------------------------------------------

_init_stores(
    ParentBased,
    "_local_parent_sampled",
    "_remote_parent_sampled",
    "_local_parent_not_sampled",
    "_remote_parent_not_sampled",
)


class ParentDelegates(NamedTuple):
    """The samplers a ``ParentBased`` sampler hands each kind of child to."""

    local_sampled: Sampler
    remote_sampled: Sampler
    local_not_sampled: Sampler
    remote_not_sampled: Sampler


def parent_based_delegates(sampler: ParentBased) -> ParentDelegates:
    """The delegates ``sampler`` was made with (``ParentBased._local_parent_sampled`` etc.).

    The SDK does not expose them. tracekit reads them to know that a child's decision is
    its parent's flag (the default delegates), so it decides without calling the sampler.
    """
    return ParentDelegates(
        sampler._local_parent_sampled,
        sampler._remote_parent_sampled,
        sampler._local_parent_not_sampled,
        sampler._remote_parent_not_sampled,
    )


# --- the export queue ------------------------------------------------------------------

_init_stores(BatchSpanProcessor, "_batch_processor")
try:
    _shared: Any = importlib.import_module("opentelemetry.sdk._shared_internal")
except ImportError:
    _shared = None  # noted as missing below
_BatchProcessor = _resolve(_shared, "BatchProcessor", "opentelemetry.sdk._shared_internal")
if _BatchProcessor is not None:
    _init_stores(_BatchProcessor, "_queue", "_max_queue_size")


def batch_queue(processor: BatchSpanProcessor) -> tuple[Sized, int]:
    """The queue of spans ``processor`` has yet to export, and how many it holds at most.

    Both are private (``BatchSpanProcessor._batch_processor._queue`` and
    ``._max_queue_size``). tracekit reads them to count the spans a full queue drops
    and to pace its span recorder on the backlog.
    """
    inner: Any = processor._batch_processor
    return inner._queue, int(inner._max_queue_size)


# --- resource after a fork -------------------------------------------------------------

_init_stores(TracerProvider, "_resource", "_tracers")
if not callable(getattr(TracerProvider, "_update_resource", None)):
    # an SDK before 1.44, where the fallback below runs: check its meter-provider part
    # too (newer SDKs skip this, so their metrics SDK is not imported just for a check)
    from opentelemetry.sdk.metrics import MeterProvider as _MeterProvider

    _init_stores(_MeterProvider, "_sdk_config")


def update_resource(provider: TracerProvider | MeterProvider, update: Resource) -> bool:
    """Merge ``update`` into an SDK tracer or meter provider's resource, in place.

    Where the provider has one (SDK 1.44+), this is the SDK's own after-fork refresh,
    ``_update_resource``: the provider and every tracer or meter it handed out, under
    the SDK's own locks. Older SDKs have none, so the resource is replaced on the
    provider (``TracerProvider._resource``) and on the tracers it cached
    (``TracerProvider._tracers``), or in a meter provider's configuration
    (``MeterProvider._sdk_config``), which its readers read at each collection.
    Returns True when tracers handed out earlier may still hold the old resource and
    should be fetched again. A tracer copies its provider's resource when it is made.
    """
    method: Callable[[Resource], None] | None = getattr(provider, "_update_resource", None)
    if callable(method):
        method(update)
        return False
    if isinstance(provider, TracerProvider):
        merged = provider._resource = provider.resource.merge(update)
        for tracer in provider._tracers.values():
            tracer.resource = merged
        return True
    config = provider._sdk_config
    config.resource = config.resource.merge(update)
    return False


if _missing:
    raise _unsupported(("opentelemetry-sdk", "opentelemetry-api"), SUPPORTED_SDK, _missing)


# --- the stable HTTP semantic conventions -----------------------------------------------

_SEMCONV_MODULE = "opentelemetry.instrumentation._semconv"
_SEMCONV_CLASS = "_OpenTelemetrySemanticConventionStability"


def _semconv_stability() -> Any:
    """``opentelemetry.instrumentation._semconv._OpenTelemetrySemanticConventionStability``.

    The switch OTel's HTTP instrumentations read once per process to pick old or
    stable attribute names. It is resolved on each call, not at import, because
    importing it costs about 60 ms (the calls are rare: one per instrumented app or
    client).
    """
    missing: list[str] = []
    try:
        module = importlib.import_module(_SEMCONV_MODULE)
    except ImportError:
        module, missing = None, [_SEMCONV_MODULE]
    cls = getattr(module, _SEMCONV_CLASS, None)
    if module is not None and cls is None:
        missing.append(f"{_SEMCONV_MODULE}.{_SEMCONV_CLASS}")
    if cls is not None:
        where = f"{_SEMCONV_MODULE}.{_SEMCONV_CLASS}"
        missing.extend(
            f"{where}.{n}" for n in ("_initialized", "_initialize") if not hasattr(cls, n)
        )
    if missing:
        raise _unsupported(("opentelemetry-instrumentation",), SUPPORTED_INSTRUMENTATION, missing)
    return cls


def semconv_initialized() -> bool:
    """Whether the HTTP instrumentations' semantic-convention switch has read its
    environment variable (``_OpenTelemetrySemanticConventionStability._initialized``)."""
    return bool(_semconv_stability()._initialized)


def initialize_semconv() -> None:
    """Make the switch read ``OTEL_SEMCONV_STABILITY_OPT_IN`` now, if it has not yet
    (``_OpenTelemetrySemanticConventionStability._initialize()``)."""
    _semconv_stability()._initialize()
