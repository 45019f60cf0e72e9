from __future__ import annotations

import gzip
from collections.abc import Iterator

import pytest
import requests
from prometheus_client import CollectorRegistry

from exporter.collectors.gpu import GpuCollector
from exporter.server import ExporterServer
from tests.exporter.snapshots import fixed_snapshot


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


def test_metrics_gzip_when_asked(server: str) -> None:
    raw = requests.get(server + "/metrics", headers={"Accept-Encoding": "gzip"}, stream=True,
                       timeout=5).raw.read(decode_content=False)
    assert "gpu_info{" in gzip.decompress(raw).decode()


def test_openmetrics_negotiated(server: str) -> None:
    r = requests.get(server + "/metrics",
                     headers={"Accept": "application/openmetrics-text; version=1.0.0"}, timeout=5)
    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")


def test_probes(server: str) -> None:
    Flags.healthy, Flags.ready = True, False
    assert requests.get(server + "/healthz", timeout=5).status_code == 200
    assert requests.get(server + "/readyz", timeout=5).status_code == 503
    Flags.healthy, Flags.ready = False, True
    assert requests.get(server + "/healthz", timeout=5).status_code == 503
    assert requests.get(server + "/readyz", timeout=5).status_code == 200
    assert requests.get(server + "/nope", timeout=5).status_code == 404
