"""Helpers the collect tests share: posting bodies, building two releases, splitting."""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tracekit import conventions as cv
from tracekit.collect import Collector
from tracekit.testing import TraceBuilder


def url(c: Collector) -> str:
    return f"http://{c.address}/v1/traces"


def post_json(c: Collector, doc: dict[str, Any], *, gz: bool = False) -> httpx.Response:
    body = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if gz:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return httpx.post(url(c), content=body, headers=headers, timeout=30)


def releases(n: int, *, seed: int = 7, slow_from: float = 0.9) -> TraceBuilder:
    """``n`` requests in v1 and in v2, where v2's downstream tail grew (deterministic)."""
    rng = random.Random(seed)
    b = TraceBuilder(service="ranker", version="v1", seed=seed)
    for version in ("v1", "v2"):
        for i in range(n):
            fr = rng.lognormvariate(2.0, 0.3)
            model = rng.lognormvariate(2.5, 0.2)
            down = rng.lognormvariate(2.3, 0.4)
            if version == "v2" and rng.random() > slow_from:
                down *= 4
            total = fr + model + down + 1.0
            r = b.request(start_ms=i * 5.0, duration_ms=total, version=version)
            r.stage(cv.FEATURE_RETRIEVAL, start_ms=0.2, duration_ms=fr)
            r.stage(cv.MODEL_EXECUTE, start_ms=0.4 + fr, duration_ms=model)
            r.stage(cv.DOWNSTREAM, start_ms=0.6 + fr + model, duration_ms=down)
    return b


def split_documents(doc: dict[str, Any], per_doc: int) -> list[dict[str, Any]]:
    """Cut an OTLP document into documents of at most ``per_doc`` spans (resource kept)."""
    out = []
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            spans = ss["spans"]
            for i in range(0, len(spans), per_doc):
                part = copy.deepcopy({k: v for k, v in rs.items() if k != "scopeSpans"})
                part["scopeSpans"] = [
                    {"scope": ss.get("scope", {}), "spans": spans[i : i + per_doc]}
                ]
                out.append({"resourceSpans": [part]})
    return out


@contextlib.contextmanager
def running(db: Path, **kwargs: Any) -> Iterator[Collector]:
    """A started collector with both receivers on free loopback ports; stopped after."""
    kwargs.setdefault("flush_interval", 0.05)
    c = Collector(str(db), port=0, grpc_port=0, **kwargs)
    c.start()
    try:
        yield c
    finally:
        c.stop(timeout=30)


@contextlib.contextmanager
def file_held(db: Path) -> Iterator[Any]:
    """Another process holds ``db`` read-only (a long `tracekit diff`) until released.

    Yields ``release()``; DuckDB's lock is per process, so the writer cannot open the
    file meanwhile and accepted spans wait in memory.
    """
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import duckdb, sys; c = duckdb.connect(sys.argv[1], read_only=True); "
            "print('held', flush=True); sys.stdin.readline(); c.close()",
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            holder.communicate(input="\n", timeout=30)

    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield release
    finally:
        if not released:
            try:
                release()
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.communicate()
