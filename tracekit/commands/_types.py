"""Option value converters (argparse ``type=``): a malformed value is a usage error.

Each names what it expects, so ``--window soon`` fails as "--window 'soon': expected a
duration (e.g. 250ms, 30s, 1m or 1h30m)", exit code 2, before any work. Durations use
one grammar (:mod:`tracekit.units`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from tracekit import units
from tracekit.errors import ConfigError


def _converter(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return fn(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name  # argparse names the converter in "invalid <name> value"
    return convert


def duration_type(*, default_unit: str = "s", positive: bool = True) -> Callable[[str], float]:
    """``--window 30s``-style values → seconds (a bare number is ``default_unit``)."""
    return _converter(
        lambda t: units.parse_duration(
            t, default_unit=default_unit, allow_zero=not positive, what=""
        ),
        "duration",
    )


def duration_ms_type(text: str) -> float:
    """``--min-effect 1ms``-style values → milliseconds (a bare number is ms)."""
    return float(_converter(lambda t: units.parse_duration_ms(t, what=""), "duration")(text))


confidence_type: Callable[[str], float] = _converter(
    lambda t: units.parse_confidence(t, what=""), "confidence"
)
"""``0.95`` or ``95%`` → 0.95; outside [0.5, 1) is a usage error."""

time_type: Callable[[str], int] = _converter(units.parse_time_ns, "time")
"""``2h`` (back from now) or ``2026-01-01T10:00Z`` → Unix nanoseconds."""


link_gbps_type: Callable[[str], float] = _converter(
    lambda t: units.parse_link_gbps(t, what=""), "link rate"
)
"""``400``, ``400Gb/s`` or ``100G`` → Gb/s (a positive number)."""


def slo_type(text: str) -> Any:
    """``p95<200ms`` → :class:`~tracekit.analysis.facade.Slo`."""
    from tracekit.analysis.facade import parse_slo

    return _converter(parse_slo, "slo")(text)


def http_url_type(text: str) -> str:
    """An http(s) URL with a host (``--jaeger-url``): what the report and tables link."""
    from tracekit.render.html.escape import link_url

    if link_url(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL: give the Jaeger UI's base URL, "
            "e.g. http://localhost:16686"
        )
    return text
