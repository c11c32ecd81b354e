"""A seeded mutator over real trace files: no exception escapes ingest, good lines survive.

Each case takes a corpus file (or a built JSON-lines file), damages some of its
documents (a value of the wrong JSON type, nesting far past any limit, a cut line, a
huge string or number, a span copied under another's id, a parent pointing back) and
ingests the result. Whatever the damage, ``ingest_paths`` must return a report, and
every span of a JSON-lines line left alone must be stored. Fixed seeds, bounded time.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tracekit import conventions as cv
from tracekit.analysis.ingest import ingest_documents, ingest_paths
from tracekit.analysis.store import Store, open_store
from tracekit.errors import IngestError
from tracekit.testing import TraceBuilder

SEEDS = range(int(os.environ.get("TK_FUZZ_SEEDS", "8")))
"""More with ``TK_FUZZ_SEEDS=200 TK_FUZZ_BUDGET_S=600`` (a longer hunt, same cases)."""
BUDGET_S = float(os.environ.get("TK_FUZZ_BUDGET_S", "15"))
CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus" / "traces"
DEEP = "__TK_DEEP__"
CORPUS_FILES = (
    "otlp/jaegerui_nodejs_collector_fileexporter_4lines.jsonl",
    "otlp/goauto_nethttp_collector_fileexporter.jsonl",
    "otlp/jaegerv3_n_plus_one_full_serial.json",
    "otlp/highlight_nextjs_traces.json",
    "jaeger/jaegerui_petclinic_testTraceNormal.json",
    "jaeger/jaeger_anonymizer_span_array.json",
)

_WRONG: tuple[Any, ...] = (5, 1.5, -1, True, None, "x", "", [], {}, [1, "a"], {"a": [1]})


def built_lines() -> list[str]:
    b = TraceBuilder(seed=3)
    for i in range(6):
        r = b.request(start_ms=i * 500, duration_ms=80)
        r.stage(cv.FEATURE_RETRIEVAL, start_ms=1, duration_ms=10, attributes={"k": [1, 2]})
        r.stage(cv.MODEL_EXECUTE, start_ms=20, duration_ms=40)
    lines = []
    for rs in b.to_otlp()["resourceSpans"]:
        for scope in rs["scopeSpans"]:
            for i in range(0, len(scope["spans"]), 3):
                one = {
                    "resource": rs["resource"],
                    "scopeSpans": [{"spans": scope["spans"][i : i + 3]}],
                }
                lines.append(json.dumps({"resourceSpans": [one]}))
    return lines


def _nodes(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``doc`` (iteratively; corpus files are shallow)."""
    out = []
    stack = [(doc, path)]
    while stack:
        node, p = stack.pop()
        out.append(p)
        if isinstance(node, dict):
            stack.extend((v, (*p, k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, (*p, i)) for i, v in enumerate(node))
    return out


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return doc


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def _spans(doc: Any) -> list[dict[str, Any]]:
    return [
        n
        for p in _nodes(doc)
        if isinstance(n := _get(doc, p), dict) and ("spanId" in n or "spanID" in n)
    ]


def mutate(rng: random.Random, text: str, donors: list[dict[str, Any]]) -> str:
    """One damaged version of the JSON ``text``."""
    how = rng.choice(("type", "type", "deep", "deep_attr", "cut", "huge", "dup", "cycle"))
    if how == "cut":
        return text[: rng.randrange(1, max(2, len(text)))]
    doc = json.loads(text)
    paths = _nodes(doc)
    target = rng.choice(paths)
    if how == "type":
        doc = _set(doc, target, rng.choice(_WRONG))
    elif how == "deep":
        doc = _set(doc, target, DEEP)
    elif how == "deep_attr":
        doc = _set(doc, target, {"arrayValue": {"values": [DEEP]}})
    elif how == "huge":
        doc = _set(doc, target, rng.choice(("x" * 200_000, 10**40, -(10**40), 1e308)))
    spans = _spans(doc)
    if how == "dup" and spans and donors:
        donor = json.loads(json.dumps(rng.choice(donors)))
        target_span = rng.choice(spans)
        target_span.clear()
        target_span.update(donor)
    elif how == "cycle" and spans:
        s = rng.choice(spans)
        other = rng.choice(spans)
        if "spanId" in s:
            s["parentSpanId"] = other.get("spanId")
        else:
            s["references"] = [{"refType": "CHILD_OF", "spanID": other.get("spanID")}]
    out = json.dumps(doc)
    depth = rng.choice((40, 1_200, 3_000))
    return out.replace(f'"{DEEP}"', "[" * depth + "]" * depth)


def stored_keys(store: Store) -> set[tuple[str, str]]:
    return {(t, s) for t, s in store.run("SELECT trace_id, span_id FROM spans")}


def _ingest(store: Store, path: Path, **kw: Any) -> Any:
    try:
        return ingest_paths(store, [path], **kw)
    except IngestError:
        if kw.get("strict"):
            return None  # strict stops at the first skip: a report, not a crash
        raise


@pytest.fixture(scope="module")
def clock() -> list[float]:
    return [time.perf_counter()]


def _cases(corpus: Path) -> list[tuple[str, list[str], bool]]:
    """(name, documents, lines?) for the built file and each corpus file."""
    out = [("built.jsonl", built_lines(), True)]
    for name in CORPUS_FILES:
        text = (corpus / name).read_text()
        if name.endswith(".jsonl"):
            out.append((name, [ln for ln in text.splitlines() if ln.strip()], True))
        else:
            out.append((name, [json.dumps(json.loads(text))], False))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_no_exception_escapes_ingest_and_untouched_lines_survive(
    tmp_path: Path, seed: int, clock: list[float]
) -> None:
    if time.perf_counter() - clock[0] > BUDGET_S:
        pytest.skip("fuzz time budget spent")
    rng = random.Random(seed)
    corpus = CORPUS
    for name, docs, lines in _cases(corpus):
        donors = [s for d in docs for s in _spans(json.loads(d))]
        hit = set(rng.sample(range(len(docs)), k=max(1, len(docs) // 3))) if lines else {0}
        damaged = [mutate(rng, d, donors) if i in hit else d for i, d in enumerate(docs)]
        path = tmp_path / Path(name).name
        path.write_text("\n".join(damaged) + "\n")
        with open_store(":memory:") as store:
            report = _ingest(store, path)
            assert report is not None
            got = stored_keys(store)
        if name == "built.jsonl":
            _ingest_strict(path)
        if not lines:
            continue
        clean = tmp_path / f"clean-{Path(name).name}"
        clean.write_text("\n".join(d for i, d in enumerate(docs) if i not in hit) + "\n")
        with open_store(":memory:") as store:
            ingest_paths(store, [clean])
            expected = stored_keys(store)
        assert expected <= got, f"{name} seed {seed}: lost {sorted(expected - got)[:3]}"
        # The receiver's path: the same lines as bytes, decoded in memory.
        with open_store(":memory:") as store:
            ingest_documents(store, [d.encode() for d in damaged], source="mem")
            assert expected <= stored_keys(store)


def _ingest_strict(path: Path) -> None:
    with open_store(":memory:") as store:
        _ingest(store, path, strict=True)
