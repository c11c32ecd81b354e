"""A small trace builder for tests and examples: requests, stages and spans in milliseconds.

Tests across tracekit (and users checking their own analyses) describe a trace the way
one reads a waterfall, and get span rows for the store, an OTLP JSON document exactly
as the OpenTelemetry Collector's file exporter writes it, or a JSONL file::

    from tracekit import conventions as cv
    from tracekit.testing import TraceBuilder

    b = TraceBuilder(service="ranker", version="v1", seed=0)
    r = b.request(start_ms=0, duration_ms=100, attributes={cv.INFLIGHT: 3})
    r.stage(cv.FEATURE_RETRIEVAL, start_ms=0, duration_ms=15, attributes={cv.CACHE_HIT: False})
    call = r.stage(cv.DOWNSTREAM, start_ms=60, duration_ms=40)
    r.span("GET /price", start_ms=62, duration_ms=36, kind="SERVER", parent=call, service="pricing")
    b.load(store)                      # insert the spans, then attribution.refresh(store)

Ids are derived from ``seed`` and times count from :data:`EPOCH_NS` (2026-01-01T00:00Z),
so the same calls always build the same trace.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit import conventions as cv
from tracekit.instrumentation.exporters import encode_attributes

if TYPE_CHECKING:  # the builder itself must not need duckdb
    from tracekit.analysis.store import Store

EPOCH_NS = 1_767_225_600 * 1_000_000_000
"""2026-01-01T00:00:00Z in Unix nanoseconds: time zero of every built trace."""
NS_PER_MS = 1_000_000

SOURCE = "tracekit.testing"
"""The ``source`` column of built span rows."""

# OTLP enums as the protobuf JSON mapping writes them (integers).
_KIND_ENUM = {
    "UNSPECIFIED": 0,
    "INTERNAL": 1,
    "SERVER": 2,
    "CLIENT": 3,
    "PRODUCER": 4,
    "CONSUMER": 5,
}
_STATUS_ENUM = {"UNSET": 0, "OK": 1, "ERROR": 2}
# The OpenTracing reference type on a link (tracekit.analysis.ingest.jaeger.REF_TYPE_ATTR,
# spelled out: the builder must not import the analyzer).
_REF_TYPE = "opentracing.ref_type"

AttrValue = str | bool | int | float | Sequence[Any] | Mapping[str, Any]


def _ms_to_ns(value: float) -> int:
    return round(value * NS_PER_MS)


@dataclass
class _Resource:
    service: str
    version: str | None
    instance_id: str | None
    host: str | None
    job: tuple[int, int] | None = None
    """(rank, world size) of a training process."""

    def attributes(self) -> dict[str, Any]:
        out: dict[str, Any] = {cv.SERVICE_NAME: self.service}
        if self.job is not None:
            out[cv.RANK], out[cv.WORLD_SIZE], out[cv.LOCAL_RANK] = self.job[0], self.job[1], 0
        if self.version is not None:
            out[cv.SERVICE_VERSION] = self.version
        if self.instance_id is not None:
            out[cv.SERVICE_INSTANCE_ID] = self.instance_id
        if self.host is not None:
            out[cv.HOST_NAME] = self.host
        return out

    def key(self) -> tuple[Any, ...]:
        return (self.service, self.version, self.instance_id, self.host, self.job)


@dataclass
class SpanRef:
    """One built span. ``start_ns``/``end_ns`` are absolute Unix nanoseconds."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int | None
    end_ns: int | None
    resource: _Resource
    attributes: dict[str, Any] = field(default_factory=dict)
    status: str = "UNSET"
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)

    @property
    def duration_ms(self) -> float:
        if self.start_ns is None or self.end_ns is None:
            return float("nan")
        return (self.end_ns - self.start_ns) / NS_PER_MS


class RequestBuilder:
    """One request trace: its SERVER root span plus the stages and spans added to it."""

    def __init__(self, builder: TraceBuilder, root: SpanRef) -> None:
        self.builder = builder
        self.root = root
        self.trace_id = root.trace_id
        self.span_id = root.span_id

    @property
    def start_ns(self) -> int:
        assert self.root.start_ns is not None
        return self.root.start_ns

    def stage(
        self,
        stage: str,
        *,
        start_ms: float,
        duration_ms: float,
        time_kind: str | None = None,
        cpu_ms: float | None = None,
        gpu_ms: float | None = None,
        attributes: Mapping[str, AttrValue] | None = None,
        parent: SpanRef | RequestBuilder | str | None = None,
        kind: str | None = None,
        name: str | None = None,
        service: str | None = None,
        error: bool = False,
    ) -> SpanRef:
        """A stage span (``tracekit.stage`` set); ``start_ms`` counts from the request start.

        ``time_kind`` defaults to :func:`tracekit.conventions.default_time_kind`; a
        ``downstream`` stage is a CLIENT span, the others INTERNAL.
        """
        attrs: dict[str, Any] = {
            cv.STAGE: stage,
            cv.TIME_KIND: time_kind or cv.default_time_kind(stage),
        }
        if cpu_ms is not None:
            attrs[cv.CPU_TIME_NS] = _ms_to_ns(cpu_ms)
        if gpu_ms is not None:
            attrs[cv.GPU_TIME_NS] = _ms_to_ns(gpu_ms)
        attrs.update(attributes or {})
        default_kind = "CLIENT" if stage == cv.DOWNSTREAM else "INTERNAL"
        return self.span(
            name or stage,
            start_ms=start_ms,
            duration_ms=duration_ms,
            kind=kind or default_kind,
            parent=parent,
            service=service,
            attributes=attrs,
            error=error,
        )

    def span(
        self,
        name: str,
        *,
        start_ms: float | None,
        duration_ms: float | None,
        kind: str = "INTERNAL",
        stage: str | None = None,
        parent: SpanRef | RequestBuilder | str | None = None,
        service: str | None = None,
        version: str | None = None,
        attributes: Mapping[str, AttrValue] | None = None,
        error: bool = False,
        host: str | None = None,
        links: Sequence[SpanRef | RequestBuilder] = (),
        follows_from: bool = False,
        parentless: bool = False,
    ) -> SpanRef:
        """A plain span under ``parent`` (default: the request span).

        ``parent`` may be a span id string naming a span that does not exist (an orphan).
        ``service`` puts the span under another service's resource (``version`` is then
        that service's own, absent by default); ``host`` runs that service on another
        host (default: the builder's). ``start_ms=None`` builds a span without
        timestamps, as some broken exporters send.

        ``links``: spans it links to. ``follows_from``: its tie to ``parent`` is a
        FOLLOWS_FROM reference, written as the OpenTelemetry Collector translates a
        Jaeger one: the parent, and a link to it with ``opentracing.ref_type``
        ``follows_from``. ``parentless``: no parent at all, a second root of the trace
        (with ``links`` into it: a span reached only by a link).
        """
        if parentless:
            parent_id: str | None = None
        elif isinstance(parent, str):
            parent_id = parent
        else:
            parent_id = (parent or self).span_id
        attrs = dict(attributes or {})
        if stage is not None:
            attrs.setdefault(cv.STAGE, stage)
        if start_ms is None or duration_ms is None:
            start_ns = end_ns = None
        else:
            start_ns = self.start_ns + _ms_to_ns(start_ms)
            end_ns = start_ns + _ms_to_ns(duration_ms)
        resource = (
            self.root.resource
            if service is None and host is None
            else self.builder.resource(service, version, host=host)
        )
        ref = SpanRef(
            trace_id=self.trace_id,
            span_id=self.builder.new_span_id(),
            parent_span_id=parent_id,
            name=name,
            kind=kind,
            start_ns=start_ns,
            end_ns=end_ns,
            resource=resource,
            attributes=attrs,
            status="ERROR" if error else "UNSET",
            links=[(m.trace_id, m.span_id, {}) for m in links],
        )
        if follows_from and parent_id is not None:
            ref.links.append((self.trace_id, parent_id, {_REF_TYPE: "follows_from"}))
        self.builder.spans.append(ref)
        return ref

    def collective(
        self,
        seq: int,
        *,
        start_ms: float,
        duration_ms: float,
        parent: SpanRef | None = None,
        op: str = "all_reduce",
        nbytes: int = 0,
        group: str = "default",
        background: bool = False,
        group_size: int | None = None,
        group_desc: str | None = None,
    ) -> SpanRef:
        """A ``communication`` span (one collective, number ``seq`` in ``group``).

        ``background``: launched while ``parent`` kept computing (a DDP bucket).
        ``group_size``/``group_desc``: the process group's size and description, as the
        instrumentation writes them where torch knows them (absent by default).
        """
        attrs: dict[str, Any] = {
            cv.COMM_OP: op,
            cv.COMM_BYTES: nbytes,
            cv.COMM_GROUP: group,
            cv.COMM_SEQ: seq,
        }
        if background:
            attrs[cv.COMM_ASYNC] = True
        if group_size is not None:
            attrs[cv.COMM_GROUP_SIZE] = group_size
        if group_desc is not None:
            attrs[cv.COMM_GROUP_DESC] = group_desc
        return self.stage(
            cv.COMMUNICATION,
            start_ms=start_ms,
            duration_ms=duration_ms,
            parent=parent,
            name=f"{cv.COMM_SPAN_NAME} {op}",
            attributes=attrs,
        )


class TraceBuilder:
    """Builds traces deterministically; see the module docstring for an example."""

    def __init__(
        self,
        service: str = "ranker",
        version: str | None = "v1",
        instance_id: str | None = None,
        host: str | None = "host-a",
        seed: int = 0,
    ) -> None:
        self.service = service
        self.version = version
        self.instance_id = instance_id if instance_id is not None else f"{service}-0"
        self.host = host
        self._rng = random.Random(seed)
        self._resources: dict[tuple[Any, ...], _Resource] = {}
        self.spans: list[SpanRef] = []
        self.requests: list[RequestBuilder] = []

    # --- ids and resources -----------------------------------------------------------
    def new_trace_id(self) -> str:
        return f"{self._rng.getrandbits(128) | 1:032x}"

    def new_span_id(self) -> str:
        return f"{self._rng.getrandbits(64) | 1:016x}"

    def resource(
        self,
        service: str | None = None,
        version: str | None = None,
        instance_id: str | None = None,
        *,
        host: str | None = None,
    ) -> _Resource:
        """The (shared) resource of ``service``; the builder's own when ``service`` is None.

        ``host``: the service on another host than the builder's.
        """
        on = host or self.host
        if service is None or service == self.service:
            res = _Resource(
                self.service, version or self.version, instance_id or self.instance_id, on
            )
        else:
            res = _Resource(service, version, instance_id or f"{service}-0", on)
        return self._resources.setdefault(res.key(), res)

    # --- building --------------------------------------------------------------------
    def request(
        self,
        *,
        start_ms: float = 0.0,
        duration_ms: float = 100.0,
        name: str = "POST /predict",
        route: str | None = "/predict",
        attributes: Mapping[str, AttrValue] | None = None,
        weight: float | None = None,
        error: bool = False,
        service: str | None = None,
        version: str | None = None,
        instance_id: str | None = None,
    ) -> RequestBuilder:
        """A new trace whose root is a SERVER span ``start_ms`` after :data:`EPOCH_NS`."""
        attrs: dict[str, Any] = {}
        method, _, _ = name.partition(" ")
        if method.isupper():
            attrs[cv.HTTP_REQUEST_METHOD] = method
        if route is not None:
            attrs[cv.HTTP_ROUTE] = route
        attrs[cv.HTTP_RESPONSE_STATUS_CODE] = 500 if error else 200
        if weight is not None:
            attrs[cv.SAMPLE_WEIGHT] = weight
        attrs.update(attributes or {})
        start_ns = EPOCH_NS + _ms_to_ns(start_ms)
        root = SpanRef(
            trace_id=self.new_trace_id(),
            span_id=self.new_span_id(),
            parent_span_id=None,
            name=name,
            kind="SERVER",
            start_ns=start_ns,
            end_ns=start_ns + _ms_to_ns(duration_ms),
            resource=self.resource(service, version, instance_id),
            attributes=attrs,
            status="ERROR" if error else "UNSET",
        )
        self.spans.append(root)
        req = RequestBuilder(self, root)
        self.requests.append(req)
        return req

    def batch(
        self,
        members: Iterable[RequestBuilder | SpanRef],
        *,
        start_ms: float,
        duration_ms: float,
        attributes: Mapping[str, AttrValue] | None = None,
    ) -> SpanRef:
        """A ``tracekit.batch`` root span in its own trace, linked to each member request."""
        refs = [m.root if isinstance(m, RequestBuilder) else m for m in members]
        attrs: dict[str, Any] = {cv.BATCH_REQUEST_COUNT: len(refs), cv.BATCH_SIZE: len(refs)}
        attrs.update(attributes or {})
        start_ns = EPOCH_NS + _ms_to_ns(start_ms)
        span = SpanRef(
            trace_id=self.new_trace_id(),
            span_id=self.new_span_id(),
            parent_span_id=None,
            name=cv.BATCH_SPAN_NAME,
            kind="INTERNAL",
            start_ns=start_ns,
            end_ns=start_ns + _ms_to_ns(duration_ms),
            resource=self.resource(),
            attributes=attrs,
            links=[(m.trace_id, m.span_id, {}) for m in refs],
        )
        self.spans.append(span)
        return span

    def step(
        self,
        index: int,
        *,
        rank: int,
        world_size: int,
        start_ms: float,
        duration_ms: float,
        samples: int | None = None,
        host: str | None = None,
        version: str | None = None,
    ) -> RequestBuilder:
        """A ``train_step`` root span of one rank (its own trace); add stages to it.

        Each rank is its own process: resource ``service.instance.id`` ``<service>-rank<r>``
        with ``tracekit.rank``/``world_size``, on ``host`` (default: the builder's).
        """
        res = _Resource(
            self.service,
            version or self.version,
            f"{self.service}-rank{rank}",
            host or self.host,
            (rank, world_size),
        )
        res = self._resources.setdefault(res.key(), res)
        attrs: dict[str, Any] = {cv.STEP: index, cv.RANK: rank, cv.WORLD_SIZE: world_size}
        if samples is not None:
            attrs[cv.STEP_SAMPLES] = samples
        start_ns = EPOCH_NS + _ms_to_ns(start_ms)
        root = SpanRef(
            trace_id=self.new_trace_id(),
            span_id=self.new_span_id(),
            parent_span_id=None,
            name=cv.STEP_SPAN_NAME,
            kind="INTERNAL",
            start_ns=start_ns,
            end_ns=start_ns + _ms_to_ns(duration_ms),
            resource=res,
            attributes=attrs,
        )
        self.spans.append(root)
        req = RequestBuilder(self, root)
        self.requests.append(req)
        return req

    # --- output ----------------------------------------------------------------------
    def trace_ids(self) -> list[str]:
        """Every trace id built, in creation order."""
        return list(dict.fromkeys(s.trace_id for s in self.spans))

    def rows(self) -> list[tuple[Any, ...]]:
        """Span rows in :data:`tracekit.analysis.store.SPAN_COLUMNS` order."""
        return [_row(s) for s in self.spans]

    def to_otlp(self) -> dict[str, Any]:
        """An ExportTraceServiceRequest in OTLP/JSON, as the Collector file exporter writes it."""
        return {"resourceSpans": self._resource_spans(None)}

    def write_jsonl(self, path: str | Path, *, spans_per_line: int = 512) -> Path:
        """Write OTLP JSON lines: one ``{"resourceSpans": [...]}`` document per line."""
        p = Path(path)
        with p.open("w", encoding="utf-8") as fh:
            for rs in self._resource_spans(spans_per_line):
                fh.write(json.dumps({"resourceSpans": [rs]}, separators=(",", ":")))
                fh.write("\n")
        return p

    def load(self, store: Store) -> None:
        """Insert the spans into ``store`` and refresh attribution for the built traces."""
        from tracekit.analysis.attribution import per_request as attribution

        store.insert_spans(self.rows())
        attribution.refresh(store, self.trace_ids())

    def _resource_spans(self, chunk: int | None) -> list[dict[str, Any]]:
        groups: dict[tuple[Any, ...], list[SpanRef]] = {}
        for s in self.spans:
            groups.setdefault(s.resource.key(), []).append(s)
        out = []
        for spans in groups.values():
            resource = {"attributes": encode_attributes(spans[0].resource.attributes())}
            size = chunk or len(spans)
            for i in range(0, len(spans), size):
                out.append(
                    {
                        "resource": resource,
                        "scopeSpans": [
                            {
                                "scope": {"name": SOURCE},
                                "spans": [_otlp_span(s) for s in spans[i : i + size]],
                            }
                        ],
                    }
                )
        return out


def _row(s: SpanRef) -> tuple[Any, ...]:
    a = s.attributes
    links = [{"trace_id": t, "span_id": p, "attributes": la} for t, p, la in s.links]
    weight = a.get(cv.SAMPLE_WEIGHT)
    return (
        s.trace_id,
        s.span_id,
        s.parent_span_id,
        s.name,
        s.kind,
        s.start_ns,
        s.end_ns,
        s.status,
        s.resource.service,
        s.resource.version,
        s.resource.instance_id,
        s.resource.host,
        a.get(cv.STAGE),
        a.get(cv.TIME_KIND),
        a.get(cv.CPU_TIME_NS),
        a.get(cv.GPU_TIME_NS),
        float(weight) if weight is not None else 1.0,
        json.dumps(a),
        json.dumps(s.resource.attributes()),
        json.dumps(links) if links else None,
        SOURCE,
    )


def _otlp_span(s: SpanRef) -> dict[str, Any]:
    span: dict[str, Any] = {"traceId": s.trace_id, "spanId": s.span_id}
    if s.parent_span_id:
        span["parentSpanId"] = s.parent_span_id
    span["name"] = s.name
    span["kind"] = _KIND_ENUM[s.kind]
    # A span without timestamps is sent with the fields absent (proto3 zero values).
    if s.start_ns is not None and s.end_ns is not None:
        span["startTimeUnixNano"] = str(s.start_ns)
        span["endTimeUnixNano"] = str(s.end_ns)
    if s.attributes:
        span["attributes"] = encode_attributes(s.attributes)
    if s.links:
        span["links"] = [
            {"traceId": t, "spanId": p, **({"attributes": encode_attributes(a)} if a else {})}
            for t, p, a in s.links
        ]
    span["status"] = {"code": _STATUS_ENUM[s.status]} if s.status != "UNSET" else {}
    return span


def worked_example(builder: TraceBuilder | None = None, *, start_ms: float = 0.0) -> RequestBuilder:
    """The seed's p99 request of 160 ms, built on ``builder`` (a new one when None).

    Feature retrieval 15 ms, preprocess 10, batch queue 55, model 20, a downstream
    call of 45 (whose own service's spans count as downstream), postprocess 10, and
    5 ms in no stage (unattributed)::

        0    15   25          80    100            145  155 160
        |feat|pre |batch_queue|model|  downstream   |post|  |
    """
    b = builder or TraceBuilder(service="ranker", version="v2", seed=160)
    r = b.request(
        start_ms=start_ms,
        duration_ms=160,
        attributes={cv.INFLIGHT: 12, cv.QUEUE_DEPTH: 9, cv.CPU_UTILIZATION: 0.35},
    )
    r.stage(cv.FEATURE_RETRIEVAL, start_ms=0, duration_ms=15, attributes={cv.CACHE_HIT: False})
    r.stage(cv.PREPROCESS, start_ms=15, duration_ms=10, cpu_ms=9.5)
    r.stage(
        cv.BATCH_QUEUE,
        start_ms=25,
        duration_ms=55,
        attributes={cv.BATCH_ID: "b-1", cv.BATCH_SIZE: 8},
    )
    r.stage(cv.MODEL_EXECUTE, start_ms=80, duration_ms=20, gpu_ms=18.0, cpu_ms=1.0)
    call = r.stage(cv.DOWNSTREAM, start_ms=100, duration_ms=45, name="GET /price")
    server = r.span(
        "GET /price", start_ms=102, duration_ms=41, kind="SERVER", parent=call, service="pricing"
    )
    r.span(
        "SELECT prices",
        start_ms=105,
        duration_ms=30,
        kind="CLIENT",
        parent=server,
        service="pricing",
    )
    r.stage(cv.POSTPROCESS, start_ms=145, duration_ms=10, cpu_ms=9.0)
    return r


def queue_regression(
    builder: TraceBuilder,
    *,
    releases: Sequence[str] = ("v1", "v2"),
    requests: int = 400,
    queue_ms: float = 5.0,
    after_queue_ms: float | None = None,
    extra_ms: float = 0.0,
    extra_share: float = 0.2,
    stage: str = cv.BATCH_QUEUE,
    name: str = "POST /predict",
    model_child: str | None = None,
    seed: int = 0,
) -> None:
    """Two releases of ``requests`` each, a wait ``stage`` then ``model_execute``, whose
    wait grows in the last: its median is ``after_queue_ms`` (default ``queue_ms``), and
    ``extra_share`` of its requests wait ``extra_ms`` more; ``model_child`` names a span
    inside the model's. Requests arrive every 50 ms, the releases 100 s apart; lognormal
    times, deterministic from ``seed``."""
    rng = random.Random(seed)
    for n, version in enumerate(releases):
        last = n == len(releases) - 1
        median = after_queue_ms if last and after_queue_ms is not None else queue_ms
        for i in range(requests):
            queue = rng.lognormvariate(math.log(median), 0.3)
            queue += extra_ms if last and rng.random() < extra_share else 0.0
            model = rng.lognormvariate(math.log(10.0), 0.1)
            r = builder.request(
                start_ms=n * 100_000 + i * 50.0,
                duration_ms=round(queue + model + 1.0, 3),
                version=version,
                name=name,
            )
            r.stage(stage, start_ms=0.5, duration_ms=round(queue, 3), time_kind="wait")
            m = r.stage(
                cv.MODEL_EXECUTE, start_ms=round(0.5 + queue, 3), duration_ms=round(model, 3)
            )
            if model_child is not None:
                r.span(
                    model_child,
                    start_ms=round(0.6 + queue, 3),
                    duration_ms=round(model / 2, 3),
                    parent=m,
                )


def training_run(
    builder: TraceBuilder,
    *,
    world_size: int,
    steps: int,
    version: str | None = None,
    batch: int = 32,
    data_ms: float = 2.0,
    forward_ms: float = 20.0,
    backward_ms: float = 40.0,
    optimizer_ms: float = 5.0,
    transfer_ms: float = 10.0,
    overlap: float = 0.5,
    straggler: tuple[int, float] | None = None,
    ranks_per_host: int = 8,
    host_offsets_ms: Mapping[int, float] | None = None,
    jitter_ms: float = 0.5,
) -> None:
    """A synchronous data-parallel run: every step, every rank loads, computes, all-reduces.

    Per rank and step: ``data_wait``, ``forward``, ``backward`` with one bucket all-reduce
    launched at ``overlap`` of the backward pass (background, as DDP does) and one at its
    end, then ``optimizer``. A collective ends ``transfer_ms`` after the last rank
    arrives. ``straggler=(rank, ms)`` makes that rank's forward slower. Ranks sit
    ``ranks_per_host`` to a host; ``host_offsets_ms[h]`` shifts host ``h``'s clock.
    Every rank's step starts when the previous one ended everywhere (deterministic
    jitter from the builder's seed).
    """
    rng = builder._rng
    offsets = host_offsets_ms or {}
    t = 0.0
    seq = 0
    for index in range(steps):
        plan = []
        for rank in range(world_size):
            extra = straggler[1] if straggler and straggler[0] == rank else 0.0
            j = [rng.uniform(0, jitter_ms) for _ in range(3)]
            data, fwd = data_ms + j[0], forward_ms + extra + j[1]
            bwd = backward_ms + j[2]
            plan.append((data, fwd, bwd))
        # bucket 1 goes out mid-backward, bucket 2 at its end; each ends when the last
        # rank's launch arrived plus the transfer (bucket 2 also after bucket 1)
        first = [t + d + f + bwd * overlap for d, f, bwd in plan]
        last = [t + d + f + bwd for d, f, bwd in plan]
        end1 = max(first) + transfer_ms
        end2 = max(max(last), end1) + transfer_ms
        step_end = end2 + optimizer_ms
        for rank, (data, fwd, _bwd) in enumerate(plan):
            host = rank // ranks_per_host
            off = offsets.get(host, 0.0)
            s = builder.step(
                index,
                rank=rank,
                world_size=world_size,
                start_ms=t + off,
                duration_ms=step_end - t,
                samples=batch,
                host=f"node-{host}",
                version=version,
            )
            s.stage(cv.DATA_WAIT, start_ms=0, duration_ms=data)
            s.stage(cv.FORWARD, start_ms=data, duration_ms=fwd)
            b0 = data + fwd
            bw = s.stage(cv.BACKWARD, start_ms=b0, duration_ms=end2 - t - b0)
            for k, (launch, end) in enumerate(((first[rank], end1), (last[rank], end2))):
                s.collective(
                    seq + k,
                    start_ms=launch - t,
                    duration_ms=end - launch,
                    parent=bw,
                    nbytes=25 << 20,
                    background=True,
                )
            s.stage(cv.OPTIMIZER, start_ms=end2 - t, duration_ms=optimizer_ms)
        seq += 2
        t = step_end
