"""``call.py``'s gRPC layer against answers grpc-go and grpcio do not give on request: an HTTP
error status, a reset stream, GOAWAY, two messages, a compressed one. The peer is an ``h2``
server on a unix socket, written for each case (grpc-go and grpcio cover the ordinary answers
and statuses: ``test_grpcgo.py``, ``test_client.py``)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest

from gpuscope.exporter.kubernetes.podresources import api_pb2
from gpuscope.exporter.kubernetes.podresources.call import (
    CallError,
    ListCall,
    grpc_timeout,
)

Answer = Callable[[h2.connection.H2Connection, int], None]


def message(body: bytes, compressed: bool = False) -> bytes:
    return (b"\1" if compressed else b"\0") + len(body).to_bytes(4, "big") + body


OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
OK_TRAILERS = [("grpc-status", "0")]
ANSWER = api_pb2.ListPodResourcesResponse(
    pod_resources=[api_pb2.PodResources(name="p", namespace="ns")]).SerializeToString()


class Peer:
    """Accepts one connection at a time; answers each request's headers with ``answer``;
    keeps the request headers it saw."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.answer: Answer = lambda conn, stream: None
        self.requests: list[dict[str, str]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except OSError:
                return
            with sock:
                self._one(sock)

    def _one(self, sock: socket.socket) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    self.requests.append(dict(event.headers or ()))  # type: ignore[arg-type]
                elif isinstance(event, h2.events.StreamEnded):
                    self.answer(conn, event.stream_id)
            try:
                sock.sendall(conn.data_to_send())
            except OSError:
                return

    def close(self) -> None:
        self._server.close()


@pytest.fixture()
def peer(tmp_path: Path) -> Iterator[Peer]:
    p = Peer(tmp_path / "kubelet.sock")
    yield p
    p.close()


def call(peer: Peer, timeout: float = 5.0, limit: int = 1 << 20) -> object:
    return ListCall(peer.path, timeout, limit).run()


def unary(body: bytes) -> Answer:
    """An answer as a gRPC server sends one: headers, ``body`` as the data, trailers."""
    def answer(conn: h2.connection.H2Connection, stream: int) -> None:
        conn.send_headers(stream, OK_HEADERS)
        conn.send_data(stream, body)
        conn.send_headers(stream, OK_TRAILERS, end_stream=True)

    return answer


def fails(peer: Peer, code: str, fragment: str = "", **kw: float) -> None:
    with pytest.raises(CallError) as raised:
        call(peer, **kw)  # type: ignore[arg-type]
    assert raised.value.code == code, raised.value
    assert fragment in raised.value.details, raised.value


def test_an_ordinary_answer_and_what_the_request_says(peer: Peer) -> None:
    peer.answer = unary(message(ANSWER))
    got = call(peer, timeout=2.5)
    assert isinstance(got, api_pb2.ListPodResourcesResponse)
    assert [p.name for p in got.pod_resources] == ["p"]
    (request,) = peer.requests
    assert request[":path"] == "/v1.PodResourcesLister/List"
    assert request[":method"] == "POST"
    assert request["te"] == "trailers"
    assert request["content-type"].startswith("application/grpc")
    # The deadline goes with the request (what is left of 2.5 s, rounded up to the ms).
    assert request["grpc-timeout"].endswith("m")
    assert 2000 < int(request["grpc-timeout"][:-1]) <= 2500


@pytest.mark.parametrize(("http", "code"), [("404", "UNIMPLEMENTED"), ("503", "UNAVAILABLE"),
                                            ("401", "UNAUTHENTICATED"), ("418", "UNKNOWN")])
def test_an_http_error_without_a_grpc_status_is_mapped(peer: Peer, http: str, code: str) -> None:
    peer.answer = lambda conn, stream: conn.send_headers(stream, [(":status", http)],
                                                         end_stream=True)
    fails(peer, code, f"HTTP {http}")


def test_a_status_in_trailers_only_headers_with_its_message_decoded(peer: Peer) -> None:
    peer.answer = lambda conn, stream: conn.send_headers(stream, [
        *OK_HEADERS, ("grpc-status", "7"), ("grpc-message", "kubelet%20says%3A%20no")],
        end_stream=True)
    fails(peer, "PERMISSION_DENIED", "kubelet says: no")


def test_an_unknown_status_number_is_unknown(peer: Peer) -> None:
    peer.answer = lambda conn, stream: conn.send_headers(stream, [
        *OK_HEADERS, ("grpc-status", "99")], end_stream=True)
    fails(peer, "UNKNOWN")


@pytest.mark.parametrize(("error", "code"), [
    (h2.errors.ErrorCodes.REFUSED_STREAM, "UNAVAILABLE"),
    (h2.errors.ErrorCodes.CANCEL, "CANCELLED"),
    (h2.errors.ErrorCodes.INTERNAL_ERROR, "INTERNAL"),
])
def test_a_reset_stream(peer: Peer, error: h2.errors.ErrorCodes, code: str) -> None:
    peer.answer = lambda conn, stream: conn.reset_stream(stream, error)
    fails(peer, code, "stream reset")


def test_goaway_before_the_answer_is_unavailable(peer: Peer) -> None:
    peer.answer = lambda conn, stream: conn.close_connection()
    fails(peer, "UNAVAILABLE", "GOAWAY")


def test_two_messages_in_a_unary_answer_are_internal(peer: Peer) -> None:
    peer.answer = unary(message(ANSWER) + message(ANSWER))
    fails(peer, "INTERNAL", "more than one message")


def test_a_compressed_message_is_internal(peer: Peer) -> None:
    peer.answer = unary(message(ANSWER, compressed=True))
    fails(peer, "INTERNAL", "compressed")


def test_an_answer_over_the_limit_is_refused_from_its_prefix(peer: Peer) -> None:
    # Only the prefix is sent: the refusal must not wait for the 1 GiB it announces.
    def answer(conn: h2.connection.H2Connection, stream: int) -> None:
        conn.send_headers(stream, OK_HEADERS)
        conn.send_data(stream, b"\0" + (1 << 30).to_bytes(4, "big"))

    peer.answer = answer
    fails(peer, "RESOURCE_EXHAUSTED", f"({1 << 30} vs. 1000)", limit=1000, timeout=2.0)


def test_no_answer_before_the_deadline(peer: Peer) -> None:
    peer.answer = lambda conn, stream: conn.send_headers(stream, OK_HEADERS)
    fails(peer, "DEADLINE_EXCEEDED", timeout=0.3)


def test_cancel_from_another_thread_ends_the_call_at_once(peer: Peer) -> None:
    peer.answer = lambda conn, stream: conn.send_headers(stream, OK_HEADERS)
    c = ListCall(peer.path, 30.0, 1 << 20)
    threading.Timer(0.2, c.cancel).start()
    with pytest.raises(CallError) as raised:
        c.run()
    assert raised.value.code == "CANCELLED"


@pytest.mark.parametrize(("seconds", "header"), [
    (5.0, "5000m"), (0.0001, "1m"), (1.2345, "1235m"), (10**6, "1000000S")])
def test_grpc_timeout_header(seconds: float, header: str) -> None:
    assert grpc_timeout(seconds) == header
