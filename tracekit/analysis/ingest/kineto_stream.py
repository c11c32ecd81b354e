"""A streaming reader for Kineto chrome-trace JSON: one event at a time, bounded memory.

A Kineto file is one JSON object: small metadata keys (``schemaVersion``,
``distributedInfo``, …) around one huge ``traceEvents`` array, with
``baseTimeNanoseconds`` usually written *after* the array. :class:`KinetoStream` walks
the top-level object itself and hands each element of ``traceEvents`` to the
standard library's C decoder (``json.JSONDecoder.raw_decode``) over a sliding text
buffer, so memory holds one buffer (:data:`CHUNK_CHARS`) plus one event, whatever the
file's size. ijson would do the same walk, but its per-token Python objects made it no
faster, and this needs no extra dependency.

Floats are kept as their decimal text (``parse_float=str``): Kineto writes
nanosecond fractions of microsecond timestamps (``1711964646123456.789``), which a
float64 cannot hold; :func:`us_to_ns` converts them exactly.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from typing import IO, Any

CHUNK_CHARS = 1 << 20
"""Characters read from the (decompressed) file at a time."""

MAX_VALUE_CHARS = 64 << 20
"""A single JSON value (one event, one metadata entry) larger than this is damage."""

_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder(parse_float=str)


class KinetoFormatError(ValueError):
    """The file is not well-formed Kineto JSON; ``where`` says how far it got."""

    def __init__(self, reason: str, *, events: int, offset: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.events = events
        self.offset = offset


class KinetoStream:
    """Iterate the events of one Kineto document; :attr:`meta` fills in as it goes.

    After :meth:`events` is exhausted :attr:`meta` holds every top-level key except
    ``traceEvents``. Raises :class:`KinetoFormatError` on truncation or damage.
    """

    def __init__(self, fh: IO[str]) -> None:
        self._fh = fh
        self._buf = ""
        self._pos = 0
        self._base = 0  # characters dropped from the buffer so far
        self._eof = False
        self.meta: dict[str, Any] = {}
        self.count = 0
        """Events yielded so far."""

    # --- buffer -----------------------------------------------------------------
    def _fill(self) -> bool:
        if self._eof:
            return False
        data = self._fh.read(CHUNK_CHARS)
        if not data:
            self._eof = True
            return False
        self._base += self._pos
        self._buf = self._buf[self._pos :] + data
        self._pos = 0
        return True

    def _fail(self, reason: str) -> KinetoFormatError:
        return KinetoFormatError(reason, events=self.count, offset=self._base + self._pos)

    def _peek(self) -> str:
        """The next non-blank character ('' at end of input)."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._fill():
                return ""

    def _expect(self, chars: str, what: str) -> str:
        c = self._peek()
        if not c:
            raise self._fail(f"file ends early (truncated?) where {what} was expected")
        if c not in chars:
            raise self._fail(f"expected {what}, found {c!r}")
        self._pos += 1
        return c

    def _value(self) -> Any:
        if not self._peek():
            raise self._fail("file ends early (truncated?) inside the trace")
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except RecursionError:
                raise self._fail("a value nested too deep to decode") from None
            except json.JSONDecodeError as exc:
                if len(self._buf) - self._pos > MAX_VALUE_CHARS or not self._fill():
                    at_end = self._eof and exc.pos >= len(self._buf) - 1
                    raise self._fail(
                        "file ends early (truncated?) inside the trace"
                        if at_end or "Unterminated" in exc.msg
                        else f"invalid JSON ({exc.msg})"
                    ) from exc
                continue
            # A number at the very end of the buffer may continue in the next chunk.
            if end == len(self._buf) and not self._eof and self._fill():
                continue
            self._pos = end
            return value

    # --- document ---------------------------------------------------------------
    def events(self) -> Iterator[Any]:
        self._expect("{", "a JSON object")
        if self._peek() == "}":
            self._pos += 1
            return
        while True:
            key = self._value()
            if not isinstance(key, str):
                raise self._fail("expected an object key")
            self._expect(":", "':'")
            if key == "traceEvents":
                yield from self._array()
            else:
                self.meta[key] = self._value()
            if self._expect(",}", "',' or '}'") == "}":
                return

    def _array(self) -> Iterator[Any]:
        self._expect("[", "the traceEvents array")
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            event = self._value()
            self.count += 1
            yield event
            if self._expect(",]", "',' or ']' between events") == "]":
                return


def us_to_ns(value: Any) -> int | None:
    """Microseconds (an int, or a float kept as decimal text) to integer nanoseconds.

    Exact to the nanosecond (digits past the third decimal are dropped); None for
    anything that is not a number, or not a finite one that fits 64 bits (``Infinity``,
    ``NaN``, ``1e400``: hostile or damaged input must cost its event, not the file).
    """
    ns = _to_ns(value)
    return ns if ns is not None and -_MAX_NS <= ns <= _MAX_NS else None


_MAX_NS = 1 << 62


def _to_ns(value: Any) -> int | None:
    if type(value) is int:
        return value * 1000
    if type(value) is str:
        whole, dot, frac = value.partition(".")
        if dot and "e" not in frac and "E" not in frac and whole.lstrip("-").isdigit():
            digits = frac[:3].ljust(3, "0")
            if digits.isdigit():
                magnitude = int(whole.lstrip("-")) * 1000 + int(digits)
                return -magnitude if whole.startswith("-") else magnitude
        try:
            return int(Decimal(value) * 1000)
        except (InvalidOperation, ValueError, OverflowError):
            return None
    if type(value) is float and math.isfinite(value):
        return int(round(value * 1000))
    return None
