"""train_steps() and communication(): one trace per step, data_wait inside, nothing extra."""

from __future__ import annotations

import time

from tests.training.conftest import finished

import tracekit
from tracekit import conventions as cv
from tracekit.instrumentation.training import communication, job_identity, train_steps


def _loader(n: int, wait_s: float = 0.0):
    for i in range(n):
        time.sleep(wait_s)
        yield [i] * 4


def test_each_item_is_a_step_with_data_wait_and_the_users_stages(spans):
    for batch in train_steps(_loader(3, 0.002), samples=lambda b: len(b), start=10):
        with tracekit.stage(cv.FORWARD):
            pass
        with tracekit.stage(cv.BACKWARD):
            with communication("all_reduce", bytes=1024):
                pass
    got = finished(spans)
    steps = sorted((s for s in got if s.name == cv.STEP_SPAN_NAME), key=lambda s: s.start_time)
    assert [s.attributes[cv.STEP] for s in steps] == [10, 11, 12]
    assert all(s.attributes[cv.STEP_SAMPLES] == 4 for s in steps)
    assert all(s.parent is None for s in steps)
    assert len({s.context.trace_id for s in steps}) == 3
    for step in steps:
        mine = [s for s in got if s.context.trace_id == step.context.trace_id]
        by = {s.attributes.get(cv.STAGE): s for s in mine if s is not step}
        assert set(by) == {cv.DATA_WAIT, cv.FORWARD, cv.BACKWARD, cv.COMMUNICATION}
        wait = by[cv.DATA_WAIT]
        assert wait.parent.span_id == step.context.span_id
        assert wait.start_time == step.start_time and wait.end_time - wait.start_time >= 2e6
        assert by[cv.COMMUNICATION].parent.span_id == by[cv.BACKWARD].context.span_id
    seqs = sorted(s.attributes[cv.COMM_SEQ] for s in got if s.name.startswith(cv.COMM_SPAN_NAME))
    assert seqs == [0, 1, 2]
    # consecutive steps touch: the next fetch starts as the previous step ends
    assert steps[0].end_time == steps[1].start_time


def test_exhausted_fetch_and_empty_loader_export_nothing(spans):
    for _ in train_steps([]):
        raise AssertionError("no items")
    assert finished(spans) == []


def test_break_ends_the_step(spans):
    for i, _ in enumerate(train_steps(_loader(5))):
        if i == 1:
            break
    steps = [s for s in finished(spans) if s.name == cv.STEP_SPAN_NAME]
    assert len(steps) == 2


def test_an_error_in_the_body_propagates_and_the_step_still_ends(spans):
    try:
        for _ in train_steps(_loader(3)):
            raise KeyError("boom")
    except KeyError:
        pass
    assert len([s for s in finished(spans) if s.name == cv.STEP_SPAN_NAME]) == 1


def test_rank_comes_from_the_environment_without_a_process_group(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    ident = job_identity()
    assert (ident.rank, ident.world_size, ident.local_rank) == (3, 8, 1)
