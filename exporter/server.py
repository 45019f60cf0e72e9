"""HTTP endpoints: ``/metrics`` (Prometheus text or OpenMetrics), ``/healthz``, ``/readyz``.

A plain ``ThreadingHTTPServer``: a scrape only renders already-sampled state, so one thread
per connection is cheap and a slow client cannot hold up another.
"""

from __future__ import annotations

import gzip
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

_INDEX = b"""<html><head><title>gpuscope exporter</title></head><body>
<h1>gpuscope exporter</h1>
<ul><li><a href="/metrics">/metrics</a></li><li><a href="/healthz">/healthz</a></li>
<li><a href="/readyz">/readyz</a></li></ul></body></html>
"""


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
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
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
