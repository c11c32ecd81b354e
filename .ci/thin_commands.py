"""`make lint`: every module in tracekit/commands/ stays under 120 lines.

A command is parse → one ``tracekit.Analysis`` call → render (docs/design.md,
"Layout"); a module growing past this is behaviour that belongs in the analysis.
"""

from __future__ import annotations

import sys
from pathlib import Path

LIMIT = 120


def main() -> int:
    root = Path(__file__).resolve().parent.parent / "tracekit" / "commands"
    fat = []
    for path in sorted(root.glob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines >= LIMIT:
            fat.append(f"{path.relative_to(root.parent.parent)}: {lines} lines")
    for line in fat:
        print(
            f"{line} (a command module stays under {LIMIT}: move behaviour into tracekit.Analysis)"
        )
    return 1 if fat else 0


if __name__ == "__main__":
    sys.exit(main())
