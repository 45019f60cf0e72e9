"""Fixtures of the dashboard tests: hand-built series, a headless Chromium, and the demo
dashboard as a real ``gpuscope-dashboard --demo`` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

import pytest
import requests
from playwright.sync_api import BrowserContext, Page, sync_playwright

from gpuscope.dashboard.data.steps import StepQuery
from gpuscope.dashboard.series import FleetData, GpuInfo, GpuRef, NodeInfo, Series, Window
from gpuscope.dashboard.views import FleetView, with_details
from tests.conftest import REPO, free_port, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run",
]

T0 = 1_800_000_000.0  # a fixed "now" for hand-built series


def make_series(values: Sequence[float], *, step: float = 60.0, end: float = T0) -> Series:
    """``values`` at ``end - (n-1)*step ... end``."""
    n = len(values)
    return Series(tuple(end - (n - 1 - i) * step for i in range(n)), tuple(values))


def make_window(seconds: float, *, step: float = 60.0, end: float = T0) -> Window:
    return Window(start=end - seconds, end=end, step=step)


class FixedSource:
    """A data source serving one :class:`FleetData` (the service's view of a store): its
    window, the page, and no answers to the registry's step queries."""

    description = "fixed test source"

    def __init__(self, data: FleetData) -> None:
        self.data = data

    def window(self, window_seconds: float) -> Window:
        return self.data.window

    def fleet(self, window_seconds: float, namespace: str | None = None,
              window: Window | None = None) -> FleetData:
        return self.data

    def step_series(self, queries: Sequence[StepQuery], window_seconds: float,
                    window: Window | None = None
                    ) -> dict[StepQuery, list[tuple[dict[str, str], Series]]]:
        return {q: [] for q in queries}

    def close(self) -> None:
        pass


def one_idle_gpu_fleet(node: str = "gpu-node-1") -> FleetData:
    """The smallest fleet: one node (g6.xlarge, named ``node``) with one L4, idle over the
    last hour."""
    ref = GpuRef(node, "GPU-1")
    w = make_window(3600)
    return FleetData(
        window=w, history_start=w.start,
        gpus={ref: GpuInfo(node, "0", "GPU-1", "NVIDIA L4")},
        nodes={node: NodeInfo(node, "g6.xlarge")},
        gpu_busy_max={ref: make_series([0.0] * 61)}, gpu_now={ref: 0.0}, gpu_mean={ref: 0.0},
    )


@pytest.fixture(scope="session")
def browser() -> Iterator[BrowserContext]:
    """One headless Chromium (Debian's, never a downloaded one) for the session."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} not found: apt-get install chromium (scripts/setup --test)")
    with tempfile.TemporaryDirectory() as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        context.set_default_timeout(20_000)
        yield context
        context.close()


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    pg = browser.new_page()
    yield pg
    pg.close()


class DashboardProcess:
    """``python -m gpuscope.dashboard ...`` on a free loopback port."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self._log = log.open("wb")
        self.log_path = log
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpuscope.dashboard",
             "--listen", f"127.0.0.1:{self.port}", *args],
            cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
            env={k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")},
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"dashboard exited {self.proc.returncode}: "
                                     f"{self.log_path.read_text()}")
            try:
                return requests.get(self.url, timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, timeout, self.url)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@pytest.fixture(scope="session")
def demo_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardProcess]:
    proc = DashboardProcess(["--demo"], tmp_path_factory.mktemp("demo") / "dashboard.log")
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


class _RecordingPrometheus(BaseHTTPRequestHandler):
    """A Prometheus HTTP API that answers every query with an empty result and records it."""

    queries: list[str] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        form = parse_qs(self.rfile.read(length).decode())
        self.queries.append(form["query"][0])
        kind = "matrix" if self.path.endswith("query_range") else "vector"
        body = json.dumps({"status": "success", "data": {"resultType": kind, "result": []}})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def recording_prometheus() -> Iterator[tuple[str, list[str]]]:
    """(base URL, the PromQL queries it received, in order)."""
    queries: list[str] = []
    handler = type("H", (_RecordingPrometheus,), {"queries": queries})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", queries
    server.shutdown()
    server.server_close()


def every_row(view: FleetView) -> FleetView:
    """``view`` with what every row of its tables shows beyond its verdict read from the store
    (as "show all rows" reads it; the page reads it for the first ``TOP_ROWS``): for
    comparing every row of a page with another's."""
    for table_id in view.row_details:
        view, problem = with_details(view, table_id, 1 << 30)
        assert problem is None, problem
    return view
