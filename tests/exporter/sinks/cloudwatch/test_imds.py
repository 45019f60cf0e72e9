"""``--instance-id imds``: IMDSv2 (token, then the instance ID), against a local double."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuscope.exporter.sinks.cloudwatch.imds import instance_id_from_imds
from tests.conftest import free_port


class _Imds(BaseHTTPRequestHandler):
    answer = b"i-0abc1234def567890"
    seen: list[tuple[str, str, str | None]] = []

    def do_PUT(self) -> None:
        ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self.seen.append(("PUT", self.path, ttl))
        self._reply(200, b"TOKEN-1")

    def do_GET(self) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token")
        self.seen.append(("GET", self.path, token))
        if token != "TOKEN-1":
            self._reply(401, b"")
        else:
            self._reply(200, self.answer)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def imds() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    _Imds.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_token_then_instance_id(imds: str) -> None:
    assert instance_id_from_imds(imds) == "i-0abc1234def567890"
    assert _Imds.seen == [("PUT", "/latest/api/token", "60"),
                          ("GET", "/latest/meta-data/instance-id", "TOKEN-1")]


def test_garbage_or_no_imds_gives_none(imds: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Imds, "answer", b"<html>captive portal</html>")
    assert instance_id_from_imds(imds) is None
    assert instance_id_from_imds(f"http://127.0.0.1:{free_port()}", timeout=0.5) is None
