"""The HTTP server's limits against clients that hold connections (docs/security.md): a
deadline for a request's line and headers and for a TLS handshake, not per read; a cap on
concurrent connections that evicts the longest-idle one; and scrapes and probes that keep
working under hundreds of idle and trickling connections."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry

from gpuscope.exporter.config import ConfigError, parse_config
from gpuscope.exporter.sinks.prometheus import server as server_module
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sinks.prometheus.server import ConnectionStats, ExporterServer
from gpuscope.exporter.sinks.prometheus.tls import tls_context
from tests.exporter.snapshots import fixed_snapshot
from tests.pki import TestCA

HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


def _registry() -> CollectorRegistry:
    snap = fixed_snapshot()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(lambda: snap))
    return registry


def _start(**kw: object) -> ExporterServer:
    srv = ExporterServer("127.0.0.1", 0, _registry(), lambda: True, lambda: True,
                         **kw)  # type: ignore[arg-type]
    srv.start()
    return srv


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _ask(sock: socket.socket, request: bytes = HEALTHZ) -> bytes:
    """Sends ``request`` and reads its whole response (the headers, then Content-Length
    bytes): the status line and headers."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return head


def _closed_within(sock: socket.socket, within: float) -> float | None:
    """Seconds until the server closes ``sock`` (EOF or a reset; what it sends before is
    skipped), or None if it is still open after ``within``."""
    began = time.monotonic()
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - began


def _trickle(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> None:
    for i in range(len(data)):
        if stop.wait(every):
            return
        try:
            sock.sendall(data[i:i + 1])
        except OSError:
            return


@pytest.fixture
def short_deadlines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "REQUEST_TIMEOUT", 1.0)
    monkeypatch.setattr(server_module, "IDLE_TIMEOUT", 30.0)


# -- deadlines -------------------------------------------------------------------------------
def test_a_trickled_request_is_cut_off_at_the_deadline(short_deadlines: None) -> None:
    """One byte every 0.2 s reset the 300 s idle timeout with each read: such a client held
    its thread for as long as it kept trickling. The request line and headers now have
    REQUEST_TIMEOUT in all from their first byte."""
    srv = _start()
    stop = threading.Event()
    sock = _connect(srv.port)
    try:
        request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200 + b"\r\n\r\n"
        trickler = threading.Thread(target=_trickle, args=(sock, request, 0.2, stop))
        trickler.start()
        took = _closed_within(sock, within=6.0)
        assert took is not None, "a trickling client was never cut off"
        assert took < 3.0, took
        assert srv.connection_stats.totals()["timeout"] == 1
    finally:
        stop.set()
        sock.close()
        srv.stop()


def test_a_slow_but_timely_request_and_a_long_idle_keep_alive_are_served(
    short_deadlines: None,
) -> None:
    srv = _start()
    sock = _connect(srv.port)
    try:
        for piece in (b"GET /healthz HTT", b"P/1.1\r\nHost: x\r\n", b"\r\n"):
            time.sleep(0.2)
            sock.sendall(piece)
        assert _ask(sock, b"").startswith(b"HTTP/1.1 200")
        # Idle between requests longer than the request deadline: idle is not a request.
        time.sleep(1.5)
        assert _ask(sock).startswith(b"HTTP/1.1 200")
    finally:
        sock.close()
        srv.stop()


def test_request_line_and_headers_are_bounded_in_size(short_deadlines: None) -> None:
    """100 header lines of 64 KiB each were accepted (6.5 MB held per connection)."""
    srv = _start()
    sock = _connect(srv.port)
    try:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        with pytest.raises(OSError):  # the server closes mid-send (a reset or a pipe)
            for i in range(100):
                sock.sendall(b"X-%d: " % i + b"a" * 60_000 + b"\r\n")
                time.sleep(0.01)
        assert srv.connection_stats.totals()["too_large"] == 1
    finally:
        sock.close()
        srv.stop()


def _client_hello() -> bytes:
    """A real ClientHello, as bytes to send by hand."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


@pytest.fixture(scope="module")
def server_tls(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    tmp: Path = tmp_path_factory.mktemp("pki-limits")
    issued = TestCA("limits-ca").issue("exporter", server=True, sans=["127.0.0.1"])
    (tmp / "tls.crt").write_bytes(issued.cert_pem)
    (tmp / "tls.key").write_bytes(issued.key_pem)
    return tls_context(str(tmp / "tls.crt"), str(tmp / "tls.key"))


def test_a_trickled_tls_handshake_is_cut_off_at_the_deadline(
    server_tls: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "TLS_HANDSHAKE_TIMEOUT", 1.0)
    srv = _start(ssl_context=server_tls)
    stop = threading.Event()
    sock = _connect(srv.port)
    try:
        hello = _client_hello()
        trickler = threading.Thread(target=_trickle, args=(sock, hello, 0.05, stop))
        trickler.start()
        took = _closed_within(sock, within=6.0)
        assert took is not None, "a trickled handshake was never cut off"
        assert took < 3.0, took
    finally:
        stop.set()
        sock.close()
        srv.stop()


def test_over_tls_silent_and_idle_connections_are_evicted(server_tls: ssl.SSLContext) -> None:
    """A TLS connection is idle until its handshake's first byte (silent ones held a thread
    for TLS_HANDSHAKE_TIMEOUT each) and again between requests: both are evicted at the cap,
    and a new client is served at once."""
    srv = _start(ssl_context=server_tls, max_connections=4)
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    kept = client.wrap_socket(_connect(srv.port), server_hostname="127.0.0.1")
    silent: list[socket.socket] = []
    new: list[ssl.SSLSocket] = []
    try:
        assert _ask(kept).startswith(b"HTTP/1.1 200")  # now idle, the longest
        time.sleep(0.05)
        silent = [_connect(srv.port) for _ in range(3)]
        time.sleep(0.2)
        for _ in range(3):  # each kept open: a slot taken from the longest idle
            began = time.monotonic()
            new.append(client.wrap_socket(_connect(srv.port), server_hostname="127.0.0.1"))
            assert _ask(new[-1]).startswith(b"HTTP/1.1 200")
            assert time.monotonic() - began < 1.0
        assert _closed_within(kept, within=2.0) is not None
        assert [_closed_within(s, within=2.0) is not None for s in silent] == [
            True, True, False]
        assert srv.connection_stats.totals()["evicted"] == 3
    finally:
        for s in [kept, *silent, *new]:
            s.close()
        srv.stop()


# -- the cap ---------------------------------------------------------------------------------
def test_at_the_cap_the_longest_idle_connection_is_evicted(short_deadlines: None) -> None:
    srv = _start(max_connections=4)
    socks = [_connect(srv.port) for _ in range(4)]
    try:
        for s in socks:  # each has been served once and waits for its next request
            assert _ask(s).startswith(b"HTTP/1.1 200")
            time.sleep(0.05)
        # A new client is served; the connection idle the longest (the first) is closed.
        assert requests.get(f"http://127.0.0.1:{srv.port}/readyz", timeout=5).status_code == 200
        assert _closed_within(socks[0], within=2.0) is not None
        for s in socks[1:]:
            assert _ask(s).startswith(b"HTTP/1.1 200")
        assert srv.connection_stats.totals()["evicted"] == 1
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_at_the_cap_with_none_idle_a_new_connection_is_closed_at_once(
    short_deadlines: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "REQUEST_TIMEOUT", 5.0)
    srv = _start(max_connections=4)
    socks = [_connect(srv.port) for _ in range(4)]
    try:
        for s in socks:  # each in the middle of its request line: busy, not idle
            s.sendall(b"GET /hea")
        time.sleep(0.3)
        extra = _connect(srv.port)
        took = _closed_within(extra, within=2.0)
        extra.close()
        assert took is not None and took < 1.0, took
        assert srv.connection_stats.totals()["refused"] == 1
        for s in socks:  # the four are still served
            assert _ask(s, b"lthz HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 200")
    finally:
        for s in socks:
            s.close()
        srv.stop()


def _threads_named(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))


@pytest.fixture
def attacked() -> Iterator[tuple[ExporterServer, requests.Session]]:
    srv = _start()
    yield srv, requests.Session()
    srv.stop()


def test_scrapes_and_probes_survive_idle_and_trickling_connections(
    attacked: tuple[ExporterServer, requests.Session],
) -> None:
    """500 idle connections and 50 trickling ones: each had a thread (3,000 idle ones took
    the RSS from 31 to 108 MB, past the pod's 128Mi at about 4,000). Now at most
    --max-connections are open, a scrape on a kept-alive connection and new probes are
    answered within a second, and the threads stay bounded."""
    srv, prometheus = attacked
    url = f"http://127.0.0.1:{srv.port}"
    assert prometheus.get(url + "/metrics", timeout=5).status_code == 200  # kept alive
    baseline = threading.active_count()
    stop = threading.Event()
    trickling = [_connect(srv.port) for _ in range(50)]
    for s in trickling:
        s.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: ")

    def trickle_all() -> None:  # one more byte of the header every 0.2 s
        while not stop.wait(0.2):
            for s in trickling:
                with contextlib.suppress(OSError):
                    s.sendall(b"a")

    trickler = threading.Thread(target=trickle_all)
    trickler.start()
    idle: list[socket.socket] = []
    try:
        for _ in range(500):
            idle.append(_connect(srv.port))
        time.sleep(0.5)
        threads = threading.active_count() - baseline - 1  # minus the trickler
        worst = 0.0
        for _ in range(5):
            for path, session in (("/metrics", prometheus), ("/readyz", None)):
                began = time.monotonic()
                if session is None:  # the kubelet: a new connection per probe
                    got = requests.get(url + path, timeout=5)
                else:
                    got = session.get(url + path, timeout=5)
                worst = max(worst, time.monotonic() - began)
                assert got.status_code == 200, path
            time.sleep(0.1)
        stats = srv.connection_stats.totals()
        print(f"server threads {threads}, slowest answer {worst * 1000:.0f} ms, "
              f"closed {stats}")
        assert threads <= server_module.MAX_CONNECTIONS + 8, threads
        assert worst < 1.0, worst
        assert stats["evicted"] >= 400, stats
    finally:
        stop.set()
        trickler.join()
        for s in trickling + idle:
            s.close()


# -- configuration and the self-metric -------------------------------------------------------
def test_max_connections_flag() -> None:
    assert parse_config([], environ={}).max_connections == server_module.MAX_CONNECTIONS == 64
    assert parse_config(["--max-connections", "8"], environ={}).max_connections == 8
    assert parse_config([], environ={"GPUSCOPE_MAX_CONNECTIONS": "200"}).max_connections == 200
    for bad in ("0", "x", "100001"):
        with pytest.raises(ConfigError, match="--max-connections"):
            parse_config(["--max-connections", bad], environ={})


def test_closed_connections_are_a_self_metric() -> None:
    from gpuscope.exporter.cli import build_registry, build_source
    from gpuscope.exporter.kubernetes.attribution import Attributor, NodeInfo
    from gpuscope.exporter.sampler import Sampler

    cfg = parse_config(["--source", "simulated"], environ={})
    source, inputs = build_source(cfg)
    sampler = Sampler(source, cfg.interval)
    attributor = Attributor(inputs, node_fallback=NodeInfo())
    stats = ConnectionStats()
    stats.count("evicted")
    stats.count("evicted")
    try:
        registry = build_registry(cfg, sampler, attributor, connections=stats)
        got = {s.labels["reason"]: s.value for fam in registry.collect()
               if fam.name == "gpu_exporter_http_connections_closed" for s in fam.samples
               if s.name.endswith("_total")}
        assert got == {"evicted": 2.0, "refused": 0.0, "timeout": 0.0, "too_large": 0.0}
    finally:
        attributor.close()
        source.close()
