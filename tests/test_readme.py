"""README.md is a door: short, its library example runs as shown, docs/ is indexed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tracekit.analysis.store import open_store
from tracekit.testing import TraceBuilder, queue_regression

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
MAX_LINES = 300


def library_example() -> tuple[str, str]:
    """The first ```python block importing Analysis, and the ```text block after it."""
    text = README.read_text(encoding="utf-8")
    match = re.search(
        r"```python\n(?P<code>from tracekit import Analysis\n.*?)```\s*```text\n(?P<out>.*?)```",
        text,
        re.S,
    )
    assert match, "README.md has no ```python block with `from tracekit import Analysis`"
    return match["code"], match["out"]


def shape(text: str) -> str:
    """Text with every number a placeholder: same sentences, whatever the figures."""
    return re.sub(r"[+-]?\d[\d,]*(?:\.\d+)?", "N", text).strip()


def demo_like_store(path: Path) -> None:
    """v1, and v2 whose batching waits far longer (what `tracekit demo` injects)."""
    builder = TraceBuilder(service="ranker", version="v1", seed=0)
    queue_regression(builder, requests=664, queue_ms=4.0, after_queue_ms=120.0)
    with open_store(path) as store:
        builder.load(store)


def test_readme_stays_a_door() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_the_library_example_runs_as_shown(tmp_path: Path) -> None:
    code, shown = library_example()
    demo_like_store(tmp_path / "tracekit.duckdb")
    # A fresh interpreter, as a user would run it: the example's own imports only.
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    # The README shows the demo's figures; these traces have their own, in the same words.
    assert shape(out.stdout) == shape(shown), out.stdout


def test_every_docs_page_is_in_the_index_and_design_is_in_the_repository() -> None:
    docs = REPO / "docs"
    index = (docs / "index.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in docs.glob("*.md") if p.name != "index.md")
    assert "design.md" in pages
    missing = [p for p in pages if f"({p})" not in index and f"({p}#" not in index]
    assert not missing, f"docs/index.md does not list {missing}"
    stale = [
        str(p.relative_to(REPO))
        for p in [README, *docs.glob("*.md"), *(REPO / "tracekit").rglob("*.py")]
        if re.search(r"(?<![\w/])DESIGN\.md", p.read_text(encoding="utf-8"))
    ]
    assert not stale, f"cite docs/design.md, not DESIGN.md: {stale}"


def test_every_install_line_names_our_distribution_not_the_index_namesake() -> None:
    # "tracekit" in the public index is an unrelated project: an install line that names
    # it fetches someone else's code. Ours is tracekit-ml (pyproject), or a local path.
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == "tracekit-ml"
    extras = [r for reqs in project["optional-dependencies"].values() for r in reqs]
    assert not [r for r in extras if re.match(r"tracekit\[", r)], "self-extras name tracekit"
    files = [README, REPO / "CONTRIBUTING.md", REPO / "Dockerfile", *(REPO / "docs").glob("*.md")]
    files += list((REPO / "deploy").rglob("*.yaml"))
    wrong = [
        f"{p.relative_to(REPO)}: {m.group(0)}"
        for p in files
        for m in re.finditer(r"pip install [^\n`]*?['\"]?tracekit\[[^\n`]*", p.read_text("utf-8"))
    ]
    assert not wrong, wrong
