"""Embedded mode keeps nodes apart (issue 16): each target's series go to the node its
exporter states in ``gpu_node_info{node_name}``; without one, to the host, or host:port when
hosts repeat; a ``NODE=`` hint wins; two targets never merge into one node.

The end-to-end test runs two real ``gpuscope-exporter`` processes (simulated source) on
127.0.0.1, as two port-forwarded exporters look to the dashboard; the unit tests serve fixed
expositions over real HTTP."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from gpuscope.dashboard.data import EmbeddedData, Target, parse_targets
from gpuscope.dashboard.data.prometheus import PrometheusStore
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import FleetData, GpuRef
from gpuscope.dashboard.views import build_fleet_view
from tests.conftest import ExporterProcess, HttpHandler

SCENARIOS = Path(__file__).parent / "scenarios"


# -- parse_targets: the fallback names ------------------------------------------------------


def test_fallback_is_the_host_unless_hosts_repeat() -> None:
    one_each = parse_targets("http://10.0.0.5:9463/metrics,http://10.0.0.6:9463/metrics")
    assert [(t.node, t.named) for t in one_each] == [("10.0.0.5", False), ("10.0.0.6", False)]
    # Two port-forwards on one host: host:port, so an older exporter (no node_name) on each
    # still gets a node of its own.
    forwards = parse_targets("http://127.0.0.1:9401/metrics,http://127.0.0.1:9402,"
                             "http://10.0.0.7/metrics,https://127.0.0.1/metrics")
    assert [t.node for t in forwards] == ["127.0.0.1:9401", "127.0.0.1:9402", "10.0.0.7",
                                          "127.0.0.1:443"]
    # A NODE= hint is the node whatever the host.
    named = parse_targets("gpu-a=http://127.0.0.1:9401/metrics,http://127.0.0.1:9402/metrics")
    assert [(t.node, t.named) for t in named] == [("gpu-a", True), ("127.0.0.1:9402", False)]


def test_a_node_given_to_two_targets_is_an_error() -> None:
    with pytest.raises(ValueError, match="'gpu-a' given to two targets"):
        parse_targets("gpu-a=http://127.0.0.1:9401/metrics,gpu-a=http://127.0.0.1:9402/metrics")


def test_a_url_with_credentials_is_an_error_that_does_not_repeat_them() -> None:
    """urllib never sends user:password@ (it looked the host "user:s3cret@10.0.0.5" up and
    failed), and the URL went into the log and the page's note of exporters not answering."""
    for text in ("http://user:s3cret@10.0.0.5:9463/metrics", "a=https://user@10.0.0.5/metrics"):
        with pytest.raises(ValueError, match=r"must not hold credentials") as info:
            parse_targets(text)
        assert "s3cret" not in str(info.value) and "user@" not in str(info.value)


# -- the scrape path, against fixed expositions over HTTP -----------------------------------


def exposition(uuid: str, utilization: float, node_name: str | None) -> str:
    """One GPU's identity and utilization; ``gpu_node_info`` as an exporter with
    (``node_name``) or before the label (None) serves it."""
    name = f',node_name="{node_name}"' if node_name is not None else ""
    return "\n".join([
        f'gpu_info{{gpu="0",uuid="{uuid}",model="NVIDIA A10G",driver_version="550",'
        f'pci_bus_id="0",parent_uuid="",mig_profile=""}} 1',
        f'gpu_utilization_ratio{{gpu="0",uuid="{uuid}"}} {utilization}',
        f'gpu_node_info{{instance_type="g5.xlarge",zone="z",capacity_type="on-demand"{name}}} 1',
        "",
    ])


@pytest.fixture
def serve(http_server: Callable[[HttpHandler], str]
          ) -> Callable[[str | Callable[[], str]], str]:
    """``serve(text)`` -> the URL of a real HTTP server answering ``text`` (or what a
    callable returns at each request) on /metrics."""
    def start(text: str | Callable[[], str]) -> str:
        def answer(h: BaseHTTPRequestHandler) -> None:
            body = (text() if callable(text) else text).encode()
            h.send_response(200)
            h.send_header("Content-Type", "text/plain; version=0.0.4")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        return http_server(answer) + "/metrics"
    return start


Serve = Callable[[str | Callable[[], str]], str]


def address(url: str) -> str:
    return url.split("/")[2]


def gpus_by_node(data: FleetData) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for ref in data.gpus:
        out.setdefault(ref.node, set()).add(ref.uuid)
    return out


def test_stated_names_name_the_nodes_and_old_exporters_fall_back(
    serve: Serve
) -> None:
    a = serve(exposition("GPU-a", 0.9, "node-a"))
    b = serve(exposition("GPU-b", 0.0, "node-b"))
    old = serve(exposition("GPU-old", 0.5, None))
    store = EmbeddedData(parse_targets(f"{a},{b},{old}"), interval=1)
    try:
        store.scrape_once()
        data = store.fleet(900)
        assert gpus_by_node(data) == {"node-a": {"GPU-a"}, "node-b": {"GPU-b"},
                                      address(old): {"GPU-old"}}
        # node_name became node: one info row per node, not one per label set.
        assert set(data.nodes) == {"node-a", "node-b", address(old)}
        assert all("node_name" not in dict(labels) for _, labels in store._info)
    finally:
        store.close()


def test_an_exporter_stating_its_cluster_is_keyed_by_it(serve: Serve) -> None:
    """Two exporters in two clusters state one node name (EKS's private-IP names in default
    VPCs) and their clusters (``--cluster-name``): two nodes, ``a/ip-…`` and ``b/ip-…``, no
    clash; the cluster picker scopes the page to either."""
    name = "ip-10-0-1-23.ec2.internal"

    def stating(cluster: str, uuid: str, utilization: float) -> str:
        return exposition(uuid, utilization, name).replace(
            f'node_name="{name}"', f'node_name="{name}",cluster="{cluster}"')

    a = serve(stating("a", "GPU-1", 0.0))
    b = serve(stating("b", "GPU-1", 0.9))
    store = EmbeddedData(parse_targets(f"{a},{b}"), interval=1)
    try:
        store.scrape_once()
        data = store.fleet(900)
        assert gpus_by_node(data) == {f"a/{name}": {"GPU-1"}, f"b/{name}": {"GPU-1"}}
        assert set(data.nodes) == {f"a/{name}", f"b/{name}"}
        assert not any(state.clash for state in store._state.values())
        prices = bundled_prices()
        every = build_fleet_view(data, prices)
        assert every.clusters == ("a", "b") and every.kpis.gpus == 2
        only_a = build_fleet_view(data, prices, cluster="a")
        assert only_a.nodes == (f"a/{name}",) and only_a.kpis.gpus == 1
        assert only_a.cluster == "a" and only_a.clusters == ("a", "b")
    finally:
        store.close()


def test_a_job_of_one_name_in_two_clusters_is_two_runs(serve: Serve) -> None:
    """The workload view of a page scoped to a cluster shows that cluster's run alone; the
    Prometheus store asks for it with the cluster's matcher."""
    name = "ip-10-0-1-23.ec2.internal"

    def node(cluster: str, uuid: str) -> str:
        pod = 'namespace="ml",pod="train-0",container="main"'
        return exposition(uuid, 0.9, name).replace(
            f'node_name="{name}"', f'node_name="{name}",cluster="{cluster}"') + "\n".join([
                f'gpu_pod_info{{namespace="ml",pod="train-0",uid="u-{cluster}",'
                f'workload="PyTorchJob/llama"}} 1',
                f'container_gpu_allocated{{{pod},uuid="{uuid}"}} 1',
                f'container_gpu_utilization_ratio{{{pod},uuid="{uuid}"}} 0.9', ""])

    store = EmbeddedData(parse_targets(f"{serve(node('a', 'GPU-a'))},{serve(node('b', 'GPU-b'))}"),
                         interval=1)
    try:
        store.scrape_once()
        time.sleep(1.1)
        store.scrape_once()
        both = store.workload_detail("ml", "PyTorchJob/llama", 900)
        assert {d.ref.uuid for d in both.devices} == {"GPU-a", "GPU-b"}
        only_a = store.workload_detail("ml", "PyTorchJob/llama", 900, cluster="a")
        assert [d.ref for d in only_a.devices] == [GpuRef(f"a/{name}", "GPU-a")]
        # The pod drill-down likewise: both clusters' pods of the name, each line naming
        # its node; one cluster's with a cluster picked.
        pods = store.pod_detail("ml", "train-0", 900)
        assert sorted(pods.utilization) == [f"main (a/{name} GPU 0)", f"main (b/{name} GPU 0)"]
        assert sorted(store.pod_detail("ml", "train-0", 900, cluster="b").utilization) == [
            f"main (b/{name} GPU 0)"]
    finally:
        store.close()
    prom = PrometheusStore("http://127.0.0.1:1", clock=lambda: 1e9)
    try:
        window = prom.window(3600)
        assert all('cluster="a"' in q for q in prom.pod_queries("ml", "train-0", window,
                                                                "a").values())
        members = prom.workload_queries("ml", "PyTorchJob/llama", window, cluster="a")["members"]
        # Each selector scoped: the containers' utilization, their holdings, the pods.
        assert members.count('cluster="a"') == 3
        assert "cluster" not in prom.workload_queries("ml", "PyTorchJob/llama",
                                                      window)["members"]
    finally:
        prom.close()


def test_a_name_given_for_the_target_wins(serve: Serve) -> None:
    url = serve(exposition("GPU-a", 0.9, "stated-name"))
    store = EmbeddedData(parse_targets(f"given-name={url}"), interval=1)
    try:
        store.scrape_once()
        assert gpus_by_node(store.fleet(900)) == {"given-name": {"GPU-a"}}
    finally:
        store.close()


def test_two_exporters_stating_one_name_stay_apart(
    serve: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    first = serve(exposition("GPU-busy", 0.9, "same-node"))
    second = serve(exposition("GPU-idle", 0.0, "same-node"))
    # A third target, given that very name by hand, takes it from both.
    third = serve(exposition("GPU-hand", 0.3, "other"))
    store = EmbeddedData(parse_targets(f"{first},{second}"), interval=1)
    handed = EmbeddedData([Target(third, "same-node"), *parse_targets(f"{first},{second}")],
                          interval=1)
    try:
        with caplog.at_level(logging.WARNING, logger="gpuscope.dashboard.data.embedded"):
            for _ in range(3):
                store.scrape_once()
                handed.scrape_once()
        second_addr, first_addr = address(second), address(first)
        # The first target in --targets keeps the name; the other is suffixed with its
        # host:port, every round the same.
        assert gpus_by_node(store.fleet(900)) == {
            "same-node": {"GPU-busy"}, f"same-node_{second_addr}": {"GPU-idle"}}
        assert gpus_by_node(handed.fleet(900)) == {
            "same-node": {"GPU-hand"}, f"same-node_{first_addr}": {"GPU-busy"},
            f"same-node_{second_addr}": {"GPU-idle"}}
        # The kept-apart node is a node like any other: its drill-down finds its GPU.
        detail = store.node_detail(f"same-node_{second_addr}", 900)
        assert set(detail.utilization) == {"0"}
        assert set(detail.utilization["0"].values) == {0.0}
        notes = store.fleet(900).notes
        assert [n for n in notes if "same-node" in n] == [
            f"two exporters state node 'same-node': {first} keeps the name, {second} is "
            f"shown as same-node_{second_addr}"]
        # Logged once per target and name, not once per scrape.
        clashes = [r for r in caplog.records if "state node 'same-node'" in r.getMessage()]
        assert len(clashes) == 3  # store: second; handed: first and second
    finally:
        store.close()
        handed.close()


def test_an_exporter_that_renames_its_node_moves_and_frees_the_old_name(serve: Serve) -> None:
    # A port-forward that now reaches another node's exporter: its series go to the new
    # node (kept apart from the target already holding that name).
    now = {"text": exposition("GPU-a", 0.9, "node-a")}
    moving = serve(lambda: now["text"])
    other = serve(exposition("GPU-b", 0.1, "node-b"))
    store = EmbeddedData(parse_targets(f"{moving},{other}"), interval=1)
    try:
        store.scrape_once()
        now["text"] = exposition("GPU-c", 0.9, "node-b")
        store.scrape_once()
        assert gpus_by_node(store.fleet(900)) == {
            "node-a": {"GPU-a"}, "node-b": {"GPU-b"}, f"node-b_{address(moving)}": {"GPU-c"}}
        assert store._claims == {"node-b": other, f"node-b_{address(moving)}": moving}
    finally:
        store.close()


# -- end to end: two real exporters behind one host -----------------------------------------


def test_two_exporters_on_one_host_are_two_nodes_and_the_idle_one_is_flagged(
    start_exporter: Callable[..., ExporterProcess],
) -> None:
    # The idle exporter names no node: a simulated exporter then states its scenario's node.
    # The busy one gets NODE_NAME (the DaemonSet's downward API), which wins over the scenario.
    idle = start_exporter("--source", "simulated", "--interval", "0.2",
                          "--scenario", str(SCENARIOS / "embedded-idle-t4.yaml"),
                          env={"NODE_NAME": ""})
    busy = start_exporter("--source", "simulated", "--interval", "0.2",
                          "--scenario", str(SCENARIOS / "embedded-busy-a10g.yaml"),
                          env={"NODE_NAME": "emb-busy-node"})
    targets = parse_targets(f"{idle.url}/metrics,{busy.url}/metrics")
    assert [t.node for t in targets] == [f"127.0.0.1:{idle.port}", f"127.0.0.1:{busy.port}"]
    store = EmbeddedData(targets, interval=0.5)
    try:
        for _ in range(6):  # 3 s of history at 0.5 s scrapes
            store.scrape_once()
            time.sleep(0.5)
        data = store.fleet(900)
        view = build_fleet_view(data, bundled_prices())
    finally:
        store.close()
    models = {node: sorted(data.gpus[ref].model for ref in data.gpus if ref.node == node)
              for node in {ref.node for ref in data.gpus}}
    assert models == {"emb-idle-t4": ["Tesla T4"], "emb-busy-node": ["NVIDIA A10G"] * 4}
    assert data.nodes["emb-idle-t4"].instance_type == "g4dn.xlarge"
    assert data.nodes["emb-busy-node"].instance_type == "g5.12xlarge"
    # The planted idle node is flagged, with the g4dn.xlarge's price; the busy one is not.
    assert [(r.node, r.instance_type) for r in view.idle_rows] == [("emb-idle-t4", "g4dn.xlarge")]
    assert view.idle_rows[0].price_per_hour == pytest.approx(0.526)
    assert not [n for n in data.notes if "state node" in n]
