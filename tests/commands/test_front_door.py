"""Commands and the demo reach the analysis through the facade's public names only.

make lint's import contract forbids them every analysis module but the facade and the
result vocabulary; it cannot see a name the facade merely imports for itself
(``from tracekit.analysis.facade import run_gate`` would pass it). This test can.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tracekit.analysis.facade as facade

ROOT = Path(__file__).resolve().parents[2] / "tracekit"


def _imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every ``from tracekit.analysis… import name``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tracekit.analysis"):
            out.extend((node.lineno, node.module or "", alias.name) for alias in node.names)
        elif isinstance(node, ast.Import):
            out.extend(
                (node.lineno, alias.name, "")
                for alias in node.names
                if alias.name.startswith("tracekit.analysis")
            )
    return out


def test_commands_and_the_demo_use_only_the_facades_public_names() -> None:
    allowed = set(facade.__all__)
    wrong = []
    for path in sorted([*(ROOT / "commands").glob("*.py"), *(ROOT / "demo").glob("*.py")]):
        for line, module, name in _imports(path):
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if module == "tracekit.analysis.facade" and name not in allowed:
                wrong.append(f"{where}: {name} is not in tracekit.analysis.facade.__all__")
            elif module not in ("tracekit.analysis.facade", "tracekit.analysis.results"):
                wrong.append(f"{where}: imports {module}")
    assert not wrong, "\n".join(wrong)


def test_the_check_catches_a_private_name(tmp_path: Path) -> None:
    sneaky = tmp_path / "sneaky.py"
    sneaky.write_text("from tracekit.analysis.facade import run_gate\n")
    assert _imports(sneaky) == [(1, "tracekit.analysis.facade", "run_gate")]
    assert "run_gate" not in facade.__all__
