"""docker-compose.yml and the Dockerfile match what the demo code reads.

No Docker engine runs here, so the compose file is checked statically: every command
runs a module that exists and accepts those arguments, every environment variable is
one the code declares (and the ones it needs are set), ports and URLs line up, and
the services export to Jaeger's OTLP endpoint.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tracekit.demo import downstream, loadgen, service
from tracekit.demo import settings as st

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"

# Variables the image sets for every process, beside the ones tracekit.demo declares.
IMAGE_ENV = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONUNBUFFERED"}
PARSERS = {
    "tracekit.demo.service": service.cli_parser,
    "tracekit.demo.downstream": downstream.cli_parser,
    "tracekit.demo.loadgen": loadgen.build_parser,
}
_SUBST = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def _resolve(value: Any) -> str:
    """A compose value with ``${VAR:-default}`` replaced by its default."""
    return _SUBST.sub(lambda m: m.group(2) or "", str(value))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and "services" in data
    return data["services"]


def _env(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: _resolve(v) for k, v in env.items()}


def _demo_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose.items() if "build" in svc}


def test_jaeger_v2_with_ui_and_both_otlp_ports(compose: dict[str, Any]) -> None:
    jaeger = compose["jaeger"]
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+(\.\d+)?", jaeger["image"])
    published = {str(p).split(":")[-1] for p in jaeger["ports"]}
    assert {"16686", "4317", "4318"} <= published


def test_every_command_runs_a_demo_module_that_accepts_its_arguments(
    compose: dict[str, Any],
) -> None:
    services = _demo_services(compose)
    modules = set()
    for name, svc in services.items():
        cmd = svc["command"]
        assert cmd[:2] == ["python", "-m"], name
        module, args = cmd[2], cmd[3:]
        assert importlib.util.find_spec(module) is not None, f"{name}: no module {module}"
        assert callable(getattr(importlib.import_module(module), "main", None)), module
        PARSERS[module]().parse_args(args)  # exits (fails the test) on an unknown flag
        modules.add(module)
    assert modules == set(PARSERS)


def test_environment_names_are_the_ones_the_code_reads(compose: dict[str, Any]) -> None:
    for name, svc in _demo_services(compose).items():
        unknown = set(_env(svc)) - set(st.ENV_VARS) - IMAGE_ENV
        assert not unknown, f"{name} sets variables no demo module reads: {unknown}"


def test_servers_parse_their_settings_and_export_to_jaeger(compose: dict[str, Any]) -> None:
    for name, svc in _demo_services(compose).items():
        module = svc["command"][2]
        if module == "tracekit.demo.loadgen":
            continue
        env = _env(svc)
        settings = st.parse_settings(PARSERS[module](), svc["command"][3:], env)
        assert settings.host == "0.0.0.0", f"{name} must listen beyond the container"
        assert settings.port > 0, f"{name} needs a fixed port in compose"
        assert settings.version in ("v1", "v2")
        assert urlsplit(settings.otlp_endpoint).netloc == "jaeger:4318", name
        assert settings.trace_file == ""  # spans go to Jaeger only
        settings.knobs  # the regression name is valid  # noqa: B018


def test_ranker_calls_its_own_release_of_pricing_on_the_port_it_listens_on(
    compose: dict[str, Any],
) -> None:
    services = _demo_services(compose)
    rankers = {n: s for n, s in services.items() if s["command"][2] == "tracekit.demo.service"}
    assert len(rankers) == 2
    for svc in rankers.values():
        env = _env(svc)
        url = urlsplit(env[st.ENV_DOWNSTREAM_URL])
        target = services[url.hostname]
        assert target["command"][2] == "tracekit.demo.downstream"
        target_env = _env(target)
        assert int(target_env[st.ENV_PORT]) == url.port
        assert target_env[st.ENV_VERSION] == env[st.ENV_VERSION]
        assert target_env[st.ENV_REGRESSION] == env[st.ENV_REGRESSION]
        assert url.hostname in svc.get("depends_on", [])
        published = {str(p).rsplit(":", 1)[-1] for p in svc.get("ports", [])}
        assert env[st.ENV_PORT] in published


def test_load_generators_hit_their_ranker_over_loopback(compose: dict[str, Any]) -> None:
    services = _demo_services(compose)
    loaders = {n: s for n, s in services.items() if s["command"][2] == "tracekit.demo.loadgen"}
    assert len(loaders) == 2
    for name, svc in loaders.items():
        args = loadgen.build_parser().parse_args(svc["command"][3:])
        loadgen.require_loopback(args.url)
        ranker_name = svc["network_mode"].removeprefix("service:")
        ranker_env = _env(services[ranker_name])
        assert urlsplit(args.url).port == int(ranker_env[st.ENV_PORT]), name
        assert urlsplit(args.url).path == service.PREDICT_PATH
        assert svc["depends_on"][ranker_name]["condition"] == "service_healthy"
        assert "healthcheck" in services[ranker_name]


def test_health_checks_use_the_health_route_on_the_service_port(compose: dict[str, Any]) -> None:
    for name, svc in _demo_services(compose).items():
        check = svc.get("healthcheck")
        if not check:
            continue
        text = " ".join(check["test"])
        port = _env(svc)[st.ENV_PORT]
        assert f"127.0.0.1:{port}{st.HEALTH_PATH}" in text, name


def test_dockerfile_builds_the_demo_from_python_slim_with_cpu_torch() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert "download.pytorch.org/whl/cpu" in text
    assert '".[demo]"' in text
    for var in ("OMP_NUM_THREADS=1",):
        assert var in text
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r"^demo = ", pyproject, re.M), "the demo extra the image installs"


COLLECTOR_CONFIG = REPO / "deploy" / "otel-collector-clickhouse.yaml"


def test_the_clickhouse_profile_runs_clickhouse_and_a_contrib_collector(
    compose: dict[str, Any],
) -> None:
    clickhouse, collector = compose["clickhouse"], compose["otel-collector"]
    assert clickhouse["profiles"] == collector["profiles"] == ["clickhouse"]
    assert re.fullmatch(r"clickhouse/clickhouse-server:\d+\.\d+", clickhouse["image"])
    assert "8123:8123" in clickhouse["ports"]
    assert re.fullmatch(r"otel/opentelemetry-collector-contrib:\d+\.\d+\.\d+", collector["image"])
    mount = collector["volumes"][0].split(":")
    assert (REPO / mount[0]).resolve() == COLLECTOR_CONFIG
    assert f"--config={mount[1]}" in collector["command"]
    assert collector["depends_on"]["clickhouse"]["condition"] == "service_healthy"


def test_the_collector_writes_otel_traces_where_tracekit_reads_it(compose: dict[str, Any]) -> None:
    from tracekit.analysis.store.url import DEFAULT_TABLE, parse_store_url

    config = yaml.safe_load(COLLECTOR_CONFIG.read_text())
    exporter = config["exporters"]["clickhouse"]
    pipeline = config["service"]["pipelines"]["traces"]
    assert {"clickhouse", "otlp/jaeger"} <= set(pipeline["exporters"])
    assert pipeline["receivers"] == ["otlp"]
    assert urlsplit(exporter["endpoint"]).hostname == "clickhouse"
    assert exporter["traces_table_name"] == DEFAULT_TABLE
    assert config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    env = _env(compose["clickhouse"])
    # The URL the compose file's header tells people to pass to tracekit.
    header = COMPOSE.read_text()
    url_text = re.search(r"--store (clickhouse://\S+)", header)
    assert url_text is not None
    url = parse_store_url(url_text.group(1))
    assert (url.user, url.password, url.database, url.port) == (
        env["CLICKHOUSE_USER"],
        env["CLICKHOUSE_PASSWORD"],
        exporter["database"],
        8123,
    )
    assert (exporter["username"], exporter["password"]) == (url.user, url.password)


def test_services_export_to_jaeger_unless_pointed_at_the_collector(
    compose: dict[str, Any],
) -> None:
    for name, svc in _demo_services(compose).items():
        raw = (svc.get("environment") or {}).get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if raw is None:
            continue
        assert raw == "${TRACEKIT_OTLP_ENDPOINT:-http://jaeger:4318}", name
    assert "4318" in str(
        yaml.safe_load(COLLECTOR_CONFIG.read_text())["receivers"]["otlp"]["protocols"]["http"]
    )
