"""Stages derived from an LLM engine's latency attributes: ``queue``, ``prefill``, ``decode``.

vLLM traces a request as one ``llm_request`` SERVER span, from the request's arrival to
its end, whose latencies are attributes in seconds and which has no child spans: left
alone, the whole request reads as ``unattributed``. :func:`derive` gives such a span the
stage children the engine measured, each marked ``tracekit.stage.derived = attributes``.
Which attributes make which stage depends on the layout that wrote the span
(:data:`LAYOUTS`; docs/llm.md has the table, and where each comes from in vLLM's source):

- ``vllm-v1`` (``time_in_model_prefill`` or ``…_decode`` present): queue ←
  ``time_in_queue``, prefill ← ``time_in_model_prefill``, decode ← ``time_in_model_decode``;
- ``vllm-v0`` (otherwise): queue ← ``time_in_queue``, prefill ← ``time_to_first_token`` −
  ``time_in_queue``, decode ← ``e2e`` − ``time_to_first_token``;
- ``vllm-journey`` (``llm_request`` over ``llm_core``, no latency attribute) and
  ``tracekit`` (``generation()``, real stage spans): nothing derived.

Placement: the stages lie end to end around the first token: prefill ends at
``time_to_first_token`` from the span's start, queue ends where prefill begins, decode
begins there. For v0 that puts the queue at the span's start (vLLM v0 counts it from
arrival); for v1 the gap before the queue is the API server's own time (vLLM V1 counts
the queue from the engine core's QUEUED event, not from arrival). The rest of ``e2e``,
and of the span, stays ``unattributed``.

Trust: a stage whose value is missing, not a number, not finite or negative is left out;
so is one that does not fit in ``e2e`` after the stages before it; the span is always
kept. Each is counted (``llm_missing``, ``llm_invalid``, ``llm_inconsistent``), and so
is a request without token counts (TPOT needs the output count). Nothing is derived for
a span that already has a real stage child (tracekit's own ``generation()`` writes them),
and real stage children arriving later replace derived ones. vLLM's journey tracing
keeps its per-state times in span events, which tracekit does not read: nothing can be
derived from it, and each ``llm_core`` span without latency attributes is counted.

Derived span ids come from (trace id, parent span id, stage), so ingesting the same input
again adds nothing. The same step runs over a ClickHouse snapshot before ``tracekit
attribute`` attributes it (:func:`derive` with ``staged=False``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from tracekit import conventions as cv
from tracekit.analysis.ingest import problems as pk
from tracekit.analysis.ingest.problems import ProblemLog
from tracekit.analysis.store import SPAN_COLUMNS, Store

# --- vLLM's span names (its source, not a semantic convention: kept here, not in conventions)
LLM_REQUEST_SPAN: Final = "llm_request"
"""vLLM's request span (SERVER): v0 ``LLMEngine.create_trace_span``, V1
``OutputProcessor.do_tracing``, journey tracing's API-layer span."""
LLM_CORE_SPAN: Final = "llm_core"
"""vLLM journey tracing's engine-core span (INTERNAL, child of ``llm_request``), QUEUED to
FINISHED; its per-state times are span events."""

TRACEKIT: Final = "tracekit"
VLLM_V1: Final = "vllm-v1"
VLLM_V0: Final = "vllm-v0"
VLLM_JOURNEY: Final = "vllm-journey"

_Q = cv.GEN_AI_LATENCY_TIME_IN_QUEUE
_TTFT = cv.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN
_E2E = cv.GEN_AI_LATENCY_E2E
_P = cv.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL
_D = cv.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE


@dataclass(frozen=True)
class Layout:
    """How one engine writes a request span, and which attributes make which stage."""

    name: str
    writer: str
    """Where the engine writes the span (source file and function, or span pair)."""
    recognised_by: tuple[str, ...]
    """Any of these (an attribute; for the journey pair, a child span's name) marks it."""
    stages: tuple[tuple[str, tuple[str, ...]], ...]
    """(stage, measure) in request order; a measure is ``(attribute,)`` or
    ``(minuend, subtrahend)``, both in seconds. Empty: nothing is derived."""


LAYOUTS: Final = (
    Layout(
        TRACEKIT,
        "tracekit.generation(): real queue/prefill/decode spans under the span",
        (cv.GENERATION_FIRST_TOKEN_NS,),
        (),
    ),
    Layout(
        VLLM_V1,
        "vllm/v1/engine/output_processor.py OutputProcessor.do_tracing",
        (_P, _D),
        ((cv.QUEUE, (_Q,)), (cv.PREFILL, (_P,)), (cv.DECODE, (_D,))),
    ),
    Layout(
        VLLM_V0,
        "vllm/engine/llm_engine.py LLMEngine.create_trace_span",
        (_Q, _TTFT, _E2E),
        ((cv.QUEUE, (_Q,)), (cv.PREFILL, (_TTFT, _Q)), (cv.DECODE, (_E2E, _TTFT))),
    ),
    Layout(
        VLLM_JOURNEY,
        "vLLM journey tracing: llm_request (API) + llm_core (engine core), times in events",
        (LLM_CORE_SPAN,),
        (),
    ),
)
"""Every layout tracekit recognises (docs/llm.md has the sources). A span without
tracekit's mark and real stage children is read as the first deriving layout whose
``recognised_by`` it carries, else as v0; a journey ``llm_core`` without latency
attributes is only counted."""

OUTPUT_TOKENS: Final = (cv.GEN_AI_USAGE_COMPLETION_TOKENS, cv.GEN_AI_USAGE_OUTPUT_TOKENS)
PROMPT_TOKENS: Final = (cv.GEN_AI_USAGE_PROMPT_TOKENS, cv.GEN_AI_USAGE_INPUT_TOKENS)

TOLERANCE_NS: Final = 1_000
"""Slack for seconds as floats: an epoch second in a double is good to ~0.25 µs."""

_KEYS = (_Q, _TTFT, _E2E, _P, _D, *PROMPT_TOKENS, *OUTPUT_TOKENS)
_SECONDS = (_Q, _TTFT, _E2E, _P, _D)
_JSON_NUMBER = ("BIGINT", "UBIGINT", "DOUBLE")
"""``json_type`` of a JSON number; a ``VARCHAR`` that casts to one counts too (ClickHouse
keeps attribute values as text)."""
_LATENCY = '"gen_ai.latency.'
"""How a latency attribute's key starts in the attributes' JSON text (a cheap first filter)."""


def _path(key: str) -> str:
    return '$."' + key.replace('"', '\\"') + '"'


_PARAMS: Final[dict[str, Any]] = {
    "paths": [_path(key) for key in _KEYS],
    "mark": _path(cv.GENERATION_FIRST_TOKEN_NS),
    "latency": _LATENCY,
    "derived_path": _path(cv.STAGE_DERIVED),
    "derived": cv.DERIVED_FROM_ATTRIBUTES,
    "derived_key": f'"{cv.STAGE_DERIVED}"',
    "stages": list(cv.LLM_STAGES),
    "core": LLM_CORE_SPAN,
    "request": LLM_REQUEST_SPAN,
    "id_prefix": f"{cv.STAGE_DERIVED}/",
    "internal": "INTERNAL",
    "unset": "UNSET",
}
"""Every value the statements below bind (each takes the ones it names)."""


def _pick(*names: str) -> dict[str, Any]:
    return {n: _PARAMS[n] for n in names}


NOT_DERIVED: Final = (
    "NOT coalesce(list_contains($stages, stage) "
    "AND json_extract_string(attributes, $derived_path) = $derived, false)"
)
"""A ``spans`` filter that keeps the spans the input carried (see :func:`not_derived_params`)."""


def not_derived_params() -> dict[str, Any]:
    """The values :data:`NOT_DERIVED` binds."""
    return _pick("stages", "derived_path", "derived")


def derived_span_id(trace_id: str, parent_span_id: str, stage: str) -> str:
    """The span id of ``stage`` derived under ``parent_span_id``: the same on every ingest
    (what :data:`_INSERT` computes in SQL)."""
    key = f"{_PARAMS['id_prefix']}{trace_id}/{parent_span_id}/{stage}"
    return hashlib.md5(key.encode()).hexdigest()[:16]


# The two inputs a derivation reads: this ingest's stage, or every span of a store (a
# ClickHouse snapshot). Identifiers come from this allow-list; values are parameters.
_SOURCES = {
    True: ("_tk_stage", "s.file_no", "s.file_no, s.lineno, s.seq"),
    False: ("spans", "NULL::INTEGER", "p.trace_id, p.span_id"),
}

_CANDIDATES = """
SELECT * EXCLUDE (j), {values} FROM (
    SELECT p.trace_id, p.span_id, p.start_ns, p.end_ns, p.service_name, p.service_version,
           p.instance_id, p.host_name, p.sample_weight,
           p.resource_attributes::VARCHAR AS resource_attributes, p.source, p.trace_state,
           {file_no} AS file_no, json_extract(p.attributes, $paths) AS j
    FROM {source} s JOIN spans p ON p.trace_id = s.trace_id AND p.span_id = s.span_id
    WHERE contains(s.attributes::VARCHAR, $latency)
      AND p.start_ns IS NOT NULL AND p.end_ns IS NOT NULL
      AND json_type(p.attributes, $mark) IS NULL
      AND NOT EXISTS (SELECT 1 FROM spans k
                      WHERE k.trace_id = p.trace_id AND k.parent_span_id = p.span_id
                        AND k.stage IS NOT NULL)
    ORDER BY {order}
)
"""
"""The input's spans with a latency attribute that need stages: timed, without tracekit's
first-token mark, without a stage child stored under them (a real one: nothing to derive;
a derived one: derived by an earlier ingest of the same span, so counted once). For each of
:data:`_KEYS` (read in one pass over the attributes): its JSON type ``t<i>``, its value as
a double ``v<i>``, its JSON text ``x<i>``."""

_VALUE = (
    "json_type(j[{n}]) AS t{i}, TRY_CAST(j[{n}] ->> '$' AS DOUBLE) AS v{i}, j[{n}]::VARCHAR AS x{i}"
)

_JOURNEY = """
SELECT c.source, c.span_id, {file_no}
FROM {source} s
JOIN spans c ON c.trace_id = s.trace_id AND c.span_id = s.span_id
JOIN spans p ON p.trace_id = c.trace_id AND p.span_id = c.parent_span_id
WHERE s.name = $core AND p.name = $request
  AND NOT contains(c.attributes::VARCHAR, $latency)
  AND NOT EXISTS (SELECT 1 FROM spans o WHERE o.trace_id = p.trace_id
                  AND (o.span_id = p.span_id OR o.parent_span_id = p.span_id)
                  AND contains(o.attributes::VARCHAR, $latency))
ORDER BY {order}
"""
"""Journey tracing's ``llm_core`` spans of the input with no latency attribute on the
pair (nor on a V1 ``llm_request`` beside it): nothing can be derived for them."""

_ANY_DERIVED = """
SELECT EXISTS (SELECT 1 FROM spans WHERE list_contains($stages, stage)
               AND json_extract_string(attributes, $derived_path) = $derived)
"""

_DROP_REPLACED = """
DELETE FROM spans d
WHERE list_contains($stages, d.stage)
  AND json_extract_string(d.attributes, $derived_path) = $derived
  AND EXISTS (SELECT 1 FROM _tk_stage r
              WHERE r.trace_id = d.trace_id AND r.parent_span_id = d.parent_span_id
                AND r.stage IS NOT NULL AND NOT contains(r.attributes, $derived_key))
"""
"""Derived stages whose parent now has a real stage child in this input: they stood in
for it, and go."""

_INSERT = """
INSERT INTO spans ({columns})
SELECT trace_id, span_id, parent_span_id, stage, $internal, start_ns, end_ns, $unset,
       service_name, service_version, instance_id, host_name, stage, time_kind,
       NULL, NULL, sample_weight, attributes::JSON, resource_attributes::JSON, '[]'::JSON,
       source, trace_state
FROM (SELECT *, left(md5($id_prefix || trace_id || '/' || parent_span_id || '/' || stage), 16)
                AS span_id
      FROM _tk_derived) g
WHERE NOT EXISTS (SELECT 1 FROM spans p WHERE p.trace_id = g.trace_id AND p.span_id = g.span_id)
"""
"""The derived stage rows whose key ``spans`` does not hold yet; ids from
(trace, parent, stage) as :func:`derived_span_id` makes them."""

_PARENT_COLUMNS = (
    "service_name",
    "service_version",
    "instance_id",
    "host_name",
    "sample_weight",
    "resource_attributes",
    "source",
    "trace_state",
)
"""What a derived stage takes from its request span: it is part of that request."""

_KINDS = {stage: str(cv.default_time_kind(stage)) for stage in cv.LLM_STAGES}
_ATTRIBUTES = {
    stage: json.dumps(
        {cv.STAGE: stage, cv.TIME_KIND: kind, cv.STAGE_DERIVED: cv.DERIVED_FROM_ATTRIBUTES},
        separators=(",", ":"),
    )
    for stage, kind in _KINDS.items()
}
"""A derived stage span's attributes, as stored: the stage, its kind, the derived mark."""


@dataclass
class Derived:
    """What one :func:`derive` did."""

    requests: int = 0
    """Request spans of the input that were given derived stages."""
    spans_added: int = 0
    """Derived stage spans new to the store (0 when the input was ingested before)."""
    replaced: int = 0
    """Derived stage spans removed because real stage spans arrived under their parent."""


def derive(
    store: Store,
    log: ProblemLog,
    *,
    staged: bool = True,
    per_file: dict[int, int] | None = None,
) -> Derived:
    """Derive stage spans for the input's request spans and store them (see the module doc).

    ``staged``: the input is this ingest's stage (``_tk_stage``), whose spans are already
    in ``spans``; otherwise it is every span of ``store`` (a ClickHouse snapshot).
    Problems go to ``log`` at the span's source and, by file number, to ``per_file``.
    Runs inside the caller's transaction, if any. The arithmetic is over numpy columns:
    a store of vLLM requests has one candidate per request.
    """
    source, file_no, order = _SOURCES[staged]
    out = Derived()
    if staged and store.run(_ANY_DERIVED, _pick("stages", "derived_path", "derived"))[0][0]:
        gone = store.run(_DROP_REPLACED, _pick("stages", "derived_path", "derived", "derived_key"))
        out.replaced = int(gone[0][0]) if gone else 0

    def problem(where: str | None, file: int | None, why: str, kind: str) -> None:
        log.add(where or "", why, kind)
        if per_file is not None and file is not None:
            per_file[file] = per_file.get(file, 0) + 1

    values = ", ".join(_VALUE.format(i=i, n=i + 1) for i in range(len(_KEYS)))
    sql = _CANDIDATES.format(file_no=file_no, values=values, source=source, order=order)
    cols = _fetch(store, sql, _pick("latency", "mark", "paths"))
    # The text filter above also matches a key written inside a value (a request body
    # logged as an attribute): keep the spans that carry a latency key of their own.
    own = np.logical_or.reduce(
        [cols[f"t{i}"].astype(str) != "None" for i, key in enumerate(_KEYS) if key in _SECONDS]
    )
    cols = {name: values[own] for name, values in cols.items()}
    if len(cols["span_id"]):
        plan = _Plan(cols)
        for i, why, kind in plan.problems():
            problem(cols["source"][i], cols["file_no"][i], why, kind)
        frame = plan.rows()
        out.requests = plan.requests
        out.spans_added = _insert(store, frame)
    journey = _JOURNEY.format(file_no=file_no, source=source, order=order)
    for where, span_id, file in store.run(journey, _pick("latency", "core", "request")):
        problem(
            where,
            file,
            f"span {span_id} ({LLM_CORE_SPAN}, vLLM journey tracing) carries no gen_ai.latency.* "
            "attribute: its per-state times are span events, which tracekit does not read; "
            "no stage derived",
            pk.LLM_MISSING,
        )
    return out


Array = npt.NDArray[Any]

_DERIVING = tuple(layout for layout in LAYOUTS if layout.stages)
_STEP_TOKENS, _STEP_INVALID, _STEP_E2E, _STEP_STAGES, _STEP_PLACE = 0, 10, 20, 30, 50
"""Where each check sits in the order problems are listed for one span."""


class _Plan:
    """The stages of a batch of candidate spans, computed column-wise (a row a span).

    Checks run in the order the module doc gives; each problem keeps its row and its
    place in that order, so :meth:`problems` lists them span by span, as found.
    """

    def __init__(self, cols: dict[str, Array]) -> None:
        self.cols = cols
        self._found: list[tuple[int, int, str, str]] = []
        self.present: dict[str, Array] = {}
        self.ns: dict[str, Array] = {}
        """Each key's value in ns (floats: exact below 2^53 ns); NaN when absent or unusable."""
        for i, key in enumerate(_KEYS):
            kind = cols[f"t{i}"].astype(str)
            value = cols[f"v{i}"].astype(float)
            usable = np.isin(kind, (*_JSON_NUMBER, "VARCHAR")) & np.isfinite(value) & (value >= 0)
            self.present[key] = kind != "None"
            self.ns[key] = np.where(usable, np.rint(value * 1e9), np.nan)
        # The first deriving layout whose marks the span carries; v0's reading otherwise.
        self.layout = np.full(len(cols["span_id"]), VLLM_V0, dtype=object)
        named = np.zeros(len(cols["span_id"]), dtype=bool)
        for layout in _DERIVING:
            hit = ~named & np.logical_or.reduce([self.present[k] for k in layout.recognised_by])
            self.layout[hit] = layout.name
            named |= hit
        for i, key in enumerate(_KEYS):
            if key in _SECONDS:
                self._invalid(i, key, self.present[key] & np.isnan(self.ns[key]))
        self._tokens()
        self.duration = (cols["end_ns"] - cols["start_ns"]).astype(float)
        self.bound = self._bound()
        self.lengths = {stage: self._length(k, stage) for k, stage in enumerate(cv.LLM_STAGES)}
        self.kept = self._fit()
        self.lo, self.hi = self._place()
        self.requests = int(np.logical_or.reduce(list(self.kept.values())).sum())

    def problems(self) -> list[tuple[int, str, str]]:
        """(row, reason, kind), span by span in input order, each span's in check order."""
        return [(r, why, kind) for r, _, why, kind in sorted(self._found, key=lambda f: f[:2])]

    def _what(self, r: int) -> str:
        return f"span {self.cols['span_id'][r]} ({self.layout[r]})"

    def _each(self, mask: Array, step: int, say: Callable[[int], tuple[str, str]]) -> None:
        for r in np.flatnonzero(mask):
            why, kind = say(int(r))
            self._found.append((int(r), step, why, kind))

    # --- the checks, in order -----------------------------------------------------------
    def _invalid(self, i: int, key: str, mask: Array) -> None:
        text = self.cols[f"x{i}"]
        self._each(
            mask,
            _STEP_INVALID + i,
            lambda r: (
                f"{self._what(r)}: {key} is {text[r]}, not a finite number of seconds "
                "(>= 0); ignored",
                pk.LLM_INVALID,
            ),
        )

    def _tokens(self) -> None:
        no = [
            np.logical_and.reduce([~self.present[k] for k in g])
            for g in (PROMPT_TOKENS, OUTPUT_TOKENS)
        ]

        def say(r: int) -> tuple[str, str]:
            groups = [
                g
                for g, missing in zip((PROMPT_TOKENS, OUTPUT_TOKENS), no, strict=True)
                if missing[r]
            ]
            listed = " nor ".join(" / ".join(g) for g in groups)
            why = f"{self._what(r)} has no {listed}: TPOT needs the output count; stages kept"
            return why, pk.LLM_MISSING

        self._each(no[0] | no[1], _STEP_TOKENS, say)

    def _bound(self) -> Array:
        """Where the stages must end by: e2e, or the span's end when sooner or e2e is unknown."""
        e2e, duration = self.ns[_E2E], self.duration
        self._each(
            e2e > duration + TOLERANCE_NS,
            _STEP_E2E,
            lambda r: (
                f"{self._what(r)}: {_E2E} {e2e[r] / 1e9:.6f} s is longer than the span "
                f"({duration[r] / 1e9:.6f} s); stages kept within the span",
                pk.LLM_INCONSISTENT,
            ),
        )
        return np.where(np.isnan(e2e), duration, np.fmin(e2e, duration))

    def _length(self, k: int, stage: str) -> Array:
        """The stage's ns by each row's layout; NaN where missing, unusable or negative."""
        out = np.full(len(self.duration), np.nan)
        for layout in _DERIVING:
            measure = dict(layout.stages).get(stage)
            if measure is None:
                continue
            rows = self.layout == layout.name
            absent = np.logical_or.reduce([~self.present[key] for key in measure])
            values = [self.ns[key] for key in measure]
            n = values[0] - sum(values[1:], np.zeros_like(values[0]))
            negative = rows & ~absent & (n < -TOLERANCE_NS)
            step = _STEP_STAGES + 3 * k
            self._each(rows & absent, step, partial(self._missing, stage, measure))
            self._each(negative, step + 1, partial(self._negative, stage, measure, n))
            out = np.where(rows & ~absent & ~negative & ~np.isnan(n), np.maximum(n, 0), out)
        return out

    def _missing(self, stage: str, measure: tuple[str, ...], r: int) -> tuple[str, str]:
        absent = " and ".join(key for key in measure if not self.present[key][r])
        return f"{self._what(r)}: no {stage} without {absent}", pk.LLM_MISSING

    def _negative(self, stage: str, measure: tuple[str, ...], n: Array, r: int) -> tuple[str, str]:
        why = f"{measure[1]} exceeds {measure[0]} by {-n[r] / 1e9:.6f} s; {stage} left out"
        return f"{self._what(r)}: {why}", pk.LLM_INCONSISTENT

    def _over(self, stage: str, before: dict[str, Array], total: Array, r: int) -> tuple[str, str]:
        names = " + ".join([*(s for s, ok in before.items() if ok[r]), stage])
        why = (
            f"{names} ({total[r] / 1e9:.6f} s) exceed {_E2E} ({self.bound[r] / 1e9:.6f} s); "
            f"{stage} left out"
        )
        return f"{self._what(r)}: {why}", pk.LLM_INCONSISTENT

    def _fit(self) -> dict[str, Array]:
        """Which stages fit in the bound after the kept ones before them."""
        kept: dict[str, Array] = {}
        used = np.zeros(len(self.duration))
        for k, stage in enumerate(cv.LLM_STAGES):
            n = self.lengths[stage]
            total = used + n
            fits = ~np.isnan(n) & (total <= self.bound + TOLERANCE_NS)
            over = partial(self._over, stage, dict(kept), total)
            self._each(~np.isnan(n) & ~fits, _STEP_STAGES + 3 * k + 2, over)
            kept[stage] = fits
            used = used + np.where(fits, n, 0)
        return kept

    def _place(self) -> tuple[dict[str, Array], dict[str, Array]]:
        """(start, end) ns from the span's start per stage: end to end, prefill ending at
        the first token (``time_to_first_token``), all inside ``[0, bound]``."""
        length = {s: np.where(self.kept[s], self.lengths[s], 0.0) for s in cv.LLM_STAGES}
        before = length[cv.QUEUE] + length[cv.PREFILL]
        ttft = self.ns[_TTFT]
        late = ttft + TOLERANCE_NS < before
        self._each(
            late,
            _STEP_PLACE,
            lambda r: (
                f"{self._what(r)}: queue + prefill ({before[r] / 1e9:.6f} s) exceed {_TTFT} "
                f"({ttft[r] / 1e9:.6f} s); laid from the span's start",
                pk.LLM_INCONSISTENT,
            ),
        )
        # Without a prefill, nothing ends at the first token: the queue starts the span.
        first = np.where(np.isnan(ttft) | late | ~self.kept[cv.PREFILL], before, ttft)
        # V1's frontend sees the first token after the engine made it, so ttft + decode may
        # pass e2e by that delay: decode then ends at e2e.
        first = np.maximum(before, np.minimum(first, self.bound - length[cv.DECODE]))
        at = first - before
        lo, hi = {}, {}
        for stage in cv.LLM_STAGES:
            lo[stage] = np.maximum(0.0, at)
            hi[stage] = np.minimum(self.bound, lo[stage] + length[stage])
            at = at + length[stage]
        return lo, hi

    # --- the rows -------------------------------------------------------------------------
    def rows(self) -> dict[str, Array]:
        """The derived stage spans as columns for :data:`_INSERT`."""
        parts: list[dict[str, Array]] = []
        start = self.cols["start_ns"].astype(np.int64)
        for stage in cv.LLM_STAGES:
            m = self.kept[stage]
            count = int(m.sum())
            if not count:
                continue
            parts.append(
                {
                    "trace_id": self.cols["trace_id"][m],
                    "parent_span_id": self.cols["span_id"][m],
                    "stage": np.full(count, stage, dtype=object),
                    "time_kind": np.full(count, _KINDS[stage], dtype=object),
                    "attributes": np.full(count, _ATTRIBUTES[stage], dtype=object),
                    "start_ns": start[m] + self.lo[stage][m].astype(np.int64),
                    "end_ns": start[m] + self.hi[stage][m].astype(np.int64),
                    **{c: self.cols[c][m] for c in _PARENT_COLUMNS},
                }
            )
        if not parts:
            return {}
        return {c: np.concatenate([p[c] for p in parts]) for c in parts[0]}


def _fetch(store: Store, sql: str, params: dict[str, Any]) -> dict[str, Array]:
    """A query's columns as numpy arrays: NULL is NaN in a double column, None elsewhere."""
    got = store.con.execute(sql, params).fetchnumpy()
    out: dict[str, Array] = {}
    for name, arr in got.items():
        if isinstance(arr, np.ma.MaskedArray):
            mask = np.ma.getmaskarray(arr)
            if arr.dtype.kind == "f":
                out[name] = arr.filled(np.nan)
            else:
                data = arr.data.astype(object)
                data[mask] = None
                out[name] = data
        else:
            out[name] = np.asarray(arr)
    return out


def _insert(store: Store, frame: dict[str, Array]) -> int:
    """Store the derived rows whose key ``spans`` does not hold yet; how many were new."""
    if not frame:
        return 0
    store.con.register("_tk_derived", frame)
    try:
        got = store.run(
            _INSERT.format(columns=", ".join((*SPAN_COLUMNS, "trace_state"))),
            _pick("id_prefix", "internal", "unset"),
        )
    finally:
        store.con.unregister("_tk_derived")
    return int(got[0][0]) if got else 0
