"""`tracekit ingest` (placeholder until its module lands; its owner replaces this file)."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(sub: Any) -> None:
    parser = sub.add_parser("ingest", help="(not available in this build)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    print("tracekit ingest is not available in this build", file=sys.stderr)
    return 2
