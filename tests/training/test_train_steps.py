"""train_steps() and communication(): one trace per step, data_wait inside, nothing extra."""

from __future__ import annotations

import time

import tracekit
from tests.training.conftest import finished
from tracekit import conventions as cv
from tracekit.instrumentation.training import communication, job_identity, train_steps


def _loader(n: int, wait_s: float = 0.0):
    for i in range(n):
        time.sleep(wait_s)
        yield [i] * 4


def test_each_item_is_a_step_with_data_wait_and_the_users_stages(spans):
    for _batch in train_steps(_loader(3, 0.002), samples=lambda b: len(b), start=10):
        with tracekit.stage(cv.FORWARD):
            pass
        with tracekit.stage(cv.BACKWARD), communication("all_reduce", bytes=1024):
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


def test_configure_puts_the_job_identity_on_the_resource(monkeypatch):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    exporter = InMemorySpanExporter()
    tracekit.configure(service_name="trainer", service_version="t1", exporter=exporter)
    try:
        for _ in train_steps(_loader(1)):
            pass
        (step,) = finished(exporter)[-1:]
    finally:
        tracekit.shutdown()
    res = step.resource.attributes
    assert (res[cv.RANK], res[cv.WORLD_SIZE], res[cv.LOCAL_RANK]) == (5, 8, 1)


def test_a_process_outside_a_job_gets_no_rank_on_its_resource(monkeypatch):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    exporter = InMemorySpanExporter()
    tracekit.configure(service_name="ranker", service_version="v1", exporter=exporter)
    try:
        with tracekit.stage(cv.PREPROCESS):
            pass
        spans = finished(exporter)
    finally:
        tracekit.shutdown()
    assert spans and cv.RANK not in spans[0].resource.attributes
