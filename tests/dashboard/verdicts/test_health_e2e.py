"""The GPU-health verdict end to end: two real exporters over the C double of libnvidia-ml
(``bench/fake_libnvml``: real pynvml, a native library), one node with a GPU lost, a GPU that
raised XID 79 (fallen off the bus) and a GPU with a row remap pending, one healthy node;
scraped by a real Prometheus, a real VictoriaMetrics and the embedded store. Each store gives
the same rows: the three broken GPUs under their node with its $/hour, nothing on the healthy
node."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpuscope.dashboard.data import EmbeddedData, Target
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.health import VERDICT, GpuHealth
from gpuscope.dashboard.views import FleetView, page_view
from tests.conftest import ExporterProcess, stop_all, wait_for
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


def c_exporter(node: str, instance_type: str, env: dict[str, str]) -> ExporterProcess:
    """``gpuscope-exporter --source nvml`` over the C double (4 GPUs, 2 processes each), its
    faults planted by ``env``."""
    return ExporterProcess(
        ["--interval", "0.5", "--node-name", node, "--instance-type", instance_type],
        env=env,
        launcher=("-m", "bench.nvml_c_exporter", "--gpus", "4", "--processes-per-gpu", "2",
                  "--"))


@dataclass
class Stores:
    prometheus: Store
    victoriametrics: Store
    embedded: EmbeddedData


@pytest.fixture(scope="module")
def stores(prometheus_bin: str) -> Iterator[Stores]:
    exporters = [c_exporter(SICK, "p4d.24xlarge", FAULTS), c_exporter(OK, "g5.12xlarge", {})]
    embedded: EmbeddedData | None = None
    try:
        for e in exporters:
            e.wait_ready(120)
        scrape = "\n".join(
            f"  - job_name: {node}\n    scrape_interval: 1s\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{e.port}'], labels: {{node: {node}}}}}]"
            for node, e in zip((SICK, OK), exporters, strict=True))
        embedded = EmbeddedData(
            [Target(f"{e.url}/metrics", node) for node, e in zip((SICK, OK), exporters,
                                                                strict=True)],
            interval=1.0, max_points=900,
            extra_metrics=registry.step_metrics())
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
        stop_all(exporters)


def view_of(source: PrometheusData | EmbeddedData) -> FleetView:
    return page_view(source, WINDOW, bundled_prices())


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
