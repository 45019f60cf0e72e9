from __future__ import annotations

import errno
import gzip
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sinks.prometheus.server import ExporterServer, _Handler
from tests.exporter.snapshots import fixed_snapshot
from tests.ports import has_ipv6


class Flags:
    healthy = True
    ready = False


@pytest.fixture
def server() -> Iterator[str]:
    snap = fixed_snapshot()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(lambda: snap))
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: Flags.healthy, lambda: Flags.ready)
    srv.start()
    yield f"http://127.0.0.1:{srv.port}"
    srv.stop()


def test_metrics_text_format(server: str) -> None:
    r = requests.get(server + "/metrics", headers={"Accept-Encoding": "identity"}, timeout=5)
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert 'gpu_up{gpu="1",uuid="GPU-66666666-7777-8888-9999-000000000000"} 0.0' in r.text
    # Was "gpuscope " (BaseHTTPRequestHandler joins the Python version, emptied, with a
    # space); nothing about the Python behind it.
    assert r.headers["Server"] == "gpuscope"


def test_metrics_gzip_when_asked(server: str) -> None:
    raw = requests.get(server + "/metrics", headers={"Accept-Encoding": "gzip"}, stream=True,
                       timeout=5).raw.read(decode_content=False)
    assert "gpu_info{" in gzip.decompress(raw).decode()


# What Prometheus sends: 2.x, and 3.x with its default scrape_protocols.
PROMETHEUS_2_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,"
    "text/plain;version=1.0.0;escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,"
    "*/*;q=0.1"
)


@pytest.mark.parametrize("accept", [PROMETHEUS_2_ACCEPT, PROMETHEUS_3_ACCEPT, "*/*", "text/*"])
def test_text_when_accepted_even_if_openmetrics_preferred(server: str, accept: str) -> None:
    # The exporter uses nothing OpenMetrics-only, and the text encoder is far cheaper.
    r = requests.get(server + "/metrics", headers={"Accept": accept}, timeout=5)
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "# EOF" not in r.text
    assert 'gpu_up{gpu="1",uuid="GPU-66666666-7777-8888-9999-000000000000"} 0.0' in r.text


@pytest.mark.parametrize("accept", [
    "application/openmetrics-text; version=1.0.0",
    "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0",
])
def test_openmetrics_only_when_nothing_else_accepted(server: str, accept: str) -> None:
    r = requests.get(server + "/metrics", headers={"Accept": accept}, timeout=5)
    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")


def test_accepted_sockets_have_nagle_off(
    server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With Nagle on, the body (second write) waited for the client's delayed ACK of the
    # headers: a request after another on a kept-alive connection stalled 40+ ms.
    seen: list[int] = []
    setup = _Handler.setup

    def record(handler: _Handler) -> None:
        setup(handler)
        seen.append(handler.connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(_Handler, "setup", record)
    with requests.Session() as session:  # one kept-alive connection, two requests
        assert session.get(server + "/healthz", timeout=5).status_code == 200
        assert session.get(server + "/metrics", timeout=5).status_code == 200
    assert len(seen) == 1 and seen[0] != 0


def test_probes(server: str) -> None:
    Flags.healthy, Flags.ready = True, False
    assert requests.get(server + "/healthz", timeout=5).status_code == 200
    assert requests.get(server + "/readyz", timeout=5).status_code == 503
    Flags.healthy, Flags.ready = False, True
    assert requests.get(server + "/healthz", timeout=5).status_code == 503
    assert requests.get(server + "/readyz", timeout=5).status_code == 200
    assert requests.get(server + "/nope", timeout=5).status_code == 404


class CountingCollector:
    """One gauge whose value is the number of times it was collected."""

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.calls += 1
        time.sleep(0.005)  # a rendering that takes a while, so concurrent scrapes overlap
        yield GaugeMetricFamily("renders", "Renders so far.", value=self.calls)


PLAIN = {"Accept-Encoding": "identity"}


def test_render_once_per_key_however_many_scrape() -> None:
    collector = CountingCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    key = [0]
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: True,
                         render_key=lambda: key[0])
    srv.start()
    url = f"http://127.0.0.1:{srv.port}/metrics"
    try:
        with ThreadPoolExecutor(max_workers=32) as pool:
            bodies = list(pool.map(lambda _: requests.get(url, headers=PLAIN, timeout=10).text,
                                   range(64)))
        assert collector.calls == 1
        assert set(bodies) == {bodies[0]} and "renders 1.0" in bodies[0]
        # A client accepting gzip is a variant of its own, rendered once too (this body is
        # under 1 KiB, so it goes out uncompressed either way).
        zipped = requests.get(url, headers={"Accept-Encoding": "gzip"}, timeout=5)
        assert "renders 2.0" in zipped.text and "Content-Encoding" not in zipped.headers
        assert "renders 1.0" in requests.get(url, headers=PLAIN, timeout=5).text
        key[0] = 1  # the next sampling round
        assert "renders 3.0" in requests.get(url, headers=PLAIN, timeout=5).text
        assert collector.calls == 3
    finally:
        srv.stop()


def test_renderings_kept_are_bounded_whatever_clients_accept() -> None:
    """The content type comes from the client's Accept header (prometheus_client echoes its
    version and escaping): every distinct one kept a rendering for the exporter's life, so a
    client counting up the version grew memory without bound (3,000 scrapes: +160 MB)."""
    collector = CountingCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    key = [0]
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: True,
                         render_key=lambda: key[0])
    srv.start()
    url = f"http://127.0.0.1:{srv.port}/metrics"
    try:
        with requests.Session() as session:
            for i in range(40):
                key[0] = i // 20  # two sampling rounds
                accept = f"application/openmetrics-text; version=1.0.{i}"
                got = session.get(url, headers={**PLAIN, "Accept": accept}, timeout=5)
                assert got.status_code == 200
        kept = srv._httpd._rendered
        assert len(kept) <= 10, len(kept)  # the text format's 2, and 8 others
        # The usual variants are still rendered once per round.
        calls = collector.calls
        for _ in range(3):
            requests.get(url, headers=PLAIN, timeout=5)
        assert collector.calls == calls + 1
    finally:
        srv.stop()


def test_without_a_render_key_every_scrape_renders() -> None:
    collector = CountingCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: True)
    srv.start()
    try:
        for i in range(1, 4):
            body = requests.get(f"http://127.0.0.1:{srv.port}/metrics", timeout=5).text
            assert f"renders {i}.0" in body
    finally:
        srv.stop()


def test_listen_backlog_admits_a_burst_of_connections() -> None:
    """100 clients connecting at once all get through the handshake at once (the default
    backlog of 5 made most of them wait for SYN retransmits, 1 s and more)."""
    registry = CollectorRegistry(auto_describe=False)
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: True)
    srv.start()
    socks: list[socket.socket] = []
    try:
        # The kernel completes a handshake for a connection in the backlog before the
        # accept loop gets to it; past the backlog, the SYN is dropped and retried after 1 s.
        started = time.monotonic()
        for _ in range(100):
            socks.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        assert time.monotonic() - started < 0.9
    finally:
        for s in socks:
            s.close()
        srv.stop()


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` (EOF or a reset) within ``within`` seconds; what
    it sends before that (a response) is read and skipped."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def test_idle_connections_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connection that sends nothing, or stays idle after its response (a keep-alive whose
    client vanished without a FIN: a crashed node, a dropped NAT entry), is closed after
    IDLE_TIMEOUT: each such connection held a thread and a file descriptor for good."""
    from gpuscope.exporter.sinks.prometheus import server as server_module

    monkeypatch.setattr(server_module, "IDLE_TIMEOUT", 0.5, raising=False)
    registry = CollectorRegistry(auto_describe=False)
    srv = ExporterServer("127.0.0.1", 0, registry, lambda: True, lambda: True)
    srv.start()
    silent = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    kept_alive = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    try:
        kept_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept_alive.recv(65536).startswith(b"HTTP/1.1 200")
        assert _closed_by_server(silent, within=5.0)
        assert _closed_by_server(kept_alive, within=5.0)
        # A scrape still works, and a client that keeps talking is not cut off.
        with requests.Session() as session:
            for _ in range(3):
                assert session.get(f"http://127.0.0.1:{srv.port}/metrics", timeout=5).ok
                time.sleep(0.2)
    finally:
        silent.close()
        kept_alive.close()
        srv.stop()


def test_the_default_address_serves_ipv4_and_ipv6() -> None:
    # The default, [::]: one socket for IPv4 clients (an IPv4 or dual-stack cluster) and
    # IPv6 ones (an IPv6-only cluster, such as EKS's IPv6 mode, where 0.0.0.0 left every
    # scrape and probe of the pod's IPv6 address unanswered), whatever bindv6only says.
    srv = ExporterServer("::", 0, CollectorRegistry(auto_describe=False), lambda: True,
                         lambda: True)
    srv.start()
    try:
        urls = [f"http://127.0.0.1:{srv.port}/healthz"]
        if has_ipv6():  # (else the server fell back to IPv4: the next test's case)
            urls.append(f"http://[::1]:{srv.port}/healthz")
        for url in urls:
            assert requests.get(url, timeout=5).status_code == 200, url
    finally:
        srv.stop()


def test_without_ipv6_the_default_address_is_every_ipv4_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A kernel booted with ipv6.disable=1: an AF_INET6 socket cannot be made at all.
    real = socket.socket

    class NoIPv6(real):  # type: ignore[misc,valid-type]
        def __init__(self, family: int = socket.AF_INET, *args: object, **kw: object) -> None:
            if family == socket.AF_INET6:
                raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
            super().__init__(family, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "socket", NoIPv6)
    srv = ExporterServer("::", 0, CollectorRegistry(auto_describe=False), lambda: True,
                         lambda: True)
    monkeypatch.setattr(socket, "socket", real)
    srv.start()
    try:
        assert requests.get(f"http://127.0.0.1:{srv.port}/healthz", timeout=5).status_code == 200
    finally:
        srv.stop()
    # Any other address is taken as given: no IPv6 there is an error, not a fallback.
    monkeypatch.setattr(socket, "socket", NoIPv6)
    with pytest.raises(OSError):
        ExporterServer("::1", 0, CollectorRegistry(auto_describe=False), lambda: True,
                       lambda: True)
