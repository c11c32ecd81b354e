"""LLM signals in the autoscale audit: requests waiting and running in the engine, from
the traced queue/prefill/decode stages, ranked beside in-flight and CPU, and the KEDA/HPA
snippets naming vLLM's gauges.

One replica, one engine slot, FIFO: each request waits for the one before it to finish,
so at each arrival the requests queued in front are known exactly. Quiet minutes keep
the queue empty; bursts fill it and break the objective.
"""

from __future__ import annotations

import numpy as np
import pytest

from tracekit import conventions as cv
from tracekit.analysis.autoscale import metric_queries as mq
from tracekit.analysis.autoscale import rules as sr
from tracekit.analysis.autoscale.audit import audit_autoscaling, llm_load_at_arrival
from tracekit.analysis.autoscale.model import parse_slo
from tracekit.analysis.cohorts.release import load_release
from tracekit.analysis.facade import Analysis
from tracekit.analysis.store import open_store
from tracekit.testing import TraceBuilder

SERVICE_MS = 80.0  # prefill 20 + decode 60 per request, one at a time


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory):
    b = TraceBuilder(seed=4)
    rng = np.random.default_rng(4)
    t, free, expected = 0.0, 0.0, []
    for minute in range(12):
        rate = 30.0 if minute in (4, 5, 9) else 5.0  # per second; the slot serves 12.5/s
        end = (minute + 1) * 10_000.0
        while True:
            t += rng.exponential(1000.0 / rate)
            if t >= end:
                t = end
                break
            start = max(t, free)
            queue = start - t
            free = start + SERVICE_MS
            expected.append((t, start))
            r = b.request(start_ms=t, duration_ms=queue + SERVICE_MS + 1.0, version="llm")
            r.stage(cv.QUEUE, start_ms=0.0, duration_ms=queue)
            r.stage(cv.PREFILL, start_ms=queue, duration_ms=20.0)
            r.stage(cv.DECODE, start_ms=queue + 20.0, duration_ms=60.0)
    path = tmp_path_factory.mktemp("llm") / "t.duckdb"
    with open_store(path) as store:
        b.load(store)
    return path, expected


def test_waiting_at_arrival_counts_the_requests_queued_in_front(db) -> None:
    path, expected = db
    with open_store(path, read_only=True) as store:
        data = load_release(store, "llm")
    waiting, running = llm_load_at_arrival(data)
    want = [sum(1 for a, s in expected[:i] if a <= t < s) for i, (t, _) in enumerate(expected)]
    assert waiting.tolist() == pytest.approx(want, abs=1e-9)
    # One slot: at most one request runs when another arrives.
    assert set(np.unique(running)) <= {0.0, 1.0}


def test_the_audit_ranks_waiting_requests_and_names_vllms_gauge(db) -> None:
    path, _ = db
    with open_store(path, read_only=True) as store:
        result = audit_autoscaling(store, release="llm", slo=parse_slo("p95<500ms"), window_s=10)
    names = [s.name for s in result.signals]
    waiting = next(s for s in result.signals if s.name == sr.LLM_WAITING)
    assert waiting.available and waiting.separation > 0.9 and waiting.correlation > 0.7
    assert names.index(sr.LLM_WAITING) < names.index(sr.CPU_UTILIZATION)
    assert result.violating_windows >= 2
    snippet = mq.keda_snippet(sr.LLM_WAITING, 4.0, result.rule)
    assert "sum(vllm:num_requests_waiting" in snippet
    assert 'as: "vllm_num_requests_waiting"' in mq.adapter_rule(sr.LLM_WAITING)


def test_waiting_is_a_signal_people_can_name(db) -> None:
    path, _ = db
    with Analysis.open(path) as a:
        r = a.autoscale("llm", slo="p95<500ms", signal="vllm:num_requests_waiting", target="4")
    assert r.rule.metrics[0].signal == sr.LLM_WAITING


def test_services_without_llm_stages_list_no_llm_signals(tmp_path) -> None:
    b = TraceBuilder(seed=1)
    for i in range(200):
        b.request(start_ms=i * 100.0, duration_ms=20.0, version="plain")
    path = tmp_path / "p.duckdb"
    with open_store(path) as store:
        b.load(store)
    with open_store(path, read_only=True) as store:
        result = audit_autoscaling(store, release="plain", slo=parse_slo("p95<50ms"), window_s=2)
    assert not {s.name for s in result.signals} & sr.LLM_SIGNALS


def test_vllm_metric_names_map_to_their_signals_and_kv_cache_to_none() -> None:
    from tracekit.analysis.autoscale.rule_files import signal_for_name

    assert signal_for_name("vllm:num_requests_waiting") == sr.LLM_WAITING
    assert signal_for_name("vllm:num_requests_running") == sr.LLM_RUNNING
    # KV-cache use is not GPU utilisation: read, never replayed against the GPU signal.
    assert signal_for_name("vllm:gpu_cache_usage_perc") is None
    assert signal_for_name("vllm:kv_cache_usage_perc") is None
    assert signal_for_name("DCGM_FI_DEV_GPU_UTIL") == sr.GPU_UTILIZATION
