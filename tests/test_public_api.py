"""The public surface of ``import tracekit`` is exactly what the issue names."""

from __future__ import annotations

import subprocess
import sys

import tracekit

EXPECTED = [
    "Analysis",
    "BatchRecorder",
    "ConfigError",
    "DynamicBatcher",
    "TracekitError",
    "communication",
    "configure",
    "generation",
    "instrument_ddp",
    "instrument_fastapi",
    "instrument_httpx",
    "instrument_model",
    "model_execution",
    "profile_next",
    "shutdown",
    "stage",
    "train_steps",
]


def test_all_is_pinned_and_sorted() -> None:
    assert tracekit.__all__ == EXPECTED
    assert sorted(tracekit._EXPORTS) == EXPECTED


def test_the_front_door_loads_neither_rich_nor_plotly() -> None:
    # A library user asks questions; drawing tables or charts is the renderers' business.
    code = (
        "import sys; from tracekit import Analysis; Analysis.open;"
        "print(','.join(m for m in ('rich','plotly') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_public_name_resolves() -> None:
    for name in EXPECTED:
        assert callable(getattr(tracekit, name)), name


def test_errors_are_the_tree_users_catch() -> None:
    assert issubclass(tracekit.ConfigError, tracekit.TracekitError)
    assert tracekit.TracekitError is __import__("tracekit.errors").errors.TracekitError


def test_import_tracekit_loads_no_analysis_or_torch() -> None:
    code = (
        "import sys, tracekit; tracekit.stage; tracekit.configure;"
        "print(','.join(m for m in ('duckdb','rich','torch','numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
