"""tracekit's one exception tree.

::

    TracekitError
    ├── ConfigError       bad configure() arguments, bad budget / HPA / config file
    │   └── UsageError    a command line argparse cannot parse (one line, exit 2)
    ├── StoreError        a store that cannot be opened or read (missing, locked, damaged)
    ├── IngestError       a trace file or Jaeger response that cannot be read
    ├── QueryError        a question the store cannot answer (unknown release, no requests)
    └── InstrumentationError  raised only under pytest; in production it is logged once

Errors from libraries underneath are translated where they enter
(``raise IngestError(...) from exc``). The CLI turns any ``TracekitError`` into one
line on stderr and exit code 2.
"""

from __future__ import annotations


class TracekitError(Exception):
    """Base of every error tracekit raises on purpose."""


class ConfigError(TracekitError):
    """A configuration value (argument, environment variable, file field) is wrong."""


class UsageError(ConfigError):
    """A command line that cannot be parsed; the message names the option."""


class StoreError(TracekitError):
    """The store cannot be opened or read (missing, locked, damaged, of another program)."""


class IngestError(TracekitError):
    """Trace input that cannot be read. ``where`` is ``file:line`` (or ``file``)."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason


class QueryError(TracekitError):
    """The store holds nothing that answers the question (unknown release, no requests)."""


class InstrumentationError(TracekitError):
    """Internal instrumentation failure; surfaced only under pytest."""
