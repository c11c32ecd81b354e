"""Raw HTTP/1.1 on a socket for the receiver's wire tests: requests as bytes, a reader
that parses responses itself (status line, headers, Content-Length / chunked /
until-close bodies), spans described once and encoded as OTLP/JSON or protobuf, and
a peak-RSS probe."""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

JSON = "application/json"
PROTOBUF = "application/x-protobuf"
KINDS = ["UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER"]
EPOCH_NS = 1_767_225_600 * 1_000_000_000


# --- requests -----------------------------------------------------------------------


def request(
    body: bytes = b"",
    *,
    content_type: str | None = PROTOBUF,
    method: str = "POST",
    path: str = "/v1/traces",
    headers: Sequence[tuple[str, str]] = (),
    chunks: Sequence[bytes] | None = None,
    length: int | None = None,
) -> bytes:
    """One request as bytes: ``chunks`` sends the body chunked (those chunks, then the
    last-chunk); otherwise Content-Length is ``length`` (default: the body's)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    lines.extend(f"{k}: {v}" for k, v in headers)
    if chunks is not None:
        lines.append("Transfer-Encoding: chunked")
        payload = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks if c) + b"0\r\n\r\n"
    else:
        lines.append(f"Content-Length: {len(body) if length is None else length}")
        payload = body
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# --- responses ----------------------------------------------------------------------


@dataclass
class Response:
    status: int
    reason: str
    version: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def json(self) -> Any:
        return json.loads(self.body)


class ProtocolViolation(AssertionError):
    """The server's bytes are not a well-formed HTTP/1.1 response."""


class Closed(AssertionError):
    """The server closed (or reset) the connection before a complete response."""

    def __init__(self, message: str, got: bytes) -> None:
        super().__init__(f"{message}; bytes received: {got[:300]!r}")
        self.got = got


class Conn:
    """A client connection with its own read buffer (several responses may be read)."""

    def __init__(self, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.eof = False

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def _fill(self, deadline: float) -> bool:
        """Read more; False at EOF (or a reset). A socket timeout past ``deadline`` raises."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete response in time; buffered: {self.buf[:300]!r}")
        self.sock.settimeout(min(left, self.timeout))
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        except TimeoutError:
            raise TimeoutError(f"no complete response in time; got {self.buf[:300]!r}") from None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    def _line(self, deadline: float) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > 65536:
                raise ProtocolViolation(f"a line over 64 KiB: {self.buf[:200]!r}")
            if not self._fill(deadline):
                raise Closed("connection closed inside a response line", self.buf)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exactly(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            if not self._fill(deadline):
                raise Closed(
                    f"connection closed {n - len(self.buf)} bytes short of a body", self.buf
                )
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read_response(
        self, timeout: float | None = None, *, informational: bool = False
    ) -> Response:
        """The next response (a 1xx is skipped unless ``informational``); :class:`Closed`
        when none comes."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if not self.buf and not self._fill(deadline):
                raise Closed("connection closed without a response", b"")
            status_line = self._line(deadline).decode("latin-1")
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise ProtocolViolation(f"not an HTTP/1.x status line: {status_line!r}")
            if len(parts[1]) != 3:
                raise ProtocolViolation(f"status code not 3 digits: {status_line!r}")
            headers: list[tuple[str, str]] = []
            while line := self._line(deadline):
                name, sep, value = line.decode("latin-1").partition(":")
                if not sep or not name or name != name.strip():
                    raise ProtocolViolation(f"bad header line {line!r}")
                headers.append((name, value.strip()))
            status = int(parts[1])
            response = Response(status, parts[2] if len(parts) > 2 else "", parts[0], headers, b"")
            if 100 <= status < 200:
                if informational:
                    return response
                continue
            response.body = self._body(response, deadline)
            return response

    def _body(self, response: Response, deadline: float) -> bytes:
        te = (response.header("transfer-encoding") or "").lower()
        lengths = {v for k, v in response.headers if k.lower() == "content-length"}
        if response.status in (204, 304):
            return b""
        if "chunked" in te:
            if lengths:
                raise ProtocolViolation("both Content-Length and chunked")
            out = b""
            while True:
                size_line = self._line(deadline).split(b";", 1)[0].strip()
                try:
                    size = int(size_line, 16)
                except ValueError:
                    raise ProtocolViolation(f"bad chunk size {size_line!r}") from None
                if size == 0:
                    while self._line(deadline):  # trailers
                        pass
                    return out
                out += self._exactly(size, deadline)
                if self._exactly(2, deadline) != b"\r\n":
                    raise ProtocolViolation("chunk not followed by CRLF")
        if lengths:
            if len(lengths) != 1 or not next(iter(lengths)).isdigit():
                raise ProtocolViolation(f"bad Content-Length {lengths}")
            return self._exactly(int(next(iter(lengths))), deadline)
        # Neither: the body runs to the close, which the response must announce.
        if (response.header("connection") or "").lower() != "close":
            raise ProtocolViolation("a body delimited by nothing on a keep-alive connection")
        while self._fill(deadline):
            pass
        out, self.buf = self.buf, b""
        return out

    def closed_by_server(self, within: float) -> bool:
        """True when the server closes the connection within ``within`` seconds (any
        bytes it sends first are kept in ``buf``); False if it is still open then."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                if not self._fill(deadline):
                    return True
            except TimeoutError:
                return False
        return False


def exchange(port: int, raw: bytes, timeout: float = 10.0) -> Response:
    with Conn(port, timeout) as conn:
        conn.send(raw)
        return conn.read_response()


# --- spans ----------------------------------------------------------------------------


@dataclass
class SpanSpec:
    trace_id: str
    span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    parent_span_id: str | None = None
    attributes: dict[str, Any] = field(default_factory=dict)

    def row(self) -> tuple[Any, ...]:
        """What ``ROW_SQL`` selects for this span (attributes decoded to a dict)."""
        return (
            self.trace_id,
            self.span_id,
            self.parent_span_id,
            self.name,
            KINDS[self.kind],
            self.start_ns,
            self.end_ns,
            self.attributes,
        )


ROW_SQL = (
    "SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, attributes, "
    "resource_attributes FROM spans ORDER BY trace_id, span_id"
)

RESOURCE = {"service.name": "wire-test", "service.version": "v9"}


def make_spans(n: int, tag: int) -> list[SpanSpec]:
    """``n`` distinct spans (one trace per ``tag``): a root and its children, with every
    scalar attribute type and a unicode name."""
    trace = f"{tag:08x}" + "5a" * 12
    out = []
    for i in range(n):
        start = EPOCH_NS + tag * 10_000_000_000 + i * 1_000_003
        out.append(
            SpanSpec(
                trace_id=trace,
                span_id=f"{tag:04x}{i + 1:012x}",
                name=f"op-{tag}-{i} ✓",
                kind=2 if i == 0 else 1 + i % 5,
                start_ns=start,
                end_ns=start + 777_001 + i,
                parent_span_id=None if i == 0 else f"{tag:04x}{1:012x}",
                attributes={
                    "s": f"value {tag}/{i}",
                    "i": -12345 * (i + 1),
                    "b": i % 2 == 0,
                    "d": 0.25 + i,
                },
            )
        )
    return out


def _json_value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": v}


def json_span(s: SpanSpec) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": s.trace_id,
        "spanId": s.span_id,
        "name": s.name,
        "kind": s.kind,
        "startTimeUnixNano": str(s.start_ns),
        "endTimeUnixNano": str(s.end_ns),
        "attributes": [{"key": k, "value": _json_value(v)} for k, v in s.attributes.items()],
    }
    if s.parent_span_id:
        out["parentSpanId"] = s.parent_span_id
    return out


def json_doc(spans: Sequence[SpanSpec | dict[str, Any]]) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [
                        {"key": k, "value": {"stringValue": v}} for k, v in RESOURCE.items()
                    ]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "wire"},
                        "spans": [s if isinstance(s, dict) else json_span(s) for s in spans],
                    }
                ],
            }
        ]
    }


def json_body(spans: Sequence[SpanSpec | dict[str, Any]]) -> bytes:
    return json.dumps(json_doc(spans)).encode()


def pb_request(spans: Sequence[SpanSpec]) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in RESOURCE.items():
        kv = rs.resource.attributes.add()
        kv.key = k
        kv.value.string_value = v
    ss = rs.scope_spans.add()
    ss.scope.name = "wire"
    for s in spans:
        span = ss.spans.add()
        span.trace_id = bytes.fromhex(s.trace_id)
        span.span_id = bytes.fromhex(s.span_id)
        if s.parent_span_id:
            span.parent_span_id = bytes.fromhex(s.parent_span_id)
        span.name = s.name
        span.kind = s.kind
        span.start_time_unix_nano = s.start_ns
        span.end_time_unix_nano = s.end_ns
        for k, v in s.attributes.items():
            kv = span.attributes.add()
            kv.key = k
            if isinstance(v, bool):
                kv.value.bool_value = v
            elif isinstance(v, int):
                kv.value.int_value = v
            elif isinstance(v, float):
                kv.value.double_value = v
            else:
                kv.value.string_value = v
    return req


def pb_body(spans: Sequence[SpanSpec]) -> bytes:
    return pb_request(spans).SerializeToString()


def gz(data: bytes) -> bytes:
    return gzip.compress(data)


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def pb_field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


# --- memory -----------------------------------------------------------------------------


def _status_kb(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise LookupError(field_name)


@contextlib.contextmanager
def peak_rss_growth() -> Iterator[list[int]]:
    """Yields a list that holds, on exit, the peak RSS growth in bytes over the block.

    The peak is the kernel's high-water mark reset at the start (``clear_refs`` 5), and,
    where that cannot be reset, RSS sampled every millisecond.
    """
    result: list[int] = []
    base = _status_kb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        hwm_reset = _status_kb("VmHWM") <= base + 1024
    except OSError:
        hwm_reset = False
    sampled = [base]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.001):
            sampled[0] = max(sampled[0], _status_kb("VmRSS"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        stop.set()
        sampler.join()
        peak = max(sampled[0], _status_kb("VmHWM") if hwm_reset else 0, _status_kb("VmRSS"))
        result.append((peak - base) * 1024)
