"""``tracekit demo --training``: the real 1-rank and 2-rank DDP jobs, through the CLI."""

from __future__ import annotations

import pytest

from tracekit.cli import main


def test_the_training_demo_names_the_injected_straggler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["demo", "--training", "--regression", "straggler"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "$ tracekit steps" in out and "$ tracekit diff --before 1rank --after 2rank" in out
    assert "run 2rank: 2 ranks," in out and "run 1rank: 1 rank," in out
    assert "training diff 1rank (1 rank) → 2rank (2 ranks)" in out
    assert "verdict: straggler" in out and "rank 1 on " in out
    lines = out.splitlines()
    assert any(ln.startswith("injected in 2rank: straggler — ") for ln in lines), out
    assert "expected: straggler" in lines, out
    assert "tracekit diff found: straggler (rank 1) ✓" in lines, out
