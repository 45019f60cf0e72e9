from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.kubernetes.apiserver import NodeInfo
from gpuscope.exporter.kubernetes.attribution import (
    HOST,
    Attribution,
    ContainerKey,
    ContainerUsage,
    PodIdentity,
)
from gpuscope.exporter.sinks.prometheus.collectors.container import ContainerCollector


def render(
    result: Attribution | None, node_name: str = "", cluster: str | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ContainerCollector(lambda: result, node_name=node_name, cluster=cluster))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_container_pod_and_node_series() -> None:
    key = ContainerKey("ml", "train-0", "pytorch")
    result = Attribution(
        timestamp=1.0,
        containers=(
            ContainerUsage(key, "GPU-a", True, 0.9, 1024),
            ContainerUsage(ContainerKey("ml", "nb", "j"), "MIG-b", True, None, 0),
            ContainerUsage(HOST, "GPU-a", False, 0.05, 512),
        ),
        pods=(PodIdentity("ml", "train-0", "uid-1", "PyTorchJob/ft"),),
        node=NodeInfo("p4d.24xlarge", "us-east-1a", "on-demand"),
        unnamed_processes=2,
    )
    got = render(result)
    lbl = (("container", "pytorch"), ("namespace", "ml"), ("pod", "train-0"), ("uuid", "GPU-a"))
    assert got[("container_gpu_allocated", lbl)] == 1
    assert got[("container_gpu_utilization_ratio", lbl)] == 0.9
    assert got[("container_gpu_memory_used_bytes", lbl)] == 1024
    host = (("container", ""), ("namespace", ""), ("pod", ""), ("uuid", "GPU-a"))
    assert ("container_gpu_allocated", host) not in got
    assert got[("container_gpu_utilization_ratio", host)] == 0.05
    mig = (("container", "j"), ("namespace", "ml"), ("pod", "nb"), ("uuid", "MIG-b"))
    assert ("container_gpu_utilization_ratio", mig) not in got  # absent, not 0
    assert got[("container_gpu_memory_used_bytes", mig)] == 0
    assert got[("gpu_pod_info", (("namespace", "ml"), ("pod", "train-0"), ("uid", "uid-1"),
                                 ("workload", "PyTorchJob/ft")))] == 1
    assert got[("gpu_node_info", (("capacity_type", "on-demand"), ("instance_type",
                                  "p4d.24xlarge"), ("node_name", ""), ("zone", "us-east-1a")))] == 1
    assert got[("gpu_exporter_attribution_unnamed_processes", ())] == 2


def test_nothing_before_first_join_and_vanished_pods_vanish() -> None:
    assert render(None) == {}
    empty = render(Attribution(timestamp=2.0))
    assert not any(name.startswith("container_") or name == "gpu_pod_info" for name, _ in empty)


def node_rows(got: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> list[dict[str, str]]:
    return [dict(labels) for name, labels in got if name == "gpu_node_info"]


def test_node_name_is_stated_without_api_server_and_before_first_join() -> None:
    # No API server, no --instance-type: the node's labels are unknown, its name is not.
    no_metadata = Attribution(timestamp=1.0, node=None)
    for result in (None, no_metadata, Attribution(timestamp=1.0, node=NodeInfo())):
        assert node_rows(render(result, "gpu-node-7")) == [
            {"node_name": "gpu-node-7", "instance_type": "", "zone": "", "capacity_type": ""}]
    # Before the first join only the node's identity is served, nothing about containers.
    assert {name for name, _ in render(None, "gpu-node-7")} == {"gpu_node_info"}
    # With the API server's node labels, one series carries both.
    full = render(Attribution(timestamp=1.0, node=NodeInfo("g5.xlarge", "z1", "spot")), "n1")
    assert node_rows(full) == [
        {"node_name": "n1", "instance_type": "g5.xlarge", "zone": "z1", "capacity_type": "spot"}]
    # Without a name and without labels there is nothing to say.
    assert node_rows(render(no_metadata)) == []


def test_cluster_name_labels_gpu_node_info_and_nothing_else() -> None:
    key = ContainerKey("ml", "train-0", "pytorch")
    result = Attribution(
        timestamp=1.0, containers=(ContainerUsage(key, "GPU-a", True, 0.5, 1024),),
        pods=(PodIdentity("ml", "train-0", "uid-1", "Job/train"),),
        node=NodeInfo("p5.48xlarge", "us-east-1a", "spot"))
    with_cluster = render(result, "ip-10-0-1-23.ec2.internal", cluster="prod-east")
    assert node_rows(with_cluster) == [
        {"node_name": "ip-10-0-1-23.ec2.internal", "instance_type": "p5.48xlarge",
         "zone": "us-east-1a", "capacity_type": "spot", "cluster": "prod-east"}]
    assert [name for name, labels in with_cluster if "cluster" in dict(labels)] == [
        "gpu_node_info"]
    # Before the first join too: the node says which cluster it is in.
    assert node_rows(render(None, "n1", cluster="prod-east"))[0]["cluster"] == "prod-east"
    # Without --cluster-name (None, or empty) the series is unchanged: no cluster label.
    for cluster in (None, ""):
        without = render(result, "ip-10-0-1-23.ec2.internal", cluster=cluster)
        assert not [name for name, labels in without if "cluster" in dict(labels)]
        assert {k: v for k, v in without.items() if k[0] != "gpu_node_info"} == {
            k: v for k, v in with_cluster.items() if k[0] != "gpu_node_info"}
