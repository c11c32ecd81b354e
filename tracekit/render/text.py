"""Data-derived text made safe to show: names from traces never act on a terminal.

Span, stage, service and release names come from whoever sent the traces. Table and
markdown output pass every such string through :func:`printable`, so an escape sequence
(``\\x1b[1A\\x1b[2K`` erases the line above), a newline (a forged output line) or a bidi
override shows as its escape instead of doing what it says. JSON output keeps the raw
strings: JSON's own escaping already makes them inert.
"""

from __future__ import annotations

_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}

_UNSAFE = (
    *range(0x00, 0x20),  # C0 controls
    0x7F,  # DEL
    *range(0x80, 0xA0),  # C1 controls (0x9b alone is a CSI on some terminals)
    0x2028,  # line separator
    0x2029,  # paragraph separator
    *range(0x202A, 0x202F),  # bidi embeddings and overrides
    *range(0x2066, 0x206A),  # bidi isolates
)


def _escape(codepoint: int) -> str:
    if codepoint in _NAMED:
        return _NAMED[codepoint]
    return f"\\x{codepoint:02x}" if codepoint < 0x100 else f"\\u{codepoint:04x}"


_TABLE = {cp: _escape(cp) for cp in _UNSAFE}


def printable(text: str) -> str:
    """``text`` with control characters, line separators and bidi controls escaped
    (``\\x1b``, ``\\n``, ``\\u202e``); everything else, backslashes included, unchanged.

    Idempotent, so a string escaped twice on its way to the screen reads the same.
    """
    return text.translate(_TABLE)
