"""The load generator is open loop: a stall shows up in many samples, not one."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import pytest
from fastapi import FastAPI

from tracekit.demo.loadgen import (
    arrival_offsets,
    block_plan,
    ranker_payload,
    require_loopback,
    run_blocks,
    run_load,
)
from tracekit.errors import ConfigError

RATE = 100.0
STALL_S = 0.4


def _stalling_app(stall_after: int) -> FastAPI:
    """Serves one request at a time; the ``stall_after``-th holds the line for STALL_S."""
    app = FastAPI()
    lock = asyncio.Lock()
    seen = {"n": 0}

    @app.post("/work")
    async def work(body: dict[str, Any]) -> dict[str, int]:
        async with lock:
            seen["n"] += 1
            if seen["n"] == stall_after:
                await asyncio.sleep(STALL_S)
            return {"n": seen["n"]}

    return app


def test_arrivals_are_poisson_at_the_rate_and_repeat_with_the_seed() -> None:
    offsets = arrival_offsets(200.0, 20.0, seed=3)
    assert offsets == arrival_offsets(200.0, 20.0, seed=3)
    assert offsets != arrival_offsets(200.0, 20.0, seed=4)
    assert abs(len(offsets) - 4000) < 4 * 4000**0.5  # Poisson count: within 4 sigma
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    # exponential gaps: mean = sd = 1/rate
    assert statistics.mean(gaps) == pytest.approx(1 / 200.0, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(1 / 200.0, rel=0.1)
    assert all(0 < o < 20.0 for o in offsets)
    assert len(arrival_offsets(200.0, 20.0, seed=3, limit=50)) == 50


def test_bodies_are_mostly_hot_users_with_a_full_slate() -> None:
    rng = random.Random(0)
    bodies = [ranker_payload(rng) for _ in range(2000)]
    from tracekit.demo.features import CANDIDATES, HOT_USERS

    assert all(len(b["items"]) == CANDIDATES for b in bodies)
    cold = sum(b["user_id"] >= HOT_USERS for b in bodies)
    assert 0 < cold < 40


def test_only_loopback_targets_are_accepted() -> None:
    require_loopback("http://127.0.0.1:8000/predict")
    require_loopback("http://localhost:8000/predict")
    with pytest.raises(ConfigError, match="loopback"):
        require_loopback("http://192.0.2.10:8000/predict")
    with pytest.raises(ConfigError):
        asyncio.run(run_load("http://192.0.2.10:8000/", rate=1, duration_s=1))


def test_a_server_stall_is_charged_to_every_request_scheduled_during_it(thread_server) -> None:
    # 100/s for 1.5 s; the 40th request holds the server for 400 ms. Everything scheduled
    # in that window queues behind it. Measured from the scheduled send time, ~40
    # requests see a long latency; a closed-loop client would have recorded one.
    with thread_server(_stalling_app(stall_after=40)) as server:
        result = asyncio.run(
            run_load(
                server.url + "/work",
                rate=RATE,
                duration_s=1.5,
                seed=1,
                payload=lambda rng: {"x": rng.random()},
            )
        )
    assert result.failed == 0 and result.completed == result.scheduled
    slow = [ms for ms in result.latencies_ms if ms > STALL_S * 1000 / 2]
    # Requests arriving in the stall's first half wait more than half of it.
    assert len(slow) >= 12, sorted(result.latencies_ms)[-20:]
    assert max(result.latencies_ms) >= STALL_S * 1000 * 0.9


def test_a_client_side_stall_counts_against_latency_too(thread_server) -> None:
    # The load generator's own event loop freezes for 300 ms: sends go out late, and the
    # lateness is inside the latency (as it would be for a user), not silently dropped.
    app = FastAPI()

    @app.post("/fast")
    async def fast(body: dict[str, Any]) -> dict[str, bool]:
        return {"ok": True}

    async def drive(url: str) -> Any:
        loop = asyncio.get_running_loop()
        loop.call_later(0.5, time.sleep, 0.3)
        return await run_load(url, rate=RATE, duration_s=1.5, seed=2, payload=lambda rng: {"x": 1})

    with thread_server(app) as server:
        result = asyncio.run(drive(server.url + "/fast"))
    assert result.failed == 0
    assert max(result.send_lag_ms) >= 250
    assert max(result.latencies_ms) >= 250
    # Every late send's latency includes its lag.
    late = [lag for lag in result.send_lag_ms if lag > 100]
    assert len(late) >= 10
    assert sum(ms > 100 for ms in result.latencies_ms) >= len(late)


def test_blocks_take_turns_with_equal_inputs_for_every_target() -> None:
    plan = block_plan(3, rate=50.0, duration_s=2.0, block_s=0.25, seed=5)
    assert len(plan) == 3 * 8
    rounds = [plan[i : i + 3] for i in range(0, len(plan), 3)]
    for r, blocks in enumerate(rounds):
        assert sorted(b.target for b in blocks) == [0, 1, 2]  # one block each per round
        assert {b.round for b in blocks} == {r}
        assert len({(b.offsets, b.seed) for b in blocks}) == 1  # the same arrivals and bodies
        assert all(0 <= o < 0.25 for b in blocks for o in b.offsets)
    # Orders vary from round to round: no target is always first.
    assert len({blocks[0].target for blocks in rounds}) > 1
    assert plan == block_plan(3, rate=50.0, duration_s=2.0, block_s=0.25, seed=5)


def test_aligned_blocks_keep_clear_of_their_slot_edges() -> None:
    plan = block_plan(2, rate=50.0, duration_s=6.0, block_s=1.5, seed=1, align_s=0.05)
    assert plan[0].offsets[0] == 0.0  # the time line starts with the first block
    for block in plan[1:]:
        assert block.offsets[0] == pytest.approx(0.05)
        assert max(block.offsets) < 1.5 - 0.05


def test_only_the_target_under_load_runs(thread_server) -> None:
    # Two real servers; the switch log shows each one thawed for its blocks and frozen
    # once its block's requests ended and the other's turn had come.
    app = FastAPI()

    @app.post("/work")
    async def work(body: dict[str, Any]) -> dict[str, bool]:
        return {"ok": True}

    events: list[tuple[str, int]] = []
    running: set[int] = set()

    def pause(i: int) -> None:
        events.append(("pause", i))
        running.discard(i)

    def resume(i: int) -> None:
        events.append(("resume", i))
        running.add(i)

    plan = block_plan(2, rate=RATE, duration_s=0.6, block_s=0.1, seed=3)
    with thread_server(app) as a, thread_server(app) as b:
        results = asyncio.run(
            run_blocks(
                [a.url + "/work", b.url + "/work"],
                plan,
                block_s=0.1,
                pause=pause,
                resume=resume,
                payload=lambda rng: {"x": 1},
            )
        )
    assert [r.completed for r in results] == [r.scheduled for r in results]
    assert results[0].scheduled == results[1].scheduled > 0
    assert running == {0, 1}  # handed back thawed: the caller stops them next
    for target in (0, 1):
        # Thawed and frozen in turn, never twice in a row; thawed at most once per block.
        mine = [kind for kind, i in events if i == target]
        assert mine == ["resume", "pause"] * (len(mine) // 2) + ["resume"]
        assert 1 <= len(mine) // 2 + 1 <= sum(b.target == target for b in plan) + 1
