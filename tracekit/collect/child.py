"""A child process of tracekit's own, spoken to in frames over its stdin and stdout.

The collector runs its decoding (:mod:`.pool`) and its store writing
(:mod:`.store_worker`) in such children, each ``python -m MODULE``: no fork of a process
running grpcio and uvicorn threads, and no re-import of the caller's ``__main__`` as
multiprocessing's spawn would do. A frame is an 8-byte length, then a pickle; both ends
are tracekit's, and nothing else writes to those pipes.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

_LEN = struct.Struct("<Q")


def write_frame(fh: IO[bytes], value: Any) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(_LEN.pack(len(data)))
    fh.write(data)
    fh.flush()


def read_frame(fh: IO[bytes]) -> Any:
    """The next frame; ``EOFError`` when the other end has closed."""
    head = fh.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError("the other end closed")
    (n,) = _LEN.unpack(head)
    data = fh.read(n)
    if len(data) < n:
        raise EOFError("the other end closed mid-frame")
    return pickle.loads(data)  # noqa: S301 - frames come from our own process


class Child:
    """``python -m module *args``: one call at a time (callers serialise)."""

    def __init__(self, module: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )

    def call(self, request: Any) -> Any:
        """Send one frame, read one back; ``OSError``/``EOFError`` when the child died."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        write_frame(self.proc.stdin, request)
        return read_frame(self.proc.stdout)

    def close(self, timeout: float = 5.0) -> None:
        """Close its stdin (the child's loop ends), wait, kill if it does not go."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.close(timeout=5.0)


PARENT_POLL_S = 0.5


def child_main() -> tuple[IO[bytes], IO[bytes]]:
    """In the child: ignore Ctrl-C (the collector's process group gets it too; the child
    ends when its stdin closes), end at once if the collector dies (``kill -9``: its
    work is in the collector's write-ahead log, and a child waiting on the store must not
    outlive it), and take the frame streams."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(0)

    threading.Thread(target=watch, name="tracekit-parent-watch", daemon=True).start()
    return sys.stdin.buffer, sys.stdout.buffer
