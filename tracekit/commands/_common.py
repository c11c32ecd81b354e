"""The CLI's shared vocabulary: options several commands take, their converters, output.

Each option is declared once here so it means the same in every command: ``--before`` /
``--after`` and ``--version`` name releases (``service.version``) or training runs,
``--service`` / ``--route`` select requests, ``--confidence`` is a two-sided level,
durations use one grammar (:mod:`tracekit.units`). Converters are argparse ``type=``
functions, so a malformed value is a usage error (exit 2) naming the option.

Outputs are written here too: :func:`check_outputs` refuses, before any work, an output
that is an input (the store, a config file) or cannot be a file, and
:func:`write_output` replaces a file atomically; :func:`claim_output_dir` does the same
for a directory a command fills with several files.
"""

from __future__ import annotations

import argparse
import os
import secrets
import stat
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from tracekit import units
from tracekit.errors import ConfigError, UsageError
from tracekit.render import FORMATS, render


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the examples in a command's description as written, shows real defaults."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # "(default: None)" / "(default: False)" tells a newcomer nothing.
        if action.default in (None, False) or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


def add_command(sub: Any, name: str, *, help: str, description: str) -> argparse.ArgumentParser:
    """A subparser whose description (with its example) is printed as written."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, formatter_class=HelpFormatter
    )
    return parser


# --- converters (argparse ``type=``) ---------------------------------------------------


def _converter(fn: Callable[[str], Any], name: str) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return fn(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = name  # argparse names the converter in "invalid <name> value"
    return convert


def duration_type(*, default_unit: str = "s", positive: bool = True) -> Callable[[str], float]:
    """``--window 30s``-style values → seconds (a bare number is ``default_unit``)."""
    return _converter(
        lambda t: units.parse_duration(
            t, default_unit=default_unit, allow_zero=not positive, what=""
        ),
        "duration",
    )


def duration_ms_type(text: str) -> float:
    """``--min-effect 1ms``-style values → milliseconds (a bare number is ms)."""
    return float(_converter(lambda t: units.parse_duration_ms(t, what=""), "duration")(text))


confidence_type: Callable[[str], float] = _converter(
    lambda t: units.parse_confidence(t, what=""), "confidence"
)
"""``0.95`` or ``95%`` → 0.95; outside [0.5, 1) is a usage error."""


def slo_type(text: str) -> Any:
    """``p95<200ms`` → :class:`~tracekit.analysis.autoscale.model.Slo`."""
    from tracekit.analysis.autoscale.model import parse_slo

    return _converter(parse_slo, "slo")(text)


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and a :class:`UsageError`.

    argparse would print the whole usage block and exit; tracekit's rule is one line that
    says what to do, exit code 2 (the CLI's ``main`` turns the error into both).
    """

    def error(self, message: str) -> NoReturn:
        # "argument --window: 'soon': expected …" reads better as "--window 'soon': …".
        if message.startswith("argument ") and ": " in message:
            option, _, rest = message[len("argument ") :].partition(": ")
            option = option.split("/")[-1]
            if rest.startswith(option):
                message = rest
            else:
                message = f"{option} {rest}" if rest.startswith("'") else f"{option}: {rest}"
        raise UsageError(f"{self.prog}: error: {message} (see `{self.prog} --help`)")


# --- option builders --------------------------------------------------------------------


def http_url_type(text: str) -> str:
    """An http(s) URL with a host (``--jaeger-url``): what the report and tables link."""
    from tracekit.render.html.escape import link_url

    if link_url(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL: give the Jaeger UI's base URL, "
            "e.g. http://localhost:16686"
        )
    return text


def add_releases(
    parser: argparse.ArgumentParser, *, what: str = "release", required: bool = True
) -> None:
    """``--before V1 --after V2``: the baseline and the candidate release (or run)."""
    parser.add_argument(
        "--before", required=required, metavar="V1", help=f"baseline {what} (service.version)"
    )
    parser.add_argument(
        "--after", required=required, metavar="V2", help=f"candidate {what} (service.version)"
    )


def add_version(
    parser: argparse.ArgumentParser,
    *,
    help: str,
    dest: str = "version",
    multiple: bool = False,
) -> None:
    """``--version V``: always a release label (``service.version``); ``help`` says its role."""
    parser.add_argument(
        "--version",
        dest=dest,
        metavar="V",
        action="append" if multiple else "store",
        default=None,
        help=help,
    )


def add_filters(parser: argparse.ArgumentParser, *, route: bool = True) -> None:
    """``--service`` and ``--route``: which requests a command reads."""
    parser.add_argument("--service", metavar="NAME", help="only requests entering this service")
    if route:
        parser.add_argument(
            "--route", metavar="ROUTE", help="only this route (http.route or span name)"
        )


def add_confidence(parser: argparse.ArgumentParser, *, default: float | None = 0.95) -> None:
    """``--confidence``: the two-sided level of every interval the command reports."""
    parser.add_argument(
        "--confidence",
        type=confidence_type,
        default=default,
        help="two-sided confidence of the intervals, in [0.5, 1) (0.95 or 95%%)",
    )


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", default="tracekit.duckdb", metavar="FILE", help="tracekit store (a DuckDB file)"
    )


def add_store(parser: argparse.ArgumentParser, *, window: bool = True) -> None:
    """``--store URL`` (alias ``--db``) and ``--table``; ``window`` adds ``--since/--until``."""
    group = parser.add_argument_group("store (docs/clickhouse.md)")
    group.add_argument(
        "--store",
        "--db",
        dest="db",
        default="tracekit.duckdb",
        metavar="URL",
        help="a DuckDB file, clickhouse://user:password@host:8123/database (the OTel "
        "Collector's ClickHouse exporter table) or chdb:///path (embedded ClickHouse)",
    )
    group.add_argument("--table", default="otel_traces", help="traces table of a ClickHouse store")
    if window:
        group.add_argument(
            "--since",
            type=_converter(_time_ns, "time"),
            metavar="WHEN",
            help="ClickHouse stores: only requests starting at or after WHEN "
            "(a duration back from now, 2h, or an ISO time, 2026-01-01T10:00Z)",
        )
        group.add_argument(
            "--until",
            type=_converter(_time_ns, "time"),
            metavar="WHEN",
            help="ClickHouse stores: only requests starting before WHEN (as --since)",
        )


def _time_ns(text: str) -> int:
    """A duration back from now (``2h``) or an ISO-8601 time → Unix nanoseconds."""
    import datetime as dt
    import time

    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return time.time_ns() - int(units.parse_duration(text, what="--since/--until") * 1e9)
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp()) * 1_000_000_000 + when.microsecond * 1_000


def open_analysis_store(
    args: argparse.Namespace, *, releases: Any = (), trace_prefix: str | None = None
) -> Any:
    """Open ``args.db`` read-only for one analysis command.

    For a ClickHouse store only the requests the command can use are pulled (its
    ``releases``, ``--service``, ``--route``, ``--since/--until``, a trace-id prefix) and
    attributed; the analysis then runs on them as on a DuckDB file.
    """
    from tracekit.analysis.store import open_store
    from tracekit.analysis.store.url import parse_store_url

    since, until = getattr(args, "since", None), getattr(args, "until", None)
    url = parse_store_url(args.db, table=getattr(args, "table", "otel_traces"))
    if not url.is_clickhouse:
        if since is not None or until is not None:
            raise ConfigError(
                "--since/--until select from a ClickHouse store; a DuckDB store holds what "
                "was ingested into it"
            )
        return open_store(url.path, read_only=True)
    from tracekit.analysis.attribution import per_request
    from tracekit.analysis.store.clickhouse import Selection, open_snapshot

    labels = [releases] if isinstance(releases, str) else list(releases or ())
    selection = Selection(
        releases=tuple(str(r) for r in labels if r),
        service=getattr(args, "service", None),
        route=getattr(args, "route", None),
        trace_prefix=trace_prefix,
        since_ns=since,
        until_ns=until,
    )
    store = open_snapshot(url, selection)
    try:
        per_request.refresh(store)
    except BaseException:
        store.close()
        raise
    store.needs_attribution = False
    return store


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table for people, json for scripts (schema in README), markdown for PRs",
    )


# --- output -----------------------------------------------------------------------------


def emit(
    result: Any, fmt: str, renderers: Mapping[str, Callable[[Any], str]] | None = None
) -> None:
    """Render ``result`` in ``fmt`` (by its type unless ``renderers`` is given) to stdout."""
    text = renderers[fmt](result) if renderers is not None else render(result, fmt)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@contextmanager
def progress_bar(
    label: str, *, enabled: bool | None = None
) -> Iterator[Callable[[int, int], None]]:
    """A transient bar on stderr fed by ``(done, total)`` bytes; a no-op off a terminal.

    Long analysis calls take this callback (``progress=``): the analysis reports how far
    it is, the CLI decides how (or whether) to show it.
    """
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), BarColumn(), DownloadColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=max(total, 1))

        yield advance


Paths = Mapping[str, str | Path | None]
"""Option (``--junit``) → the path it was given; ``None`` where the option was not."""

OUTPUT_DIR_MARKER = ".tracekit-output"
"""The file :func:`claim_output_dir` leaves in a directory: tracekit may write there again."""


def store_input(args: argparse.Namespace) -> dict[str, str]:
    """``--db`` as an input for :func:`check_outputs`: the local file or directory it reads."""
    from tracekit.analysis.store.url import parse_store_url

    url = parse_store_url(args.db, table=getattr(args, "table", "otel_traces"))
    local = url.kind in ("duckdb", "chdb") and url.path and url.path != ":memory:"
    return {"--db": url.path} if local else {}


def check_outputs(outputs: Paths, inputs: Paths | None = None) -> None:
    """Refuse outputs that would destroy an input or each other, or that cannot be files.

    Same file means the same file once resolved (``./x``, ``../d/x`` and a symlink to
    ``x`` are all ``x``). Each refusal is a :class:`ConfigError` naming both paths, raised
    before the command spends time on its analysis.
    """
    given = [(opt, path) for opt, path in outputs.items() if path is not None]
    read = [(opt, path) for opt, path in (inputs or {}).items() if path is not None]
    for i, (option, path) in enumerate(given):
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
