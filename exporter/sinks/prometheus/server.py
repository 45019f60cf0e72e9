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
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import socket
import ssl
import sys
import threading
from collections.abc import Callable, Hashable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from gpuscope.exporter.flags import IPV6_UNAVAILABLE
from gpuscope.exporter.sinks.prometheus.exposition import CONTENT_TYPE, generate_text

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
#: kept-alive connection; also one blocked send) before the server closes it. Without it a
#: client gone without a FIN (its node crashed, a NAT or conntrack entry dropped) held a
#: thread and a file descriptor for as long as the exporter ran. Above the usual scrape
#: intervals, so that Prometheus keeps reusing its connection; a longer interval only costs
#: a new connection per scrape (Go's client reconnects to a closed idle connection).
IDLE_TIMEOUT = 300.0


class TLSError(Exception):
    """A certificate, key or CA file that cannot be used; ``str()`` is one line."""


def _refuse_password() -> str:
    # Called by OpenSSL for an encrypted key; without it OpenSSL would prompt on the terminal.
    raise TLSError("--tls-key-file: encrypted private keys are not supported")


def _read(flag: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise TLSError(f"{flag} {path}: {exc.strerror or exc}") from None


def tls_context(
    cert_file: str, key_file: str, client_ca_file: str | None = None
) -> ssl.SSLContext:
    """A server context for TLS 1.2 or newer with this certificate (chain) and key; with
    ``client_ca_file``, a client certificate signed by that CA is required. Files are PEM;
    cert and key may be the same file. Raises :class:`TLSError` with one line."""
    if b"-----BEGIN CERTIFICATE-----" not in _read("--tls-cert-file", cert_file):
        raise TLSError(f"--tls-cert-file {cert_file}: no PEM certificate in it")
    if b"PRIVATE KEY-----" not in _read("--tls-key-file", key_file):
        raise TLSError(f"--tls-key-file {key_file}: no PEM private key in it")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    try:
        ctx.load_cert_chain(cert_file, key_file, password=_refuse_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TLSError(f"--tls-key-file {key_file} is not the key of the certificate in "
                           f"--tls-cert-file {cert_file}") from None
        raise TLSError(f"--tls-cert-file {cert_file}, --tls-key-file {key_file}: cannot load "
                       f"them: {exc.reason or exc}") from None
    except OSError as exc:  # removed or unreadable since it was read above
        raise TLSError(f"--tls-cert-file {cert_file}, --tls-key-file {key_file}: "
                       f"{exc.strerror or exc}") from None
    if client_ca_file is not None:
        _read("--tls-client-ca-file", client_ca_file)
        try:
            ctx.load_verify_locations(cafile=client_ca_file)
        except ssl.SSLError as exc:
            raise TLSError(f"--tls-client-ca-file {client_ca_file}: no usable PEM CA "
                           f"certificate in it ({exc.reason or exc})") from None
        except OSError as exc:
            raise TLSError(f"--tls-client-ca-file {client_ca_file}: "
                           f"{exc.strerror or exc}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


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
        ssl_context: ssl.SSLContext | None = None,
        probes_only: bool = False,
        render_key: Callable[[], Hashable] | None = None,
    ) -> None:
        if ":" in address[0]:  # an IPv6 literal such as "::"
            self.address_family = socket.AF_INET6
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
                sock = self.ssl_context.wrap_socket(
                    sock, server_side=True, do_handshake_on_connect=False
                )
            except OSError:
                sock.close()
                raise
        return sock, address

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            # A client that connects and never finishes its handshake (or speaks plain HTTP)
            # holds only this thread, and only for TLS_HANDSHAKE_TIMEOUT seconds.
            try:
                request.settimeout(TLS_HANDSHAKE_TIMEOUT)
                request.do_handshake()
                request.settimeout(None)
            except OSError as exc:  # ssl.SSLError, TimeoutError, a reset
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
    server_version = "gpuscope"
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on every connection: a response goes out as two writes (headers, body), and
    # with Nagle the body waited for the ACK of the headers, which a client delays by up to
    # 40 ms: a /metrics right after another request on a kept-alive connection took 43-47 ms.
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        # Every read and write of the connection then ends with TimeoutError after this
        # long, which BaseHTTPRequestHandler answers by closing the connection.
        self.connection.settimeout(self.server.idle_timeout)

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
        ssl_context: ssl.SSLContext | None = None,
        probes_only: bool = False,
        render_key: Callable[[], Hashable] | None = None,
    ) -> None:
        self._httpd = _HTTPServer((host, port), registry, healthy, ready, ssl_context,
                                  probes_only, render_key)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="gpuscope-http", daemon=True
        )

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
