"""Tail sampling inside ``tracekit collect``: keep the slow traces and a weighted fraction
of the rest, deciding per whole trace.

Spans of one trace arrive from several services at different times, so a trace is
decided ``decision_wait`` seconds after its first span arrived (the OpenTelemetry
Collector's ``tail_sampling`` processor waits the same way). The decision reads the
trace's root span (the request):

* **slowest** — its duration is at or above the ``100 − keep_slowest`` percentile of the
  last ``window`` requests of the same route and release: kept with certainty;
* **rest** — otherwise kept with probability ``sample_rest``, chosen from the trace id's
  56 random bits (W3C Trace Context level 2), so every collector keeps the same traces;
* a trace whose root never arrived, and every trace while its route's window is still
  filling, is kept with certainty (there is nothing to rank it against).

A kept trace's spans carry ``tracekit.sample.weight`` = its inclusion probability's
inverse × the weight it already had (its own ``tracekit.sample.weight``, else the
adjusted count of OTel probability sampling, ``ot=th:`` in ``traceState``): 1 for the
certain keeps, ``1/sample_rest`` for the rest. Given the threshold in force when a trace
was decided, that is the Horvitz–Thompson weight, so weighted quantiles, shares and
counts stay unbiased; docs/sampling.md shows the check.

Spans that arrive after their trace was decided follow the decision (remembered for the
last ``remember`` traces). :meth:`TailSampler.add` is bounded by ``max_spans`` held.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tracekit import conventions as cv
from tracekit.analysis.ingest.rows import threshold_weight

_RANDOM_BITS = 56
_MAX_THRESHOLD = 1 << _RANDOM_BITS


def th_adjusted_count(trace_state: str | None) -> float:
    """Adjusted count of OTel probability sampling: ``ot=th:T`` → 2^56 ÷ (2^56 − T).

    The ingest's own reading of the tracestate, so the sampler and the store agree on
    every weight; 1 when absent or malformed.
    """
    return threshold_weight(trace_state) or 1.0


def rest_keeps(trace_id: str, fraction: float) -> bool:
    """Whether the trace id's random bits fall under ``fraction`` (consistent everywhere)."""
    bits = int(trace_id[-14:], 16)
    return bits < fraction * _MAX_THRESHOLD


@dataclass
class _Entry:
    resource: dict[str, Any]
    scope: dict[str, Any]
    span: dict[str, Any]


@dataclass
class _Trace:
    first_seen: float
    entries: list[_Entry] = field(default_factory=list)


@dataclass
class SamplerStats:
    traces_decided: int = 0
    kept_slow: int = 0
    kept_rest: int = 0
    kept_unranked: int = 0
    dropped: int = 0
    late_spans: int = 0


class _Window:
    """The last ``size`` durations of one (route, release), sorted for rank look-ups."""

    def __init__(self, size: int) -> None:
        self.order: deque[float] = deque()
        self.sorted: list[float] = []
        self.size = size

    def threshold(self, keep_pct: float) -> float:
        rank = int(len(self.sorted) * (1.0 - keep_pct / 100.0))
        return self.sorted[min(rank, len(self.sorted) - 1)]

    def add(self, value: float) -> None:
        self.order.append(value)
        bisect.insort(self.sorted, value)
        if len(self.order) > self.size:
            old = self.order.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]


class SamplerFull(Exception):  # noqa: N818 - a signal to the receiver, not a failure
    """The sampler holds ``max_spans`` undecided spans: answer 429."""


class TailSampler:
    """Holds spans until their trace is decided, then emits the kept ones as documents."""

    def __init__(
        self,
        *,
        keep_slowest: float,
        sample_rest: float,
        decision_wait: float = 5.0,
        window: int = 1000,
        min_window: int = 50,
        max_spans: int = 500_000,
        remember: int = 200_000,
        emit: Callable[[dict[str, Any], int], object],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= keep_slowest <= 100:
            raise ValueError("keep_slowest is a percentage, 0..100")
        if not 0 < sample_rest <= 1:
            raise ValueError("sample_rest is a fraction in (0, 1]")
        self.keep_slowest = keep_slowest
        self.sample_rest = sample_rest
        self.decision_wait = decision_wait
        self.window = window
        self.min_window = min_window
        self.max_spans = max_spans
        self.remember = remember
        self.emit = emit
        self.clock = clock
        self.stats = SamplerStats()
        self._lock = threading.Lock()
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._held = 0
        self._decided: OrderedDict[str, float] = OrderedDict()
        """trace id → weight kept with (0 when dropped), for spans arriving late."""
        self._windows: dict[tuple[str, str], _Window] = {}
        self._unsent: list[tuple[dict[str, Any], int]] = []
        """Kept documents ``emit`` has not taken yet (counted in ``held_spans``)."""

    @property
    def held_spans(self) -> int:
        return self._held

    def add(self, doc: dict[str, Any], spans: int) -> None:
        """Take the spans of one screened document; :class:`SamplerFull` at the bound."""
        late: list[_Entry] = []
        late_weight: dict[str, float] = {}
        with self._lock:
            if self._held and self._held + spans > self.max_spans:
                raise SamplerFull(f"{self._held:,} spans waiting for their trace's decision")
            now = self.clock()
            for rs in doc.get("resourceSpans") or ():
                resource = rs.get("resource") or {}
                for ss in rs.get("scopeSpans") or ():
                    scope = ss.get("scope") or {}
                    for span in ss.get("spans") or ():
                        entry = _Entry(resource, scope, span)
                        tid = span["traceId"]
                        if tid in self._decided:
                            self.stats.late_spans += 1
                            if self._decided[tid] > 0:
                                late.append(entry)
                                late_weight[tid] = self._decided[tid]
                            continue
                        trace = self._traces.get(tid)
                        if trace is None:
                            trace = self._traces[tid] = _Trace(now)
                        trace.entries.append(entry)
                        self._held += 1
        if late:
            for e in late:
                _set_weight(e.span, late_weight[e.span["traceId"]])
            self.emit(_document(late), len(late))

    def decide_due(self, *, everything: bool = False) -> int:
        """Decide the traces whose wait is over (all with ``everything``); emit kept spans."""
        kept: list[_Entry] = []
        decided = 0
        with self._lock:
            cutoff = self.clock() - self.decision_wait
            while self._traces:
                tid, trace = next(iter(self._traces.items()))
                if not everything and trace.first_seen > cutoff:
                    break
                del self._traces[tid]
                self._held -= len(trace.entries)
                decided += 1
                weight = self._decide(tid, trace)
                self._decided[tid] = weight
                if len(self._decided) > self.remember:
                    self._decided.popitem(last=False)
                if weight > 0:
                    for e in trace.entries:
                        _set_weight(e.span, weight)
                    kept.extend(trace.entries)
        if kept:
            with self._lock:
                self._unsent.append((_document(kept), len(kept)))
                self._held += len(kept)
        self._send()
        return decided

    def _send(self) -> None:
        """Hand the kept documents to ``emit``; one it refuses stays for the next call
        (its spans were acknowledged: they must reach the store)."""
        while True:
            with self._lock:
                if not self._unsent:
                    return
                doc, n = self._unsent[0]
            self.emit(doc, n)
            with self._lock:
                self._unsent.pop(0)
                self._held -= n

    def _decide(self, trace_id: str, trace: _Trace) -> float:
        """The weight the trace is kept with, 0 when dropped."""
        self.stats.traces_decided += 1
        root = next((e for e in trace.entries if not e.span.get("parentSpanId")), None)
        if root is None:
            self.stats.kept_unranked += 1
            return _prior_weight(trace.entries[0].span)
        span = root.span
        prior = _prior_weight(span)
        try:
            duration = float(int(span["endTimeUnixNano"]) - int(span["startTimeUnixNano"]))
        except (KeyError, TypeError, ValueError):
            self.stats.kept_unranked += 1
            return prior
        attrs = _attrs(span.get("attributes"))
        route = str(attrs.get(cv.HTTP_ROUTE) or span.get("name") or "")
        release = str(_attrs(root.resource.get("attributes")).get(cv.SERVICE_VERSION) or "")
        window = self._windows.setdefault((route, release), _Window(self.window))
        ready = len(window.sorted) >= max(self.min_window, 1)
        slow = ready and duration >= window.threshold(self.keep_slowest)
        window.add(duration)
        if not ready:
            self.stats.kept_unranked += 1
            return prior
        if slow:
            self.stats.kept_slow += 1
            return prior
        if rest_keeps(trace_id, self.sample_rest):
            self.stats.kept_rest += 1
            return prior / self.sample_rest
        self.stats.dropped += 1
        return 0.0


def _attrs(items: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or ():
        if isinstance(item, dict) and "key" in item:
            value = item.get("value") or {}
            out[str(item["key"])] = next(iter(value.values()), None) if value else None
    return out


def _prior_weight(span: dict[str, Any]) -> float:
    """The weight a span already carries: its own attribute, else ``ot=th:``, else 1."""
    raw = _attrs(span.get("attributes")).get(cv.SAMPLE_WEIGHT)
    try:
        weight = float(raw) if raw is not None else 0.0
    except (TypeError, ValueError):
        weight = 0.0
    return weight if weight > 0 else th_adjusted_count(span.get("traceState"))


def _set_weight(span: dict[str, Any], weight: float) -> None:
    attrs = [
        a
        for a in span.get("attributes") or ()
        if not (isinstance(a, dict) and a.get("key") == cv.SAMPLE_WEIGHT)
    ]
    attrs.append({"key": cv.SAMPLE_WEIGHT, "value": {"doubleValue": weight}})
    span["attributes"] = attrs


def _document(entries: list[_Entry]) -> dict[str, Any]:
    """One OTLP document of ``entries``, grouped back under their resource and scope."""
    groups: dict[tuple[int, int], tuple[_Entry, list[dict[str, Any]]]] = {}
    for e in entries:
        key = (id(e.resource), id(e.scope))
        if key not in groups:
            groups[key] = (e, [])
        groups[key][1].append(e.span)
    return {
        "resourceSpans": [
            {"resource": e.resource, "scopeSpans": [{"scope": e.scope, "spans": spans}]}
            for e, spans in groups.values()
        ]
    }
