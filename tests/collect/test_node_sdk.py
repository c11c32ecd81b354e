"""`tracekit collect`'s receiver fed by the real Node.js OpenTelemetry SDK, over OTLP/HTTP
protobuf, OTLP/HTTP JSON and OTLP/gRPC, gzip-compressed and not.

Node's exporters stream their bodies (``Transfer-Encoding: chunked``, no
``Content-Length``), gzip or not, so this is the check that a receiver reads what the
most common non-Python SDK actually sends. Each case runs ``tests/collect/node/export.js``
against a collector started in-process on 127.0.0.1, then compares every stored span,
field by field, with the list of spans the SDK reports having made.

The Node modules are pinned by ``tests/collect/node/package-lock.json`` and installed
outside the tests folder, into ``.cache/node/`` at the repository root, by::

    make node-deps    # copies package.json + package-lock.json there, `npm ci --prefix .cache/node`

(``make test`` runs it first; it does nothing when ``.cache/node/.installed`` is newer
than the lock file.) ``export.js`` runs with ``NODE_PATH=.cache/node/node_modules``.
The tests skip, saying why, when ``node`` or ``npm`` is not on PATH, when the modules are
not installed, or when the installed lock file is not the repository's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tracekit.analysis.store import open_store
from tracekit.collect import Collector

REPO = Path(__file__).resolve().parents[2]
NODE_SRC = Path(__file__).resolve().parent / "node"
EXPORT_JS = NODE_SRC / "export.js"
NODE_CACHE = REPO / ".cache" / "node"
NODE_MODULES = NODE_CACHE / "node_modules"

REQUESTS = 10
"""Requests export.js makes: a SERVER root and two INTERNAL children each."""
SERVICE = "ranker-node"
VERSION = "v3.1"
EXPORT_TIMEOUT_S = 60

JS_KINDS = {0: "INTERNAL", 1: "SERVER", 2: "CLIENT", 3: "PRODUCER", 4: "CONSUMER"}
"""The JS API's SpanKind numbers (OTLP's are one more) → the store's kind."""
STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}

CASES = [
    ("proto", "gzip"),
    ("proto", "none"),
    ("json", "gzip"),
    ("json", "none"),
    ("grpc", "gzip"),
    ("grpc", "none"),
]

_SPANS = (
    "SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code,"
    " service_name, service_version, instance_id, stage, time_kind, gpu_time_ns,"
    " attributes, resource_attributes, links FROM spans"
)
_REQUESTS = (
    "SELECT trace_id, root_span_id, service_name, release, name, route, start_ns,"
    " duration_ns, is_error, span_count FROM requests ORDER BY trace_id"
)


@pytest.fixture(scope="module")
def node_env() -> dict[str, str]:
    """The environment export.js runs in; skips when Node or its modules are missing."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not on PATH: the Node.js SDK tests need both")
    installed_ok = (NODE_CACHE / ".installed").is_file()
    if not installed_ok or not (NODE_MODULES / "@opentelemetry" / "sdk-trace-node").is_dir():
        pytest.skip(
            f"the Node.js OpenTelemetry SDK is not installed in {NODE_CACHE}: make node-deps"
        )
    lock = NODE_SRC / "package-lock.json"
    installed = NODE_CACHE / "package-lock.json"
    if not installed.is_file() or installed.read_bytes() != lock.read_bytes():
        pytest.skip(f"{NODE_CACHE} holds another package-lock.json than {lock}: make node-deps")
    return {**os.environ, "NODE_PATH": str(NODE_MODULES), "NO_COLOR": "1"}


@pytest.fixture
def receiver(protocol: str, tmp_path: Path) -> Iterator[Collector]:
    """The collector in-process on free 127.0.0.1 ports (gRPC too for the gRPC cases)."""
    options: dict[str, Any] = {"port": 0, "flush_interval": 0.05}
    if protocol == "grpc":
        options["grpc_port"] = 0
    c = Collector(str(tmp_path / "live.duckdb"), **options)
    c.start()
    yield c
    c.stop()


def _export(
    env: dict[str, str], url: str, protocol: str, compression: str
) -> tuple[list[dict[str, Any]], subprocess.CompletedProcess[str]]:
    """Run export.js; the spans it made (its stdout line) and the finished process."""
    command = [
        "node",
        str(EXPORT_JS),
        *("--url", url, "--protocol", protocol, "--compression", compression),
        *("--spans", str(REQUESTS), "--service", SERVICE, "--version", VERSION),
    ]
    try:
        done = subprocess.run(
            command,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=EXPORT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"export.js did not finish in {EXPORT_TIMEOUT_S} s; stderr:\n{exc.stderr}")
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    if len(lines) != 1:
        pytest.fail(
            f"export.js (exit {done.returncode}) printed {len(lines)} lines, not one JSON line;"
            f"\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
        )
    return json.loads(lines[0]), done


def _check_sent(sent: list[dict[str, Any]]) -> None:
    """What export.js made is the scenario this test is about."""
    assert len(sent) == 3 * REQUESTS
    roots = [s for s in sent if not s["parentSpanId"]]
    assert len(roots) == REQUESTS
    assert {JS_KINDS[s["kind"]] for s in roots} == {"SERVER"}
    assert sorted(s["name"] for s in sent if s["parentSpanId"]) == sorted(
        ["feature_retrieval", "model_execute"] * REQUESTS
    )
    assert sum(len(s["links"]) for s in sent) == 1
    assert sum(len(s["events"]) for s in sent) == 1
    assert [STATUS_CODES[s["status"]["code"]] for s in sent].count("ERROR") == 1
    assert all(int(s["endTimeUnixNano"]) > int(s["startTimeUnixNano"]) for s in sent)


def _receiver_counts(c: Collector) -> str:
    """What the receiver says it saw, for a failure message (if its status has the fields)."""
    try:
        s = c.status()
        return (
            f"; the receiver counted {s.spans_received} received, {s.spans_rejected} "
            f"rejected, errors {s.errors}"
        )
    except AttributeError:
        return ""


def _expected_row(span: dict[str, Any]) -> dict[str, Any]:
    """The store's row for one span as the Node SDK saw it."""
    attrs = span["attributes"]
    resource = span["resource"]
    return {
        "parent_span_id": span["parentSpanId"] or None,
        "name": span["name"],
        "kind": JS_KINDS[span["kind"]],
        "start_ns": int(span["startTimeUnixNano"]),
        "end_ns": int(span["endTimeUnixNano"]),
        "status_code": STATUS_CODES[span["status"]["code"]],
        "service_name": resource["service.name"],
        "service_version": resource["service.version"],
        "instance_id": resource["service.instance.id"],
        "stage": attrs.get("tracekit.stage"),
        "time_kind": attrs.get("tracekit.time_kind"),
        "gpu_time_ns": attrs.get("tracekit.gpu_time_ns"),
        "attributes": attrs,
        "resource_attributes": resource,
        "links": [
            {"trace_id": ln["traceId"], "span_id": ln["spanId"], "attributes": ln["attributes"]}
            for ln in span["links"]
        ],
    }


def _stored_rows(db: Path) -> tuple[dict[tuple[str, str], dict[str, Any]], list[Any]]:
    with open_store(db, read_only=True) as store:
        spans = store.run(_SPANS)
        requests = store.run(_REQUESTS)
    rows = {}
    for r in spans:
        rows[(r[0], r[1])] = {
            "parent_span_id": r[2],
            "name": r[3],
            "kind": r[4],
            "start_ns": r[5],
            "end_ns": r[6],
            "status_code": r[7],
            "service_name": r[8],
            "service_version": r[9],
            "instance_id": r[10],
            "stage": r[11],
            "time_kind": r[12],
            "gpu_time_ns": r[13],
            "attributes": json.loads(r[14]) if r[14] is not None else None,
            "resource_attributes": json.loads(r[15]) if r[15] is not None else None,
            "links": json.loads(r[16]) if r[16] is not None else None,
        }
    return rows, requests


@pytest.mark.parametrize(("protocol", "compression"), CASES)
def test_node_sdk_spans_are_stored_as_the_sdk_made_them(
    protocol: str,
    compression: str,
    node_env: dict[str, str],
    receiver: Collector,
    tmp_path: Path,
) -> None:
    if protocol == "grpc":
        url = f"http://{receiver.grpc_address}"
    else:
        url = f"http://{receiver.address}/v1/traces"
    sent, done = _export(node_env, url, protocol, compression)
    _check_sent(sent)
    receiver.stop()
    stored, requests = _stored_rows(tmp_path / "live.duckdb")

    n_sent, n_stored = len(sent), len(stored)
    node_said = f"; export.js exited {done.returncode}:\n{done.stderr}" if done.returncode else ""
    assert n_stored == n_sent, (
        f"Node sent {n_sent} spans ({protocol}, {compression}), the store has {n_stored}"
        f"{_receiver_counts(receiver)}{node_said}"
    )
    assert done.returncode == 0, f"export.js exited {done.returncode}:\n{done.stderr}"

    expected = {(s["traceId"], s["spanId"]): _expected_row(s) for s in sent}
    assert stored.keys() == expected.keys()
    for key, want in expected.items():
        assert stored[key] == want, f"span {key} ({want['name']}) is stored otherwise"

    roots = {(s["traceId"], s["spanId"]): s for s in sent if not s["parentSpanId"]}
    assert len(requests) == REQUESTS, f"{REQUESTS} SERVER roots, {len(requests)} requests"
    for trace_id, root_id, service, release, name, route, start, duration, err, n in requests:
        root = roots[(trace_id, root_id)]
        assert (service, release, name, route) == (SERVICE, VERSION, "POST /predict", "/predict")
        assert start == int(root["startTimeUnixNano"])
        assert duration == int(root["endTimeUnixNano"]) - int(root["startTimeUnixNano"])
        assert err == (root["status"]["code"] == 2)
        assert n == 3
