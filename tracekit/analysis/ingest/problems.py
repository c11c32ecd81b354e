"""What an ingest found wrong with its input, and the report it hands back.

Every oddity is counted by kind. Some kinds drop data (a malformed line, a span without
ids): they add to :attr:`IngestReport.skipped`, make ``tracekit ingest`` exit 2, and
stop a ``strict`` ingest at once. A parent cycle is repaired (kept, with a root) and
stops a ``strict`` ingest too. The rest (orphans, clock skew, duplicates, …) are
warnings: the data is kept as it came and the analysis copes with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tracekit.errors import IngestError

# --- kinds that drop data ------------------------------------------------------------
MALFORMED = "malformed"
"""A line, document, trace or span that is not valid JSON or lacks a required field."""
UNRECOGNIZED = "unrecognized"
"""A file that is no trace format tracekit reads (skipped; a warning inside directories)."""
SOURCE_ERROR = "source_error"
"""The source said it failed (a Jaeger ``errors`` list, an api_v3 ``error`` object)."""

# --- warnings: data kept ----------------------------------------------------------
EMPTY_FILE = "empty_file"
"""A file with no content, or only whitespace."""
ORPHAN = "orphan"
"""A span whose parent is in neither the input nor the store (a remote or lost parent)."""
DUPLICATE = "duplicate"
"""The same (trace_id, span_id) twice in the input; the first is kept."""
SKEW = "skew"
"""A child that starts before or ends after its parent, the two on different hosts
(clock skew between hosts; :mod:`.skew` says how hosts are told apart)."""
OVERRUN = "overrun"
"""A child outside its parent by more than :data:`.skew.TOLERANCE_NS` on the same host: not
skew (one clock) but, mostly, a server span outliving its client call."""
NEGATIVE_DURATION = "negative_duration"
"""End before start; stored with end = start."""
NO_TIMESTAMPS = "no_timestamps"
"""A span without start and/or end time; stored with NULL times, never invented ones."""
NON_HEX_ID = "non_hex_id"
"""An id that is not hex (``trace-123``, base64); mapped deterministically to hex."""
HUGE_ATTRIBUTE = "huge_attribute"
"""A string attribute longer than the limit; stored truncated."""
LLM_MISSING = "llm_missing"
"""An LLM request span lacks a latency a stage needs, or its token counts; the stage is
not derived, the span is kept (:mod:`.genai`)."""
LLM_INVALID = "llm_invalid"
"""An LLM latency attribute that is not a finite, non-negative number of seconds; ignored."""
LLM_INCONSISTENT = "llm_inconsistent"
"""LLM latencies that contradict each other (queue longer than e2e, queue + prefill past
e2e, …): the stage that does not fit is not derived, the span is kept."""

# --- repaired: data kept, but a strict ingest fails ---------------------------------
CYCLE = "cycle"
"""Spans whose parents lead round in a circle (or a span that is its own parent); the
span that closes it is stored as the root, so the trace is still a request."""

SKIPPING_KINDS = frozenset({MALFORMED, SOURCE_ERROR})
"""Kinds whose problems always drop data (``unrecognized`` does when the file was named)."""

FAILS_STRICT = frozenset({CYCLE})
"""Kinds that drop nothing but stop a ``strict`` ingest: the stored data was repaired."""

MAX_LISTED = 1000
"""Problems kept per kind in :attr:`IngestReport.problems`; all are counted."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the input, located as ``file:line``."""

    where: str
    reason: str
    kind: str
    skipped: int = 0
    """How many lines, traces, spans or files this problem dropped (0 for a warning)."""

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


@dataclass
class IngestReport:
    """What one ingest read, stored and found wrong."""

    files: int = 0
    spans_read: int = 0
    spans_stored: int = 0
    """Spans new to the store (re-ingesting a file stores 0)."""
    traces: int = 0
    """Distinct trace ids the input touched."""
    releases: list[str] = field(default_factory=list)
    """``service.version`` labels of the root spans of the touched traces."""
    problems: list[Problem] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    """Problems by kind (every one, including those not listed)."""
    skipped: int = 0
    """Lines, traces, spans or files dropped; non-zero makes ``tracekit ingest`` exit 2."""
    trace_ids: list[str] = field(default_factory=list)
    stages_derived: int = 0
    """Request spans given queue/prefill/decode stages from their latency attributes."""
    profiles: int = 0
    """Profiles captured on trigger read (docs/profiling.md); ``profiles_stored`` are new."""
    profiles_stored: int = 0
    every_trace: bool = False
    """The store held no spans before: the touched traces are all of its traces (a
    refresh can then rebuild everything without naming them)."""
    seconds: float = 0.0
    requests_attributed: int = 0
    """Requests whose attribution was rebuilt, when the caller refreshed it."""
    stopped: str = ""
    """For a pull from a service: how many traces came back and why the pull stopped."""

    @property
    def skipping_problems(self) -> list[Problem]:
        return [p for p in self.problems if p.skipped]

    def summary_line(self) -> str:
        """``ingested 3 files: 1,234 spans (1,200 new) in 150 traces; releases v1, v2; problems: …``"""
        releases = ", ".join(self.releases) if self.releases else "none labelled"
        problems = ", ".join(f"{n} {kind}" for kind, n in sorted(self.counts.items())) or "none"
        text = (
            f"ingested {_count(self.files, 'file')}: {_count(self.spans_read, 'span')} "
            f"({self.spans_stored:,} new) in {_count(self.traces, 'trace')}; "
            f"releases: {releases}; problems: {problems}"
        )
        if self.profiles:
            text += (
                f"; {self.profiles:,} triggered profile{'s' if self.profiles != 1 else ''}"
                f" ({self.profiles_stored:,} new)"
            )
        if self.stages_derived:
            text += f"; stages derived from attributes for {_count(self.stages_derived, 'request')}"
        if self.skipped:
            text += f"; skipped {self.skipped:,}"
        return text


def _count(n: int, noun: str) -> str:
    """``1 trace``, ``1,234 traces``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


class ProblemLog:
    """Collects problems while an ingest runs; raises at the first skip when strict."""

    def __init__(self, *, strict: bool) -> None:
        self.strict = strict
        self.problems: list[Problem] = []
        self.counts: dict[str, int] = {}
        self.skipped = 0
        self.current_file = ""
        """Display path of the file being read; problems are tallied per file for ``ingest_log``."""
        self.by_file: dict[str, int] = {}
        self._seen: set[tuple[str, str, str]] = set()

    def add(self, where: str, reason: str, kind: str, *, skipped: int = 0, n: int = 1) -> None:
        """Record ``n`` problems of ``kind`` (one listed); ``skipped`` items were dropped."""
        if self.strict and (skipped or kind in FAILS_STRICT):
            raise IngestError(where, reason)
        self.counts[kind] = self.counts.get(kind, 0) + n
        self.skipped += skipped
        self.by_file[self.current_file] = self.by_file.get(self.current_file, 0) + n
        if self.counts[kind] - n < MAX_LISTED:
            self.problems.append(Problem(where, reason, kind, skipped))

    def first_time(self, kind: str, key: str) -> bool:
        """True the first time ``key`` shows up for ``kind`` in the current file."""
        token = (self.current_file, kind, key)
        if token in self._seen:
            return False
        self._seen.add(token)
        return True
