"""HTTP endpoints: ``/metrics`` (Prometheus text or OpenMetrics), ``/healthz``, ``/readyz``.

A plain ``ThreadingHTTPServer``: a scrape only renders already-sampled state, so one thread
per connection is cheap and a slow client cannot hold up another.

``/metrics`` answers in the Prometheus text format 0.0.4 whenever the client accepts it, even
when it prefers OpenMetrics (Prometheus does: ``text/plain;version=0.0.4;q=0.5`` after
``application/openmetrics-text``). The exporter uses nothing that only OpenMetrics can carry
(no exemplars, no ``_created`` samples, no units metadata), and prometheus_client's OpenMetrics
encoder costs about 60 % more than its text encoder, which :mod:`exporter.exposition` beats
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
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.exposition import CONTENT_TYPE, generate_text

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


#: Seconds a client has, after connecting, to complete the TLS handshake.
TLS_HANDSHAKE_TIMEOUT = 10.0


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


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        ssl_context: ssl.SSLContext | None = None,
        probes_only: bool = False,
    ) -> None:
        if ":" in address[0]:  # an IPv6 literal such as "::"
            self.address_family = socket.AF_INET6
        self.registry = registry
        self.healthy = healthy
        self.ready = ready
        self.ssl_context = ssl_context
        self.probes_only = probes_only
        super().__init__(address, _Handler)

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
        if isinstance(sys.exc_info()[1], ssl.SSLError):  # a TLS client gone mid-request
            log.debug("TLS error with %s: %s", client_address[0], sys.exc_info()[1])
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    server_version = "gpuscope"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY on every connection: a response goes out as two writes (headers, body), and
    # with Nagle the body waited for the ACK of the headers, which a client delays by up to
    # 40 ms: a /metrics right after another request on a kept-alive connection took 43-47 ms.
    disable_nagle_algorithm = True

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
        if _accepts_text_004(accept):
            body, content_type = generate_text(self.server.registry), CONTENT_TYPE
        else:  # OpenMetrics (or text 1.0.0) only: prometheus_client negotiates the details
            encoder, content_type = choose_encoder(accept)
            body = encoder(self.server.registry)
        headers = {}
        # Prometheus always offers gzip; for a few hundred series it saves ~85 % on the wire.
        if "gzip" in self.headers.get("Accept-Encoding", "") and len(body) > 1024:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
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
    ``probes_only`` (plain-HTTP probes next to a TLS port that requires client certificates)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
        ssl_context: ssl.SSLContext | None = None,
        probes_only: bool = False,
    ) -> None:
        self._httpd = _HTTPServer((host, port), registry, healthy, ready, ssl_context,
                                  probes_only)
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
