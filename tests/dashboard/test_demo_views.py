"""The demo fleet in-process through embedded scraping and the views: exactly the planted
findings, and only them; plus the service's fallback when the backend fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpuscope.dashboard.data import DataError, EmbeddedData
from gpuscope.dashboard.demo import DemoFleet
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import FleetData, NodeDetail, PodDetail
from gpuscope.dashboard.service import DashboardService
from gpuscope.dashboard.views import FleetView, build_fleet_view

IDLE_NODES = {
    "ip-10-0-2-37.ec2.internal": ("p4d.24xlarge", 8, 2),   # type, GPUs, allocated-idle GPUs
    "ip-10-0-4-18.ec2.internal": ("g5.12xlarge", 4, 0),
    "ip-10-0-5-90.ec2.internal": ("g6.xlarge", 1, 1),
}


@pytest.fixture(scope="module")
def demo() -> Iterator[tuple[DemoFleet, EmbeddedData]]:
    fleet = DemoFleet()
    targets = fleet.start()
    store = EmbeddedData(targets, interval=5.0)
    fleet.backfill(store)
    store.scrape_once()
    yield fleet, store
    store.close()
    fleet.stop()


@pytest.fixture(scope="module")
def view(demo: tuple[DemoFleet, EmbeddedData]) -> FleetView:
    return build_fleet_view(demo[1].fleet(3600), bundled_prices())


def test_idle_nodes_are_the_planted_ones(view: FleetView) -> None:
    prices = bundled_prices()
    assert {r.node for r in view.idle_rows} == set(IDLE_NODES)
    for row in view.idle_rows:
        itype, gpus, allocated = IDLE_NODES[row.node]
        assert (row.instance_type, row.gpus, row.allocated_gpus) == (itype, gpus, allocated)
        assert row.price_per_hour == prices.per_hour(itype)
        assert row.idle_seconds > 50 * 60  # the demo's hour of past is the evidence
    k = view.kpis
    assert k.burning_per_hour == pytest.approx(21.957642 + 5.672 + 0.8048)
    assert k.idle_nodes == 3 and k.idle == 13 and k.gpus == 34
    assert k.wasted == pytest.approx(k.wasted_allocated + k.wasted_unallocated)
    assert k.unpriced_idle_nodes == ()


def test_the_near_miss_is_not_idle(view: FleetView) -> None:
    row = view.heatmap.nodes.index("ip-10-0-5-91.ec2.internal")
    # rate() of the busy counter; scrape times jitter against the sampler's rounds a little.
    assert view.heatmap.z[row][0] == pytest.approx(0.06, rel=2e-3)
    assert view.heatmap.idle[row] == (True,) * 0 + (False,) + (False,) * 7


def test_starved_containers_are_the_planted_ones(view: FleetView) -> None:
    got = {(r.kind, r.namespace, r.pod, r.container, r.gpu) for r in view.starved_rows}
    assert got == {
        ("time-slice", "serving", "rerank-api-6b8c7d9f5-m3n8z", "server", "0"),
        ("input-starved", "vision", "resnet-finetune-8kq2x", "trainer", "1"),
    }
    shares = {r.pod.split("-")[0]: r for r in view.share_rows}
    assert set(shares) == {"chat", "embed", "rerank"}
    assert shares["rerank"].share == pytest.approx(0.03 / 0.94, abs=0.01)
    assert shares["rerank"].fair_share == pytest.approx(1 / 3)


def test_straggler_is_the_planted_rank(view: FleetView) -> None:
    assert [(r.workload, r.pods, r.gpu) for r in view.straggler_rows] == [
        ("PyTorchJob/llama-pretrain", ("llama-pretrain-worker-5",), "5"),
    ]
    row = view.straggler_rows[0]
    assert 0.3 <= row.utilization <= 0.4 and 0.88 <= row.median <= 0.96
    # llama-pretrain, llm-api (2 replicas) and bert-pretrain (8 GPUs) were compared.
    assert view.workloads_checked == 3


def test_unknown_instance_type_is_listed_without_price(view: FleetView) -> None:
    assert "dgx-a100-01" in view.nodes


def test_drill_downs(demo: tuple[DemoFleet, EmbeddedData]) -> None:
    store = demo[1]
    node = store.node_detail("ip-10-0-3-52.ec2.internal", 900)
    assert isinstance(node, NodeDetail)
    assert set(node.utilization) == {"0", "1", "2", "3"}
    assert node.utilization["0"].values[-1] == pytest.approx(0.94, abs=0.03)
    assert any("rerank-api" in name for name in node.containers)
    pod = store.pod_detail("vision", "resnet-finetune-8kq2x", 900)
    assert isinstance(pod, PodDetail)
    [name] = pod.utilization
    assert name == "trainer (ip-10-0-3-52.ec2.internal GPU 1)"
    assert pod.memory_used[name].values[-1] == 18 * 2**30


class Flaky:
    """A DataSource that answers with a fixed FleetData until told to fail."""

    description = "flaky"

    def __init__(self, data: FleetData) -> None:
        self.data = data
        self.fail = False

    def fleet(self, window_seconds: float, namespace: str | None = None) -> FleetData:
        if self.fail:
            raise DataError("Prometheus http://prom:9090 unreachable: timed out")
        return self.data

    def node_detail(self, node: str, window_seconds: float) -> NodeDetail:
        raise DataError("down")

    def pod_detail(self, namespace: str, pod: str, window_seconds: float) -> PodDetail:
        raise RuntimeError("bug")

    def close(self) -> None:
        pass


def test_backend_failure_keeps_the_last_data_with_a_banner(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    source = Flaky(demo[1].fleet(3600))
    service = DashboardService(source, bundled_prices(), share_for=0)
    first = service.fleet("1h", None)
    assert first.banner is None and first.view is not None
    source.fail = True
    second = service.fleet("1h", None)
    assert second.view is first.view
    assert second.banner is not None
    assert "unreachable: timed out" in second.banner and "Showing the last data" in second.banner
    # Nothing cached for a brand-new service: a banner and no view, no exception.
    fresh = DashboardService(source, bundled_prices(), share_for=0).fleet("1h", None)
    assert fresh.view is None and fresh.banner and "No data yet" in fresh.banner
    # Drill-downs report problems as text, bugs included.
    assert service.node("n", "1h") == (None, "down")
    detail, problem = service.pod("ns/p", "1h")
    assert detail is None and problem == "Internal error: RuntimeError: bug"


def test_invalid_namespace_filter_is_ignored_with_a_banner(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    service = DashboardService(demo[1], bundled_prices())
    answer = service.fleet("1h", '"}) or vector(1) or up{x="')
    assert answer.view is not None and answer.banner is not None
    assert answer.banner.startswith("Namespace filter ignored: not a Kubernetes namespace")
    assert len(answer.view.idle_rows) == 3
    narrowed = service.fleet("1h", "vision")
    assert narrowed.banner is None and narrowed.view is not None
    assert [r.pod for r in narrowed.view.starved_rows] == ["resnet-finetune-8kq2x"]


def test_view_caches_stay_bounded_whatever_namespaces_are_typed(
    demo: tuple[DemoFleet, EmbeddedData],
) -> None:
    """Every distinct namespace typed into the filter is a cache key; a dashboard left open
    for weeks must not keep them all."""
    from gpuscope.dashboard.service import MAX_CACHED_VIEWS

    service = DashboardService(demo[1], bundled_prices(), share_for=0)
    for i in range(MAX_CACHED_VIEWS + 20):
        assert service.fleet("1h", f"team-{i}").view is not None
    assert len(service._last) <= MAX_CACHED_VIEWS
    assert len(service._inflight) <= MAX_CACHED_VIEWS
    # The newest views are the ones kept.
    assert ("1h", f"team-{MAX_CACHED_VIEWS + 19}") in service._last
    assert ("1h", "team-0") not in service._last
