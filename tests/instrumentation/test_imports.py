"""The serving side works with torch, duckdb and rich not installed."""

from __future__ import annotations

import subprocess
import sys

# Runs in a fresh interpreter where importing the analysis and torch packages fails,
# as in a serving image built without those extras.
SCRIPT = """
import sys

class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "duckdb", "rich", "numpy"):
            raise ImportError(f"{name} is not installed")
        return None

sys.meta_path.insert(0, Absent())
import tracekit
tracekit.configure(service_name="a", exporter="file", path=sys.argv[1])
for name in tracekit.__all__:
    if name != "Analysis":  # the analyzer's front door needs the analysis extra
        getattr(tracekit, name)
try:
    tracekit.Analysis
except ImportError:
    pass  # as it should: the extra is not installed
else:
    raise AssertionError("tracekit.Analysis imported without numpy and duckdb")
with tracekit.stage("preprocess"):
    pass
with tracekit.model_execution():
    pass
tracekit.shutdown()
print("ok")
"""


def test_serving_api_works_without_analysis_or_torch_installed(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "t.jsonl")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    text = (tmp_path / "t.jsonl").read_text()
    assert text.count('"preprocess"') >= 1 and '"model_execute"' in text
