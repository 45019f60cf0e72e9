"""Fixtures for the alerting tests: Debian's Alertmanager tools and a real moto server."""

from __future__ import annotations

import json
import os
import queue
import resource
import shutil
import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

# One way to run a real moto server for the whole suite (the CloudWatch sink tests' fixture).
from tests.exporter.sinks.cloudwatch.conftest import MotoServer
from tests.exporter.sinks.cloudwatch.conftest import moto_server as moto_server


def run_with_a_disk_that_fills(args: list[str], limit: int) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in the repository where no file can grow past ``limit`` bytes
    (RLIMIT_FSIZE: a write past it fails with EFBIG part-way, as on a full disk)."""

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, preexec_fn=limit_file_size,
    )


def debian_tool(*names: str, package: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    # Not a skip: scripts/test installs the Debian package, so a missing binary means the
    # suite was run some other way.
    pytest.fail(f"{names[0]} not found: install Debian's {package} (scripts/test does)")


@pytest.fixture(scope="session")
def amtool() -> str:
    return debian_tool("amtool", package="prometheus-alertmanager")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    # Debian names the binary prometheus-alertmanager; upstream tarballs call it alertmanager.
    return debian_tool("prometheus-alertmanager", "alertmanager", package="prometheus-alertmanager")


@pytest.fixture
def moto(moto_server: MotoServer) -> str:
    """The moto server's URL, with every account's state emptied first."""
    moto_server.reset()
    return moto_server.url


REPO = Path(__file__).resolve().parents[2]


class Webhook:
    """An HTTP server that records every Alertmanager notification by receiver (URL path)."""

    def __init__(self) -> None:
        self.received: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.put((self.path.strip("/"), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def drain(self) -> list[tuple[str, Any]]:
        """Every notification received so far (receiver, body), taken off the queue."""
        out = []
        while not self.received.empty():
            out.append(self.received.get_nowait())
        return out
