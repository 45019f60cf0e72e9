"""One unary gRPC call over HTTP/2 cleartext on a unix socket, in pure Python.

Why: the exporter makes exactly one kind of gRPC call, the kubelet's PodResources ``List()``,
every few seconds on a local unix socket. grpcio would do it at a cost of ~17.5 MiB of
resident memory (its C core, shared objects and threads) on every GPU node, more than half
of the exporter's whole budget (docs/benchmarks.md). This module does the same call in a few
hundred lines of stdlib: one short-lived HTTP/2 connection per call.

The exchange, per the gRPC "HTTP/2 protocol" spec (grpc/grpc doc/PROTOCOL-HTTP2.md) and
RFC 9113 (HTTP/2):

1. the client connection preface, our SETTINGS (no server push, a flow-control window big
   enough for the largest accepted answer, a header list limit) and a connection-level
   WINDOW_UPDATE to the same size;
2. a HEADERS frame opening stream 1: ``POST <method>``, ``content-type: application/grpc``,
   ``te: trailers``, ``grpc-timeout`` (so the server gives up when we do);
3. one DATA frame with the length-prefixed request message and END_STREAM;
4. then we read: the server's SETTINGS (acknowledged), PINGs (answered), the response
   HEADERS, DATA frames (the length-prefixed answer) and the trailers with ``grpc-status``
   and ``grpc-message``; or a trailers-only answer; or RST_STREAM / GOAWAY.

Failures map to gRPC status code names as grpcio reports them, so messages read the same:
no connection, a peer that does not speak HTTP/2, or a connection that ends early are
``UNAVAILABLE``; the deadline passing is ``DEADLINE_EXCEEDED``; an answer over the receive
limit is ``RESOURCE_EXHAUSTED``; a malformed answer is ``INTERNAL``; a server's own status
is passed through. Not supported, because the kubelet's server never needs them here:
compressed messages (we advertise no ``grpc-accept-encoding``), streaming calls, TLS.

Every read and write is bounded by the call's deadline (a monotonic clock), so a kubelet
that accepts and then hangs costs one deadline, never a stuck thread. :meth:`UnixGrpcCall.cancel`
closes the socket from another thread and the call fails at once.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable
from urllib.parse import unquote

from gpuscope.exporter.kubernetes.podresources import hpack

__all__ = ["STATUS_NAMES", "GrpcError", "UnixGrpcCall", "check_limits", "unary_call"]

#: gRPC status codes by number (grpc/grpc doc/statuscodes.md).
STATUS_NAMES: dict[int, str] = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}

# HTTP status -> gRPC status when a server answers with something other than 200
# (PROTOCOL-HTTP2.md and grpc's doc/http-grpc-status-mapping.md).
_HTTP_TO_GRPC = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE",
                 503: "UNAVAILABLE", 504: "UNAVAILABLE"}

# RST_STREAM error code -> gRPC status (same document): REFUSED_STREAM means "not processed,
# try again", CANCEL is a cancellation, ENHANCE_YOUR_CALM too many requests; the rest INTERNAL.
_RST_TO_GRPC = {0x7: "UNAVAILABLE", 0x8: "CANCELLED", 0xB: "RESOURCE_EXHAUSTED",
                0xC: "PERMISSION_DENIED"}

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types and flags (RFC 9113 section 6).
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
_PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# SETTINGS identifiers we send.
_SETTINGS_ENABLE_PUSH, _SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4
_SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

_DEFAULT_WINDOW = 65_535  # RFC 9113 6.9.2: every window starts here
_MAX_WINDOW = 2**31 - 1
_MAX_FRAME = 16_384  # we never raise SETTINGS_MAX_FRAME_SIZE, so no peer frame may be bigger
_MAX_HEADER_LIST = 65_536
_STREAM = 1  # the one stream of the call: client streams are odd, the first is 1
_RECV_CHUNK = 65_536



class GrpcError(Exception):
    """A failed call: ``code`` is the gRPC status name, ``details`` the one-line reason."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


class _Deadline:
    def __init__(self, timeout: float, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._end = clock() + timeout

    def remaining(self) -> float:
        left = self._end - self._clock()
        if left <= 0:
            raise GrpcError("DEADLINE_EXCEEDED", "Deadline Exceeded")
        return left


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") \
        + payload


def _grpc_timeout(seconds: float) -> str:
    # PROTOCOL-HTTP2.md: at most 8 ASCII digits and a unit. Milliseconds, rounded up so the
    # server never gives up before we do; 99,999,999 ms is over a day.
    return f"{min(99_999_999, max(1, int(seconds * 1000 + 0.999)))}m"


def check_limits(timeout: float, max_receive_bytes: int) -> None:
    """Raise ``ValueError`` unless the deadline (seconds) and the answer limit (bytes) are
    positive; for callers that want a bad value refused before the first call."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if max_receive_bytes <= 0:
        raise ValueError(f"max_receive_bytes must be > 0, got {max_receive_bytes}")


class UnixGrpcCall:
    """One unary call; :meth:`run` performs it, :meth:`cancel` aborts it from another thread.

    ``socket_path``: the server's unix socket. ``method``: ``/<package>.<Service>/<Method>``.
    ``request``: the serialized request message. ``timeout``: the call's deadline, seconds.
    ``max_receive_bytes``: the largest answer message accepted. ``authority``: the
    ``:authority`` pseudo-header (grpc-go clients send ``localhost`` for unix sockets).
    ``clock``: a monotonic clock in seconds (the deadline).
    """

    def __init__(
        self,
        socket_path: str,
        method: str,
        request: bytes,
        timeout: float,
        max_receive_bytes: int,
        authority: str = "localhost",
        user_agent: str = "gpuscope",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_limits(timeout, max_receive_bytes)
        self.socket_path = socket_path
        self.method = method
        self.request = request
        self.timeout = timeout
        self.max_receive_bytes = max_receive_bytes
        self.authority = authority
        self.user_agent = user_agent
        self._clock = clock
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._cancelled = False
        # Per connection, so set afresh by run(): bytes received but not yet framed, and the
        # HPACK decoder whose dynamic table follows the server's.
        self._buffer = bytearray()
        self._decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_LIST)

    def cancel(self) -> None:
        """Abort the call: the socket is shut down and :meth:`run` raises ``CANCELLED``."""
        with self._lock:
            self._cancelled = True
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: nothing to wake
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv()

    def run(self) -> bytes:
        """Make the call and return the answer message's bytes; raises :class:`GrpcError`."""
        deadline = _Deadline(self.timeout, self._clock)
        self._buffer = bytearray()
        self._decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_LIST)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._lock:
            if self._cancelled:
                sock.close()
                raise GrpcError("CANCELLED", "call cancelled")
            self._sock = sock
        try:
            try:
                sock.settimeout(deadline.remaining())
                sock.connect(self.socket_path)
            except TimeoutError as error:
                raise GrpcError("DEADLINE_EXCEEDED", "Deadline Exceeded") from error
            except OSError as error:
                raise self._unavailable(f"cannot connect to {self.socket_path}: "
                                        f"{error.strerror or error}") from error
            self._send(sock, deadline, self._opening())
            answer = self._exchange(sock, deadline)
            # A polite goodbye; the answer is already in hand, so failures don't matter.
            with contextlib.suppress(OSError):
                sock.sendall(_frame(_GOAWAY, 0, 0, struct.pack(">II", _STREAM, 0)))
            return answer
        finally:
            with self._lock:
                self._sock = None
            sock.close()

    # --- sending ---------------------------------------------------------------------------

    def _opening(self) -> bytes:
        window = min(_MAX_WINDOW, max(_DEFAULT_WINDOW, self.max_receive_bytes + 1024))
        settings = struct.pack(">HIHIHI", _SETTINGS_ENABLE_PUSH, 0,
                               _SETTINGS_INITIAL_WINDOW_SIZE, window,
                               _SETTINGS_MAX_HEADER_LIST_SIZE, _MAX_HEADER_LIST)
        headers = hpack.encode([
            (":method", "POST"),
            (":scheme", "http"),
            (":path", self.method),
            (":authority", self.authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", _grpc_timeout(self.timeout)),
            ("user-agent", self.user_agent),
        ])
        if len(headers) > _MAX_FRAME:
            raise GrpcError("INTERNAL", "request headers too large")
        message = b"\x00" + len(self.request).to_bytes(4, "big") + self.request
        out = [_PREFACE, _frame(_SETTINGS, 0, 0, settings)]
        if window > _DEFAULT_WINDOW:
            out.append(_frame(_WINDOW_UPDATE, 0, 0, (window - _DEFAULT_WINDOW).to_bytes(4, "big")))
        out.append(_frame(_HEADERS, _END_HEADERS, _STREAM, headers))
        # The request fits the peer's initial stream window (65,535 bytes) and one frame for
        # every message this module is used for (List's request is empty).
        if len(message) > _MAX_FRAME:
            raise GrpcError("INTERNAL", "request message too large for one frame")
        out.append(_frame(_DATA, _END_STREAM, _STREAM, message))
        return b"".join(out)

    def _send(self, sock: socket.socket, deadline: _Deadline, data: bytes) -> None:
        try:
            sock.settimeout(deadline.remaining())
            sock.sendall(data)
        except TimeoutError as error:
            raise GrpcError("DEADLINE_EXCEEDED", "Deadline Exceeded") from error
        except OSError as error:
            raise self._unavailable(f"connection lost while sending: {error}") from error

    # --- receiving -------------------------------------------------------------------------

    def _read(self, sock: socket.socket, deadline: _Deadline, n: int) -> bytes:
        buffer = self._buffer
        while len(buffer) < n:
            try:
                sock.settimeout(deadline.remaining())
                chunk = sock.recv(_RECV_CHUNK)
            except TimeoutError as error:
                raise GrpcError("DEADLINE_EXCEEDED", "Deadline Exceeded") from error
            except OSError as error:
                raise self._unavailable(f"connection lost: {error}") from error
            if not chunk:
                raise self._unavailable("connection closed by the server")
            buffer += chunk
        data = bytes(buffer[:n])
        del buffer[:n]
        return data

    def _read_frame(self, sock: socket.socket, deadline: _Deadline) -> tuple[int, int, int, bytes]:
        header = self._read(sock, deadline, 9)
        length = int.from_bytes(header[:3], "big")
        kind, flags = header[3], header[4]
        stream = int.from_bytes(header[5:9], "big") & 0x7FFF_FFFF
        if length > _MAX_FRAME:
            # Also what a non-HTTP/2 peer looks like: "HTTP/1.1 ..." reads as a huge frame.
            raise self._unavailable(f"not an HTTP/2 answer (frame of {length} bytes, type "
                                    f"{kind})")
        return kind, flags, stream, self._read(sock, deadline, length)

    def _exchange(self, sock: socket.socket, deadline: _Deadline) -> bytes:
        response_headers: dict[str, str] | None = None
        body = bytearray()
        block = bytearray()  # a header block being assembled from HEADERS + CONTINUATION
        in_block = False
        block_end_stream = False
        first_frame = True
        while True:
            kind, flags, stream, payload = self._read_frame(sock, deadline)
            if first_frame and kind != _SETTINGS:
                # RFC 9113 3.4: the server's preface is a SETTINGS frame.
                raise self._unavailable("not an HTTP/2 server (no SETTINGS first)")
            first_frame = False
            if in_block and (kind != _CONTINUATION or stream != _STREAM):
                raise self._internal("header block interrupted by another frame")
            if kind == _SETTINGS:
                if stream != 0 or (flags & _ACK and payload) or len(payload) % 6:
                    raise self._unavailable("malformed SETTINGS frame")
                if not flags & _ACK:
                    self._send(sock, deadline, _frame(_SETTINGS, _ACK, 0))
            elif kind == _PING:
                if len(payload) != 8 or stream != 0:
                    raise self._unavailable("malformed PING frame")
                if not flags & _ACK:
                    self._send(sock, deadline, _frame(_PING, _ACK, 0, payload))
            elif kind == _GOAWAY:
                if len(payload) < 8:
                    raise self._unavailable("malformed GOAWAY frame")
                last_stream, code = struct.unpack(">II", payload[:8])
                if (last_stream & 0x7FFF_FFFF) < _STREAM:
                    # Our stream was not processed; anything higher may still complete.
                    raise self._unavailable(f"server sent GOAWAY (error code {code:#x})")
            elif kind == _PUSH_PROMISE:
                raise self._unavailable("server push, which we disabled")
            elif stream != _STREAM:
                continue  # WINDOW_UPDATE, PRIORITY, unknown types on stream 0 or others
            elif kind == _RST_STREAM:
                code = int.from_bytes(payload[:4], "big") if len(payload) == 4 else 0x1
                raise GrpcError(_RST_TO_GRPC.get(code, "INTERNAL"),
                                f"stream reset by the server (error code {code:#x})")
            elif kind in (_HEADERS, _CONTINUATION):
                if kind == _HEADERS:
                    block_end_stream = bool(flags & _END_STREAM)
                    block += self._unpad(flags, payload, priority=True)
                elif not in_block:
                    raise self._internal("CONTINUATION without HEADERS")
                else:
                    block += payload
                if len(block) > _MAX_HEADER_LIST:
                    raise self._internal("header block too large")
                in_block = not flags & _END_HEADERS
                if in_block:
                    continue
                try:
                    fields = self._decoder.decode(bytes(block))
                except hpack.HpackError as error:
                    raise self._internal(f"bad header block: {error}") from error
                block.clear()
                headers = {name: value for name, value in fields}
                if response_headers is None:
                    response_headers = headers
                    self._check_response(headers)
                    if block_end_stream:  # trailers-only: an error status without a body
                        return self._finish(headers, body)
                elif block_end_stream:
                    return self._finish(headers, body)
                else:
                    raise self._internal("second header block without END_STREAM")
            elif kind == _DATA:
                if response_headers is None:
                    raise self._internal("DATA before response headers")
                body += self._unpad(flags, payload, priority=False)
                if len(body) > self.max_receive_bytes + 5:
                    raise GrpcError("RESOURCE_EXHAUSTED",
                                    f"Received message larger than max ({len(body) - 5} vs. "
                                    f"{self.max_receive_bytes})")
                if flags & _END_STREAM:
                    raise self._internal("server ended the stream without trailers")

    def _unpad(self, flags: int, payload: bytes, priority: bool) -> bytes:
        start, end = 0, len(payload)
        if flags & _PADDED:
            if not payload:
                raise self._internal("padded frame without a pad length")
            start, end = 1, len(payload) - payload[0]
        if priority and flags & _PRIORITY_FLAG:
            start += 5  # stream dependency (4) and weight (1), ignored
        if end < start:
            raise self._internal("frame padding longer than the frame")
        return payload[start:end]

    def _check_response(self, headers: dict[str, str]) -> None:
        status = headers.get(":status", "")
        if status != "200":
            code = _HTTP_TO_GRPC.get(int(status) if status.isdigit() else 0, "UNKNOWN")
            raise GrpcError(code, f"HTTP status {status or 'missing'} from the server")
        content_type = headers.get("content-type", "")
        if not content_type.startswith("application/grpc"):
            raise GrpcError("UNKNOWN", f"content-type {content_type!r} is not gRPC")

    def _finish(self, trailers: dict[str, str], body: bytearray) -> bytes:
        raw_status = trailers.get("grpc-status")
        if raw_status is None or not raw_status.isdigit():
            raise self._internal(f"trailers without a valid grpc-status ({raw_status!r})")
        code = int(raw_status)
        if code != 0:
            message = unquote(trailers.get("grpc-message", ""), errors="replace")
            raise GrpcError(STATUS_NAMES.get(code, "UNKNOWN"), message or f"status {code}")
        if len(body) < 5:
            raise self._internal(f"answer of {len(body)} bytes has no message")
        compressed = body[0]
        length = int.from_bytes(body[1:5], "big")
        if compressed:
            raise self._internal("compressed message, but no compression was offered")
        if length > self.max_receive_bytes:
            raise GrpcError("RESOURCE_EXHAUSTED", f"Received message larger than max "
                            f"({length} vs. {self.max_receive_bytes})")
        if len(body) != 5 + length:
            raise self._internal(f"answer is {len(body) - 5} bytes, its prefix says {length}")
        return bytes(body[5:])

    def _unavailable(self, details: str) -> GrpcError:
        if self._cancelled:
            return GrpcError("CANCELLED", "call cancelled")
        return GrpcError("UNAVAILABLE", details)

    def _internal(self, details: str) -> GrpcError:
        return GrpcError("INTERNAL", details)


def unary_call(
    socket_path: str,
    method: str,
    request: bytes,
    timeout: float,
    max_receive_bytes: int = 4 * 1024 * 1024,
) -> bytes:
    """Make one unary call on a new connection and return the answer message's bytes."""
    return UnixGrpcCall(socket_path, method, request, timeout, max_receive_bytes).run()
