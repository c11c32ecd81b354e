"""tracekit's GPU temporal breakdown and overlap against Holistic Trace Analysis's.

HTA (``holistictraceanalysis``) is a test-only dependency. On every corpus file HTA can
analyse, and on the profiles without ProfilerStep in ``data/`` (where both take every
device op), tracekit's idle / compute / non-compute percentages and communication
overlap must be within 1 percentage point of HTA's as shipped, and equal (to HTA's two
decimals) when HTA's rounding of nanosecond timestamps is switched off: the only
deliberate difference that moves them on these files (docs/kineto.md).
"""

from __future__ import annotations

import logging
import math
import shutil
import warnings
from pathlib import Path

import pytest

from tracekit.analysis.ingest import ingest_paths
from tracekit.analysis.store import open_store
from tracekit.analysis.training.gpu import rank_gpu_breakdown

hta_analysis = pytest.importorskip("hta.trace_analysis")

KINETO = Path(__file__).resolve().parents[1] / "data" / "corpus" / "kineto"
DATA = Path(__file__).resolve().parent / "data"
HTA_RUNS_ON = [
    KINETO / "hta_nccl_parser_config_nccl_data.json.gz",
    KINETO / "hta_ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    KINETO / "hta_amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    KINETO / "hta_trace_diff_test_test.json.gz",
    DATA / "alexnet.json.gz",
    DATA / "simple_add.json.gz",
]
"""The CPU-only file has no GPU time line; HTA fails on it (IndexError)."""
INTEGER_US = {"hta_trace_diff_test_test.json.gz", "alexnet.json.gz", "simple_add.json.gz"}


def _hta(folder: Path) -> tuple[dict[str, float], float | None]:
    logging.getLogger("hta").setLevel(logging.ERROR)
    # HTA's own pandas deprecations and 0/0 (no communication) are HTA's, not ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = hta_analysis.TraceAnalysis(trace_dir=str(folder))
        tb = t.get_temporal_breakdown(visualize=False).iloc[0]
        ov = t.get_comm_comp_overlap(visualize=False).iloc[0]["comp_comm_overlap_pctg"]
    figures = {
        "idle": float(tb["idle_time_pctg"]),
        "compute": float(tb["compute_time_pctg"]),
        "non_compute": float(tb["non_compute_time_pctg"]),
    }
    return figures, None if math.isnan(ov) else float(ov)


@pytest.mark.parametrize("rounding", ["hta_default", "no_ns_rounding"])
@pytest.mark.parametrize("path", HTA_RUNS_ON, ids=lambda p: p.name)
def test_temporal_breakdown_and_overlap_agree_with_hta(tmp_path, monkeypatch, path, rounding):
    name = path.name
    folder = tmp_path / "trace"
    folder.mkdir()
    shutil.copy(path, folder / name)
    if rounding == "no_ns_rounding":
        if name in INTEGER_US:
            pytest.skip("integer microseconds: HTA's rounding does not apply")
        monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    hta, hta_overlap = _hta(folder)
    with open_store(":memory:") as store:
        ingest_paths(store, [folder / name], version="run")
        (gpu,) = rank_gpu_breakdown(store, "run").values()
    ours = {
        "idle": gpu.gpu_idle_pct,
        "compute": gpu.gpu_compute_pct,
        "non_compute": gpu.gpu_non_compute_pct,
    }
    tolerance = 1.0 if rounding == "hta_default" else 0.006  # HTA prints two decimals
    for key, value in hta.items():
        assert abs(ours[key] - value) <= tolerance, (key, ours[key], value)
    if hta_overlap is None:
        assert gpu.comm_overlap_pct is None
    else:
        assert gpu.comm_overlap_pct is not None
        assert abs(gpu.comm_overlap_pct - hta_overlap) <= tolerance
