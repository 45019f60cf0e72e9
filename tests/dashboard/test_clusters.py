"""Many clusters in one store (issue 30): the node is (cluster, node). A central Prometheus or
VictoriaMetrics holds two clusters' series under the ``cluster`` label, each with a node
named ``ip-10-0-1-23.ec2.internal`` (EKS names nodes after their private IP, and eksctl gives
every cluster the same VPC range): idle in cluster ``a``, busy in cluster ``b``, even their
GPUs' UUIDs and pods' names alike. The page shows two nodes, keyed ``a/ip-…`` and ``b/ip-…``:
the idle one flagged under its cluster with its $, the busy one not, and each drill-down
reads its own cluster's series. One cluster (no label) keeps its nodes' bare names
(every other test)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

import bench.fleet as F
from gpuscope.dashboard import sections
from gpuscope.dashboard.data import EmbeddedData, parse_targets
from gpuscope.dashboard.data.promql import node_key, node_matchers, node_parts, scoped
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.verdicts.owners import rollup
from gpuscope.dashboard.views import FleetView, page_view
from tests.dashboard.test_showback import add_up
from tests.stores import fleet_in_both, replay_rules, start_prometheus

NAME = "ip-10-0-1-23.ec2.internal"
IDLE, BUSY = node_key("a", NAME), node_key("b", NAME)
WINDOW = 3600.0


def two_clusters(end: float) -> F.Fleet:
    """One node in each cluster, both named NAME: an idle g5.12xlarge (4 GPUs) in ``a``,
    a g6.xlarge in ``b`` just busy enough not to be idle (the fleet's near miss: 6 %)."""
    idle, = F.layout({"idle": 1})
    busy, = F.layout({"near-miss": 1})
    nodes = [replace(idle, name=NAME, cluster="a"), replace(busy, name=NAME, cluster="b")]
    return F.Fleet(F.Shape(2, 60.0, WINDOW, end), nodes)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[FleetView,
                                                                               PrometheusData]]]:
    end = (time.time() // 60 - 5) * 60 - 23.0
    out = {}
    with fleet_in_both(two_clusters(end), tmp_path_factory.mktemp("clusters")) as stores:
        sources = []
        for store in stores:
            prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
            sources.append(prom)
            out[store.kind] = (page_view(prom, WINDOW, bundled_prices()), prom)
        yield out
        for prom in sources:
            prom.close()


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics"])
def test_two_nodes_of_one_name_are_two_nodes(
        pages: dict[str, tuple[FleetView, PrometheusData]], kind: str) -> None:
    view, prom = pages[kind]
    assert set(view.nodes) == {IDLE, BUSY}
    assert view.kpis.gpus == 5 and view.kpis.idle == 4 and view.kpis.idle_nodes == 1
    [row] = view.idle_rows
    assert (row.node, row.instance_type, row.gpus) == (IDLE, "g5.12xlarge", 4)
    # The idle node's own price, not the busy namesake's (g6.xlarge: $0.8048/hour).
    assert row.price_per_hour == pytest.approx(bundled_prices().node_price(
        "g5.12xlarge", "on-demand").per_hour)
    assert view.kpis.burning_per_hour == pytest.approx(row.price_per_hour)
    # Each drill-down reads its own cluster's series.
    idle, busy = prom.node_detail(IDLE, WINDOW), prom.node_detail(BUSY, WINDOW)
    assert sorted(idle.utilization) == ["0", "1", "2", "3"] and sorted(busy.utilization) == ["0"]
    assert max(max(s.values) for s in idle.utilization.values()) < 0.05
    assert min(busy.utilization["0"].values) > 0.05


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics"])
def test_the_cluster_picker_scopes_every_section(
        pages: dict[str, tuple[FleetView, PrometheusData]], kind: str) -> None:
    view, prom = pages[kind]
    prices = bundled_prices()
    idle_price = prices.node_price("g5.12xlarge", "on-demand").per_hour
    busy_price = prices.node_price("g6.xlarge", "on-demand").per_hour
    assert view.clusters == ("a", "b") and view.cluster is None
    # Showback, unscoped: the idle node nobody holds is cluster a's unallocated capacity;
    # cluster b's is its one workload's, busy. Each cluster's $ add up to its nodes' cost.
    by_cluster = {o.cluster: o for o in rollup(view.owners, by_namespace=False)}
    assert by_cluster["a"].spent == pytest.approx(idle_price * view.history_seconds / 3600)
    assert by_cluster["a"].idle == pytest.approx(view.kpis.wasted) and view.kpis.wasted > 0
    assert by_cluster["b"].spent == pytest.approx(busy_price * view.history_seconds / 3600)
    assert by_cluster["b"].idle == 0.0 and by_cluster["b"].gpu_hours > 0
    add_up(view)
    # Scoped to a cluster: its node alone in every section, its KPIs, its owners.
    for cluster, node in (("a", IDLE), ("b", BUSY)):
        scoped_view = page_view(prom, WINDOW, prices, cluster=cluster)
        assert scoped_view.cluster == cluster and scoped_view.clusters == ("a", "b")
        assert scoped_view.nodes == (node,) and scoped_view.heatmap.nodes == (node,)
        assert {o.cluster for o in scoped_view.owners} == {cluster}
        add_up(scoped_view)
        for table in sections.tables():
            rows, _, _ = sections.table_rows(scoped_view, table.id, {"cluster": cluster}, 500)
            for row in rows:
                text = " ".join(str(v) for v in row.values())
                other = BUSY if cluster == "a" else IDLE
                assert other not in text and f"cluster={'b' if cluster == 'a' else 'a'}" \
                    not in text, (table.id, row)
    a = page_view(prom, WINDOW, prices, cluster="a")
    b = page_view(prom, WINDOW, prices, cluster="b")
    assert (a.kpis.gpus, a.kpis.idle_nodes, len(a.idle_rows)) == (4, 1, 1)
    assert (b.kpis.gpus, b.kpis.idle_nodes, len(b.idle_rows)) == (1, 0, 0)
    assert a.kpis.wasted == pytest.approx(view.kpis.wasted) and b.kpis.wasted == 0.0
    assert a.kpis.fleet_per_hour == pytest.approx(idle_price)
    # A cluster the store does not hold: an empty page, not another cluster's.
    none = page_view(prom, WINDOW, prices, cluster="c")
    assert none.nodes == () and none.kpis.gpus == 0 and none.owners == ()


def test_node_keys_and_scoping() -> None:
    assert node_parts(IDLE) == ("a", NAME) and node_parts(NAME) == ("", NAME)
    assert node_key("", NAME) == NAME
    assert scoped('max by (node, uuid) (x{pod="on (node)"}) and on (node, uuid) y', "k8s") == (
        'max by (k8s, node, uuid) (x{pod="on (node)"}) and on (k8s, node, uuid) y')
    assert scoped("count by (namespace) (x) and on () y", "cluster") == (
        "count by (namespace) (x) and on () y")
    # A workload is its cluster's too (a job of one name in two clusters is two runs).
    assert scoped("quantile by (namespace, workload, model) (0.5, x) and on (namespace,"
                  " workload) y", "cluster") == (
        "quantile by (cluster, namespace, workload, model) (0.5, x) and on (cluster,"
        " namespace, workload) y")
    assert node_matchers([IDLE, "other"], "cluster") == {
        "node": f'=~"{NAME.replace(".", chr(92) * 2 + ".")}|other"', "cluster": '=~"|a"'}
    assert node_matchers(["n1", "n2"], "cluster") == {"node": '=~"n1|n2"', "cluster": '=~""'}


def test_embedded_targets_may_name_their_cluster() -> None:
    """In embedded mode a target names its node ``cluster/node`` (``--targets
    a/ip-…=URL``): two targets of one node name in two clusters are two nodes."""
    targets = parse_targets(f"{IDLE}=http://10.0.0.5:9463/metrics,"
                            f"{BUSY}=http://10.1.0.5:9463/metrics")
    assert [t.node for t in targets] == [IDLE, BUSY]
    store = EmbeddedData(targets, interval=15.0)
    try:
        assert [t.node for t in store.targets] == [IDLE, BUSY]
    finally:
        store.close()
    with pytest.raises(ValueError, match="not a node name: 'a b/n'"):
        parse_targets("a b/n=http://10.0.0.5:9463/metrics")


class _StatedCluster(F.Fleet):
    """One cluster's Prometheus whose exporters state it (``--cluster-name``): only
    ``gpu_node_info`` carries ``cluster``, no store label does."""

    def series_of(self, family: str | None = None):  # type: ignore[no-untyped-def]
        for name, lab, values, ks in super().series_of(family):
            yield name, ({**lab, "cluster": "a"} if name == "gpu_node_info" else lab), values, ks


def test_a_cluster_stated_on_gpu_node_info_alone_keeps_the_nodes_price(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    end = (time.time() // 60 - 5) * 60 - 23.0
    idle, = F.layout({"idle": 1})
    fleet = _StatedCluster(F.Shape(1, 60.0, WINDOW, end), [replace(idle, name=NAME)])
    with fleet_in_both(fleet, tmp_path_factory.mktemp("stated")) as stores:
        for store in stores:
            prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
            try:
                view = page_view(prom, WINDOW, bundled_prices())
            finally:
                prom.close()
            [row] = view.idle_rows
            assert (row.node, row.instance_type) == (NAME, "g5.12xlarge"), store.kind
            assert row.price_per_hour is not None and view.kpis.unpriced_nodes == (), store.kind


def test_a_job_of_one_name_in_two_clusters_is_two_straggler_groups(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """One Helm chart, two clusters: the same training job (namespace, workload, pods, node
    names and GPU UUIDs alike) runs in ``a`` and in ``b``, each with its stalled rank. Each
    cluster's job is a group of its own (8 GPUs, its node's $/hour held back), not one
    group of 16, on both stores, raw and with the recording rules (vmalert)."""
    end = (time.time() // 60 - 5) * 60 - 23.0
    job, = F.layout({"straggler": 1})
    fleet = F.Fleet(F.Shape(2, 60.0, WINDOW, end),
                    [replace(job, cluster="a"), replace(job, cluster="b")])
    p5 = bundled_prices().node_price("p5.48xlarge", "on-demand").per_hour
    work = tmp_path_factory.mktemp("twins")
    views = {}
    with fleet_in_both(fleet, work) as (prometheus, vm):
        # The rules recorded before any query (test_ha_replicas says why).
        replay_rules(vm, fleet.shape.start, end, work)
        for store in (prometheus, vm):
            prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
            prom._check_rules = lambda window: (False, 0)  # type: ignore[method-assign]
            try:
                views[store.kind] = page_view(prom, WINDOW, bundled_prices())
            finally:
                prom.close()
        prom = PrometheusData(vm.url, clock=lambda: end, timeout=60)
        try:
            views["victoriametrics with the rules"] = page_view(prom, WINDOW, bundled_prices())
            assert prom.rules_loaded(views["victoriametrics with the rules"].window)
        finally:
            prom.close()
    for kind, view in views.items():
        rows = view.straggler_rows
        assert sorted(node_parts(r.node)[0] for r in rows) == ["a", "b"], (kind, rows)
        assert all(r.devices == 8 and r.kind == "stalled" for r in rows), kind
        assert all(r.price_per_hour == pytest.approx(p5) for r in rows), kind
        assert view.workloads_checked == 2, kind
        # Scoped to one cluster: its own run alone.
        assert len({r.workload for r in rows}) == 1


def test_the_default_workload_view_is_its_straggler_s_cluster_run(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """With every cluster shown, the workload view opens with the first straggler's
    workload: that straggler's run (its cluster's 8 GPUs, its straggler marked, its $), not
    the runs of that name in every cluster drawn as one (16 GPUs, both clusters' stragglers
    marked, both nodes' $ as its own)."""
    from gpuscope.dashboard.service import DashboardService

    end = (time.time() // 60 - 5) * 60 - 23.0
    job, = F.layout({"straggler": 1})
    fleet = F.Fleet(F.Shape(2, 60.0, WINDOW, end),
                    [replace(job, cluster="a"), replace(job, cluster="b")])
    p5 = bundled_prices().node_price("p5.48xlarge", "on-demand").per_hour
    blocks = tmp_path_factory.mktemp("default-run") / "tsdb"
    F.build_blocks(fleet, blocks)
    with start_prometheus(blocks, copy=False) as store:
        prom = PrometheusData(store.url, clock=lambda: end, timeout=60)
        try:
            service = DashboardService(prom, bundled_prices(), clock=lambda: end)
            view = service.fleet("1h", None).view
            assert view is not None and view.cluster is None
            first = next(r for r in view.straggler_rows
                         if f"{r.namespace}/{r.workload}" == view.default_workload)
            cluster = node_parts(first.node)[0]
            detail, marks, problem = service.workload(None, "1h")
            assert problem is None and detail is not None
            assert {node_parts(d.ref.node)[0] for d in detail.devices} == {cluster}
            assert len(detail.devices) == 8 and detail.total_devices == 8
            assert {node_parts(ref.node)[0] for ref in marks} == {cluster} and len(marks) == 1
            totals = service.run_totals(detail, "1h")
            assert totals is not None and totals.stragglers == 1
            assert totals.spent == pytest.approx(p5 * view.history_seconds / 3600)
            # Picked by name with every cluster shown: the runs of that name in every
            # cluster, their totals summed (RunTotals: over clusters, or the picked one's).
            both, _, _ = service.workload(view.default_workload, "1h")
            assert both is not None and len(both.devices) == 16
            summed = service.run_totals(both, "1h")
            assert summed is not None and summed.stragglers == 2
            assert summed.spent == pytest.approx(2 * totals.spent)
        finally:
            prom.close()
