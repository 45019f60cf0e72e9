"""One call to the kubelet's ``v1.PodResourcesLister``: gRPC's unary call over ``h2``.

:class:`ListCall` is ``List()``; :class:`AllocatableCall` is ``GetAllocatableResources()``
(Kubernetes 1.21+, on by default from 1.23); both are a :class:`UnaryCall`.

The HTTP/2 connection (framing, HPACK, flow control, settings) is ``h2``'s; the messages are
the protobuf runtime's, from the stubs generated from ``api.proto`` (``api_pb2``; see
``generate.sh``). What is written here is the part of gRPC a unary call needs on top of them
(the gRPC-over-HTTP/2 protocol, github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md): the
request headers (``grpc-timeout`` among them, so the kubelet gives up when we do), the 5-byte
prefix of a message, the status in the trailers (or in trailers-only headers), and the status
codes' names. It runs in the calling thread on a blocking socket, with the deadline as the
socket's timeout: no event loop, no thread, nothing that outlives the call.

Why not grpclib (the first choice, issue 13): it needs an asyncio event loop per call in a
thread that has none, and its own loop-bridging, for one request and one answer every few
seconds; and it cost 0.7 MiB of the exporter's 45 MiB budget (docs/benchmarks.md, round 5).
The protocol part left here is small and tested against grpc-go (what kubelets run) and
grpcio, including a peer that is not HTTP/2, resets, GOAWAY, restarts and answers > 4 MiB.

Failures are :class:`CallError` with a gRPC status code name, as grpc-go and grpcio name them:
no connection, a peer that does not speak HTTP/2 or a connection lost midway are
``UNAVAILABLE``; the deadline passing is ``DEADLINE_EXCEEDED``; an answer over the receive
limit is ``RESOURCE_EXHAUSTED`` (refused from its length prefix, before it is read); an answer
that is not one message of the method's answer type is ``INTERNAL``; a status sent by the server is
passed through (an older kubelet answers ``GetAllocatableResources()`` with ``UNIMPLEMENTED``);
:meth:`UnaryCall.cancel` (from another thread) makes the call fail at once with ``CANCELLED``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterable
from typing import Generic, TypeVar, cast
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from google.protobuf.message import DecodeError

from gpuscope.exporter.kubernetes.podresources import api_pb2

__all__ = ["AllocatableCall", "CallError", "ListCall", "UnaryCall", "check_limits"]

PATH = "/v1.PodResourcesLister/List"
ALLOCATABLE_PATH = "/v1.PodResourcesLister/GetAllocatableResources"

#: The answer types of the methods called.
Response = TypeVar("Response", api_pb2.ListPodResourcesResponse,
                   api_pb2.AllocatableResourcesResponse)

#: gRPC's status codes by number (grpc/include/grpcpp/impl/codegen/status_code_enum.h).
STATUS_NAMES = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
    "UNAUTHENTICATED",
)

#: A gRPC status from an HTTP status, when an answer carries none (PROTOCOL-HTTP2.md, "HTTP
#: to gRPC Status Code Mapping").
HTTP_STATUS = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
               404: "UNIMPLEMENTED", 429: "UNAVAILABLE", 502: "UNAVAILABLE",
               503: "UNAVAILABLE", 504: "UNAVAILABLE"}

#: The HTTP/2 flow-control window offered to the kubelet, per stream and for the connection,
#: bytes: grpc-go and grpclib open 4 MiB too. A 20 MiB answer comes in ~0.2 s on a local
#: socket; the window is acknowledged as the data is taken.
WINDOW = 4 * 1024 * 1024
RECV_BYTES = 256 * 1024


class CallError(Exception):
    """A failed call: ``code`` is the gRPC status name, ``details`` the one-line reason."""

    def __init__(self, code: str, details: str) -> None:
        super().__init__(f"{code}: {details}")
        self.code = code
        self.details = details


def check_limits(timeout: float, max_receive_bytes: int) -> None:
    """Raise ``ValueError`` unless the deadline (seconds) and the answer limit (bytes) are
    positive; for callers that want a bad value refused before the first call."""
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    if max_receive_bytes <= 0:
        raise ValueError(f"max_receive_bytes must be > 0, got {max_receive_bytes}")


def grpc_timeout(seconds: float) -> str:
    """The ``grpc-timeout`` header's value: at most 8 digits and a unit; milliseconds,
    rounded up, so the kubelet never gives up before we do."""
    ms = max(1, -int(-seconds * 1000 // 1))
    return f"{ms}m" if ms < 10**8 else f"{-(-ms // 1000)}S"


class UnaryCall(Generic[Response]):
    """One unary call of ``path`` with the serialised ``request``, answered by one
    ``response`` message; :meth:`run` makes it (blocking), :meth:`cancel` aborts it from
    another thread. One-shot: create one per call.

    ``socket_path``: the kubelet's unix socket. ``timeout``: the call's deadline, seconds,
    connection included; it is also sent to the kubelet (``grpc-timeout``). ``max_receive_bytes``:
    the largest answer message accepted.
    """

    def __init__(self, socket_path: str, timeout: float, max_receive_bytes: int, *,
                 path: str, request: bytes, response: type[Response]) -> None:
        check_limits(timeout, max_receive_bytes)
        self.socket_path = socket_path
        self.timeout = timeout
        self.max_receive_bytes = max_receive_bytes
        self.path = path
        self._request = request
        self._response: type[Response] = response
        self._lock = threading.Lock()
        self._cancelled = False
        self._sock: socket.socket | None = None

    def cancel(self) -> None:
        """Abort the call: :meth:`run` raises ``CANCELLED`` (at once if it is running)."""
        with self._lock:
            self._cancelled = True
            sock = self._sock
        if sock is not None:
            # Wakes the recv() blocked in run(). Not connected yet, or closed already: run()
            # checks the flag.
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> Response:
        """Make the call and return the answer; raises :class:`CallError`."""
        deadline = time.monotonic() + self.timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with self._lock:
            if self._cancelled:
                sock.close()
                raise CallError("CANCELLED", "call cancelled")
            self._sock = sock
        try:
            return self._call(sock, deadline)
        except CallError:
            if self._cancelled:
                raise CallError("CANCELLED", "call cancelled") from None
            raise
        finally:
            with self._lock:
                self._sock = None
            sock.close()

    def _call(self, sock: socket.socket, deadline: float) -> Response:
        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CallError("DEADLINE_EXCEEDED", "Deadline Exceeded")
            return left

        try:
            sock.settimeout(remaining())
            sock.connect(self.socket_path)
        except TimeoutError:
            raise CallError("DEADLINE_EXCEEDED", "Deadline Exceeded") from None
        except OSError as error:
            raise CallError("UNAVAILABLE", f"cannot connect to {self.socket_path}: "
                                           f"{error.strerror or error}") from None

        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=True, header_encoding="utf-8"))
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
                              h2.settings.SettingCodes.ENABLE_PUSH: 0})
        conn.increment_flow_control_window(WINDOW - 65535)
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [
            (":method", "POST"), (":scheme", "http"), (":path", self.path),
            (":authority", "localhost"), ("te", "trailers"),
            ("content-type", "application/grpc+proto"), ("user-agent", "gpuscope"),
            ("grpc-timeout", grpc_timeout(remaining())),
        ])
        request = self._request
        conn.send_data(stream, b"\0" + len(request).to_bytes(4, "big") + request,
                       end_stream=True)
        answer = _Answer(self.max_receive_bytes)
        try:
            sock.sendall(conn.data_to_send())
            while not answer.ended:
                sock.settimeout(remaining())
                data = sock.recv(RECV_BYTES)
                if not data:
                    raise CallError("UNAVAILABLE", "connection lost: the kubelet closed the "
                                                   "connection before its answer")
                for event in conn.receive_data(data):
                    answer.take(conn, stream, event)
                out = conn.data_to_send()  # settings and pings acknowledged, windows opened
                if out:
                    sock.sendall(out)
        except TimeoutError:
            raise CallError("DEADLINE_EXCEEDED", "Deadline Exceeded") from None
        except h2.exceptions.H2Error as error:
            # The peer broke HTTP/2 (one that does not speak it, or a connection cut midway).
            raise CallError("UNAVAILABLE", f"connection lost: {type(error).__name__}: "
                                           f"{error}") from None
        except OSError as error:
            raise CallError("UNAVAILABLE", f"connection lost: {error.strerror or error}"
                            ) from None
        with contextlib.suppress(OSError, h2.exceptions.H2Error):  # a polite end
            conn.close_connection()
            sock.sendall(conn.data_to_send())
        return answer.message(self._response)


class ListCall(UnaryCall[api_pb2.ListPodResourcesResponse]):
    """One ``List()`` call: every pod the kubelet runs and the resources assigned to them."""

    def __init__(self, socket_path: str, timeout: float, max_receive_bytes: int) -> None:
        super().__init__(
            socket_path, timeout, max_receive_bytes, path=PATH,
            request=api_pb2.ListPodResourcesRequest().SerializeToString(),
            response=api_pb2.ListPodResourcesResponse)


class AllocatableCall(UnaryCall[api_pb2.AllocatableResourcesResponse]):
    """One ``GetAllocatableResources()`` call: every device, CPU and memory block the kubelet
    can assign, allocated or not (the device plugins' healthy devices)."""

    def __init__(self, socket_path: str, timeout: float, max_receive_bytes: int) -> None:
        super().__init__(
            socket_path, timeout, max_receive_bytes, path=ALLOCATABLE_PATH,
            request=api_pb2.AllocatableResourcesRequest().SerializeToString(),
            response=api_pb2.AllocatableResourcesResponse)


class _Answer:
    """What the kubelet has sent on the call's stream: headers, the message's bytes (refused
    from its prefix when over ``limit``), the status."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.http_status: int | None = None
        self.grpc_status: str | None = None
        self.grpc_message = ""
        self.data = bytearray()
        self.ended = False

    def take(self, conn: h2.connection.H2Connection, stream: int, event: object) -> None:
        if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
            if getattr(event, "stream_id", stream) == stream:
                # Decoded to str by the connection's header_encoding.
                self._headers(cast("Iterable[tuple[str, str]]", event.headers or ()))
        elif isinstance(event, h2.events.DataReceived):
            if event.stream_id == stream:
                self.data += event.data
                self._check_size()
            # Taken: the window opens again (h2 sends WINDOW_UPDATE once enough is taken).
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            if event.stream_id == stream:
                self.ended = True
        elif isinstance(event, h2.events.StreamReset):
            if event.stream_id == stream:
                code = event.error_code
                name = "CANCELLED" if code == h2.errors.ErrorCodes.CANCEL else (
                    "UNAVAILABLE" if code == h2.errors.ErrorCodes.REFUSED_STREAM else "INTERNAL")
                raise CallError(name, f"stream reset by the kubelet ({_code_name(code)})")
        elif isinstance(event, h2.events.ConnectionTerminated):
            raise CallError("UNAVAILABLE", "connection lost: the kubelet ended the connection "
                                           f"(GOAWAY {_code_name(event.error_code)})")

    def _headers(self, headers: Iterable[tuple[str, str]]) -> None:
        for name, value in headers:
            if name == ":status":
                self.http_status = int(value) if value.isdigit() else 0
            elif name == "grpc-status":
                number = int(value) if value.isdigit() else -1
                self.grpc_status = (STATUS_NAMES[number] if 0 <= number < len(STATUS_NAMES)
                                    else "UNKNOWN")
            elif name == "grpc-message":
                self.grpc_message = " ".join(unquote(value).split())

    def _check_size(self) -> None:
        if len(self.data) >= 5:
            length = int.from_bytes(self.data[1:5], "big")
            if length > self.limit:
                raise CallError("RESOURCE_EXHAUSTED", "Received message larger than max "
                                                      f"({length} vs. {self.limit})")
            if len(self.data) > 5 + length:
                raise CallError("INTERNAL", "bad answer: more than one message for a "
                                            "unary call")

    def message(self, response: type[Response]) -> Response:
        """The answer, decoded as ``response``, once the stream has ended; raises
        :class:`CallError`."""
        if self.grpc_status is None:
            code = HTTP_STATUS.get(self.http_status or 0, "UNKNOWN")
            if self.http_status == 200:
                code = "INTERNAL"
            raise CallError(code, f"no gRPC status in the answer (HTTP {self.http_status})")
        if self.grpc_status != "OK":
            raise CallError(self.grpc_status, self.grpc_message or f"status {self.grpc_status}")
        data = bytes(self.data)
        if len(data) < 5 or len(data) != 5 + int.from_bytes(data[1:5], "big"):
            raise CallError("INTERNAL", f"bad answer: a message cut short ({len(data)} bytes)")
        if data[0] != 0:
            raise CallError("INTERNAL", "bad answer: compressed, and no compression was "
                                        "offered")
        message = response()
        try:
            message.ParseFromString(data[5:])
        except DecodeError as error:
            raise CallError("INTERNAL", f"bad answer: {error}") from None
        return message


def _code_name(code: object) -> str:
    return getattr(code, "name", str(code))
