"""Budget grammar and the gate config file: what parses, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.analysis.gate.budgets import (
    ABSOLUTE,
    DEFAULT_BUDGETS,
    DELTA,
    RELATIVE,
    load_config,
    parse_budget,
    parse_budgets,
    parse_config,
    parse_duration_ms,
)
from tracekit.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "percentile", "op", "value", "kind", "stage"),
    [
        ("p99<=+10%", 99.0, "<=", 0.10, RELATIVE, None),
        ("p99 <= 10%", 99.0, "<=", 0.10, RELATIVE, None),
        ("p50 < -5%", 50.0, "<", -0.05, RELATIVE, None),
        ("p95 < 200ms", 95.0, "<", 200.0, ABSOLUTE, None),
        ("p95<0.2s", 95.0, "<", 200.0, ABSOLUTE, None),
        ("p90 <= 150us", 90.0, "<=", 0.15, ABSOLUTE, None),
        ("p99.9 <= +5ms", 99.9, "<=", 5.0, DELTA, None),
        ("stage.batch_queue.p99<40ms", 99.0, "<", 40.0, ABSOLUTE, "batch_queue"),
        ("stage.my.custom-stage.p95 <= +20%", 95.0, "<=", 0.20, RELATIVE, "my.custom-stage"),
    ],
)
def test_budget_grammar(
    text: str, percentile: float, op: str, value: float, kind: str, stage: str | None
) -> None:
    b = parse_budget(text)
    assert (b.percentile, b.op, b.kind, b.stage) == (percentile, op, kind, stage)
    assert b.value == pytest.approx(value)


def test_canonical_name_parses_back_to_the_same_budget() -> None:
    for text in ("p99<=+10%", "p95 < 0.2s", "stage.batch_queue.p99.9<40ms", "p50<=-2.5ms"):
        b = parse_budget(text)
        assert parse_budget(b.name) == b
    assert parse_budget("stage.batch_queue.p99<40ms").name == "stage.batch_queue.p99 < 40ms"
    assert parse_budget("p99<=10%").name == "p99 <= +10%"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("p99 > +10%", "operator must be < or <="),
        ("p99 >= 200ms", "operator must be < or <="),
        ("p100 < 1s", "between 0 and 100"),
        ("p99 < 200", "give a unit"),
        ("latency < 200ms", "expected [stage.NAME.]pNN OP VALUE"),
        ("p99 <= +10 %%", "expected"),
    ],
)
def test_bad_budgets_say_what_is_wrong(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="budget") as info:
        parse_budget(text)
    assert fragment in str(info.value)


def test_repeated_budgets_are_kept_once() -> None:
    assert len(parse_budgets(["p99<=+10%", "p99 <= 10%", "p95<=+10%"])) == 2


def test_defaults_are_p95_and_p99_within_ten_percent() -> None:
    assert [b.name for b in DEFAULT_BUDGETS] == ["p95 <= +10%", "p99 <= +10%"]


def test_durations() -> None:
    assert parse_duration_ms("1ms") == 1.0
    assert parse_duration_ms("250us") == 0.25
    assert parse_duration_ms("0.01 s") == 10.0
    assert parse_duration_ms(3) == 3.0
    for bad in ("-1ms", "fast", True, [1]):
        with pytest.raises(ConfigError, match="min_effect"):
            parse_duration_ms(bad, what="min_effect")


EXAMPLE = """\
# tracekit-gate.toml
[gate]
confidence = 0.9
min_effect = "1ms"
budgets = [
  "p95 <= +10%",
  "p99 <= +10%",
  "stage.batch_queue.p99 < 40ms",
]
"""


def test_config_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "tracekit-gate.toml"
    path.write_text(EXAMPLE)
    cfg = load_config(path)
    assert cfg.confidence == 0.9
    assert cfg.min_effect_ms == 1.0
    assert [b.name for b in cfg.budgets] == [
        "p95 <= +10%",
        "p99 <= +10%",
        "stage.batch_queue.p99 < 40ms",
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (EXAMPLE.replace('"p99 <= +10%"', '"p99 > +10%"'), "gate.budgets[1] (line 7)"),
        (EXAMPLE.replace("confidence = 0.9", "confidence = 1.5"), "gate.confidence (line 3)"),
        (EXAMPLE.replace('"1ms"', '"soon"'), "gate.min_effect (line 4)"),
        (EXAMPLE.replace("min_effect", "min_efect"), "unknown field gate.min_efect (line 4)"),
        (EXAMPLE.replace('  "p95 <= +10%",\n', "  95,\n"), "gate.budgets"),
        (EXAMPLE + "[budget]\nmetric = 'p99'\n", "unknown key or table 'budget'"),
        ("confidence = 0.9\n", "unknown key or table 'confidence'"),
        ("", "no [gate] table"),
        ("[gate\n", "not valid TOML"),
        ("[gate]\nbudgets = []\n", "gate.budgets is empty"),
    ],
)
def test_config_errors_name_the_file_and_field(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "ci/tracekit-gate.toml")
    message = str(info.value)
    assert message.startswith("ci/tracekit-gate.toml: ")
    assert fragment in message


def test_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read gate config"):
        load_config(tmp_path / "nope.toml")
