"""The CLI's shared vocabulary: options several commands take, their converters, output.

Each option is declared once here so it means the same in every command: ``--before`` /
``--after`` and ``--version`` name releases (``service.version``) or training runs,
``--service`` / ``--route`` select requests, ``--confidence`` is a two-sided level,
durations use one grammar (:mod:`tracekit.units`). Converters are argparse ``type=``
functions, so a malformed value is a usage error (exit 2) naming the option.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
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
