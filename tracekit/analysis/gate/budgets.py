"""Latency budgets for the release gate: the grammar, ``--budget`` flags and the config file.

One budget is an upper limit on one quantile of one latency::

    [stage.<name>.]p<NN>[.N] <op> <value>

    p99 <= +10%                    relative: after / before - 1 may be at most +10%
    p99 <= +5ms                    delta:    after - before may be at most 5 ms
    p95 < 200ms                    absolute: the after release's p95 stays under 200 ms
    stage.batch_queue.p99 < 40ms   the same, on one stage's critical-path time

``op`` is ``<`` or ``<=``; absolute values take ``us``, ``ms`` or ``s``; a signed time
(``+5ms``, ``-2ms``) is a change from the baseline, a percentage always is. The config
file (``tracekit-gate.toml``) holds one ``[gate]`` table whose ``budgets`` list uses the
same grammar, so there is one syntax to learn; see docs/gate.md.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from tracekit import units
from tracekit.errors import ConfigError

ABSOLUTE = "absolute"
"""The after release's quantile is compared with a fixed number of milliseconds."""
DELTA = "delta"
"""after - before, in milliseconds, is compared with the budget."""
RELATIVE = "relative"
"""after / before - 1 is compared with the budget (a fraction: 0.1 is +10%)."""

LATENCY = "latency"
"""Metric name of the request's own duration (stage metrics are ``stage.<name>``)."""

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_BUDGET_RE = re.compile(
    rf"""^\s*
    (?:stage\.(?P<stage>[A-Za-z0-9_.\-]+?)\.)?
    p(?P<pct>{_NUMBER})\s*
    (?P<op><=|<|>=|>|==|=|≤)\s*
    (?P<sign>[+-])?\s*(?P<num>{_NUMBER})\s*(?P<unit>%|us|µs|ms|s)?\s*$""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Budget:
    """An upper limit on one quantile of the request latency or of one stage."""

    percentile: float
    """The quantile as a percentile, 0 < percentile < 100 (``99.9`` for p99.9)."""
    op: str
    """``<`` or ``<=``."""
    value: float
    """Milliseconds for absolute and delta budgets; a fraction for relative ones."""
    kind: str
    """:data:`ABSOLUTE`, :data:`DELTA` or :data:`RELATIVE`."""
    stage: str | None = None
    """The stage whose critical-path time is limited; ``None`` for the request latency."""

    @property
    def quantile(self) -> float:
        return self.percentile / 100.0

    @property
    def metric(self) -> str:
        """``latency`` or ``stage.<name>``."""
        return LATENCY if self.stage is None else f"stage.{self.stage}"

    @property
    def quantile_name(self) -> str:
        return f"p{self.percentile:g}"

    @property
    def strict(self) -> bool:
        return self.op == "<"

    @property
    def value_text(self) -> str:
        """The limit as written in canonical form: ``+10%``, ``+5ms``, ``200ms``."""
        return format_limit(self.value, self.kind)

    @property
    def name(self) -> str:
        """Canonical text, e.g. ``stage.batch_queue.p99 < 40ms``; parses back to itself."""
        prefix = "" if self.stage is None else f"stage.{self.stage}."
        return f"{prefix}{self.quantile_name} {self.op} {self.value_text}"


DEFAULT_BUDGETS: tuple[Budget, ...] = (
    Budget(95.0, "<=", 0.10, RELATIVE),
    Budget(99.0, "<=", 0.10, RELATIVE),
)
"""Used when no budget is given: request p95 and p99 each at most +10% over the baseline."""


def format_limit(value: float, kind: str) -> str:
    """``+10%`` for relative, ``+5ms`` for delta, ``200ms`` for absolute limits."""
    if kind == RELATIVE:
        return f"{value * 100:+g}%"
    if kind == DELTA:
        return f"{value:+g}ms"
    return f"{value:g}ms"


def parse_budget(text: str) -> Budget:
    """Parse one budget (grammar in the module docstring); :class:`ConfigError` if wrong."""
    m = _BUDGET_RE.match(text)
    if m is None:
        raise ConfigError(
            f"cannot read budget {text!r}: expected [stage.NAME.]pNN OP VALUE, "
            "e.g. 'p99<=+10%', 'p95<200ms' or 'stage.batch_queue.p99<40ms'"
        )
    op = m["op"]
    if op == "≤":
        op = "<="
    if op not in ("<", "<="):
        raise ConfigError(
            f"budget {text!r}: operator must be < or <= (a budget is an upper limit), not {op!r}"
        )
    pct = float(m["pct"])
    if not 0.0 < pct < 100.0:
        raise ConfigError(f"budget {text!r}: the percentile must lie between 0 and 100")
    number = float(m["num"])
    sign = m["sign"]
    unit = m["unit"]
    signed = -number if sign == "-" else number
    if unit == "%":
        return Budget(pct, op, signed / 100.0, RELATIVE, m["stage"])
    if unit is None:
        raise ConfigError(
            f"budget {text!r}: give a unit: a time (us, ms, s) or a change in percent (+10%)"
        )
    ms = signed * units.UNIT_SECONDS[unit] * 1000.0
    if sign is None:
        return Budget(pct, op, ms, ABSOLUTE, m["stage"])
    return Budget(pct, op, ms, DELTA, m["stage"])


def parse_budgets(texts: list[str] | tuple[str, ...]) -> tuple[Budget, ...]:
    """Parse several budgets, dropping exact repeats (same canonical name)."""
    out: dict[str, Budget] = {}
    for text in texts:
        b = parse_budget(text)
        out.setdefault(b.name, b)
    return tuple(out.values())


def parse_duration_ms(value: object, *, what: str = "duration") -> float:
    """``"1ms"``, ``"0.5 ms"``, ``"250us"``, ``"0.01s"`` or a plain number of ms → ms (≥ 0)."""
    return units.parse_duration_ms(value, what=what)


def check_confidence(value: object, *, what: str = "confidence") -> float:
    """A two-sided confidence level in [0.5, 1); anything else is a :class:`ConfigError`."""
    return units.parse_confidence(value, what=what)


@dataclass(frozen=True)
class GateConfig:
    """What a ``tracekit-gate.toml`` says; ``None`` where it says nothing."""

    budgets: tuple[Budget, ...] = ()
    confidence: float | None = None
    min_effect_ms: float | None = None
    service: str | None = None
    route: str | None = None


_GATE_KEYS = ("budgets", "confidence", "min_effect", "service", "route")


def _line_of(text: str, needle: str) -> str:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return f" (line {number})"
    return ""


def parse_config(text: str, source: str = "tracekit-gate.toml") -> GateConfig:
    """Read the ``[gate]`` table of a config file's text. Errors name the file and field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from exc
    extra = sorted(set(data) - {"gate"})
    if extra:
        raise ConfigError(
            f"{source}: unknown key or table {extra[0]!r}; everything goes under [gate]"
        )
    gate = data.get("gate")
    if not isinstance(gate, dict):
        raise ConfigError(f"{source}: no [gate] table (see docs/gate.md for the schema)")
    unknown = sorted(set(gate) - set(_GATE_KEYS))
    if unknown:
        raise ConfigError(
            f"{source}: unknown field gate.{unknown[0]}{_line_of(text, unknown[0])}; "
            f"known fields: {', '.join(_GATE_KEYS)}"
        )

    budgets: tuple[Budget, ...] = ()
    if "budgets" in gate:
        raw = gate["budgets"]
        if not isinstance(raw, list) or not all(isinstance(b, str) for b in raw):
            raise ConfigError(
                f"{source}: gate.budgets{_line_of(text, 'budgets')} must be a list of strings "
                'such as ["p99 <= +10%", "stage.batch_queue.p99 < 40ms"]'
            )
        if not raw:
            raise ConfigError(f"{source}: gate.budgets is empty; leave it out for the defaults")
        parsed: dict[str, Budget] = {}
        for i, item in enumerate(raw):
            try:
                b = parse_budget(item)
            except ConfigError as exc:
                raise ConfigError(
                    f"{source}: gate.budgets[{i}]{_line_of(text, item)}: {exc}"
                ) from exc
            parsed.setdefault(b.name, b)
        budgets = tuple(parsed.values())

    def field(key: str) -> str:
        return f"{source}: gate.{key}{_line_of(text, key)}"

    confidence = (
        check_confidence(gate["confidence"], what=field("confidence"))
        if "confidence" in gate
        else None
    )
    min_effect = (
        parse_duration_ms(gate["min_effect"], what=field("min_effect"))
        if "min_effect" in gate
        else None
    )
    names: dict[str, str | None] = {}
    for key in ("service", "route"):
        value = gate.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{field(key)}: expected a string, not {value!r}")
        names[key] = value
    return GateConfig(budgets, confidence, min_effect, names["service"], names["route"])


def load_config(path: str | Path) -> GateConfig:
    """Read a gate config file; a missing or unreadable file is a :class:`ConfigError`."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read gate config {p}: {exc.strerror or exc}") from exc
    return parse_config(text, str(p))
