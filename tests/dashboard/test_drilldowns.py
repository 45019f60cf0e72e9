"""The drill-downs (node, pod, workload) on the same samples in the embedded store, a real
Prometheus and a real VictoriaMetrics (``tests.stores.fleet_in_both``, loaded as in
``test_step_queries.py``): the two data modes draw the same devices, and what they draw
agrees with the fleet page.

The fleet: ``node-a`` (one GPU) went away half an hour before the window's end (Karpenter
scaled it down); its pod ``ml/web-0`` came back on ``node-b`` GPU 0 (a StatefulSet's pod of
the same name) five minutes later. ``node-b`` GPU 1 runs ``ml/web-1`` in bursts whose
samples all land on a burst at the scrapes: the utilization gauge reads 1 at every scrape,
the busy counter (what the fleet page and the workload view read) a quarter."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from gpuscope.dashboard.data import EmbeddedData
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import GpuRef
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.views import page_view
from tests.dashboard.test_step_queries import INTERVAL, STEP, WINDOW, Planted, Point
from tests.stores import Store, fleet_in_both

HISTORY = WINDOW + 600.0
GONE = 1800.0    # node-a's last sample, seconds before the end
MOVED = 1500.0   # web-0's first sample on node-b, seconds before the end
BURSTY = 0.25    # node-b GPU 1: the busy counter's rate (its gauge reads 1 at every scrape)
GPUS = (("node-a", "0", "GPU-a0"), ("node-b", "0", "GPU-b0"), ("node-b", "1", "GPU-b1"))
# (pod, uid, uuid, first, last): seconds before the end, both included (None: from the start)
HOLDERS = (("web-0", "u-1", "GPU-a0", None, GONE), ("web-0", "u-2", "GPU-b0", MOVED, 0.0),
           ("web-1", "u-3", "GPU-b1", None, 0.0))
WORKLOAD = "StatefulSet/web"


def drill_fleet(end: float) -> list[tuple[str, dict[str, str], list[Point]]]:
    times = [end - 7.0 - INTERVAL * k for k in range(int(HISTORY // INTERVAL), -1, -1)]
    node_of = {uuid: node for node, _, uuid in GPUS}

    def during(first: float | None, last: float) -> list[float]:
        return [t for t in times if (first is None or end - t <= first) and end - t >= last]

    out: list[tuple[str, dict[str, str], list[Point]]] = []
    for node, gpu, uuid in GPUS:
        there = during(None, GONE if node == "node-a" else 0.0)
        lab = {"node": node, "gpu": gpu, "uuid": uuid}
        out.append(("gpu_info", {**lab, "model": "NVIDIA H100 80GB HBM3", "driver_version": "1",
                                 "pci_bus_id": f"0000:0{gpu}:00.0", "parent_uuid": "",
                                 "mig_profile": ""}, [(t, 1.0) for t in there]))
        rate = BURSTY if uuid == "GPU-b1" else 0.5
        gauge = 1.0 if uuid == "GPU-b1" else 0.5
        out.append(("gpu_utilization_ratio", lab, [(t, gauge) for t in there]))
        out.append(("gpu_busy_seconds_total", lab, [(t, rate * (t - times[0])) for t in there]))
        out.append(("gpu_memory_used_bytes", lab, [(t, 1e9) for t in there]))
    for pod, uid, uuid, first, last in HOLDERS:
        node = node_of[uuid]
        held = during(first, last)
        lab = {"node": node, "namespace": "ml", "pod": pod, "container": "main", "uuid": uuid}
        out.append(("container_gpu_allocated", lab, [(t, 1.0) for t in held]))
        out.append(("container_gpu_utilization_ratio", lab, [(t, 0.5) for t in held]))
        out.append(("container_gpu_memory_used_bytes", lab, [(t, 1e9) for t in held]))
        out.append(("gpu_pod_info", {"node": node, "namespace": "ml", "pod": pod, "uid": uid,
                                     "workload": WORKLOAD}, [(t, 1.0) for t in held]))
    return out


@dataclass
class DrillFleet(Planted):
    def __post_init__(self) -> None:
        super().__post_init__()
        self.rows = drill_fleet(self.end)

    def extra(self) -> tuple[str, ...]:
        """What the fleet page's registry verdicts read (the page is built on it)."""
        return tuple(registry.step_metrics())


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DrillFleet, list[Store]]]:
    planted = DrillFleet((time.time() // 60 - 5) * 60)
    with fleet_in_both(planted, tmp_path_factory.mktemp("drill")) as both:
        yield planted, list(both)


Source = EmbeddedData | PrometheusData


def each_source(stores: tuple[DrillFleet, list[Store]]) -> Iterator[tuple[str, Source]]:
    planted, backends = stores
    embedded = planted.embedded()
    try:
        assert embedded.window(WINDOW).step == STEP
        yield "embedded", embedded
    finally:
        embedded.close()
    for store in backends:
        prom = PrometheusData(store.url, clock=lambda: planted.end, timeout=60)
        try:
            yield store.kind, prom
        finally:
            prom.close()


def test_a_pod_that_moved_off_a_node_gone_since_shows_both_devices(
        stores: tuple[DrillFleet, list[Store]]) -> None:
    # The pod drill-down and the workload view draw what was held over the window: the
    # device of a node gone before the window's end too (its index from gpu_info over the
    # window, not at its end), in every data mode.
    for kind, source in each_source(stores):
        pod = source.pod_detail("ml", "web-0", WINDOW)
        assert sorted(pod.utilization) == sorted(pod.memory_used) == [
            "main (node-a GPU 0)", "main (node-b GPU 0)"], kind
        # Held until its node went away, then on node-b: no point of either after that.
        gone = pod.utilization["main (node-a GPU 0)"]
        assert gone.times and stores[0].end - gone.times[-1] >= GONE - STEP, kind
        work = source.workload_detail("ml", WORKLOAD, WINDOW)
        assert [(d.ref.node, d.gpu, d.pods) for d in work.devices] == [
            ("node-a", "0", ("web-0",)), ("node-b", "0", ("web-0",)),
            ("node-b", "1", ("web-1",))], kind
        assert work.total_devices == 3, kind
        assert GpuRef("node-a", "GPU-a0") in work.utilization, kind


def test_the_node_view_draws_the_utilization_the_fleet_page_judged(
        stores: tuple[DrillFleet, list[Store]]) -> None:
    # node-b GPU 1: its gauge reads 1 at every scrape, its busy counter 0.25 s/s. The
    # fleet page's heatmap and the workload view read the counter (the exact mean); the
    # node drill-down, opened from the heatmap, must draw the same, not the gauge.
    for kind, source in each_source(stores):
        view = page_view(source, WINDOW, bundled_prices())
        row = view.heatmap.nodes.index("node-b")
        heat = view.heatmap.z[row][view.heatmap.columns.index("1")]
        assert heat == pytest.approx(BURSTY, abs=0.01), kind
        node = source.node_detail("node-b", WINDOW)
        drawn = node.utilization["1"]
        assert drawn.values and all(v == pytest.approx(BURSTY, abs=0.01)
                                    for v in drawn.values), kind
        work = source.workload_detail("ml", WORKLOAD, WINDOW)
        assert drawn == work.utilization[GpuRef("node-b", "GPU-b1")], kind
        # A GPU whose gauge and counter agree reads the same either way.
        assert all(v == pytest.approx(0.5, abs=0.01) for v in node.utilization["0"].values)
