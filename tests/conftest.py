"""Fixtures shared across the suite: free ports and running exporter processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from tests.ports import free_port

REPO = Path(__file__).resolve().parent.parent

#: The modules that take half a minute or more on 2 cores (their fixtures build the 200-node
#: fleet in real stores, backfill the demo fleet's hour, run promtool over every rule test, or
#: run for a while), longest first (by ``pytest --durations``). They run before the others:
#: ``scripts/test`` hands whole files to its workers (pytest-xdist's ``--dist=loadfile``) in
#: collection order (:func:`pytest_configure`), and one of these handed out last kept one
#: worker busy alone at the end while the other had nothing left.
SLOW_FIRST = (
    "tests/dashboard/test_backends.py",
    "tests/dashboard/test_ha_replicas.py",
    "tests/dashboard/verdicts/test_recorded_runs.py",
    "tests/alerts/test_grafana.py",
    "tests/alerts/test_multicluster.py",
    "tests/reliability/test_leak.py",
    "tests/dashboard/test_embedded_and_stores.py",
    "tests/dashboard/verdicts/test_health_e2e.py",
    "tests/alerts/test_rules.py",
    "tests/dashboard/test_demo_views.py",
    "tests/dashboard/test_browser.py",
    "tests/bench/test_dashboard_bench.py",
    "tests/e2e/test_work_signals.py",
    "tests/dashboard/test_showback.py",
    "tests/bench/test_rules.py",
    "tests/exporter/kubernetes/podresources/test_grpcgo.py",
    "tests/exporter/sinks/cloudwatch/test_limits.py",
    "tests/reliability/test_dashboard_faults.py",
)


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist's ``--dist=loadfile`` hands out files in collection order, so that
    :data:`SLOW_FIRST` goes first. By default (``--loadscope-reorder``, xdist 3.8) it sorts
    them by their number of tests instead, most first: slow files of few tests (the leak
    test's 2, the health verdict's 4, one Prometheus end to end) were among the last handed
    out, and a 2-worker run ended with one worker alone on them."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """:data:`SLOW_FIRST`'s modules first, in its order; the rest as collected (a stable
    sort: each module's tests stay together and in order)."""
    rank = {path: i for i, path in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _ok(url: str) -> bool:
    try:
        return requests.get(url, timeout=1).status_code == 200
    except requests.RequestException:
        return False


class ExporterProcess:
    """``gpuscope-exporter`` as a real subprocess on a free loopback port."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 launcher: Sequence[str] = ("-m", "gpuscope.exporter")) -> None:
        """``args`` after ``--listen``; ``launcher``: what runs the exporter (e.g.
        ``-m bench.nvml_c_exporter --gpus 4 --``: over the C double of libnvidia-ml)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, *launcher, "--listen", f"127.0.0.1:{self.port}", *args]
        self.proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read() if self.proc.stdout else ""
                raise AssertionError(f"exporter exited {self.proc.returncode}: {out}")
            return _ok(self.url + "/readyz")

        wait_for(ready, timeout, f"{self.url}/readyz")

    def metrics(self) -> str:
        response = requests.get(self.url + "/metrics", timeout=5)
        response.raise_for_status()
        return response.text

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def stop_all(exporters: Iterable[ExporterProcess]) -> None:
    """Stops them together: each exporter exits some 0.5 s after its SIGTERM (its HTTP
    server's shutdown waits for the serve loop's poll), so stopped one after the other, five
    took 2.5 s. Every one is sent SIGTERM first, then each is waited for (and killed after
    10 s, as :meth:`ExporterProcess.stop` does)."""
    exporters = list(exporters)
    for exp in exporters:
        if exp.proc.poll() is None:
            exp.proc.terminate()
    for exp in exporters:
        exp.stop()


@pytest.fixture
def start_exporter() -> Iterator[Callable[..., ExporterProcess]]:
    started: list[ExporterProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> ExporterProcess:
        exp = ExporterProcess(list(args), env)
        started.append(exp)
        if ready:
            exp.wait_ready()
        return exp

    yield start
    stop_all(started)


@pytest.fixture(scope="module")
def fake_libnvml_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C double of libnvidia-ml (``bench/fake_libnvml``), built for the module's tests:
    the real pynvml loads it in place of the driver's library."""
    from bench.nvml_c_exporter import BuildError, build_library
    try:
        return build_library(tmp_path_factory.mktemp("fake_libnvml"))
    except BuildError as exc:
        # Not a skip: scripts/setup --test installs gcc and the libc headers.
        pytest.fail(str(exc))


def _debian_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        # Not a skip: the README's test command (scripts/test) installs Debian's prometheus
        # package, so a missing binary means the suite was run some other way.
        pytest.fail(f"{name} not found: run the suite with scripts/test, which installs it")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _debian_tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _debian_tool("prometheus")


#: What a test's HTTP server does with each request (GET, or POST with its body read).
HttpHandler = Callable[[BaseHTTPRequestHandler], None]


@pytest.fixture
def http_server() -> Iterator[Callable[[HttpHandler], str]]:
    """``start(handle)`` -> the base URL of a real HTTP server on 127.0.0.1 that answers
    every GET and POST with ``handle``; stopped after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(handle: HttpHandler) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                handle(self)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                handle(self)

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
