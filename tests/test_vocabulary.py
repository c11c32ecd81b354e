"""The vocabulary checker (tests/conftest.py) catches each word problem it exists for."""

from __future__ import annotations

import pytest

BAD = {
    "problems: none (0.60 s)": r"problems: none \(",
    "run 1rank: 1 ranks, 15 steps": "plural after one",
    "most of it is queue wait — the issue is queue.": "not a sentence",
    "the p95 grew. most of it is queue wait": "lower case",
    "collectives (bandwidth in GB/s):\nall_reduce 2.78 MB/s": "a header says GB/s",
    "FAIL samples_per_s -65.1% (budget -10%)": "of ideal",
    "│ postprocess │ hidden wait │ 1.0 │": "'hidden wait' as a kind",
}


@pytest.mark.parametrize("text", sorted(BAD))
def test_each_word_problem_fails_the_check(vocabulary, text: str) -> None:
    with pytest.raises(AssertionError, match=BAD[text]):
        vocabulary.check(text, "example")


def test_one_stage_with_two_kinds_across_commands_fails(vocabulary) -> None:
    vocabulary.check("│ postprocess │ compute │ 1.0 │", "summary")
    vocabulary.check("│ postprocess │ compute* │ 1.0 │", "slow")  # a mark, the same kind
    with pytest.raises(AssertionError, match="postprocess is wait here but compute in summary"):
        vocabulary.check("│ postprocess │ wait │ 1.0 │", "diff")


def test_good_words_pass(vocabulary) -> None:
    vocabulary.check(
        "p95 grew 42.6 → 193.2 ms: 78% of it is batch_queue wait — the issue is batching, "
        "not the model. Scale on in-flight requests, e.g. 1.4 per replica.\n"
        "run 1rank: 1 rank, 15 steps; samples_per_s 34.9% of ideal (budget ≥ 90%)\n"
        "ingested 1 file; problems: none; took 0.60 s\n│ batch_queue │ wait │ 143.5 │",
        "good",
    )
