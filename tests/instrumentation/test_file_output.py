"""The file exporter's output for one full request is what it was before the fast recorder.

``data/request_spans.json`` was captured from the span-per-stage implementation (every
stage an OTel SDK span on the request path) before stages were recorded into buffers
and built later. Ids and times differ from run to run, so both sides are put in a
canonical form first: each span is named by its path of span names from its trace's
root, parents, links and traces by those paths, and values that vary by run (times,
ports, CPU readings, batch ids, stack traces) by their type. Everything else — names,
kinds, attributes, parents, links, status, events, flags, scopes, resource keys — must
be equal.

Regenerate (only when the span contract changes on purpose)::

    .venv/bin/python tests/instrumentation/test_file_output.py
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException
from opentelemetry import trace

import tracekit
from tracekit import conventions as cv

FIXTURE = Path(__file__).parent / "data" / "request_spans.json"

# Values that differ between runs of the same request: compared by type only.
VOLATILE = {
    cv.CPU_TIME_NS,
    cv.GPU_TIME_NS,
    cv.QUEUE_FILL_WAIT_NS,
    cv.QUEUE_WORKER_WAIT_NS,
    cv.BATCH_ID,
    cv.CPU_UTILIZATION,
    cv.URL_FULL,
    cv.SERVER_PORT,
    cv.SERVICE_INSTANCE_ID,
    cv.HOST_NAME,
    "client.address",
    "client.port",
    "network.peer.address",
    "network.peer.port",
    "exception.stacktrace",
    "telemetry.sdk.version",
    "user_agent.original",
}


def _apps() -> tuple[FastAPI, FastAPI, list[str]]:
    downstream: list[str] = []
    scorer = FastAPI()

    @scorer.get("/score/{rid}")
    async def score(rid: int) -> dict[str, int]:
        with tracekit.stage("score"):
            await asyncio.sleep(0)
        return {"rid": rid}

    ranker = FastAPI()

    def run_batch(items: list[int]) -> list[int]:
        with tracekit.model_execution():
            return [x * 10 for x in items]

    batcher = tracekit.DynamicBatcher(run_batch, max_batch_size=4, max_wait_ms=1.0)
    state: dict[str, httpx.AsyncClient] = {}

    @tracekit.stage(cv.FEATURE_RETRIEVAL, **{cv.CACHE_HIT: False})
    async def fetch(rid: int) -> list[int]:
        await asyncio.sleep(0.001)
        return [rid]

    @tracekit.stage("tokenize")
    def tokenize(x: int) -> int:
        # someone else's OTel span inside a stage
        with trace.get_tracer("user.code").start_as_current_span("user-span") as span:
            span.set_attribute("user.answer", 42)
        return x

    @ranker.get("/predict/{rid}")
    async def predict(rid: int) -> dict[str, int]:
        features = await fetch(rid)
        with tracekit.stage(cv.PREPROCESS) as span:
            span.set_attribute("test.rid", rid)
            span.add_event("features", {"count": len(features)})
            x = tokenize(features[0])
        y = await batcher.submit(x)
        async with tracekit.stage(cv.POSTPROCESS):
            out = {"rid": rid, "y": y}
        if "c" not in state:
            state["c"] = tracekit.instrument_httpx(
                httpx.AsyncClient(base_url=downstream[0], timeout=10)
            )
        r = await state["c"].get(f"/score/{rid}")
        r.raise_for_status()
        return out

    @ranker.get("/fails")
    async def fails() -> None:
        with tracekit.stage(cv.PREPROCESS):
            raise HTTPException(status_code=503, detail="model not loaded")

    tracekit.instrument_fastapi(scorer)
    tracekit.instrument_fastapi(ranker)
    return ranker, scorer, downstream


def produce(path: Path) -> None:
    """Serve the request (and a failing one, and work outside requests) into ``path``."""
    from tests.instrumentation.conftest import serve

    tracekit.configure(service_name="golden", service_version="v1", exporter="file", path=path)
    try:
        ranker, scorer, downstream = _apps()
        with serve(scorer) as scorer_url, serve(ranker) as ranker_url:
            downstream.append(scorer_url)
            with httpx.Client(timeout=10) as client:
                assert client.get(f"{ranker_url}/predict/7").json() == {"rid": 7, "y": 70}
                assert client.get(f"{ranker_url}/fails").status_code == 503
        # outside any request: a stage as a root, inside a user span, and failing
        with (
            trace.get_tracer("user.code").start_as_current_span("user-root"),
            tracekit.stage("inside-user-span"),
        ):
            pass
        try:
            with tracekit.stage("root-stage", time_kind=cv.WAIT):
                raise ValueError("bad input")
        except ValueError:
            pass
    finally:
        tracekit.shutdown()


def _value(key: str, value: dict[str, Any]) -> Any:
    if key in VOLATILE:
        return f"<{next(iter(value))}>"
    if key == cv.SERVER_ADDRESS and ":" in value.get("stringValue", ""):
        return {"stringValue": value["stringValue"].rsplit(":", 1)[0] + ":<port>"}
    return value


def _attrs(items: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {a["key"]: _value(a["key"], a["value"]) for a in items or []}


def canonical(path: Path) -> list[dict[str, Any]]:
    """The spans in ``path`` with ids, times and run-dependent values taken out."""
    spans: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            resource = _attrs(rs["resource"].get("attributes"))
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    spans.append({**s, "_scope": ss["scope"], "_resource": resource})
    by_id = {s["spanId"]: s for s in spans}

    def path_of(s: dict[str, Any]) -> str:
        parent = by_id.get(s["parentSpanId"])
        return (path_of(parent) + " > " if parent else "") + s["name"]

    labels: dict[str, str] = {}
    seen: dict[str, int] = defaultdict(int)
    for s in sorted(spans, key=lambda s: int(s["startTimeUnixNano"])):
        p = path_of(s)
        seen[p] += 1
        labels[s["spanId"]] = p if seen[p] == 1 else f"{p} #{seen[p]}"
    roots = {s["traceId"]: labels[s["spanId"]] for s in spans if not s["parentSpanId"]}
    out = []
    for s in spans:
        out.append(
            {
                "span": labels[s["spanId"]],
                "trace": roots.get(s["traceId"], "<no root>"),
                "parent": labels.get(s["parentSpanId"], s["parentSpanId"] and "<remote>"),
                "name": s["name"],
                "kind": s["kind"],
                "flags": s["flags"],
                "scope": s["_scope"],
                "resource": s["_resource"],
                "attributes": _attrs(s.get("attributes")),
                "events": [
                    {"name": e["name"], "attributes": _attrs(e.get("attributes"))}
                    for e in s.get("events", [])
                ],
                "links": [
                    {"span": labels.get(lk["spanId"], "<unknown>"), "flags": lk["flags"]}
                    for lk in s.get("links", [])
                ],
                "status": s["status"],
                "ends_after_start": int(s["endTimeUnixNano"]) >= int(s["startTimeUnixNano"]),
            }
        )
    return sorted(out, key=lambda s: s["span"])


def _added_on_purpose(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fixture plus what issue 9 adds: nothing else may differ.

    Every request span carries ``tracekit.cpu.utilization`` (the sampler takes a first
    reading when it starts), and every ``model_execute`` span a batch writes says how
    device time was taken (``tracekit.gpu.sync``: ``none`` on this CPU-only machine),
    as does the ``tracekit.batch`` span beside them.
    """
    for s in spans:
        attrs = s["attributes"]
        if s["kind"] == 2:  # SERVER
            attrs.setdefault(cv.CPU_UTILIZATION, "<doubleValue>")
        if cv.BATCH_ID in attrs and s["name"] in (cv.MODEL_EXECUTE, cv.BATCH_SPAN_NAME):
            attrs.setdefault(cv.GPU_SYNC, {"stringValue": cv.SYNC_NONE})
    return spans


def test_file_output_for_a_request_is_unchanged_apart_from_ids_and_times(tmp_path):
    path = tmp_path / "traces.jsonl"
    produce(path)
    got = canonical(path)
    want = _added_on_purpose(json.loads(FIXTURE.read_text()))
    assert [s["span"] for s in got] == [s["span"] for s in want]
    for g, w in zip(got, want, strict=True):
        assert g == w, g["span"]


if __name__ == "__main__":
    import os
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    os.environ.setdefault("TRACEKIT_STRICT", "1")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "traces.jsonl"
        produce(out)
        FIXTURE.parent.mkdir(exist_ok=True)
        FIXTURE.write_text(json.dumps(canonical(out), indent=1, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
