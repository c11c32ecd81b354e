"""Requests kept by a sampler: the estimated count, and stores tail-sampled without weights.

Every statistic here is weighted by each request's adjusted count (docs/design.md, "Sampling
and weights"), so a store written by a sampler that records weights needs nothing
more. A tail sampler that keeps every slow trace and a fraction of the rest *without*
writing weights leaves fast requests under-counted: every quantile reads high and the
tail looks bigger than it is. :func:`unweighted_tail_sampling` recognises the common
case, the consistent samplers (OTel's ``probabilistic_sampler`` and tail sampling's
``probabilistic`` policy, tracekit's own ``--sample-rest``) that decide from the trace
id's 56 random bits (W3C Trace Context level 2): the requests below the tail then mostly
have random bits under the kept fraction while the slow ones cover the whole range.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tracekit.analysis.cohorts.release import ReleaseData

UNWEIGHTED_TAIL_SAMPLING = "unweighted_tail_sampling"
"""Flag code: the store looks tail-sampled without weights; quantiles are biased."""

_RANDOM_SPAN = float(1 << 56)
MIN_REST = 100
"""Requests in the fastest half needed before the pattern says anything."""
MAX_KEPT_FRACTION = 0.75
"""Nine in ten of the rest have random bits below this fraction: sampled by trace id.
Unsampled, 100 uniform values put their 90th percentile that low with probability < 1e-6."""
MIN_TAIL_ABOVE = 0.25
"""Share of the slowest fifth above that line (10 % expected unsampled): the tail was
kept whatever its trace id. (A head sampler keeps none above it, and is unbiased.)"""


def estimated_requests(rel: ReleaseData) -> float:
    """Summed adjusted counts: how many requests the kept ones stand for."""
    return float(rel.weights.sum())


_ID_LEN = 32
_RANDOM_DIGITS = 14
"""The trace id's last 14 hex digits carry its 56 random bits (W3C Trace Context level 2)."""


def _random_bits(trace_ids: npt.NDArray[np.object_]) -> npt.NDArray[np.float64]:
    """The 56 random bits of each 32-digit hex trace id as a fraction of their range in
    [0, 1); NaN for an id of another length or with a non-hex digit among them
    (Python's ``int(text, 16)``, used before, also took "_", "0x" and blanks there).

    Vectorised: the ids become one byte matrix read as hex digits, instead of a
    Python ``int(text, 16)`` per trace (a million traces: ~0.25 s against ~3 s).
    """
    n = len(trace_ids)
    out = np.full(n, np.nan)
    try:
        texts: list[str] = list(trace_ids)
        joined = "".join(texts)
    except TypeError:  # not all str (ids are text in the store; tests may pass others)
        texts = [str(t) for t in trace_ids]
        joined = "".join(texts)
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    keep = np.flatnonzero(lengths == _ID_LEN)
    if len(keep) == 0:
        return out
    if len(keep) < n:
        joined = "".join(texts[i] for i in keep)
    # "replace" turns a non-ASCII character into one "?" (no hex digit), so every id
    # stays 32 bytes wide and the rows line up.
    raw = np.frombuffer(joined.encode("ascii", "replace"), dtype=np.uint8)
    tail = raw.reshape(len(keep), _ID_LEN)[:, _ID_LEN - _RANDOM_DIGITS :]
    # Byte arithmetic instead of a lookup table: uint8 wraps below '0' / 'a', so one
    # comparison each tells digits and letters a-f (either case) apart from the rest.
    number = tail - np.uint8(ord("0"))
    letter = (tail | np.uint8(0x20)) - np.uint8(ord("a"))
    is_number = number < 10
    digits = np.where(is_number, number, letter + np.uint8(10))
    ok = np.all(is_number | (letter < 6), axis=1)
    # Two digits per byte, seven bytes right-aligned in a big-endian 64-bit word.
    packed = np.zeros((len(keep), 8), dtype=np.uint8)
    packed[:, 1:] = (digits[:, 0::2] << 4) | digits[:, 1::2]
    value = packed.view(">u8").ravel()
    out[keep[ok]] = value[ok] / _RANDOM_SPAN
    return out


CHECK_SAMPLE = 50_000
"""Trace ids read per group at most. The check compares shares (a 90th percentile, the
share above it), which 50,000 ids estimate to within half a percentage point; reading
all of a million-request release's ids cost a quarter of a second per group."""


def _evenly(ids: npt.NDArray[np.object_]) -> npt.NDArray[np.object_]:
    """At most :data:`CHECK_SAMPLE` of ``ids``, evenly spaced (deterministic: trace ids
    are random already, so every stride is as good a sample as another)."""
    if len(ids) <= CHECK_SAMPLE:
        return ids
    return ids[np.linspace(0, len(ids) - 1, CHECK_SAMPLE).astype(np.int64)]


def unweighted_tail_sampling(rel: ReleaseData) -> str | None:
    """Why ``rel``'s quantiles are biased, when its requests look tail-sampled without
    weights; None otherwise (or when weights were written: then they are unbiased)."""
    if rel.n < 2 * MIN_REST or np.any(rel.weights != 1.0):
        return None
    # The fastest half against the slowest fifth: a tail sampler's certain keeps reach
    # well below the kept store's own p95, its weighted keeps fill the fast half.
    fast_t, slow_t = np.quantile(rel.duration_ms, [0.5, 0.8])
    rest_bits = _random_bits(_evenly(rel.trace_ids[rel.duration_ms <= fast_t]))
    rest_bits = rest_bits[~np.isnan(rest_bits)]
    if len(rest_bits) < MIN_REST:
        return None
    kept = float(np.quantile(rest_bits, 0.9))
    if kept > MAX_KEPT_FRACTION:
        return None  # the usual answer (unsampled bits put it near 0.9): no tail to read
    tail_bits = _random_bits(_evenly(rel.trace_ids[rel.duration_ms >= slow_t]))
    tail_bits = tail_bits[~np.isnan(tail_bits)]
    above = int((tail_bits > kept).sum())
    if above < max(5, MIN_TAIL_ABOVE * len(tail_bits)):
        return None
    return (
        f"{rel.label} looks tail-sampled without weights: 9 in 10 of its {len(rest_bits):,} "
        f"fastest-half requests have trace-id random bits under {kept:.0%} of their range, "
        f"while {above} of the {len(tail_bits):,} slowest-fifth ones lie above it. A "
        f"sampler kept every slow trace and about {kept:.0%} of the rest but wrote no "
        "tracekit.sample.weight, so fast requests are under-counted about "
        f"{1 / max(kept, 1e-9):.0f}x and every quantile reads high. Re-collect through "
        "`tracekit collect --keep-slowest PCT --sample-rest FRACTION` (it writes weights)."
    )
