"""HTTP endpoints: ``/metrics`` (Prometheus text or OpenMetrics), ``/healthz``, ``/readyz``.

A plain ``ThreadingHTTPServer``: a scrape only renders already-sampled state, so one thread
per connection is cheap and a slow client cannot hold up another.

``/metrics`` answers in the Prometheus text format 0.0.4 whenever the client accepts it, even
when it prefers OpenMetrics (Prometheus does: ``text/plain;version=0.0.4;q=0.5`` after
``application/openmetrics-text``). The exporter uses nothing that only OpenMetrics can carry
(no exemplars, no ``_created`` samples, no units metadata), and prometheus_client's OpenMetrics
encoder costs about 60 % more than its text encoder, which
:mod:`gpuscope.exporter.sinks.prometheus.exposition` beats
again by about 2x with byte-identical output. OpenMetrics is served only to a client that
accepts nothing else.

With a certificate and key (``--tls-cert-file``, ``--tls-key-file``) every endpoint is served
over TLS 1.2 or newer, and with ``--tls-client-ca-file`` only to clients presenting a
certificate signed by that CA. The handshake runs in the connection's own thread with a
timeout, never in the accept loop, so a client that connects and sends nothing cannot hold up
other scrapes. Certificates are read once at start: a restart picks up rotated files.

Clients that hold connections cannot exhaust the pod's memory or its threads: at most
``max_connections`` connections are open (one thread each); a new one at the cap evicts the
connection idle the longest (waiting for a request, none of whose bytes has arrived yet), or
is closed at once when none is idle. A request's line and headers have REQUEST_TIMEOUT in all
from their first byte and at most MAX_REQUEST_BYTES, a TLS handshake TLS_HANDSHAKE_TIMEOUT in
all from the connection, a response SEND_TIMEOUT: a client trickling bytes cannot hold its
slot, and idle ones are what gets evicted, so Prometheus' scrapes and the kubelet's probes
are answered under a flood of either (``tests/.../test_server_limits.py``).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import logging
import select
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpuscope.exporter.flags import IPV6_UNAVAILABLE
from gpuscope.exporter.sinks.prometheus.exposition import CONTENT_TYPE, generate_text
from gpuscope.exporter.sinks.prometheus.tls import ReloadingContext

log = logging.getLogger(__name__)

_INDEX = b"""<html><head><title>gpuscope exporter</title></head><body>
<h1>gpuscope exporter</h1>
<ul><li><a href="/metrics">/metrics</a></li><li><a href="/healthz">/healthz</a></li>
<li><a href="/readyz">/readyz</a></li></ul></body></html>
"""


def _accepts_text_004(accept: str) -> bool:
    """Whether an ``Accept`` header admits the text format 0.0.4: no header, ``*/*``,
    ``text/*`` or ``text/plain`` without a version or with version 0.0.4, at a quality
    above 0 (RFC 9110 12.5.1)."""
    if not accept.strip():
        return True
    for media_range in accept.split(","):
        mime, *params = (p.strip() for p in media_range.split(";"))
        mime = mime.lower()
        if mime not in ("*/*", "text/*", "text/plain"):
            continue
        quality, version = 1.0, None
        for param in params:
            key, _, value = param.partition("=")
            key, value = key.strip().lower(), value.strip().strip('"')
            if key == "q":
                with contextlib.suppress(ValueError):  # a malformed q counts as 1
                    quality = float(value)
            elif key == "version":
                version = value
        if quality > 0 and (mime != "text/plain" or version in (None, "0.0.4")):
            return True
    return False


#: Renderings of ``/metrics`` kept for the current round besides the text format's two
#: (plain and gzipped): the content type echoes the client's ``Accept`` (its version and
#: escaping), so the variants a client can ask for are unbounded.
MAX_OTHER_RENDERINGS = 8

#: Seconds a client has, after connecting, to complete the TLS handshake.
TLS_HANDSHAKE_TIMEOUT = 10.0

#: Seconds a connection may stay silent (no request yet, or idle between two requests on a
#: kept-alive connection) before the server closes it. Without it a
#: client gone without a FIN (its node crashed, a NAT or conntrack entry dropped) held a
#: thread and a file descriptor for as long as the exporter ran. Above the usual scrape
#: intervals, so that Prometheus keeps reusing its connection; a longer interval only costs
#: a new connection per scrape (Go's client reconnects to a closed idle connection).
IDLE_TIMEOUT = 300.0

#: Seconds a request's line and headers have, in all, from their first byte: a client that
#: trickles them (slowloris: one byte every few seconds reset a per-read timeout) is cut off
#: then. Idle time before the first byte is IDLE_TIMEOUT's (and evictable at the cap).
REQUEST_TIMEOUT = 10.0

#: Bytes a request's line and headers may take, in all (the standard library's own limits,
#: 100 lines of 64 KiB, let one connection hold 6.5 MB). Prometheus sends well under 1 KiB.
MAX_REQUEST_BYTES = 64 * 1024

#: Seconds one response has to be sent, in all (the headers and body; a client that does not
#: read it holds its slot no longer). Three times Prometheus' default scrape timeout.
SEND_TIMEOUT = 30.0

#: Connections open at once (``--max-connections``), each with its own thread (~25 KB).
MAX_CONNECTIONS = 64

#: Why the server closed a connection itself (``gpu_exporter_http_connections_closed_total``).
CLOSE_REASONS = ("evicted", "refused", "timeout", "too_large")


class ConnectionStats:
    """Connections closed by the server to protect itself, by reason (CLOSE_REASONS); one
    object may count for several servers (the metrics port and ``--probe-listen``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(CLOSE_REASONS, 0)

    def count(self, reason: str) -> None:
        with self._lock:
            self._counts[reason] += 1

    def totals(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self._counts)


class _Conn:
    """One open connection's state, changed under the server's connections lock:
    ``idle_since`` (monotonic) while it waits for a request none of whose bytes has arrived,
    None while busy; ``deadline`` for the request being read; ``send_deadline`` for the
    response being sent."""

    __slots__ = ("deadline", "idle_since", "received", "send_deadline", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.idle_since: float | None = time.monotonic()
        self.deadline: float | None = None
        self.send_deadline = 0.0
        self.received = 0


class _RequestTooLarge(Exception):
    pass


class _ConnReader(io.RawIOBase):
    """The connection's reads, for the handler's buffered ``rfile``: while the connection is
    idle, each read may wait IDLE_TIMEOUT; from a request's first byte, all reads until its
    headers are parsed share one deadline, and its bytes are counted."""

    def __init__(self, server: _HTTPServer, conn: _Conn) -> None:
        self._server = server
        self._conn = conn

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        conn, sock = self._conn, self._conn.sock
        if conn.deadline is None:
            sock.settimeout(self._server.idle_timeout)
        else:
            left = conn.deadline - time.monotonic()
            if left <= 0:
                self._server.connection_stats.count("timeout")
                raise TimeoutError(f"request line and headers took over {REQUEST_TIMEOUT:g} s")
            sock.settimeout(left)
        try:
            n = sock.recv_into(buffer)
        except TimeoutError:
            if conn.deadline is not None:
                self._server.connection_stats.count("timeout")
            raise
        if n:
            self._server.busy(conn)
            conn.received += n
            if conn.received > MAX_REQUEST_BYTES:
                self._server.connection_stats.count("too_large")
                raise _RequestTooLarge
        return n


class _ConnWriter(io.BufferedIOBase):
    """The connection's writes, for the handler's ``wfile``: all of a response's share one
    deadline (SSLSocket.sendall's timeout is per send, not for the whole)."""

    def __init__(self, server: _HTTPServer, conn: _Conn) -> None:
        self._server = server
        self._conn = conn

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        sock = self._conn.sock
        with memoryview(data) as view, view.cast("B") as octets:
            sent = 0
            while sent < len(octets):
                left = self._conn.send_deadline - time.monotonic()
                if left <= 0:
                    self._server.connection_stats.count("timeout")
                    raise TimeoutError(f"response not sent within {SEND_TIMEOUT:g} s")
                sock.settimeout(left)
                sent += sock.send(octets[sent:])
            return sent



def _encode(
    registry: CollectorRegistry, encoder: Callable[[CollectorRegistry], bytes], gzip_ok: bool
) -> tuple[bytes, bool]:
    """The body and whether it is gzipped: only when the client accepts it and the body is
    over 1 KiB (for a few hundred series gzip saves ~85 % on the wire)."""
    body = encoder(registry)
    if gzip_ok and len(body) > 1024:
        return gzip.compress(body, compresslevel=1), True
    return body, False


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The listen backlog. socketserver's default of 5 made the kernel drop the handshakes of
    # clients connecting together (100 at once under wrk); they retried after 1, 3, 7, 15 s.
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        ssl_context: ssl.SSLContext | ReloadingContext | None = None,
        probes_only: bool = False,
        render_key: Callable[[], Hashable] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        connection_stats: ConnectionStats | None = None,
    ) -> None:
        if ":" in address[0]:  # an IPv6 literal such as "::"
            self.address_family = socket.AF_INET6
        self.max_connections = max_connections
        self.connection_stats = connection_stats or ConnectionStats()
        self._conns_lock = threading.Lock()
        self._conns: dict[socket.socket, _Conn] = {}
        self.registry = registry
        self.healthy = healthy
        self.ready = ready
        self.ssl_context = ssl_context
        self.probes_only = probes_only
        self._render_key = render_key
        self.idle_timeout = IDLE_TIMEOUT
        self._render_lock = threading.Lock()
        # (content type, gzip accepted) -> (body, gzipped) for the render key in
        # _rendered_key: one rendering per sampling round however many clients scrape (see
        # ExporterServer); emptied when the key changes.
        self._rendered: dict[tuple[str, bool], tuple[bytes, bool]] = {}
        self._rendered_key: Hashable = None
        try:
            super().__init__(address, _Handler)
        except OSError as error:
            # "::" (every address, IPv6 and IPv4: the default) on a kernel without IPv6
            # (ipv6.disable=1): every IPv4 address instead, as before IPv6 was the default.
            if address[0] != "::" or error.errno not in IPV6_UNAVAILABLE:
                raise
            log.info("IPv6 is not available (%s): listening on 0.0.0.0:%d", error, address[1])
            self.address_family = socket.AF_INET
            super().__init__(("0.0.0.0", address[1]), _Handler)

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            # Dual-stack whatever net.ipv6.bindv6only says: IPv4 clients (IPv4-mapped) and
            # IPv6 ones (an IPv6-only cluster's pod IPs) on one socket.
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()

    def render(
        self, content_type: str, encoder: Callable[[CollectorRegistry], bytes], gzip_ok: bool
    ) -> tuple[bytes, bool]:
        """The ``/metrics`` body and whether it is gzipped, from the cache while the render
        key is unchanged."""
        if self._render_key is None:
            return _encode(self.registry, encoder, gzip_ok)
        # Under the lock: when 100 scrapes arrive together, one renders and 99 wait for it
        # instead of all 100 rendering the same bytes while fighting over the GIL.
        with self._render_lock:
            key = self._render_key()
            if key != self._rendered_key:
                self._rendered.clear()
                self._rendered_key = key
            cached = self._rendered.get((content_type, gzip_ok))
            if cached is not None:
                return cached
            body, gzipped = _encode(self.registry, encoder, gzip_ok)
            others = sum(1 for kind, _ in self._rendered if kind != CONTENT_TYPE)
            if content_type == CONTENT_TYPE or others < MAX_OTHER_RENDERINGS:
                self._rendered[(content_type, gzip_ok)] = (body, gzipped)
            return body, gzipped

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        if self.ssl_context is not None:
            # No I/O here, in the accept loop: the handshake runs in the connection's thread.
            try:
                ctx = (self.ssl_context if isinstance(self.ssl_context, ssl.SSLContext)
                       else self.ssl_context.context())
                sock = ctx.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
            except OSError:
                sock.close()
                raise
        return sock, address

    def process_request(self, request: Any, client_address: Any) -> None:
        """In the accept loop: admit the connection (a thread of its own), evicting the
        longest-idle one at the cap, or close it at once when none is idle."""
        conn = _Conn(request)
        victim = None
        with self._conns_lock:
            full = len(self._conns) >= self.max_connections
            if full:
                idle = [c for c in self._conns.values() if c.idle_since is not None]
                victim = min(idle, key=lambda c: c.idle_since or 0.0, default=None)
                if victim is not None:
                    del self._conns[victim.sock]
            if not full or victim is not None:
                self._conns[request] = conn
        if full and victim is None:
            self.connection_stats.count("refused")
            log.debug("%d connections, none idle: refused %s", self.max_connections,
                      client_address[0])
            self.shutdown_request(request)
            return
        if victim is not None:
            self.connection_stats.count("evicted")
            # Its thread, waiting in recv() or poll(), sees the end of the stream and ends.
            # On the plain socket: an SSLSocket's own shutdown() drops its TLS state, which
            # that thread is using.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(victim.sock, socket.SHUT_RDWR)
        super().process_request(request, client_address)

    def connection(self, sock: socket.socket) -> _Conn:
        with self._conns_lock:
            return self._conns.get(sock) or _Conn(sock)  # (evicted already: on its own)

    def idle(self, conn: _Conn) -> None:
        """``conn`` waits for a request: evictable from now on."""
        with self._conns_lock:
            conn.idle_since, conn.deadline, conn.received = time.monotonic(), None, 0

    def busy(self, conn: _Conn) -> None:
        """A request's (or handshake's) first bytes arrived: not evictable, and the request
        deadline runs."""
        if conn.idle_since is not None:
            with self._conns_lock:
                conn.idle_since = None
                conn.deadline = time.monotonic() + REQUEST_TIMEOUT
                # (for an error answered before the request is parsed)
                conn.send_deadline = conn.deadline + SEND_TIMEOUT

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            # A client that connects and never finishes its handshake (or speaks plain HTTP)
            # holds only this thread, and only for TLS_HANDSHAKE_TIMEOUT seconds in all (the
            # standard library's handshake timeout is a deadline over its reads). Until its
            # first byte it is idle, and evictable at the cap.
            deadline = time.monotonic() + TLS_HANDSHAKE_TIMEOUT
            conn = self.connection(request)
            try:
                poll = select.poll()
                poll.register(request, select.POLLIN)
                if not poll.poll(TLS_HANDSHAKE_TIMEOUT * 1000):
                    raise TimeoutError("nothing sent")
                self.busy(conn)
                request.settimeout(max(deadline - time.monotonic(), 0.001))
                request.do_handshake()
                request.settimeout(None)
            except OSError as exc:  # ssl.SSLError, TimeoutError, a reset
                if isinstance(exc, TimeoutError) and conn.idle_since is None:
                    self.connection_stats.count("timeout")
                log.debug("TLS handshake with %s failed: %s", client_address[0], exc)
                return
        super().finish_request(request, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        # A client gone mid-request (a TLS error, a reset, a closed pipe) is the client's
        # business: a debug line, not a traceback on stderr for every impatient scraper.
        if isinstance(exc, ssl.SSLError | ConnectionResetError | BrokenPipeError):
            log.debug("connection from %s ended early: %r", client_address[0], exc)
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    _conn: _Conn
    server_version = "gpuscope"
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on every connection: a response goes out as two writes (headers, body), and
    # with Nagle the body waited for the ACK of the headers, which a client delays by up to
    # 40 ms: a /metrics right after another request on a kept-alive connection took 43-47 ms.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        # Every read and write of the connection ends with TimeoutError when its time is
        # up (_ConnReader, _ConnWriter), which BaseHTTPRequestHandler answers by closing
        # the connection.
        self._conn = self.server.connection(self.connection)
        self.rfile.close()
        self.rfile = io.BufferedReader(_ConnReader(self.server, self._conn))
        self.wfile = _ConnWriter(self.server, self._conn)

    def handle_one_request(self) -> None:
        self.server.idle(self._conn)
        try:
            super().handle_one_request()
        except _RequestTooLarge:
            self.log_error("request line and headers over %d bytes", MAX_REQUEST_BYTES)
            self.close_connection = True

    def parse_request(self) -> bool:
        self.server.busy(self._conn)  # (a request read ahead, already in rfile's buffer)
        parsed = super().parse_request()  # reads the headers; may answer an error
        self._conn.send_deadline = time.monotonic() + SEND_TIMEOUT
        return parsed

    def version_string(self) -> str:
        """The ``Server`` header: the program's name, not the Python version behind it."""
        return self.server_version

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if self.server.probes_only and path not in ("/healthz", "/readyz"):
            self._send(404, "text/plain; charset=utf-8", b"not found\n")
        elif path == "/metrics":
            self._metrics()
        elif path == "/healthz":
            self._probe(self.server.healthy(), "sampler loop alive", "sampler loop stalled or dead")
        elif path == "/readyz":
            self._probe(self.server.ready(), "fresh sample", "no fresh sample from a live source")
        elif path == "/":
            self._send(200, "text/html; charset=utf-8", _INDEX)
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _metrics(self) -> None:
        accept = self.headers.get("Accept", "")
        encoder: Callable[[CollectorRegistry], bytes]
        if _accepts_text_004(accept):
            encoder, content_type = generate_text, CONTENT_TYPE
        else:  # OpenMetrics (or text 1.0.0) only: prometheus_client negotiates the details
            encoder, content_type = choose_encoder(accept)
        gzip_ok = "gzip" in self.headers.get("Accept-Encoding", "")
        body, gzipped = self.server.render(content_type, encoder, gzip_ok)
        headers = {"Content-Encoding": "gzip"} if gzipped else {}
        self._send(200, content_type, body, headers)

    def _probe(self, ok: bool, good: str, bad: str) -> None:
        if ok:
            self._send(200, "text/plain; charset=utf-8", f"ok: {good}\n".encode())
        else:
            self._send(503, "text/plain; charset=utf-8", f"not ok: {bad}\n".encode())

    def _send(
        self, code: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # Access logs at debug only: Prometheus scrapes every few seconds.
        log.debug("%s " + format, self.address_string(), *args)


class ExporterServer:
    """Serves the endpoints on ``host:port`` from a background thread; over TLS with an
    ``ssl_context`` (see :func:`tls_context`); only ``/healthz`` and ``/readyz`` with
    ``probes_only`` (plain-HTTP probes next to a TLS port that requires client certificates).

    With ``render_key``, ``/metrics`` is rendered once per distinct key and the bytes are
    served to every scrape until the key changes. The CLI's key changes with every completed
    sampling round and at least once per interval: device and container values are exactly
    what an uncached scrape would see, and the few values that change between rounds (the
    background workers' self-metrics, CloudWatch counters) are at most one interval old,
    while 100 concurrent scrapers cost one rendering per round instead of 100
    (``bench/load.py``; docs/reliability.md has the figures before and after)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        ssl_context: ssl.SSLContext | ReloadingContext | None = None,
        probes_only: bool = False,
        render_key: Callable[[], Hashable] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        connection_stats: ConnectionStats | None = None,
    ) -> None:
        self._httpd = _HTTPServer((host, port), registry, healthy, ready, ssl_context,
                                  probes_only, render_key, max_connections, connection_stats)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="gpuscope-http", daemon=True
        )

    @property
    def connection_stats(self) -> ConnectionStats:
        return self._httpd.connection_stats

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():  # shutdown() would wait forever on a server never started
            self._httpd.shutdown()
        self._httpd.server_close()
