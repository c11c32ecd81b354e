"""Helpers for the demo tests: a real HTTP server in a thread, process checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tracekit.demo.processes import pid_alive


class ThreadServer:
    """A uvicorn server for ``app`` on a free loopback port, in a background thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from tracekit.demo.settings import bind

        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("test server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def thread_server() -> Iterator[type[ThreadServer]]:
    yield ThreadServer


def assert_all_gone(pids: list[int], timeout_s: float = 5.0) -> None:
    """Every pid has exited (and was reaped) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while any(pid_alive(p) for p in pids):
        if time.monotonic() > deadline:
            alive = [p for p in pids if pid_alive(p)]
            raise AssertionError(f"processes still running: {alive}")
        time.sleep(0.05)


def record_started_pids(mp: pytest.MonkeyPatch) -> list[int]:
    """Patch :class:`ServiceProcess` (through ``mp``) so every pid it launches is listed in
    the returned list, started or not."""
    from tracekit.demo.processes import ServiceProcess

    pids: list[int] = []
    original = ServiceProcess.start

    def start(self: ServiceProcess, *args: object, **kwargs: object) -> None:
        try:
            original(self, *args, **kwargs)  # type: ignore[arg-type]
        finally:
            if self.pid is not None:
                pids.append(self.pid)

    mp.setattr(ServiceProcess, "start", start)
    return pids
