"""Fuzzing what a kubelet can answer: whatever comes back, ``list_resources()`` returns
:class:`Assignments` or raises :class:`PodResourcesError`, nothing else, and leaves nothing open.

Two layers: a well-framed gRPC answer whose message is damaged (bytes flipped, cut, inserted
into a real ``ListPodResourcesResponse`` with devices and DRA claims), served by grpcio; and a
peer that is not a gRPC server at all, writing random bytes (or a damaged HTTP/2 preface) on
the socket, which reaches h2's parser and our gRPC framing. The watcher depends on the first
guarantee (any other exception is still counted, but with a less useful reason). Settings:
``tests/fuzz/_profile.py`` (``make fuzz`` runs these with many more examples).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import h2.connection
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gpuscope.exporter.kubernetes.podresources.client import (
    Assignments,
    PodResourcesClient,
    PodResourcesError,
)
from tests.exporter.kubernetes.podresources.test_client import (
    GPU0,
    MIG_A,
    KubeletServer,
    claim,
    claim_device,
    container,
    devices,
    open_fds,
    pod,
    response,
    wait_until,
)
from tests.fuzz._profile import fuzz

VALID = response(
    pod("ml", "trainer-0",
        container("main", devices("nvidia.com/gpu", GPU0, f"{GPU0}::1", numa=1),
                  claims=(claim("ml", "gpus", claim_device("gpu.nvidia.com", "node-a", "gpu-0",
                                                           "nvidia.com/gpu=0")),)),
        container("side", devices("nvidia.com/mig-1g.10gb", MIG_A))),
).SerializeToString()

# An HTTP/2 server's first bytes: its SETTINGS frame (empty), then a SETTINGS ack.
SERVER_PREFACE = bytes.fromhex("000000040000000000" "000000040100000000")


class Answers:
    """A grpcio server answering ``List()`` with whatever bytes ``body`` holds now."""

    def __init__(self, path: str) -> None:
        self.body = b""
        self.server = KubeletServer(path)
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {"List": grpc.unary_unary_rpc_method_handler(lambda request, context: self.body)},
        )
        from concurrent import futures

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self.server._bind_and_start(server)


class RawPeer:
    """Not a gRPC server: writes ``data`` to every connection, then closes it."""

    def __init__(self, path: str) -> None:
        self.data = b""
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            # Each connection on its own thread: served one after another, a connection whose
            # client was slow to hang up held the next one's accept for up to a second.
            threading.Thread(target=self._answer, args=(conn, self.data), daemon=True).start()

    @staticmethod
    def _answer(conn: socket.socket, data: bytes) -> None:
        with conn, contextlib.suppress(OSError):
            conn.sendall(data)
            conn.shutdown(socket.SHUT_WR)
            conn.settimeout(1.0)
            while conn.recv(65536):  # until the client hangs up
                pass

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5.0)


@pytest.fixture(scope="module")
def module_socket_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fz")
    if len(str(path)) >= 80:  # sun_path holds 107 bytes
        import tempfile

        path = Path(tempfile.mkdtemp(prefix="gpuscope-fz-"))
    return path


@pytest.fixture(scope="module")
def answers(module_socket_dir: Path) -> Iterator[tuple[Answers, PodResourcesClient]]:
    served = Answers(str(module_socket_dir / "grpc.sock"))
    client = PodResourcesClient(served.server.path, timeout=2.0)
    yield served, client
    client.close()
    served.server.stop()


@pytest.fixture(scope="module")
def raw_peer(module_socket_dir: Path) -> Iterator[tuple[RawPeer, PodResourcesClient]]:
    peer = RawPeer(str(module_socket_dir / "raw.sock"))
    # The exporter's own deadline (5 s), not a short one: every answer here is a lost
    # connection, which comes at once, and on a loaded CI machine (two pytest workers on two
    # cores) a 0.5 s deadline once passed first and read DEADLINE_EXCEEDED.
    client = PodResourcesClient(str(module_socket_dir / "raw.sock"), timeout=5.0)
    yield peer, client
    client.close()
    peer.stop()


def mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, byte) edits: 0 flips a byte, 1 inserts one, 2 cuts there."""
    out = bytearray(data)
    for kind, position, value in edits:
        at = position % (len(out) + 1)
        if kind == 0 and out:
            out[min(at, len(out) - 1)] ^= value or 0xFF
        elif kind == 1:
            out.insert(at, value)
        elif kind == 2:
            del out[at:]
    return bytes(out)


EDITS = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 10_000), st.integers(0, 255)),
                 min_size=1, max_size=6)


def check(client: PodResourcesClient, expect: str | None) -> None:
    try:
        found = client.list_resources()
    except PodResourcesError as error:
        assert str(error).startswith("List() failed: "), error
        if expect is not None:
            assert expect in str(error), error
    else:
        assert isinstance(found, Assignments)
        for allocation in found.allocations:
            assert allocation.device.raw  # decoded into our types, not half-built


def test_the_valid_answer_decodes(answers: tuple[Answers, PodResourcesClient]) -> None:
    served, client = answers
    served.body = VALID
    found = client.list_resources()
    assert len(found.allocations) == 3 and len(found.claim_devices) == 1


@fuzz(ci_examples=150)
@given(edits=EDITS)
@example(edits=[(2, len(VALID) - 3, 0)])  # cut inside the last field
@example(edits=[(0, 0, 0x07)])  # the first tag turned into a group start
def test_damaged_message_decodes_or_is_internal(
    answers: tuple[Answers, PodResourcesClient], edits: list[tuple[int, int, int]]
) -> None:
    served, client = answers
    served.body = mutate(VALID, edits)
    check(client, "INTERNAL: bad answer")


@fuzz(ci_examples=100)
@given(noise=st.binary(max_size=300), preface=st.booleans())
@example(noise=b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", preface=False)
@example(noise=b"\x00\x00\x05\x01\x04\x00\x00\x00\x01\x88garbage", preface=True)
def test_a_peer_speaking_noise_is_a_clean_error(
    raw_peer: tuple[RawPeer, PodResourcesClient], noise: bytes, preface: bool
) -> None:
    peer, client = raw_peer
    peer.data = (SERVER_PREFACE if preface else b"") + noise
    # Whatever the bytes, the connection is gone before any answer: as grpc-go and grpcio
    # report it (and as the watcher's status shows it), never INTERNAL or a Python error.
    with pytest.raises(PodResourcesError, match=r"^List\(\) failed: UNAVAILABLE: "):
        client.list_resources()


def test_peer_breaking_http2_before_the_request_goes_out(
    raw_peer: tuple[RawPeer, PodResourcesClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A race the reliability tests once hit about once in ten runs (with grpclib), made
    # certain: the peer's garbage arrives, and the peer may be gone, between connecting and
    # sending the request (the request then meets a reset connection, or its answer is the
    # garbage). Still UNAVAILABLE, like any lost connection.
    peer, client = raw_peer
    peer.data = bytes(range(256)) * 4
    initiate = h2.connection.H2Connection.initiate_connection

    def slow_initiate(self: h2.connection.H2Connection) -> None:
        time.sleep(0.05)  # the garbage is sent and the peer's side closed meanwhile
        initiate(self)

    monkeypatch.setattr(h2.connection.H2Connection, "initiate_connection", slow_initiate)
    with pytest.raises(PodResourcesError, match=r"^List\(\) failed: UNAVAILABLE: connection "):
        client.list_resources()


def test_no_descriptor_left_after_the_fuzzing(
    answers: tuple[Answers, PodResourcesClient], raw_peer: tuple[RawPeer, PodResourcesClient]
) -> None:
    # Runs after the properties above (same module fixtures): more calls change nothing.
    served, client = answers
    peer, raw_client = raw_peer
    served.body = VALID
    client.list_resources()
    before = open_fds()
    for n in range(50):
        served.body = mutate(VALID, [(0, n, 0x55)])
        check(client, None)
        peer.data = os.urandom(64)
        with pytest.raises(PodResourcesError):
            raw_client.list_resources()
    assert wait_until(lambda: open_fds() <= before), (open_fds(), before)
