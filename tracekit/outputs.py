"""Writing what a command produces without destroying what it read.

:func:`check_outputs` refuses, before any work, an output that is an input (the store,
a config file) or cannot be a file; :func:`write_output` replaces a file atomically
(the old file stays whole if writing fails); :func:`claim_output_dir` does the same for
a directory a command fills with several files (``tracekit demo --keep``). Every
refusal is a one-line :class:`~tracekit.errors.ConfigError` naming the option.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from tracekit.errors import ConfigError

Paths = Mapping[str, str | Path | None]
"""Option (``--junit``) → the path it was given; ``None`` where the option was not."""

OUTPUT_DIR_MARKER = ".tracekit-output"
"""The file :func:`claim_output_dir` leaves in a directory: tracekit may write there again."""


def check_outputs(outputs: Paths, inputs: Paths | None = None) -> None:
    """Refuse outputs that would destroy an input or each other, or that cannot be files.

    Same file means the same file once resolved (``./x``, ``../d/x`` and a symlink to
    ``x`` are all ``x``). Each refusal is a :class:`ConfigError` naming both paths, raised
    before the command spends time on its analysis.
    """
    given = [(opt, path) for opt, path in outputs.items() if path is not None]
    read = [(opt, path) for opt, path in (inputs or {}).items() if path is not None]
    for i, (option, path) in enumerate(given):
        for other, other_path in read:
            # A directory input (a chDB store) holds files no output may replace.
            if Path(other_path).is_dir() and _within(path, other_path):
                role = "the store" if other == "--db" else f"the input {other}"
                raise ConfigError(
                    f"{option} {path} is inside {role} {other_path}; writing there would "
                    f"damage it: give {option} a path outside it"
                )
        _check_destination(option, path)
        for other, other_path in read + given[:i]:
            if _same_file(path, other_path):
                role = "an input," if (other, other_path) in read else "the output"
                role = "the store" if other == "--db" else role
                raise ConfigError(
                    f"{option} {path} is {role} {other} {other_path}"
                    + _resolved_note(path, other_path)
                    + f"; writing it would destroy that file: give {option} another path"
                )
        # Not one of this command's inputs, but data tracekit reads (another store, a
        # trace file): an output never replaces it either.
        held = _data_kind(Path(path))
        if held is not None:
            raise ConfigError(
                f"{option} {path} holds {held}, which tracekit reads and does not write; "
                f"writing it would destroy that data: give {option} another path"
            )


def write_output(path: str | Path, text: str, *, option: str, inputs: Paths | None = None) -> Path:
    """Write ``text`` to ``path`` whole or not at all; returns the path.

    The text goes to a temporary file in the same directory, which then replaces ``path``
    (``os.replace``): a failure half-way leaves the previous file as it was and no
    temporary one behind. A symlink is followed (its target is replaced, the link stays);
    a device or pipe (``/dev/stdout``) is written in place. The mode of a replaced file is
    kept. Outputs that are ``inputs`` or cannot be written are a one-line
    :class:`ConfigError` naming ``option``.
    """
    check_outputs({option: path}, inputs)
    target = Path(path).resolve()
    try:
        _replace(target, text)
    except OSError as exc:
        raise ConfigError(
            f"{option} {path}: cannot write it ({exc.strerror or exc}); "
            "give a path in a writable directory"
        ) from exc
    return Path(path)


def claim_output_dir(path: Path, *, option: str, owner: str) -> Path:
    """Create or reuse ``path`` as a directory that ``owner`` (a command) fills with files.

    A new or empty directory is claimed by writing :data:`OUTPUT_DIR_MARKER` into it; one
    holding that marker was claimed before and is reused (its files are the owner's to
    replace). Anything else — a directory with someone's store or traces, a file, a path
    that cannot be created or written — is a one-line :class:`ConfigError`, and nothing in
    it is touched.
    """
    marker = path / OUTPUT_DIR_MARKER
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"{option} {path} is a file, not a directory; give a new or empty directory"
        )
    if path.is_dir() and not marker.is_file():
        foreign = _foreign_entries(path)
        if foreign:
            more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
            raise ConfigError(
                f"{option} {path} holds {foreign[0]}{more}, which {owner} did not write and "
                f"would overwrite or mix with its own; give a new or empty directory"
            )
    try:
        path.mkdir(parents=True, exist_ok=True)
        marker.write_text(
            f"Written by `{owner}`, which may write here again (and replace its files).\n",
            encoding="utf-8",
        )
    except OSError as exc:
        raise ConfigError(
            f"{option} {path}: cannot create or write the directory ({exc.strerror or exc}); "
            "give a new or empty directory you can write to"
        ) from exc
    return path


def _foreign_entries(directory: Path) -> list[Path]:
    """Everything in ``directory``, stores first, then trace files: the first is named."""

    def rank(p: Path) -> tuple[int, str]:
        kind = 0 if p.suffix in (".duckdb", ".wal") else 1 if p.suffix in (".jsonl", ".json") else 2
        return (kind, p.name)

    return sorted(directory.iterdir(), key=rank)


def _check_destination(option: str, path: str | Path) -> None:
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{option} {path} is a directory; give a file path, e.g. inside it")
    parent = out.resolve().parent
    if not parent.exists():
        raise ConfigError(
            f"{option} {path}: the directory {parent} does not exist; create it or give "
            "another path"
        )
    if not parent.is_dir():
        raise ConfigError(f"{option} {path}: {parent} is not a directory; give another path")


_SNIFF_BYTES = 4096
_TRACE_KEYS = (b'"resourceSpans"', b'"traceEvents"', b'"schemaVersion"', b'"traceID"')
"""Keys at the head of the trace formats tracekit ingests (OTLP, Kineto, Jaeger)."""


def _data_kind(path: Path) -> str | None:
    """What data an existing file at ``path`` holds that no output may replace: a DuckDB
    store, a compressed file, or a trace or profile (OTLP, Kineto, Jaeger JSON); None for
    anything else (an earlier report, an empty file, a device, no file)."""
    try:
        if not path.is_file():
            return None
        with path.open("rb") as fh:
            head = fh.read(_SNIFF_BYTES)
    except OSError:
        return None
    if head[8:12] == b"DUCK":
        return "a DuckDB database"
    if head[:2] == b"\x1f\x8b":
        return "gzip-compressed data"
    if head.lstrip()[:1] in (b"{", b"[") and any(k in head for k in _TRACE_KEYS):
        return "traces (JSON)"
    return None


def _within(path: str | Path, directory: str | Path) -> bool:
    """``path`` is ``directory`` or lies under it, once both are resolved."""
    inner, outer = Path(path).resolve(), Path(directory).resolve()
    return inner == outer or outer in inner.parents


def _same_file(a: str | Path, b: str | Path) -> bool:
    pa, pb = Path(a), Path(b)
    if pa.resolve() == pb.resolve():
        return True
    try:
        return os.path.samefile(pa, pb)  # hard links
    except OSError:
        return False


def _resolved_note(a: str | Path, b: str | Path) -> str:
    resolved = Path(a).resolve()
    return "" if str(a) == str(b) == str(resolved) else f" (both are {resolved})"


def _replace(target: Path, text: str) -> None:
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
        regular = stat.S_ISREG(target.stat().st_mode)
    except FileNotFoundError:
        mode, regular = None, True
    if not regular:
        # A device or a pipe cannot be replaced, only written (and nothing is half-kept).
        with target.open("w", encoding="utf-8") as fh:
            fh.write(text)
        return
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    # 0o666 under the umask, as open() would create it; a replaced file keeps its mode.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
