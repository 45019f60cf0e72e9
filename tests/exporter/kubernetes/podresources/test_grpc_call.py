"""The pure-Python unary gRPC call, against a real grpcio server and a scripted HTTP/2 peer.

The grpcio server (C core, the same HTTP/2 stack family as the kubelet's grpc-go server in
behaviour that matters here: SETTINGS, window updates, Huffman-coded headers, trailers) shows
the call interoperates. The scripted peer, which writes frames by hand and encodes headers
with the independent ``hpack`` package, covers what a real server rarely does: GOAWAY,
RST_STREAM, PINGs, CONTINUATION, padding, and broken answers. Every wait is bounded.
"""

from __future__ import annotations

import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import hpack as hpack_pkg  # the independent implementation (test dependency)
import pytest

from gpuscope.exporter.kubernetes.podresources.grpc_call import GrpcError, UnixGrpcCall, unary_call

METHOD = "/test.Echo/Call"


@pytest.fixture
def sock_path() -> Iterator[str]:
    # sun_path holds 107 bytes; pytest's tmp_path can be longer on some hosts.
    directory = tempfile.mkdtemp(prefix="gpuscope-")
    try:
        yield str(Path(directory) / "s.sock")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# A real grpcio server


Handler = Callable[[bytes, grpc.ServicerContext], bytes]


@pytest.fixture
def grpc_server(sock_path: str) -> Iterator[Callable[[Handler], None]]:
    servers: list[grpc.Server] = []

    def start(handler: Handler) -> None:
        generic = grpc.method_handlers_generic_handler(
            "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(handler)})
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[generic],
                             options=[("grpc.max_send_message_length", 64 * 1024 * 1024),
                                      ("grpc.max_receive_message_length", 1024)])
        assert server.add_insecure_port(f"unix://{sock_path}") != 0
        server.start()
        servers.append(server)

    yield start
    for server in servers:
        server.stop(grace=None).wait(timeout=5.0)


def test_echo_roundtrip(grpc_server: Callable[[Handler], None], sock_path: str) -> None:
    seen: list[tuple[bytes, dict[str, str]]] = []

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        seen.append((request, dict(context.invocation_metadata())))  # type: ignore[arg-type]
        return b"answer:" + request

    grpc_server(handler)
    assert unary_call(sock_path, METHOD, b"hello", timeout=2.0) == b"answer:hello"
    assert unary_call(sock_path, METHOD, b"", timeout=2.0) == b"answer:"
    assert [request for request, _ in seen] == [b"hello", b""]
    assert seen[0][1]["user-agent"].startswith("gpuscope")


def test_large_answer_crosses_many_frames_and_the_default_window(
    grpc_server: Callable[[Handler], None], sock_path: str
) -> None:
    # 20 MiB: ~1,300 DATA frames, far past HTTP/2's default 64 KiB flow-control windows.
    blob = bytes(range(256)) * (20 * 4096)
    grpc_server(lambda request, context: blob)
    assert unary_call(sock_path, METHOD, b"", timeout=10.0,
                      max_receive_bytes=32 * 1024 * 1024) == blob
    with pytest.raises(GrpcError) as caught:
        unary_call(sock_path, METHOD, b"", timeout=10.0, max_receive_bytes=4 * 1024 * 1024)
    assert caught.value.code == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (grpc.StatusCode.NOT_FOUND, "no such pod"),
        # Non-ASCII and '%': sent percent-encoded, and long enough that grpcio Huffman-codes it.
        (grpc.StatusCode.PERMISSION_DENIED, "denied: 100% sure, ünïcødé ✓, pod kube-system/x " * 3),
        (grpc.StatusCode.UNAVAILABLE, "kubelet is restarting"),
        (grpc.StatusCode.INTERNAL, ""),
    ],
)
def test_server_status_passes_through(
    grpc_server: Callable[[Handler], None], sock_path: str, code: grpc.StatusCode, details: str
) -> None:
    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(code, details)

    grpc_server(handler)
    with pytest.raises(GrpcError) as caught:
        unary_call(sock_path, METHOD, b"", timeout=2.0)
    assert caught.value.code == code.name
    assert caught.value.details == (details or f"status {code.value[0]}")


def test_unknown_method_is_unimplemented(
    grpc_server: Callable[[Handler], None], sock_path: str
) -> None:
    grpc_server(lambda request, context: b"")
    with pytest.raises(GrpcError) as caught:
        unary_call(sock_path, "/test.Echo/Nope", b"", timeout=2.0)
    assert caught.value.code == "UNIMPLEMENTED"


def test_deadline_reaches_the_server_and_bounds_the_call(
    grpc_server: Callable[[Handler], None], sock_path: str
) -> None:
    remaining: list[float | None] = []
    release = threading.Event()

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        remaining.append(context.time_remaining())
        release.wait(timeout=5.0)
        return b"late"

    grpc_server(handler)
    started = time.monotonic()
    with pytest.raises(GrpcError) as caught:
        unary_call(sock_path, METHOD, b"", timeout=0.5)
    elapsed = time.monotonic() - started
    release.set()
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert 0.45 <= elapsed < 1.5
    # grpc-timeout was sent: the server knew its deadline (0.5 s, minus transit).
    assert remaining and remaining[0] is not None and 0.2 < remaining[0] <= 0.5


def test_cancel_from_another_thread(grpc_server: Callable[[Handler], None], sock_path: str) -> None:
    entered, release = threading.Event(), threading.Event()

    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        entered.set()
        release.wait(timeout=5.0)
        return b""

    grpc_server(handler)
    call = UnixGrpcCall(sock_path, METHOD, b"", timeout=5.0, max_receive_bytes=1024)
    result: list[BaseException] = []

    def run() -> None:
        try:
            call.run()
        except GrpcError as error:
            result.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    assert entered.wait(3.0)
    started = time.monotonic()
    call.cancel()
    thread.join(3.0)
    release.set()
    assert not thread.is_alive()
    assert time.monotonic() - started < 1.0
    assert len(result) == 1 and isinstance(result[0], GrpcError)
    assert result[0].code == "CANCELLED"
    with pytest.raises(GrpcError, match="CANCELLED"):
        call.run()  # a cancelled call stays cancelled


def test_nobody_listening_is_unavailable(sock_path: str) -> None:
    with pytest.raises(GrpcError) as caught:
        unary_call(sock_path, METHOD, b"", timeout=1.0)  # no such file
    assert caught.value.code == "UNAVAILABLE"
    Path(sock_path).touch()  # a stale socket file: connection refused
    with pytest.raises(GrpcError) as caught:
        unary_call(sock_path, METHOD, b"", timeout=1.0)
    assert caught.value.code == "UNAVAILABLE"


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        UnixGrpcCall("/x", METHOD, b"", timeout=0, max_receive_bytes=1)
    with pytest.raises(ValueError):
        UnixGrpcCall("/x", METHOD, b"", timeout=1.0, max_receive_bytes=0)


# ---------------------------------------------------------------------------------------------
# A scripted HTTP/2 peer


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") \
        + payload


DATA, HEADERS, RST, SETTINGS, PING, GOAWAY, WINDOW, CONT = 0, 1, 3, 4, 6, 7, 8, 9
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def headers_block(fields: list[tuple[str, str]], huffman: bool = True) -> bytes:
    return bytes(hpack_pkg.Encoder().encode(fields, huffman=huffman))


def message(payload: bytes, compressed: int = 0) -> bytes:
    return bytes((compressed,)) + len(payload).to_bytes(4, "big") + payload


OK_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
OK_TRAILERS = [("grpc-status", "0")]


@dataclass
class Peer:
    """Accepts one connection, records the client's frames, and sends a script."""

    path: str
    script: Callable[[Peer], bytes]
    client_frames: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    client_preface: bytes = b""
    hold: bool = False
    _server: socket.socket | None = None
    _conn: socket.socket | None = None

    def start(self) -> None:
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.path)
        self._server.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        assert self._server is not None
        self._server.settimeout(5.0)
        try:
            conn, _ = self._server.accept()
        except OSError:
            return
        self._conn = conn
        conn.settimeout(5.0)
        try:
            self.client_preface = self._exact(conn, len(PREFACE))
            # The client writes its whole opening at once: SETTINGS [WINDOW_UPDATE] HEADERS DATA.
            while not self.client_frames or self.client_frames[-1][0] != DATA:
                header = self._exact(conn, 9)
                length = int.from_bytes(header[:3], "big")
                self.client_frames.append((header[3], header[4],
                                           int.from_bytes(header[5:], "big"),
                                           self._exact(conn, length)))
            answer = self.script(self)
            if not answer:
                return  # an empty script: hang up without a word
            conn.sendall(answer)
            if self.hold:
                time.sleep(3.0)
            # Drain what the client says last (SETTINGS/PING ACKs, GOAWAY) until it closes.
            while conn.recv(65536):
                pass
        except OSError:
            pass
        finally:
            conn.close()

    @staticmethod
    def _exact(conn: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = conn.recv(n - len(data))
            if not chunk:
                raise OSError("closed")
            data += chunk
        return data

    def close(self) -> None:
        if self._server is not None:
            self._server.close()


@pytest.fixture
def peer(sock_path: str) -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def make(script: Callable[[Peer], bytes] | bytes, hold: bool = False) -> Peer:
        body = script
        p = Peer(sock_path, body if callable(body) else (lambda _: body), hold=hold)
        p.start()
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def ok_answer(payload: bytes, trailers: list[tuple[str, str]] = OK_TRAILERS) -> bytes:
    return (frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
            + frame(DATA, 0, 1, message(payload))
            + frame(HEADERS, 5, 1, headers_block(trailers)))


def call(path: str, timeout: float = 2.0, max_receive_bytes: int = 1 << 20) -> bytes:
    return unary_call(path, METHOD, b"req", timeout=timeout, max_receive_bytes=max_receive_bytes)


def test_request_frames_as_the_grpc_spec_says(peer: Callable[..., Peer], sock_path: str) -> None:
    p = peer(ok_answer(b"x"))
    assert call(sock_path, timeout=3.0) == b"x"
    assert p.client_preface == PREFACE
    kinds = [kind for kind, _, _, _ in p.client_frames]
    assert kinds == [SETTINGS, WINDOW, HEADERS, DATA]
    settings = dict(struct.iter_unpack(">HI", p.client_frames[0][3]))
    assert settings[0x2] == 0  # no server push
    assert settings[0x4] >= (1 << 20)  # a stream window big enough for the whole answer
    assert int.from_bytes(p.client_frames[1][3], "big") + 65_535 == settings[0x4]
    _, flags, stream, block = p.client_frames[2]
    assert (flags & 0x4, stream) == (0x4, 1)
    fields: dict[object, object] = dict(hpack_pkg.Decoder().decode(block))
    assert fields[":method"] == "POST"
    assert fields[":scheme"] == "http"
    assert fields[":path"] == METHOD
    assert fields["content-type"] == "application/grpc"
    assert fields["te"] == "trailers"
    assert fields["grpc-timeout"] == "3000m"
    _, flags, stream, data = p.client_frames[3]
    assert (flags & 0x1, stream, data) == (0x1, 1, message(b"req"))


def test_ping_settings_continuation_and_padding(peer: Callable[..., Peer], sock_path: str) -> None:
    block = headers_block([*OK_HEADERS, ("x-extra", "y" * 300)])
    padded_data = bytes((7,)) + message(b"payload") + b"\0" * 7
    script = (
        frame(SETTINGS, 0, 0, struct.pack(">HI", 0x3, 100))
        + frame(PING, 0, 0, b"12345678")
        + frame(WINDOW, 0, 0, (1000).to_bytes(4, "big"))
        + frame(0x2, 0, 1, b"\0" * 5)  # PRIORITY: ignored
        + frame(0xEE, 0, 0, b"an unknown frame type is ignored")
        # Headers split over HEADERS (padded, with priority) + two CONTINUATIONs.
        + frame(HEADERS, 0x8 | 0x20, 1, bytes((3,)) + b"\0" * 5 + block[:10] + b"\0" * 3)
        + frame(CONT, 0, 1, block[10:20])
        + frame(CONT, 4, 1, block[20:])
        + frame(DATA, 0x8, 1, padded_data)
        + frame(HEADERS, 5, 1, headers_block(OK_TRAILERS))
    )
    p = peer(script)
    assert call(sock_path) == b"payload"
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and p._conn is not None and p._conn.fileno() != -1:
        time.sleep(0.01)
    # Not asserting on what the client sent after its opening: the peer stops recording then.


def test_ping_is_answered_before_the_answer_comes(sock_path: str) -> None:
    # A peer that withholds the answer until the client has acknowledged its SETTINGS and
    # answered its PING, as a strict server may.
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(1)
    got: list[tuple[int, int, bytes]] = []

    def serve() -> None:
        conn, _ = server.accept()
        conn.settimeout(5.0)
        with conn:
            Peer._exact(conn, len(PREFACE))
            conn.sendall(frame(SETTINGS, 0, 0) + frame(PING, 0, 0, b"abcdefgh"))
            while not any(kind == PING for kind, _, _ in got):
                header = Peer._exact(conn, 9)
                payload = Peer._exact(conn, int.from_bytes(header[:3], "big"))
                got.append((header[3], header[4], payload))
            conn.sendall(frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
                         + frame(DATA, 0, 1, message(b"pong"))
                         + frame(HEADERS, 5, 1, headers_block(OK_TRAILERS)))
            while conn.recv(65536):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert call(sock_path) == b"pong"
    finally:
        server.close()
    assert (SETTINGS, 1, b"") in got  # SETTINGS ACK
    assert (PING, 1, b"abcdefgh") in got  # PING ACK with the same payload


@pytest.mark.parametrize(
    ("name", "script", "code", "words"),
    [
        ("http/1.1 peer", b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
         "UNAVAILABLE", "not an HTTP/2"),
        ("closes at once", b"", "UNAVAILABLE", "closed"),
        ("no SETTINGS first", frame(PING, 0, 0, b"12345678"), "UNAVAILABLE", "SETTINGS"),
        ("GOAWAY before our stream",
         frame(SETTINGS, 0, 0) + frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0xB)),
         "UNAVAILABLE", "GOAWAY"),
        ("RST_STREAM REFUSED", frame(SETTINGS, 0, 0) + frame(RST, 0, 1, (7).to_bytes(4, "big")),
         "UNAVAILABLE", "reset"),
        ("RST_STREAM CANCEL", frame(SETTINGS, 0, 0) + frame(RST, 0, 1, (8).to_bytes(4, "big")),
         "CANCELLED", "reset"),
        ("RST_STREAM PROTOCOL", frame(SETTINGS, 0, 0) + frame(RST, 0, 1, (1).to_bytes(4, "big")),
         "INTERNAL", "reset"),
        ("HTTP 503", frame(SETTINGS, 0, 0) + frame(HEADERS, 5, 1, headers_block(
            [(":status", "503"), ("content-type", "text/plain")])), "UNAVAILABLE", "503"),
        ("HTTP 404", frame(SETTINGS, 0, 0) + frame(HEADERS, 5, 1, headers_block(
            [(":status", "404")])), "UNIMPLEMENTED", "404"),
        ("not grpc content", frame(SETTINGS, 0, 0) + frame(HEADERS, 5, 1, headers_block(
            [(":status", "200"), ("content-type", "text/html")])), "UNKNOWN", "content-type"),
        ("trailers-only error", frame(SETTINGS, 0, 0) + frame(HEADERS, 5, 1, headers_block(
            [*OK_HEADERS, ("grpc-status", "5"), ("grpc-message", "pod%20gone%3A%20x")])),
         "NOT_FOUND", "pod gone: x"),
        ("no trailers", frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
         + frame(DATA, 1, 1, message(b"x")), "INTERNAL", "without trailers"),
        ("no grpc-status", frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
         + frame(DATA, 0, 1, message(b"x")) + frame(HEADERS, 5, 1, headers_block(
             [("x", "y")])), "INTERNAL", "grpc-status"),
        ("compressed", frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
         + frame(DATA, 0, 1, message(b"x", compressed=1))
         + frame(HEADERS, 5, 1, headers_block(OK_TRAILERS)), "INTERNAL", "compressed"),
        ("short message", frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
         + frame(DATA, 0, 1, message(b"xyz")[:-1])
         + frame(HEADERS, 5, 1, headers_block(OK_TRAILERS)), "INTERNAL", "prefix says"),
        ("two messages", frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
         + frame(DATA, 0, 1, message(b"a") + message(b"b"))
         + frame(HEADERS, 5, 1, headers_block(OK_TRAILERS)), "INTERNAL", "prefix says"),
        ("DATA before headers", frame(SETTINGS, 0, 0) + frame(DATA, 0, 1, message(b"x")),
         "INTERNAL", "before response headers"),
        ("broken HPACK", frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, b"\xff\xff\xff\xff\xff"),
         "INTERNAL", "header block"),
        ("interrupted block", frame(SETTINGS, 0, 0) + frame(HEADERS, 0, 1, b"\x88")
         + frame(DATA, 0, 1, b""), "INTERNAL", "interrupted"),
        ("server push", frame(SETTINGS, 0, 0) + frame(0x5, 4, 1, b"\0\0\0\2\x88"),
         "UNAVAILABLE", "push"),
        ("oversized frame", frame(SETTINGS, 0, 0) + frame(DATA, 0, 1, b"\0" * 20_000),
         "UNAVAILABLE", "not an HTTP/2"),
        ("bad padding", frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS))
         + frame(DATA, 0x8, 1, bytes((200,)) + b"abc"), "INTERNAL", "padding"),
    ],
)
def test_broken_answers_fail_with_one_clear_reason(
    peer: Callable[..., Peer], sock_path: str, name: str, script: bytes, code: str, words: str
) -> None:
    peer(script)
    with pytest.raises(GrpcError) as caught:
        call(sock_path)
    assert caught.value.code == code, (name, str(caught.value))
    assert words in caught.value.details, (name, str(caught.value))
    assert "\n" not in str(caught.value)


def test_goaway_after_our_stream_still_completes(peer: Callable[..., Peer], sock_path: str) -> None:
    # A graceful shutdown: the server says it will take no new streams, but ours (1) is in.
    script = (frame(SETTINGS, 0, 0) + frame(GOAWAY, 0, 0, struct.pack(">II", 1, 0))
              + ok_answer(b"done")[9:])  # ok_answer without its SETTINGS
    peer(script)
    assert call(sock_path) == b"done"


def test_a_peer_that_stops_talking_costs_one_deadline(
    peer: Callable[..., Peer], sock_path: str
) -> None:
    peer(frame(SETTINGS, 0, 0) + frame(HEADERS, 4, 1, headers_block(OK_HEADERS)), hold=True)
    started = time.monotonic()
    with pytest.raises(GrpcError) as caught:
        call(sock_path, timeout=0.4)
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 1.5


def test_huffman_and_plain_headers_both_decode(peer: Callable[..., Peer], sock_path: str) -> None:
    for huffman in (True, False):
        script = (frame(SETTINGS, 0, 0)
                  + frame(HEADERS, 4, 1, headers_block(OK_HEADERS, huffman=huffman))
                  + frame(DATA, 0, 1, message(b"h"))
                  + frame(HEADERS, 5, 1, headers_block(OK_TRAILERS, huffman=huffman)))
        p = peer(script)
        assert call(sock_path) == b"h"
        p.close()
        Path(sock_path).unlink()
