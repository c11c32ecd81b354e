"""Which files to read and what is in them, decided from content, never from names.

gzip is recognised by its magic bytes. A file whose first non-blank line is a whole
JSON object is JSON lines (one document per line: the Collector's file exporter,
tracekit's own exporter, api_v3 answers one per line); anything else starting with
``{`` or ``[`` is one JSON document, or several concatenated (api_v3 streams). Each
document is then recognised by its keys: OTLP, api_v3, or one of Jaeger's shapes.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

GZIP_MAGIC = b"\x1f\x8b"

TRUNCATED_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
"""What Python's gzip raises at a cut or corrupt stream (after the data before it)."""

EMPTY = "empty"
LINES = "lines"
DOCUMENT = "document"
NOT_JSON = "not_json"


@dataclass(frozen=True)
class InputFile:
    path: Path
    display: str
    explicit: bool
    """Named on the command line (not found while walking a directory)."""


@dataclass(frozen=True)
class Sniffed:
    layout: str
    gzip: bool
    first_doc: Any = None
    """The first line's document, when the layout is ``lines``."""
    first_line: int = 0
    head: str = ""


def expand(paths: list[str | Path]) -> Iterator[InputFile]:
    """Files in the order given; directories recursively, sorted, hidden files skipped."""
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                rel = child.relative_to(path)
                if child.is_file() and not any(part.startswith(".") for part in rel.parts):
                    yield InputFile(child, str(child), explicit=False)
        else:
            yield InputFile(path, str(raw), explicit=True)


def is_gzip(path: Path) -> bool:
    with path.open("rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def open_text(path: Path, gz: bool) -> IO[str]:
    """Text in UTF-8 (a BOM dropped); bytes that are not UTF-8 become U+FFFD, not a crash."""
    if gz:
        return gzip.open(path, "rt", encoding="utf-8-sig", errors="replace")
    return path.open(encoding="utf-8-sig", errors="replace")


def sniff(path: Path) -> Sniffed:
    gz = is_gzip(path)
    lines = iter_lines(path, gz, keep_blank=True)
    number = 0
    deep = 0
    for _, line in lines:
        number += 1
        text = line.strip()
        if not text:
            continue
        if text[0] not in "{[":
            return Sniffed(NOT_JSON, gz, first_line=number, head=text[:40])
        if text[0] == "{":
            try:
                doc = json.loads(text)
            except RecursionError:
                # A line nested too deep for the decoder is still a line: the line
                # readers report it, and the next one tells what the file holds.
                deep = deep or number
                continue
            except json.JSONDecodeError:
                return Sniffed(DOCUMENT, gz)
            return Sniffed(LINES, gz, first_doc=doc, first_line=deep or number)
        return Sniffed(DOCUMENT, gz)
    if deep:
        return Sniffed(LINES, gz, first_doc={}, first_line=deep)
    if lines.cut is not None:
        # A stream cut before its first line ends: the line readers report the cut.
        return Sniffed(LINES, gz, first_doc={}, first_line=lines.cut)
    return Sniffed(EMPTY, gz)


class iter_lines:  # noqa: N801 - used as a function that also tells where a stream was cut
    """(line number, text) of the non-blank lines, only ``wanted`` ones when given.

    A compressed stream that is cut or corrupt ends the iteration after the last
    complete line; :attr:`cut` is then the number of the line the cut fell in.
    """

    def __init__(
        self, path: Path, gz: bool, wanted: set[int] | None = None, *, keep_blank: bool = False
    ) -> None:
        self.path, self.gz, self.wanted, self.keep_blank = path, gz, wanted, keep_blank
        self.cut: int | None = None

    def __iter__(self) -> Iterator[tuple[int, str]]:
        number = 0
        with open_text(self.path, self.gz) as fh:
            while True:
                try:
                    line = fh.readline()
                except TRUNCATED_ERRORS:
                    self.cut = number + 1
                    return
                if not line:
                    return
                number += 1
                if self.wanted is not None and number not in self.wanted:
                    continue
                if self.keep_blank or line.strip():
                    yield number, line


def read_text(path: Path, gz: bool) -> tuple[str, int | None]:
    """The whole text, and the line a compressed stream was cut in (None when whole)."""
    parts: list[str] = []
    cut = None
    with open_text(path, gz) as fh:
        while True:
            try:
                chunk = fh.read(1 << 20)
            except TRUNCATED_ERRORS:
                text = "".join(parts)
                cut = text.count("\n") + 1
                return text, cut
            if not chunk:
                return "".join(parts), cut
            parts.append(chunk)


def iter_documents(text: str) -> Iterator[tuple[int, Any]]:
    """(starting line, document) for each JSON value in ``text``, concatenated or not.

    Raises :class:`json.JSONDecodeError` at the first value that does not parse; the
    ones before it have been yielded.
    """
    decoder = json.JSONDecoder()
    pos = 0
    line = 1
    end = len(text)
    while True:
        while pos < end and text[pos] in " \t\r\n":
            if text[pos] == "\n":
                line += 1
            pos += 1
        if pos >= end:
            return
        try:
            doc, next_pos = decoder.raw_decode(text, pos)
        except RecursionError:
            # Reported like any other JSON the decoder cannot take, where the value starts.
            raise json.JSONDecodeError("nested too deep to decode", text, pos) from None
        yield line, doc
        line += text.count("\n", pos, next_pos)
        pos = next_pos


def looks_like_lines(text: str, is_trace: Callable[[Any], bool]) -> bool:
    """A document that failed to parse may be JSON lines with a bad first line."""
    good = 0
    for line in text.splitlines()[:200]:
        stripped = line.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            try:
                good += bool(is_trace(json.loads(stripped)))
            except (json.JSONDecodeError, RecursionError):
                continue
    return good > 0
