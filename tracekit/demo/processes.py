"""Starting and stopping the demo's service processes, and nothing left behind.

Each service runs as ``python -m tracekit.demo.<module>`` in its own session (so its
own process group), with stdout and stderr in a log file. The starter learns the port
from the ``LISTENING`` line and waits for the ``READY`` line; if the process exits or
stays silent, the error says so and quotes the end of its log. :meth:`stop` sends
SIGTERM to the group (uvicorn shuts down gracefully and tracekit flushes its spans),
then SIGKILL if it lingers; on Linux a service also dies with the process that started
it, however that process ends.

:meth:`pause` and :meth:`resume` freeze and thaw the whole group (SIGSTOP/SIGCONT).
The demo runs several releases in alternating blocks and freezes the ones not under
load, so an idle release burns no CPU (the ``contention`` regression's background
thread would otherwise slow the release being measured) and no timer fires in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from tracekit.demo.settings import LISTENING_MARKER, READY_MARKER
from tracekit.errors import TracekitError

START_TIMEOUT_S = 90.0
"""Import of torch and FastAPI plus the model warm-up; generous for a cold disk."""
STOP_TIMEOUT_S = 10.0
POLL_S = 0.05
LOG_TAIL_LINES = 12

# Variables a child must not inherit: the demo sets exactly what each service reads, and
# PYTEST_CURRENT_TEST would switch tracekit's instrumentation into its strict test mode.
_SCRUBBED_PREFIXES = ("OTEL_", "TRACEKIT_DEMO_", "TRACEKIT_STRICT", "PYTEST_CURRENT_TEST")


def child_environment(settings: Mapping[str, str]) -> dict[str, str]:
    """This process's environment, cleaned, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED_PREFIXES)}
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            # The model runs on one intra-op thread; keep BLAS pools from spawning more.
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
    )
    env.update(settings)
    return env


# The child asks the kernel to SIGKILL it when this process dies (Linux prctl
# PR_SET_PDEATHSIG), then execs the service. A parent killed outright (SIGKILL, or a
# SIGTERM to a test runner that runs no clean-up) would otherwise leave its services
# behind, and a service frozen with SIGSTOP between blocks could not even act on a
# SIGTERM. The setting survives exec; the check after it closes the race with a parent
# that died first. Elsewhere (no prctl) the service starts as it is.
_LAUNCH = """
import ctypes, os, signal, sys
parent, module = int(sys.argv[1]), sys.argv[2]
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
except (AttributeError, OSError):
    pass
if os.getppid() != parent:
    sys.exit(1)
os.execv(sys.executable, [sys.executable, "-m", module])
"""


class ServiceProcess:
    """One running demo service; use :meth:`start`, then :meth:`stop` (idempotent)."""

    def __init__(self, name: str, module: str, log_path: Path) -> None:
        self.name = name
        self.module = module
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = ""
        self.port = 0
        self.paused = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(
        self, env: Mapping[str, str], timeout_s: float = START_TIMEOUT_S, *, wait: bool = True
    ) -> None:
        """Launch the process and wait until it serves; raises with its log tail if not.

        With ``wait=False`` it only launches, so that several services start at once;
        :meth:`wait_ready` or :meth:`poll_ready` then tell when each serves.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _LAUNCH, str(os.getpid()), self.module],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        self.paused = False
        if wait:
            self.wait_ready(timeout_s)

    def _log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def log_tail(self) -> str:
        lines = self._log_lines()[-LOG_TAIL_LINES:]
        return "\n".join(f"    {line}" for line in lines) if lines else "    (empty log)"

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the READY line; raises (and stops the process) if it never comes."""
        deadline = time.monotonic() + timeout_s
        while not self.poll_ready():
            if time.monotonic() > deadline:
                self.stop()
                raise TracekitError(
                    f"{self.name} did not become ready within {timeout_s:.0f} s; "
                    f"end of {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(POLL_S)

    def poll_ready(self) -> bool:
        """Whether the service serves now; raises with its log tail if it exited."""
        assert self.proc is not None
        ready = False
        for line in self._log_lines():
            parts = line.split()
            if parts[:1] == [LISTENING_MARKER] and len(parts) >= 3:
                self.host, self.port = parts[1], int(parts[2])
            elif parts[:1] == [READY_MARKER]:
                ready = True
        if ready and self.port:
            return True
        code = self.proc.poll()
        if code is not None:
            raise TracekitError(
                f"{self.name} exited with status {code} while starting; "
                f"end of {self.log_path}:\n{self.log_tail()}"
            )
        return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pause(self) -> None:
        """Freeze every thread of the service (SIGSTOP to its group)."""
        if self.alive():
            self._signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """Let a paused service run again (SIGCONT to its group)."""
        if self.proc is not None:
            self._signal(signal.SIGCONT)
        self.paused = False

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int | None:
        """Stop the process group: SIGTERM, then SIGKILL; returns the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            # A stopped process keeps SIGTERM pending until it runs again.
            self.resume()
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait(timeout=timeout_s)
        return proc.returncode

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    # state is the field after the parenthesised command name
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")
