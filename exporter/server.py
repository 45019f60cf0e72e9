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
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
    ) -> None:
        if ":" in address[0]:  # an IPv6 literal such as "::"
            self.address_family = socket.AF_INET6
        self.registry = registry
        self.healthy = healthy
        self.ready = ready
        super().__init__(address, _Handler)


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
        if path == "/metrics":
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
    """Serves the endpoints on ``host:port`` from a background thread."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        healthy: Callable[[], bool],
        ready: Callable[[], bool],
    ) -> None:
        self._httpd = _HTTPServer((host, port), registry, healthy, ready)
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
        self._httpd.shutdown()
        self._httpd.server_close()
