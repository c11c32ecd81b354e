"""``tracekit demo --training``: the real 1-rank and 2-rank DDP jobs, through the CLI."""

from __future__ import annotations

import pytest

from tracekit.cli import main

pytestmark = pytest.mark.slow  # the whole demo: two DDP jobs end to end


def test_the_training_demo_names_the_injected_straggler(
    capsys: pytest.CaptureFixture[str], tmp_path, vocabulary
) -> None:
    keep = tmp_path / "out"
    code = main(["demo", "--training", "--regression", "straggler", "--keep", str(keep)])
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
    # The same words in every command over the demo's store, table and markdown.
    vocabulary.check(out, "tracekit demo --training")
    db = ["--db", str(keep / "tracekit.duckdb")]
    runs = ["--before", "1rank", "--after", "2rank"]
    for command in (["steps"], ["diff", *runs], ["gate", *runs]):
        for fmt in ("table", "markdown"):
            assert main([*command, "--format", fmt, *db]) in (0, 1, 3)
            vocabulary.check(capsys.readouterr().out, f"tracekit {command[0]} --format {fmt}")
