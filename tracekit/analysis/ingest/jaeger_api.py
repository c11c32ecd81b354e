"""Pulling traces from a running Jaeger's query service over HTTP.

api_v3 first: ``GET /api/v3/traces?query.service_name=…&query.start_time_min=…
&query.start_time_max=…&query.num_traces=N`` answers ``{"result": {"resourceSpans":
[…]}}`` (OTLP JSON; older gRPC-gateway builds stream several such objects), or 404 with
``{"error": {"httpCode": 404, "message": "No traces found"}}`` when nothing matched. A
Jaeger without api_v3 answers 404 without that body; then the legacy UI API
``GET /api/traces?service=…&lookback=…&limit=…`` (``{"data": [trace, …]}``) is used.
This module only fetches; :func:`tracekit.analysis.ingest.ingest_jaeger` decodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx

from tracekit.errors import IngestError
from tracekit.units import parse_duration

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
    """The traces of ``service`` that started in the last ``since``, at most ``limit``."""
    window = parse_since(since)
    end = now or datetime.now(UTC)
    start = end - window
    base = url.rstrip("/")
    with httpx.Client(base_url=base, timeout=timeout, transport=transport) as client:
        v3 = _get(
            client,
            base,
            V3_PATH,
            {
                "query.service_name": service,
                "query.start_time_min": _rfc3339(start),
                "query.start_time_max": _rfc3339(end),
                "query.num_traces": str(limit),
            },
        )
        if v3.status_code == 200:
            return [JaegerResponse(f"{base}{V3_PATH}", "v3", v3.text)]
        if v3.status_code == 404 and _is_v3_error(v3):
            return []  # api_v3 is there and found nothing
        if v3.status_code not in (404, 405):
            raise _http_error(base, V3_PATH, v3)
        legacy = _get(
            client,
            base,
            LEGACY_PATH,
            {
                "service": service,
                "lookback": since,
                "limit": str(limit),
                "start": str(int(start.timestamp() * 1_000_000)),
                "end": str(int(end.timestamp() * 1_000_000)),
            },
        )
        if legacy.status_code != 200:
            raise _http_error(base, LEGACY_PATH, legacy)
        return [JaegerResponse(f"{base}{LEGACY_PATH}", "legacy", legacy.text)]


def _get(client: httpx.Client, base: str, path: str, params: dict[str, str]) -> httpx.Response:
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
