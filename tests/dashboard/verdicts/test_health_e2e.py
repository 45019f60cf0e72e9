"""The GPU-health verdict end to end: two real exporters over the C double of libnvidia-ml
(``bench/fake_libnvml``: real pynvml, a native library), one node with a GPU lost, a GPU that
raised XID 79 (fallen off the bus) and a GPU with a row remap pending, one healthy node;
scraped by a real Prometheus, a real VictoriaMetrics and the embedded store. Each store gives
the same rows: the three broken GPUs under their node with its $/hour, nothing on the healthy
node."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests

from gpuscope.dashboard.data import EmbeddedData, PrometheusData, Target
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.health import VERDICT, GpuHealth
from gpuscope.dashboard.views import FleetView, build_fleet_view
from tests.conftest import REPO, wait_for
from tests.ports import free_port
from tests.stores import Store, start_prometheus, start_victoriametrics

WINDOW = 900.0
SICK, OK = "gpu-sick", "gpu-ok"
#: The planted faults, by seconds after the exporter's nvmlInit. The XID comes once the
#: stores' history has begun (two of PrometheusData's lookbacks, 8 s here, after their
#: first sample): an XID counter present when history begins is not an event of the window.
FAULTS = {"FAKE_NVML_LOST": "1@4", "FAKE_NVML_XIDS": "2:79@20",
          "FAKE_NVML_REMAPPED_ROWS": "3:0,1,1,0"}
EXPECTED = {("gpu-sick", "1"): "lost", ("gpu-sick", "2"): "XID 79",
            ("gpu-sick", "3"): "row remap pending"}


class CExporter:
    """``gpuscope-exporter --source nvml`` over the C double, as a subprocess."""

    def __init__(self, node: str, instance_type: str, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.nvml_c_exporter", "--gpus", "4",
             "--processes-per-gpu", "2", "--", "--listen", f"127.0.0.1:{self.port}",
             "--interval", "0.5", "--node-name", node, "--instance-type", instance_type],
            cwd=REPO, env={**clean, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)

    def wait_ready(self) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                out = self.proc.stdout.read() if self.proc.stdout else ""
                raise AssertionError(f"exporter exited {self.proc.returncode}: {out}")
            try:
                return requests.get(self.url + "/readyz", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_for(ready, 120, f"{self.url}/readyz")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


@dataclass
class Stores:
    prometheus: Store
    victoriametrics: Store
    embedded: EmbeddedData


@pytest.fixture(scope="module")
def stores(prometheus_bin: str) -> Iterator[Stores]:
    exporters = [CExporter(SICK, "p4d.24xlarge", FAULTS), CExporter(OK, "g5.12xlarge", {})]
    embedded: EmbeddedData | None = None
    try:
        for e in exporters:
            e.wait_ready()
        scrape = "\n".join(
            f"  - job_name: {node}\n    scrape_interval: 1s\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{e.port}'], labels: {{node: {node}}}}}]"
            for node, e in zip((SICK, OK), exporters, strict=True))
        embedded = EmbeddedData(
            [Target(f"{e.url}/metrics", node) for node, e in zip((SICK, OK), exporters,
                                                                strict=True)],
            interval=1.0, max_points=900,
            extra_metrics={q.metric for q in registry.step_queries()})
        embedded.start()
        # VictoriaMetrics answers queries up to now - 30 s by default (its latency offset,
        # for late samples); this store's data is seconds old, so the offset is 1 s here.
        with start_prometheus(scrape_config=scrape) as prom, start_victoriametrics(
                scrape_config=scrape, scrape_interval="1s",
                extra_args=["-search.latencyOffset=1s"]) as vm:
            def planted() -> bool:
                # Every fault in both stores, and a few scrapes after the last (XID at 20 s).
                return all(
                    s.scalar('count(gpu_xid_errors_total{xid="79"}) + count(gpu_up == 0) + '
                             'count(gpu_row_remap_pending == 1)') == 3
                    for s in (prom, vm))
            wait_for(planted, 120, "the faults in Prometheus and VictoriaMetrics")
            time.sleep(4)
            yield Stores(prom, vm, embedded)
    finally:
        if embedded is not None:
            embedded.close()
        for e in exporters:
            e.stop()


def view_of(source: PrometheusData | EmbeddedData) -> FleetView:
    return build_fleet_view(source.fleet(WINDOW), bundled_prices(),
                            steps=source.step_series(registry.step_queries(), WINDOW))


def found(view: FleetView) -> dict[tuple[str, str], GpuHealth]:
    return {(h.ref.node, h.gpu): h for h in view.findings[VERDICT.name]}


def check(view: FleetView) -> None:
    health = found(view)
    assert set(health) == set(EXPECTED)
    for key, what in EXPECTED.items():
        (problem,) = health[key].problems
        assert problem.what.startswith(what), (key, problem)
        assert health[key].price_per_hour == pytest.approx(21.957642)
    assert found(view)[("gpu-sick", "2")].problems[0].count == 1
    assert all(h.now for k, h in health.items() if k != ("gpu-sick", "2"))


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_the_stores_list_the_broken_gpus(stores: Stores, store: str) -> None:
    url = getattr(stores, store).url
    prom = PrometheusData(url, min_step=1, lookback=4, max_points=900)
    try:
        check(view_of(prom))
    finally:
        prom.close()


def test_the_embedded_store_lists_the_broken_gpus(stores: Stores) -> None:
    check(view_of(stores.embedded))


def test_the_rows_name_the_node_and_its_price(stores: Stores) -> None:
    view = view_of(stores.embedded)
    rows = VERDICT.rows(view.findings[VERDICT.name], view.context or pytest.fail(), {})
    assert [r["gpu"] for r in rows] == ["1", "2", "3"]
    assert all(str(r["node"]).startswith("[gpu-sick](?node=gpu-sick#") for r in rows)
    assert "fallen off the bus" in str(rows[1]["what"])
