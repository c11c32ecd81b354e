"""``tracekit demo --llm``: the continuous-batching engine, the command, one real run.

The engine is tested in-process on a tiny float64 model (no server, a second or so):
batched decoding from the KV cache gives the tokens a full recompute gives, a request
joins a running batch as soon as a slot frees, no more requests run than there are
slots, and every request ends with its tokens. One real run of the command (two service
processes, streamed load in turns, ingest, the diffs) serves the slow tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from tracekit import cli
from tracekit import conventions as cv
from tracekit.demo.command import check_regression
from tracekit.demo.llm import demo
from tracekit.demo.llm.client import MAX_TOKENS, PROMPT_CHARS, llm_payload
from tracekit.demo.llm.engine import Engine
from tracekit.demo.llm.model import Device, Runner, TinyDecoder, encode
from tracekit.demo.llm.regressions import LLM_REGRESSIONS, get_llm_regression
from tracekit.errors import ConfigError

from .conftest import assert_all_gone, record_started_pids

PROMPTS = ["hello world", "a", "the quick brown fox jumps over the lazy dog", "tracekit"]


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    # float64: batched and unbatched arithmetic then agree on every argmax
    return TinyDecoder(d_model=32, heads=2, layers=2, max_seq=96, seed=3, dtype=torch.float64)


def engine_run(runner: Runner, requests: list[tuple[str, int]], *, stagger_s: float = 0.0) -> Any:
    """Submit ``(prompt, max_tokens)`` requests (``stagger_s`` apart), read every stream;
    the engine, each request's tokens and its marks, in submission order."""

    class Marks:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def admitted(self) -> None:
            self.calls.append("admitted")

        def first_token(self) -> None:
            self.calls.append("first")

        def token(self) -> None:
            self.calls.append("token")

    async def main() -> tuple[Engine, list[list[int]], list[Marks]]:
        engine = Engine(runner, record=True)
        engine.start()
        marks = [Marks() for _ in requests]

        async def one(i: int) -> list[int]:
            await asyncio.sleep(i * stagger_s)
            prompt, n = requests[i]
            req = engine.submit(encode(prompt), n, marks[i])
            return [t async for t in engine.stream(req)]

        try:
            tokens = await asyncio.gather(*(one(i) for i in range(len(requests))))
        finally:
            await engine.aclose()
        return engine, list(tokens), marks

    return asyncio.run(main())


@pytest.mark.parametrize(
    ("decode_rows", "decode_extra", "device"),
    [(1, 0, Device()), (8, 0, Device()), (8, 64, Device(0.2, 0.2, 0.01))],
    ids=["exact", "padded", "extra-and-device"],
)
def test_batched_decoding_from_the_cache_gives_the_tokens_of_a_full_recompute(
    model: TinyDecoder, decode_rows: int, decode_extra: int, device: Device
) -> None:
    # Padding rows, the decode regression's extra work and the stand-in device's waits
    # change the time, not the tokens.
    runner = Runner(
        model, slots=3, decode_rows=decode_rows, device=device, decode_extra=decode_extra
    )
    requests = [(p, n) for p, n in zip(PROMPTS, (12, 5, 9, 15), strict=True)]
    _, tokens, marks = engine_run(runner, requests)
    for (prompt, n), got, m in zip(requests, tokens, marks, strict=True):
        assert got == model.greedy(encode(prompt), n), prompt
        # the phases in order: a slot, the prefill's token, then one mark per later token
        assert m.calls == ["admitted", "first", *["token"] * (n - 1)]
    assert len({t for ts in tokens for t in ts}) > 5  # the model says more than one thing


def test_a_request_joins_the_running_batch_as_soon_as_a_slot_frees(model: TinyDecoder) -> None:
    # Two slots: A (3 tokens) and B (12) start together; C must not wait for B.
    engine, tokens, _ = engine_run(Runner(model, slots=2), [("aaaa", 3), ("bbbb", 12), ("cccc", 4)])
    a, b, c = 1, 2, 3
    steps = engine.steps
    assert steps is not None and steps[0].admitted == (a, b)
    joined = next(i for i, s in enumerate(steps) if c in s.admitted)
    a_done = next(i for i, s in enumerate(steps) if a in s.finished)
    b_done = next(i for i, s in enumerate(steps) if b in s.finished)
    assert joined == a_done + 1  # the iteration after A left: its slot, at once
    assert joined < b_done and b in steps[joined].decoded  # into B's running batch
    assert {c, b} <= set(steps[joined].decoded)  # C's first decode step is B's too
    assert [len(t) for t in tokens] == [3, 12, 4]


def test_no_more_requests_run_than_slots_and_every_one_finishes(model: TinyDecoder) -> None:
    rng = random.Random(5)
    requests = [
        ("".join(rng.choices("abcdefgh ", k=rng.randint(1, 30))), rng.randint(1, 20))
        for _ in range(24)
    ]
    engine, tokens, marks = engine_run(Runner(model, slots=4), requests, stagger_s=0.002)
    steps = engine.steps
    assert steps is not None
    for step in steps:
        assert len(step.decoded) <= 4
        assert len(set(step.slots)) == len(step.slots) and set(step.slots) <= set(range(4))
    assert engine.peak_running == 4  # the budget is used, not just respected
    assert [len(t) for t in tokens] == [n for _, n in requests]
    assert all(m.calls[:2] == ["admitted", "first"] for m in marks)
    finished = [i for s in steps for i in s.finished]
    assert sorted(finished) == list(range(1, 25))  # each once
    assert not engine.waiting and not engine.running and sorted(engine.free) == [0, 1, 2, 3]


def test_a_client_that_leaves_frees_its_slot(model: TinyDecoder) -> None:
    async def main() -> list[int]:
        engine = Engine(Runner(model, slots=1))
        engine.start()
        try:
            long = engine.submit(encode("long"), 60)
            stream = engine.stream(long)
            await anext(stream)
            await stream.aclose()  # the client went away after one token
            return await asyncio.wait_for(engine.generate(encode("next"), 3), timeout=10)
        finally:
            await engine.aclose()

    assert len(asyncio.run(main())) == 3


def test_a_request_longer_than_a_slot_is_refused(model: TinyDecoder) -> None:
    engine = Engine(Runner(model, slots=1))
    engine.check(encode("x" * 90), 7)  # 90 + 7 - 1 = 96 positions: fits exactly
    with pytest.raises(ConfigError, match="exceeds the model's 96 positions"):
        engine.check(encode("x" * 90), 8)
    with pytest.raises(ConfigError):
        engine.check([], 4)


def test_each_llm_regression_changes_one_knob_and_names_its_metric() -> None:
    assert get_llm_regression("kv").knobs.slots < LLM_REGRESSIONS["decode"].knobs.slots
    assert get_llm_regression("decode").knobs.decode_extra > 0
    assert {r.metric for r in LLM_REGRESSIONS.values()} == {"ttft", "tpot"}
    with pytest.raises(ConfigError, match="choose one of: kv, decode"):
        get_llm_regression("batch")


def test_bodies_vary_prompt_and_max_tokens_within_bounds() -> None:
    rng = random.Random(0)
    bodies = [llm_payload(rng) for _ in range(500)]
    lengths = [len(b["prompt"]) for b in bodies]
    counts = [b["max_tokens"] for b in bodies]
    assert min(lengths) >= PROMPT_CHARS[0] and max(lengths) <= PROMPT_CHARS[1]
    assert min(counts) >= MAX_TOKENS[0] and max(counts) <= MAX_TOKENS[1]
    assert len(set(lengths)) > 40 and len(set(counts)) > 15


def test_llm_regressions_belong_to_llm_mode_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_regression(None, training=False, llm=True) == "kv"
    assert check_regression("decode", training=False, llm=True) == "decode"
    with pytest.raises(ConfigError, match=r"^--regression kv: .*\(that one needs --llm\)$"):
        check_regression("kv", training=False)
    with pytest.raises(ConfigError, match=r"--llm --regression batch: use one of kv, decode"):
        check_regression("batch", training=False, llm=True)
    with pytest.raises(ConfigError, match=r"\(that one needs --training\)"):
        check_regression("straggler", training=False, llm=True)
    for other in ("--training", "--capacity", "--collect"):
        assert cli.main(["demo", "--llm", other]) == 2
        err = capsys.readouterr().err
        assert "--llm runs alone" in err and err.count("\n") == 1


def test_the_result_judges_the_diff_of_the_regressions_own_metric() -> None:
    kv = get_llm_regression("kv")
    named = [
        demo.Named("e2e", cv.QUEUE, cv.WAIT),
        demo.Named("ttft", cv.QUEUE, cv.WAIT),
        demo.Named("tpot", "", "none"),
    ]
    assert demo.judge(kv, named) == (
        "queue (wait) in ttft",
        True,
        "also: queue (wait) in e2e, none in tpot",
    )
    # decode is judged on tpot, which named nothing: a miss, whatever e2e said
    assert demo.judge(get_llm_regression("decode"), named)[:2] == ("none in tpot", False)
    # a failed diff of the regression's own metric is a miss, never the e2e one instead
    found, ok, _ = demo.judge(kv, named[:1])
    assert not ok and found == "nothing (the ttft diff failed)"


def test_the_result_lines_are_the_serving_demos(capsys: pytest.CaptureFixture[str]) -> None:
    kv = get_llm_regression("kv")
    demo.print_verdict(kv, [demo.Named("ttft", cv.QUEUE, cv.WAIT)])
    out = capsys.readouterr().out
    assert "result" in out.splitlines()[0]
    text = " ".join(out.split()[out.split().index("result") + 2 :])  # as one line, unwrapped
    assert text == (
        f"injected in v2: kv — {kv.description} expected: queue (wait) in ttft "
        "tracekit diff found: queue (wait) in ttft ✓"
    )
    demo.print_verdict(kv, [demo.Named("ttft", cv.DECODE, cv.COMPUTE)])
    assert capsys.readouterr().out.splitlines()[-1] == (
        "tracekit diff found: decode (compute) in ttft ✗"
    )


# --- one real run ----------------------------------------------------------------------

ROUNDS = 12
"""Blocks per release in the test run: 6 s each, ~190 requests."""


@dataclass
class Run:
    out: str
    err: str
    workdir: Path
    pids: list[int]
    seconds: float


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    import time

    workdir = tmp_path_factory.mktemp("llm") / "out"
    out, err = io.StringIO(), io.StringIO()
    began = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        pids = record_started_pids(mp)
        mp.setattr(demo, "ROUNDS", ROUNDS)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["demo", "--llm", "--regression", "kv", "--keep", str(workdir)])
    assert code == 0, err.getvalue()[-3000:]
    yield Run(out.getvalue(), err.getvalue(), workdir, pids, time.monotonic() - began)


def _spans(path: Path) -> list[dict[str, Any]]:
    spans = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans.extend(ss["spans"])
    return spans


def _attr(span: dict[str, Any], key: str) -> Any:
    for a in span.get("attributes", []):
        if a["key"] == key:
            return next(iter(a["value"].values()))
    return None


@pytest.mark.slow
def test_every_request_is_served_and_every_process_stopped(run: Run) -> None:
    assert len(run.pids) == 2  # one llm service for v1, one for v2
    assert_all_gone(run.pids)
    served = re.findall(r"(v1|v2): (\d+)/(\d+) requests served", run.err)
    assert {label for label, _, _ in served} == {"v1", "v2"}, run.err
    assert all(ok == total and int(total) > 100 for _, ok, total in served), served
    assert (run.workdir / demo.DB_NAME).exists()


@pytest.mark.slow
def test_each_request_span_holds_queue_prefill_and_decode(run: Run) -> None:
    for label in ("v1", "v2"):
        spans = _spans(run.workdir / f"llm-{label}.jsonl")
        requests = [s for s in spans if s["kind"] in (2, "SPAN_KIND_SERVER")]
        stages: dict[str, list[str]] = {s["spanId"]: [] for s in requests}
        for s in spans:
            if s.get("parentSpanId") in stages and _attr(s, cv.STAGE):
                stages[s["parentSpanId"]].append(_attr(s, cv.STAGE))
        assert len(requests) > 100
        assert all(sorted(v) == sorted(cv.LLM_STAGES) for v in stages.values()), label
        tokens = [int(_attr(s, cv.GEN_AI_USAGE_COMPLETION_TOKENS)) for s in requests]
        assert min(tokens) >= MAX_TOKENS[0]


@pytest.mark.slow
def test_a_smaller_kv_cache_is_named_a_queue_wait(run: Run) -> None:
    from tracekit.analysis.facade import Analysis, DiffResult

    with Analysis.open(run.workdir / demo.DB_NAME) as analysis:
        e2e = analysis.diff("v1", "v2")
        assert isinstance(e2e, DiffResult)
        assert (e2e.verdict.primary_stage, e2e.verdict.kind) == (cv.QUEUE, cv.WAIT), run.out
        ttft = analysis.diff("v1", "v2", metric="ttft")
        assert isinstance(ttft, DiffResult)
        assert ttft.verdict.primary_stage == cv.QUEUE, run.out
    lines = run.out.splitlines()
    assert any(ln.startswith("injected in v2: kv — ") for ln in lines), run.out
    assert "expected: queue (wait) in ttft" in lines, run.out
    found = next(ln for ln in lines if ln.startswith("tracekit diff found: "))
    assert found.startswith("tracekit diff found: queue (wait) in ttft ✓"), run.out
    # the e2e verdict is a sentence that names the engine's queue, not a bare stage name
    text = " ".join(run.out.split())  # the renderer wraps at 80 columns
    assert "the issue is requests waiting in the engine's queue." in text, run.out


METRICS = ("e2e", "ttft", "tpot")


@pytest.mark.slow
def test_every_llm_command_speaks_the_one_vocabulary(run: Run, vocabulary) -> None:
    vocabulary.check(run.out, "tracekit demo --llm")
    db = ["--db", str(run.workdir / demo.DB_NAME)]
    commands = [["summary"], ["slow", "--version", "v2"]]
    commands += [["diff", "--before", "v1", "--after", "v2", "--metric", m] for m in METRICS]
    commands += [["gate", "--before", "v1", "--after", "v2", "--metric", "ttft"]]
    for command in commands:
        for fmt in ("table", "markdown"):
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
                assert cli.main([*command, "--format", fmt, *db]) in (0, 1, 3)
            vocabulary.check(out.getvalue(), f"tracekit {' '.join(command)} --format {fmt}")
