"""Trace payloads received over the network into the store, attributed at once.

``tracekit collect`` (an OTLP/HTTP receiver) hands each received batch to
:func:`ingest_otlp_payloads`; ``tracekit ingest`` reads files. Both decode with the
same decoders (:mod:`tracekit.analysis.ingest`), so a span gives the same row whichever
way it arrived, and both rebuild the attribution of the traces they touched only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tracekit.analysis.attribution import per_request
from tracekit.analysis.ingest import IngestReport, ingest_documents
from tracekit.analysis.store import Store


def ingest_otlp_payloads(
    store: Store,
    payloads: Iterable[dict[str, Any] | bytes],
    *,
    source: str,
    version: str | None = None,
) -> IngestReport:
    """Store decoded OTLP JSON ``ExportTraceServiceRequest`` payloads and attribute them.

    ``payloads`` are OTLP JSON lines (``bytes``: ingest's fast path) or dicts as
    ``json.loads`` makes them from OTLP/JSON (``resourceSpans``
    at the top; ids as hex strings, as OTLP/JSON writes them; a protobuf request
    converted with hex ids works the same). Spans get exactly the rows
    ``tracekit ingest`` gives the same spans from a file (``trace_state`` and the
    adjusted count in ``sample_weight`` included); ``source`` names the batch
    (``SOURCE:N`` is the N-th payload, where a file's spans say ``file:line``);
    ``version`` labels spans whose resource has no ``service.version``. Duplicates of
    stored spans are kept once. Then ``requests``/``request_stages`` are rebuilt for
    the traces these payloads touched, and no others (a trace whose spans arrive over
    several batches is re-attributed as each one lands).

    Returns the :class:`IngestReport` (problems located as ``SOURCE:N``), with
    ``requests_attributed`` set.
    """
    report = ingest_documents(store, payloads, source=source, version=version)
    if report.trace_ids:
        report.requests_attributed = per_request.refresh(store, report.trace_ids).requests
    return report
