"""Pulling traces from a running Jaeger's query service over HTTP.

api_v3 first: ``GET /api/v3/traces?query.service_name=…&query.start_time_min=…
&query.start_time_max=…&query.num_traces=N`` answers ``{"result": {"resourceSpans":
[…]}}`` (OTLP JSON; older gRPC-gateway builds stream several such objects), or 404 with
``{"error": {"httpCode": 404, "message": "No traces found"}}`` when nothing matched. A
Jaeger without api_v3 answers 404 without that body; then the legacy UI API
``GET /api/traces?service=…&lookback=…&limit=…`` (``{"data": [trace, …]}``) is used.
Neither API has a page token: :func:`pull_traces` pages by moving the window's end back
to the earliest trace received, until ``limit`` traces came back or the window holds no
more, and says which. This module only fetches; :func:`tracekit.analysis.ingest.ingest_jaeger`
decodes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from tracekit.analysis.ingest.detect import iter_documents
from tracekit.errors import IngestError
from tracekit.units import parse_duration

if TYPE_CHECKING:  # httpx is imported where a pull runs: every command's parser reads
    import httpx  # DEFAULT_LIMIT, and importing httpx costs ~0.1 s

DEFAULT_LIMIT = 5000
"""Traces pulled per ingest unless --limit says otherwise: a release comparison needs
hundreds of requests per release (p99 needs about a thousand), not a UI page's 20."""
V3_PATH = "/api/v3/traces"
LEGACY_PATH = "/api/traces"


@dataclass(frozen=True)
class JaegerResponse:
    """One answer body; ``source`` (the URL) stands where a file name would."""

    source: str
    api: str
    """``v3`` or ``legacy``."""
    text: str


def parse_since(since: str) -> timedelta:
    """``90s``, ``30m``, ``1h``, ``2d`` (or a sum such as ``1h30m``); a bare number is seconds."""
    return timedelta(seconds=parse_duration(since, what="--since", allow_zero=False))


def _rfc3339(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


PAGE_TRACES = 1000
"""Traces asked for per request; a pull pages through its window in requests of this many."""


@dataclass
class Pull:
    """What a pull brought back: the answer bodies, how many traces, and why it stopped."""

    responses: list[JaegerResponse] = field(default_factory=list)
    traces: int = 0
    pages: int = 0
    stopped: str = ""
    """``limit`` (--limit traces came back), ``window`` (the --since window holds no
    more), ``stalled`` (a whole page started at one instant: the window cannot move)."""

    def summary(self, limit: int) -> str:
        why = {
            "limit": f"reached --limit {limit:,}",
            "window": "no more traces in the --since window",
            "stalled": "a page of traces all started at the same instant; paging cannot go on",
        }[self.stopped]
        pages = "request" if self.pages == 1 else "requests"
        return f"Jaeger returned {self.traces:,} traces in {self.pages} {pages}; stopped: {why}"


def fetch_traces(
    url: str,
    service: str,
    *,
    since: str = "1h",
    limit: int = DEFAULT_LIMIT,
    now: datetime | None = None,
    timeout: float = 30.0,
    transport: httpx.BaseTransport | None = None,
) -> list[JaegerResponse]:
    """The answer bodies of :func:`pull_traces`."""
    return pull_traces(
        url, service, since=since, limit=limit, now=now, timeout=timeout, transport=transport
    ).responses


def pull_traces(
    url: str,
    service: str,
    *,
    since: str = "1h",
    limit: int = DEFAULT_LIMIT,
    now: datetime | None = None,
    timeout: float = 30.0,
    transport: httpx.BaseTransport | None = None,
    page: int | None = None,
) -> Pull:
    """The traces of ``service`` that started in the last ``since``, at most ``limit``.

    Jaeger answers a search with the most recent traces of the window, at most as many
    as asked; neither API has a page token. So the window's end moves back to the
    earliest start of the traces already received, page after page, until ``limit``
    traces came back or a page comes back short (the window holds no more). A trace
    seen twice (it started at a page boundary) is kept once.
    """
    page = page or PAGE_TRACES
    window = parse_since(since)
    end_ns = _ns(now or datetime.now(UTC))
    start_ns = end_ns - int(window.total_seconds() * 1e9)
    base = url.rstrip("/")
    pull = Pull()
    seen: set[str] = set()
    at_end = 0  # traces received that start exactly at the window's end: they come again
    api: str | None = None
    import httpx

    with httpx.Client(base_url=base, timeout=timeout, transport=transport) as client:
        while True:
            want = min(page, limit - pull.traces + at_end)
            if api != "legacy":
                response = _get(client, base, V3_PATH, _v3_params(service, start_ns, end_ns, want))
                if response.status_code == 200:
                    api = "v3"
                elif response.status_code == 404 and _is_v3_error(response):
                    api = "v3"  # api_v3 is there and found nothing (more)
                    pull.pages += 1
                    pull.stopped = "window"
                    return pull
                elif api is None and response.status_code in (404, 405):
                    api = "legacy"
                else:
                    raise _http_error(base, V3_PATH, response)
            if api == "legacy":
                params = _legacy_params(service, since, start_ns, end_ns, want)
                response = _get(client, base, LEGACY_PATH, params)
                if response.status_code != 200:
                    raise _http_error(base, LEGACY_PATH, response)
            pull.pages += 1
            path = V3_PATH if api == "v3" else LEGACY_PATH
            text, starts = _new_traces(response.text, api or "v3", seen, limit - pull.traces)
            returned = _returned(response.text, api or "v3")
            pull.traces += len(starts)
            if starts:
                pull.responses.append(JaegerResponse(f"{base}{path}", api or "v3", text))
            if pull.traces >= limit:
                pull.stopped = "limit"
                return pull
            if returned < want:
                pull.stopped = "window"
                return pull
            earliest = min(starts.values(), default=end_ns)
            if earliest >= end_ns or earliest <= start_ns:
                pull.stopped = "stalled" if earliest >= end_ns else "window"
                return pull
            end_ns = earliest
            at_end = sum(1 for s in starts.values() if s == end_ns)


def _ns(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000) * 1000


def _rfc3339_ns(ns: int) -> str:
    return _rfc3339(datetime.fromtimestamp(ns / 1e9, UTC))


def _v3_params(service: str, start_ns: int, end_ns: int, want: int) -> dict[str, str]:
    return {
        "query.service_name": service,
        "query.start_time_min": _rfc3339_ns(start_ns),
        "query.start_time_max": _rfc3339_ns(end_ns),
        "query.num_traces": str(want),
    }


def _legacy_params(
    service: str, since: str, start_ns: int, end_ns: int, want: int
) -> dict[str, str]:
    return {
        "service": service,
        "lookback": since,
        "limit": str(want),
        "start": str(start_ns // 1000),
        "end": str(end_ns // 1000),
    }


def _returned(text: str, api: str) -> int:
    """Distinct traces in one answer (before dropping those already seen)."""
    return len(_trace_starts(_documents(text), api))


def _documents(text: str) -> list[Any]:
    try:
        return [doc for _, doc in iter_documents(text)]
    except json.JSONDecodeError:
        return []  # the decoder reports it where it reads the body


def _trace_starts(docs: list[Any], api: str) -> dict[str, int]:
    """Trace id -> earliest span start (ns) of every trace in the answer."""
    out: dict[str, int] = {}

    def note(tid: Any, start: Any, scale: int) -> None:
        try:
            ns = int(start) * scale
        except (TypeError, ValueError):
            ns = 0
        key = str(tid).lower()
        out[key] = min(out.get(key, ns), ns)

    for doc in docs:
        if not isinstance(doc, dict):
            continue
        if api == "v3":
            result = doc.get("result", doc)
            for rs in _list(result.get("resourceSpans") if isinstance(result, dict) else None):
                for ss in _list(rs.get("scopeSpans") if isinstance(rs, dict) else None):
                    for span in _list(ss.get("spans") if isinstance(ss, dict) else None):
                        if isinstance(span, dict):
                            note(span.get("traceId"), span.get("startTimeUnixNano"), 1)
        else:
            for trace in _list(doc.get("data")):
                for span in _list(trace.get("spans") if isinstance(trace, dict) else None):
                    if isinstance(span, dict):
                        note(span.get("traceID"), span.get("startTime"), 1000)
    return out


def _list(v: Any) -> list[Any]:
    return v if isinstance(v, list) else []


def _new_traces(text: str, api: str, seen: set[str], room: int) -> tuple[str, dict[str, int]]:
    """The answer without traces already received (and past ``room``), and their starts.

    Jaeger lists the most recent first; when more came back than ``room``, the most
    recent ``room`` are kept.
    """
    docs = _documents(text)
    starts = _trace_starts(docs, api)
    fresh = {t: s for t, s in starts.items() if t not in seen}
    if len(fresh) > room:
        fresh = dict(sorted(fresh.items(), key=lambda kv: -kv[1])[:room])
    seen.update(fresh)
    if len(fresh) == len(starts) or not docs:
        return text, fresh
    keep = set(fresh)
    for doc in docs:
        _filter(doc, api, keep)
    return "\n".join(json.dumps(d) for d in docs), fresh


def _filter(doc: Any, api: str, keep: set[str]) -> None:
    if not isinstance(doc, dict):
        return
    if api == "v3":
        result = doc.get("result", doc)
        for rs in _list(result.get("resourceSpans") if isinstance(result, dict) else None):
            for ss in _list(rs.get("scopeSpans") if isinstance(rs, dict) else None):
                if isinstance(ss, dict):
                    ss["spans"] = [
                        s
                        for s in _list(ss.get("spans"))
                        if isinstance(s, dict) and str(s.get("traceId")).lower() in keep
                    ]
    else:
        doc["data"] = [
            t
            for t in _list(doc.get("data"))
            if isinstance(t, dict)
            and any(str(s.get("traceID")).lower() in keep for s in _list(t.get("spans")))
        ]


def _get(client: httpx.Client, base: str, path: str, params: dict[str, str]) -> httpx.Response:
    import httpx

    try:
        return client.get(path, params=params)
    except httpx.HTTPError as exc:
        raise IngestError(
            base,
            f"cannot reach Jaeger ({exc}); is its query service running? (UI port, usually 16686)",
        ) from exc


def _is_v3_error(response: httpx.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


def _http_error(base: str, path: str, response: httpx.Response) -> IngestError:
    body = " ".join(response.text.split())[:200]
    return IngestError(f"{base}{path}", f"Jaeger answered HTTP {response.status_code}: {body}")
