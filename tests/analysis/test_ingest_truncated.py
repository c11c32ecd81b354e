"""Input cut short: every complete line before the cut is kept, the cut is located, exit 2.

A gzip stream cut mid-way (a collector killed while writing, a partial download) used
to end ``tracekit ingest`` with an ``EOFError`` traceback. Each reader is checked:
OTLP JSON lines (the fast path), lines the reference decoder reads (Jaeger), one JSON
document, and the same without compression (a last line or document cut mid-value).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import Store
from tracekit.cli import main
from tracekit.testing import TraceBuilder


def built(n: int = 30) -> TraceBuilder:
    b = TraceBuilder(service="ranker", version="v1", seed=5)
    for i in range(n):
        r = b.request(start_ms=i * 100.0, duration_ms=50)
        r.stage("preprocess", start_ms=1, duration_ms=20)
    return b


def cut_gzip(src: bytes, dest: Path, keep: float) -> Path:
    whole = gzip.compress(src)
    dest.write_bytes(whole[: int(len(whole) * keep)])
    return dest


def lines_before(data: bytes, dest: Path) -> int:
    """How many complete lines a reader can get out of the cut file ``dest``."""
    got = b""
    with gzip.open(dest, "rb") as fh:
        try:
            while chunk := fh.read(1):
                got += chunk
        except EOFError:
            pass
    return got.count(b"\n")


def test_a_cut_gzip_of_otlp_lines_keeps_every_complete_line(tmp_path: Path, store: Store) -> None:
    text = built().write_jsonl(tmp_path / "a.jsonl", spans_per_line=2).read_bytes()
    path = cut_gzip(text, tmp_path / "a.jsonl.gz", 0.6)
    complete = lines_before(text, path)
    report = ingest_paths(store, [path])
    kept_lines = text.split(b"\n")[:complete]
    want = sum(
        len(ss["spans"])
        for line in kept_lines
        for rs in json.loads(line)["resourceSpans"]
        for ss in rs["scopeSpans"]
    )
    assert report.spans_read == want > 0
    [problem] = report.skipping_problems
    assert problem.where == f"{path}:{complete + 1}"
    assert "truncated gzip stream" in problem.reason


def test_a_cut_gzip_of_jaeger_lines_keeps_every_complete_line(tmp_path: Path, store: Store) -> None:
    lines = []
    for i in range(40):
        lines.append(
            json.dumps(
                {
                    "traceID": f"{i + 1:032x}",
                    "spans": [
                        {
                            "traceID": f"{i + 1:032x}",
                            "spanID": f"{i + 1:016x}",
                            "operationName": "GET /x",
                            "startTime": 1_700_000_000_000_000 + i,
                            "duration": 1000,
                            "processID": "p1",
                        }
                    ],
                    "processes": {"p1": {"serviceName": "svc", "tags": []}},
                }
            )
        )
    text = ("\n".join(lines) + "\n").encode()
    path = cut_gzip(text, tmp_path / "j.jsonl.gz", 0.5)
    complete = lines_before(text, path)
    report = ingest_paths(store, [path])
    assert report.spans_read == complete > 0
    assert [p.where for p in report.skipping_problems] == [f"{path}:{complete + 1}"]


def test_a_cut_gzip_of_one_document_is_reported_not_a_traceback(
    tmp_path: Path, store: Store
) -> None:
    text = json.dumps(built().to_otlp(), indent=1).encode()
    path = cut_gzip(text, tmp_path / "doc.json.gz", 0.5)
    report = ingest_paths(store, [path])
    assert report.skipped >= 1 and report.spans_read == 0
    assert any("truncated gzip stream" in p.reason for p in report.skipping_problems)


def test_a_gzip_cut_inside_its_header_is_reported(tmp_path: Path, store: Store) -> None:
    path = cut_gzip(b'{"resourceSpans": []}\n', tmp_path / "tiny.gz", 0.3)
    report = ingest_paths(store, [path])
    assert report.skipped == 1 and report.spans_read == 0


@pytest.mark.parametrize("where", [0.5, 0.98])
def test_an_uncompressed_last_line_cut_mid_value_keeps_the_rest(
    tmp_path: Path, store: Store, where: float
) -> None:
    path = built().write_jsonl(tmp_path / "a.jsonl", spans_per_line=4)
    lines = path.read_text().splitlines()
    last = lines[-1]
    path.write_text("\n".join([*lines[:-1], last[: int(len(last) * where)]]))
    report = ingest_paths(store, [path])
    assert [p.where for p in report.skipping_problems] == [f"{path}:{len(lines)}"]
    assert report.spans_read == 4 * (len(lines) - 1)


def test_an_uncompressed_document_cut_mid_value_is_reported(tmp_path: Path, store: Store) -> None:
    path = tmp_path / "doc.json"
    text = json.dumps(built().to_otlp(), indent=1)
    path.write_text(text[: len(text) // 2])
    report = ingest_paths(store, [path])
    assert report.skipped == 1 and "invalid JSON" in report.skipping_problems[0].reason


def test_the_cli_exits_2_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = built().write_jsonl(tmp_path / "a.jsonl", spans_per_line=2).read_bytes()
    path = cut_gzip(text, tmp_path / "a.jsonl.gz", 0.6)
    code = main(["ingest", str(path), "--db", str(tmp_path / "t.duckdb")])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{path}:{lines_before(text, path) + 1}: truncated gzip stream" in err
    assert "Traceback" not in err
