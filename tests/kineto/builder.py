"""A tiny Kineto trace writer for tests: one rank's events, in either timestamp layout."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

BASE_NS = 1_700_000_000_000_000_000
"""baseTimeNanoseconds of the relative layout (2023-11-14)."""


class Profile:
    """Events of one rank with times in µs after the profile's start."""

    def __init__(
        self,
        rank: int | None = 0,
        world: int = 2,
        backend: str = "nccl",
        pg_config: list[dict[str, Any]] | None = None,
    ) -> None:
        self.rank = rank
        self.world = world
        self.backend = backend
        self.pg_config = pg_config
        """``distributedInfo.pg_config``: pg_name, pg_desc, backend_config, pg_size, ranks."""
        self.events: list[dict[str, Any]] = []
        self._corr = 0

    def cpu(
        self,
        name: str,
        ts: float,
        dur: float,
        cat: str = "user_annotation",
        *,
        pid: int = 100,
        tid: int = 100,
        **args: Any,
    ) -> None:
        """A host event (a ``record_function`` block by default) on thread ``tid``."""
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )

    def kernel(
        self,
        name: str,
        launch: float,
        ts: float,
        dur: float,
        stream: int = 7,
        cat: str = "kernel",
        **args: Any,
    ) -> None:
        """A device op and the runtime call that launched it (linked by correlation)."""
        self._corr += 1
        corr = self._corr
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 100,
                "tid": 100,
                "ts": launch,
                "dur": 2,
                "args": {"correlation": corr},
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": 0,
                "tid": stream,
                "ts": ts,
                "dur": dur,
                "args": {"stream": stream, "correlation": corr, "device": 0, **args},
            }
        )

    def document(self, *, absolute: bool = False, flow: str = "ac2g") -> dict[str, Any]:
        shift = BASE_NS // 1000 if absolute else 0
        events = []
        for ev in self.events:
            ev = dict(ev)
            ev["ts"] = ev["ts"] + shift
            events.append(ev)
            if ev["cat"] == "cuda_runtime" and "correlation" in ev["args"]:
                corr = ev["args"]["correlation"]
                events.append(
                    {
                        "ph": "s",
                        "id": corr,
                        "pid": 100,
                        "tid": 100,
                        "ts": ev["ts"],
                        "cat": flow,
                        "name": flow,
                    }
                )
        doc: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
        if self.rank is not None:
            doc["distributedInfo"] = {
                "backend": self.backend,
                "rank": self.rank,
                "world_size": self.world,
            }
            if self.pg_config is not None:
                doc["distributedInfo"]["pg_config"] = self.pg_config
        doc["traceEvents"] = events
        doc["traceName"] = "test"
        if not absolute:
            doc["baseTimeNanoseconds"] = BASE_NS
        return doc

    def write(self, path: Path, *, gz: bool = False, **kw: Any) -> Path:
        text = json.dumps(self.document(**kw), indent=1)
        if gz:
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path
