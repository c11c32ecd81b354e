"""Drive Debian's headless Chromium over the DevTools protocol, on a pipe (stdlib only).

``--remote-debugging-pipe`` makes Chromium read protocol messages from fd 3 and write
them to fd 4, each a JSON object ended by a NUL byte: no port, no websocket library, no
browser download. :class:`Browser` opens a page with the network switched off, records
console errors, exceptions, log errors and every request that was not ``file:``/``data:``,
evaluates JavaScript and takes full-page screenshots.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
TIMEOUT_S = 60.0


@dataclass
class PageRun:
    """What happened while a page loaded and drew."""

    errors: list[str] = field(default_factory=list)
    """Console errors, uncaught exceptions and error log entries."""
    requests: list[str] = field(default_factory=list)
    """Every URL the page asked for that is not local (file:, data:, blob:)."""


class Browser:
    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self._next_id = 0
        self._waiting: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()

    def __enter__(self) -> Browser:
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:  # in the child, before exec: the protocol's fds 3 and 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            pass_fds=(3, 4),
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(TimeoutError, OSError):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_child)

    # --- protocol ---------------------------------------------------------------------
    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                if "id" in msg and msg["id"] in self._waiting:
                    self._waiting[msg["id"]].put(msg)
                else:
                    self._events.put(msg)

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = TIMEOUT_S,
    ) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            msg_id = self._next_id
            box: queue.Queue[dict[str, Any]] = queue.Queue()
            self._waiting[msg_id] = box
        msg: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_child, json.dumps(msg).encode() + b"\0")
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{method}: no reply in {timeout:g} s") from None
        finally:
            self._waiting.pop(msg_id, None)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def _drain(self, run: PageRun, session: str, until: str | None, deadline: float) -> None:
        """Record events of ``session``; return once ``until`` arrives (or none are left)."""
        while True:
            left = deadline - time.monotonic()
            if until is not None and left <= 0:
                raise TimeoutError(f"no {until} event in time")
            try:
                ev = self._events.get(timeout=max(0.05, left) if until else 0.05)
            except queue.Empty:
                if until is None:
                    return
                continue
            if ev.get("sessionId") != session:
                continue
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                run.errors.append(
                    "console: " + " ".join(str(a.get("value", a)) for a in p.get("args", []))
                )
            elif method == "Runtime.exceptionThrown":
                details = p.get("exceptionDetails", {})
                run.errors.append(
                    "exception: " + str(details.get("exception", {}).get("description", details))
                )
            elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                run.errors.append("log: " + p["entry"].get("text", ""))
            elif method == "Network.requestWillBeSent":
                url = p.get("request", {}).get("url", "")
                if not url.startswith(LOCAL_SCHEMES):
                    run.requests.append(url)
            if method == until:
                return

    # --- pages ------------------------------------------------------------------------
    def open(self, path: Path, *, ready_js: str, width: int = 1280) -> tuple[str, PageRun]:
        """Open ``path`` offline; wait for the load event and for ``ready_js`` to be true."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page", "Network"):
            self.call(f"{domain}.enable", session=session)
        # Offline: anything the page tried to fetch would fail and show up as an error.
        self.call(
            "Network.emulateNetworkConditions",
            {"offline": True, "latency": 0, "downloadThroughput": -1, "uploadThroughput": -1},
            session=session,
        )
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        run = PageRun()
        deadline = time.monotonic() + TIMEOUT_S
        self.call("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        self._drain(run, session, "Page.loadEventFired", deadline)
        while not self.evaluate(session, ready_js):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}: {ready_js} never became true; errors: {run.errors}")
            self._drain(run, session, None, deadline)
        self._drain(run, session, None, deadline)
        return session, run

    def evaluate(self, session: str, expression: str) -> Any:
        reply = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=session,
        )
        if "exceptionDetails" in reply:
            raise RuntimeError(f"{expression}: {reply['exceptionDetails']}")
        return reply.get("result", {}).get("value")

    def screenshot(self, session: str, out: Path) -> Path:
        """The whole page, not just the viewport, as PNG."""
        size = self.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = self.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {
                    "x": 0,
                    "y": 0,
                    "width": size["width"],
                    "height": size["height"],
                    "scale": 1,
                },
            },
            session=session,
        )
        out.write_bytes(base64.b64decode(shot["data"]))
        return out
