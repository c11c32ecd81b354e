"""The resource sampler: the CPU divisor (cgroup quota, stated request) and its windows."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

import tracekit
from tracekit.errors import ConfigError
from tracekit.instrumentation import sampler
from tracekit.instrumentation.sampler import (
    ResourceSampler,
    cgroup_cpu_limit,
    cpu_capacity,
    cpu_request,
    parse_cpu_max,
    parse_cpu_quantity,
)


@pytest.fixture(autouse=True)
def no_running_sampler(monkeypatch):
    monkeypatch.delenv(sampler.ENV_CPU_REQUEST, raising=False)
    sampler.stop()
    yield
    sampler.stop()


@pytest.mark.parametrize(
    "text, cores",
    [
        ("max 100000\n", None),
        ("max", None),
        ("50000 100000\n", 0.5),
        ("150000 100000", 1.5),
        ("200000 50000", 4.0),
    ],
)
def test_cgroup_v2_cpu_max_gives_quota_over_period(text, cores):
    assert parse_cpu_max(text) == cores


def test_cgroup_v2_file_is_read_from_the_root(tmp_path):
    (tmp_path / "cpu.max").write_text("25000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 0.25


@pytest.mark.parametrize("controller", ["cpu", "cpu,cpuacct"])
def test_cgroup_v1_quota_and_period(tmp_path, controller):
    d = tmp_path / controller
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("150000\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5


def test_cgroup_v1_without_quota_and_no_cgroup_at_all_mean_no_limit(tmp_path):
    assert cgroup_cpu_limit(tmp_path) is None
    d = tmp_path / "cpu"
    d.mkdir()
    (d / "cpu.cfs_quota_us").write_text("-1\n")
    (d / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_unreadable_cgroup_file_means_no_limit(tmp_path):
    (tmp_path / "cpu.max").write_text("garbage here\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_capacity_is_the_smaller_of_affinity_and_quota(tmp_path):
    unlimited = cpu_capacity(tmp_path)
    assert unlimited >= 1
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert cpu_capacity(tmp_path) == 0.5
    (tmp_path / "cpu.max").write_text(f"{int(unlimited * 2 * 100000)} 100000\n")
    assert cpu_capacity(tmp_path) == unlimited


@pytest.mark.parametrize(
    "text, cores", [("0.5", 0.5), ("500m", 0.5), ("2", 2.0), (" 250m\n", 0.25), ("1500m", 1.5)]
)
def test_cpu_quantity_in_cores_or_millicores(text, cores):
    assert parse_cpu_quantity(text) == cores


@pytest.mark.parametrize("text", ["", "abc", "0", "-1", "m", "5x", "inf", "nan"])
def test_bad_cpu_quantity_names_the_variable(text):
    with pytest.raises(ConfigError, match="TRACEKIT_CPU_REQUEST"):
        parse_cpu_quantity(text)


def test_stated_request_argument_beats_the_variable(monkeypatch):
    assert cpu_request() is None
    monkeypatch.setenv("TRACEKIT_CPU_REQUEST", "500m")
    assert cpu_request() == 0.5
    assert cpu_request("2") == 2.0
    assert cpu_request(0.25) == 0.25
    with pytest.raises(ConfigError, match="cpu_request"):
        cpu_request(0)


class FakeClocks:
    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def advance(self, wall_s: float, cpu_s: float) -> None:
        self.wall += wall_s
        self.cpu += cpu_s


def _sampler(clocks: FakeClocks, **kwargs) -> ResourceSampler:
    return ResourceSampler(wall=lambda: clocks.wall, cpu_clock=lambda: clocks.cpu, **kwargs)


def test_without_a_request_utilisation_is_of_the_capacity():
    clocks = FakeClocks()
    s = _sampler(clocks, cores=2.0)
    clocks.advance(1.0, 0.5)
    s.sample()
    assert s.cpu == 0.25
    clocks.advance(1.0, 3.0)  # more than the capacity (noise): capped at 1
    s.sample()
    assert s.cpu == 1.0


def test_with_a_request_utilisation_is_of_the_request_as_an_hpa_computes_it():
    clocks = FakeClocks()
    s = _sampler(clocks, cores=4.0, request=0.5)
    clocks.advance(1.0, 0.25)
    s.sample()
    assert s.cpu == 0.5
    clocks.advance(1.0, 1.0)  # bursting above the request: 200%, as the HPA says
    s.sample()
    assert s.cpu == 2.0
    clocks.advance(1.0, 10.0)  # never more than the capacity allows
    s.sample()
    assert s.cpu == 8.0


def test_instrument_fastapi_states_the_request_and_checks_it(monkeypatch):
    monkeypatch.setenv("TRACEKIT_CPU_REQUEST", "2")
    tracekit.instrument_fastapi(FastAPI(), cpu_request="500m")
    running = sampler.current()
    assert running is not None and running.request == 0.5
    with pytest.raises(ConfigError, match="cpu_request"):
        tracekit.instrument_fastapi(FastAPI(), cpu_request="half")


def test_the_variable_states_the_request_when_no_argument_does(monkeypatch):
    monkeypatch.setenv("TRACEKIT_CPU_REQUEST", "250m")
    tracekit.instrument_fastapi(FastAPI())
    running = sampler.current()
    assert running is not None and running.request == 0.25


def test_a_started_sampler_has_a_reading_before_its_first_window_closes():
    """Issue 9: the first requests after start-up carried no tracekit.cpu.utilization."""
    s = ResourceSampler(interval_s=60.0)  # no window closes during this test
    try:
        s.start()
        assert s.cpu is not None and 0.0 <= s.cpu <= 1.0
    finally:
        s.stop()


def test_fake_clocks_get_no_first_reading_until_a_window_closes():
    clocks = FakeClocks()
    s = _sampler(clocks, cores=1.0)
    s.first_reading()
    assert s.cpu is None  # the start-up window is measured on the real clocks only
