"""One grammar for durations and confidence levels, for every command and config file.

Durations are a number with an optional unit — ``ns``, ``us``/``µs``, ``ms``, ``s``,
``m``, ``h``, ``d`` — or a sum of such parts (``1h30m``). Which unit a bare number means
depends on where it is written (milliseconds for budgets and objectives, seconds for
windows), so each caller states its ``default_unit``. Errors are :class:`ConfigError`
naming the option, with an example of what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from tracekit.errors import ConfigError

UNIT_SECONDS: dict[str, float] = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
"""Seconds per unit; ``m`` is minutes (as in ``30m``), never metres or milli."""

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PART = re.compile(rf"\s*({_NUMBER})\s*(ns|us|µs|ms|min|s|m|h|d)?\s*", re.IGNORECASE)


def parse_duration(
    text: object, *, default_unit: str = "s", what: str = "duration", allow_zero: bool = True
) -> float:
    """``"250ms"``, ``"1.5s"``, ``"1h30m"``, ``"30"`` (in ``default_unit``) → seconds.

    A number (int or float) is taken in ``default_unit`` as well. Negative, infinite or
    unparseable values raise :class:`ConfigError`; so does zero unless ``allow_zero``.
    """
    example = "e.g. 250ms, 30s, 1m or 1h30m"
    if isinstance(text, bool):
        raise ConfigError(f"{what} {text!r}: expected a duration ({example})".strip())
    if isinstance(text, int | float):
        seconds = float(text) * UNIT_SECONDS[default_unit]
    elif isinstance(text, str):
        seconds = _parse_text(text, default_unit=default_unit, what=what, example=example)
    else:
        raise ConfigError(f"{what} {text!r}: expected a duration ({example})".strip())
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"{what} {text!r}: must be a non-negative duration ({example})".strip())
    if seconds == 0 and not allow_zero:
        raise ConfigError(f"{what} {text!r}: must be positive ({example})".strip())
    return seconds


def _parse_text(text: str, *, default_unit: str, what: str, example: str) -> float:
    pos, total, parts = 0, 0.0, 0
    body = text.strip()
    while pos < len(body):
        m = _PART.match(body, pos)
        if m is None or m.end() == pos:
            break
        unit = (m.group(2) or "").lower() or default_unit
        if not m.group(2) and parts:
            # "1h30" is ambiguous: only the last part may lack a unit when it stands alone.
            raise ConfigError(f"{what} {text!r}: give every part a unit ({example})".strip())
        total += float(m.group(1)) * UNIT_SECONDS[unit]
        parts += 1
        pos = m.end()
    if parts == 0 or pos != len(body):
        raise ConfigError(f"{what} {text!r}: expected a duration ({example})".strip())
    return total


def parse_duration_ms(text: object, *, what: str = "duration") -> float:
    """A duration in milliseconds; a bare number means milliseconds."""
    return parse_duration(text, default_unit="ms", what=what) * 1000.0


def parse_confidence(value: object, *, what: str = "confidence") -> float:
    """A two-sided confidence level in [0.5, 1): ``0.95`` or ``95%``."""
    if isinstance(value, str):
        stripped = value.strip()
        try:
            c = float(stripped[:-1]) / 100.0 if stripped.endswith("%") else float(stripped)
        except ValueError:
            raise ConfigError(f"{what} {value!r}: expected a number such as 0.95".strip()) from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        c = float(value)
    else:
        raise ConfigError(f"{what} {value!r}: expected a number such as 0.95".strip())
    if not 0.5 <= c < 1.0:
        raise ConfigError(f"{what} {value!r}: must lie in [0.5, 1), e.g. 0.95".strip())
    return c


def parse_time_ns(value: object, *, what: str = "--since/--until") -> int:
    """A point in time → Unix nanoseconds: a duration back from now (``2h``), an ISO-8601
    time (``2026-01-01T10:00Z``; no zone means UTC), a :class:`datetime.datetime`, or
    already nanoseconds (an ``int``)."""
    import datetime as dt
    import time

    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, dt.datetime):
        when = value
    else:
        text = str(value)
        try:
            when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            return time.time_ns() - int(parse_duration(text, what=what) * 1e9)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1_000


_RATE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z/]*)\s*")
_GIGABITS = frozenset({"", "g", "gb/s", "gbit/s", "gbps", "gbit", "gb"})
"""Units read as gigabits per second (any case, except a capital B: gigabytes)."""


def parse_link_gbps(value: object, *, what: str = "--link-gbps") -> float:
    """A network link's rate in Gb/s, as links are sold: ``400``, ``400Gb/s``, ``100G``.

    Gigabits, not gigabytes: a 400 Gb/s link moves at most 50 GB/s.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = float(value)
    else:
        m = _RATE.fullmatch(str(value))
        if m is not None and "B" in m.group(2):
            raise ConfigError(
                f"{what} {value!r}: that is gigabytes per second; give the link's rate in "
                f"gigabits, as links are sold ({float(m.group(1)) * 8:g}Gb/s = {m.group(1)} GB/s)"
            )
        if m is None or m.group(2).lower() not in _GIGABITS:
            raise ConfigError(
                f"{what} {value!r}: expected a link rate in Gb/s (e.g. 400, 400Gb/s or 100G)"
            )
        rate = float(m.group(1))
    if not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"{what} {value!r}: a link rate must be above 0 Gb/s")
    return rate


_COST = re.compile(r"\s*\$?\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:/\s*(h|hr|hour|s|sec|second|min|m))?\s*")
_PER_HOUR = {None: 1.0, "h": 1.0, "hr": 1.0, "hour": 1.0, "min": 60.0, "m": 60.0}


def parse_replica_costs(
    values: object, labels: Sequence[str], *, what: str = "--replica-cost"
) -> float | dict[str, float] | None:
    """``--replica-cost`` given once or more: ``2.50/h`` prices every release,
    ``B=1.20/h`` one release (on other hardware); a bare price is the default of the
    releases no ``LABEL=`` names. Returns one price, a price per label, or None."""
    if values is None:
        return None
    items = [values] if isinstance(values, (str, int, float)) else list(values)  # type: ignore[call-overload]
    default: float | None = None
    named: dict[str, float] = {}
    for item in items:
        text = str(item)
        if isinstance(item, str) and "=" in text:
            label, _, price = text.rpartition("=")
            label = label.strip()
            if not label:
                raise ConfigError(f"{what} {text!r}: name the release before '=' (e.g. B=1.20/h)")
            if label in named:
                raise ConfigError(f"{what}: {label} is priced twice")
            named[label] = parse_cost_per_hour(price.strip(), what=f"{what} for {label}")
        else:
            if default is not None:
                raise ConfigError(
                    f"{what}: two prices for every release; name one with LABEL=PRICE"
                )
            default = parse_cost_per_hour(item, what=what)
    if not named:
        return default
    if default is not None:
        return {label: named.get(label, default) for label in [*labels, *named]}
    return named


def parse_cost_per_hour(value: object, *, what: str = "--replica-cost") -> float:
    """A replica's price per hour: ``2.50/h`` (the default unit), ``$2.50/h``, ``0.05/min``,
    ``0.0007/s``; returned per hour."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        cost = float(value)
    else:
        m = _COST.fullmatch(str(value))
        if m is None:
            raise ConfigError(
                f"{what} {value!r}: expected a price per replica-hour (e.g. 2.50/h or 0.05/min)"
            )
        unit = m.group(2)
        cost = float(m.group(1)) * (3600.0 if unit in ("s", "sec", "second") else _PER_HOUR[unit])
    if not math.isfinite(cost) or cost < 0:
        raise ConfigError(f"{what} {value!r}: a price must be 0 or more")
    return cost
