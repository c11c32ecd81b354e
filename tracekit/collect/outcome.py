"""What a receiver gets back for one export request, and what it may ask the collector.

:class:`Outcome` is protocol-neutral; :mod:`.otlp_http` and :mod:`.otlp_grpc` frame it
as HTTP status codes or gRPC status codes. :class:`Receiving` is the part of
:class:`tracekit.collect.server.Collector` they use, so the receivers do not import it.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tracekit.collect.decode import Limits

RETRY_AFTER_S = 1
"""Seconds a client is asked to wait after a retryable refusal (the OTLP exporters honour it)."""

OK = "ok"
BAD = "bad"
"""Rejected whole and not retryable (the body, its limits or its credentials)."""
BUSY = "busy"
"""Retryable: pending spans at their bound."""
UNAVAILABLE = "unavailable"
"""Retryable: the store is not written in time, or the collector is stopping."""


@dataclass
class Outcome:
    """The answer to one export request, before a protocol frames it."""

    kind: str
    message: str = ""
    accepted: int = 0
    rejected: int = 0
    http_status: int = 200


@dataclass(frozen=True)
class Security:
    """Who may write: a bearer token and TLS files (both receivers)."""

    auth_token: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    def allows(self, authorization: str | None) -> bool:
        if self.auth_token is None:
            return True
        if not authorization or authorization[:7].lower() != "bearer ":
            return False
        return hmac.compare_digest(authorization[7:].strip().encode(), self.auth_token.encode())


class Receiving(Protocol):
    """The collector as its receivers see it."""

    limits: Limits
    security: Security
    decode_workers: int
    idle_timeout: float
    body_timeout: float

    @property
    def stopping(self) -> bool: ...

    def receive(self, body: bytes, content_type: str | None, encoding: str | None) -> Outcome: ...

    def refuse(self, kind: str, message: str, http_status: int) -> Outcome: ...

    def reserve_body(self, n: int) -> bool: ...

    def release_body(self, n: int) -> None: ...
