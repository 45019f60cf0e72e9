"""Names, units, scale and dimension sets: snapshot -> observations (pure)."""

from __future__ import annotations

import math

import pytest

from gpuscope.exporter.model import DeviceSample
from gpuscope.exporter.sinks.cloudwatch.series import (
    DEVICE_METRICS,
    NODE_UTILIZATION,
    POD_MEMORY_USED,
    POD_UTILIZATION,
    UNITS,
    Identity,
    Observer,
    megahertz,
    mib,
    percent,
    pod_dimension_sets,
)
from tests.exporter.sinks.cloudwatch.helpers import GIB, MIB, attribution, gpu, snapshot, usage

AGENT_NAMES = {
    "nvidia_smi_utilization_gpu", "nvidia_smi_utilization_memory", "nvidia_smi_memory_total",
    "nvidia_smi_memory_used", "nvidia_smi_memory_free", "nvidia_smi_temperature_gpu",
    "nvidia_smi_power_draw", "nvidia_smi_fan_speed", "nvidia_smi_clocks_current_sm",
    "nvidia_smi_clocks_current_memory",
}


def as_dict(observations: list) -> dict:  # type: ignore[type-arg]
    out: dict = {}  # type: ignore[type-arg]
    for (name, dims), value in observations:
        out.setdefault((name, dims), []).append(value)
    return out


def test_agent_names_and_no_unit() -> None:
    assert {m.name for m in DEVICE_METRICS} == AGENT_NAMES
    # The agent publishes its nvidia_smi_* metrics with no CloudWatch Unit.
    assert all(UNITS[name] is None for name in AGENT_NAMES)
    assert UNITS[POD_UTILIZATION] == "Percent"
    assert UNITS[POD_MEMORY_USED] == "Bytes"
    assert UNITS[NODE_UTILIZATION] == "Percent"


def test_scale_conversions() -> None:
    assert percent(0.93) == 93.0  # not 93.00000000000001
    assert percent(0.5) == 50.0
    assert percent(None) is None
    assert percent(float("nan")) is None
    assert mib(81559 * MIB) == 81559.0
    assert mib(39.75 * GIB) == 40704.0
    assert megahertz(1.98e9) == 1980.0
    assert megahertz(1.593e9) == 1593.0


def test_device_values_and_agent_dimensions() -> None:
    dev = gpu(0, 0.87, memory_used=30 * GIB, fan_speed_ratio=0.4)
    obs = as_dict(Observer(Identity(host="ip-10-0-1-2.ec2.internal")).observe(
        snapshot(100.0, [dev]), None))
    dims = (("host", "ip-10-0-1-2.ec2.internal"), ("index", "0"),
            ("name", "NVIDIA A100-SXM4-80GB"), ("arch", "Ampere"))
    assert obs == {
        ("nvidia_smi_utilization_gpu", dims): [87.0],
        ("nvidia_smi_utilization_memory", dims): [43.5],
        ("nvidia_smi_memory_total", dims): [81920.0],
        ("nvidia_smi_memory_used", dims): [30720.0],
        ("nvidia_smi_memory_free", dims): [51200.0],
        ("nvidia_smi_temperature_gpu", dims): [40.0],
        ("nvidia_smi_power_draw", dims): [100.0],
        ("nvidia_smi_fan_speed", dims): [40.0],
        ("nvidia_smi_clocks_current_sm", dims): [1410.0],
        ("nvidia_smi_clocks_current_memory", dims): [1593.0],
    }


def test_unsupported_values_and_lost_devices_are_left_out() -> None:
    no_util = gpu(0, None)
    lost = DeviceSample(index="1", uuid="GPU-lost", model="X", up=False)
    obs = as_dict(Observer(Identity(host="h")).observe(snapshot(1.0, [no_util, lost]), None))
    names = {name for name, _ in obs}
    assert "nvidia_smi_utilization_gpu" not in names
    assert "nvidia_smi_fan_speed" not in names
    assert all(dict(dims)["index"] == "0" for _, dims in obs)


def test_extended_dimension_set_and_choice() -> None:
    dev = gpu(3, 0.5)
    ident = Identity(host="h", cluster_name="prod", instance_id="i-0123456789abcdef0",
                     instance_type="p4d.24xlarge")
    agent = (("host", "h"), ("index", "3"), ("name", "NVIDIA A100-SXM4-80GB"),
             ("arch", "Ampere"))
    extended = (*agent, ("InstanceId", "i-0123456789abcdef0"),
                ("InstanceType", "p4d.24xlarge"), ("ClusterName", "prod"))
    both = Observer(ident).device_dimension_sets(dev, "p4d.24xlarge")
    assert both == (agent, extended)
    only_agent = Observer(Identity(host="h", cluster_name="prod", device_dimensions="agent"))
    assert only_agent.device_dimension_sets(dev, None) == (agent,)
    only_ext = Observer(Identity(host="h", cluster_name="prod", device_dimensions="extended"))
    assert only_ext.device_dimension_sets(dev, None) == ((*agent, ("ClusterName", "prod")),)
    # Nothing extra known: one set, never the same datum twice.
    assert Observer(Identity(host="h")).device_dimension_sets(dev, None) == (agent,)


def test_instance_type_from_node_labels_wins_over_flag() -> None:
    ident = Identity(host="h", cluster_name="c", instance_type="from-flag")
    observer = Observer(ident)
    attr = attribution(5.0, [], instance_type="g5.12xlarge")
    obs = as_dict(observer.observe(snapshot(5.0, [gpu(0, 0.5)]), attr))
    node_keys = [dims for name, dims in obs if name == NODE_UTILIZATION]
    assert node_keys == [(("ClusterName", "c"), ("NodeName", "h"),
                          ("InstanceType", "g5.12xlarge")), (("ClusterName", "c"),)]


def test_mig_slices_keep_their_own_index_and_name() -> None:
    parent = DeviceSample(index="7", uuid="GPU-p", model="NVIDIA H100 80GB HBM3",
                          architecture="Hopper", memory_used_bytes=5 * GIB,
                          memory_total_bytes=80 * GIB, power_watts=90.0)
    sl = DeviceSample(index="7/1", uuid="MIG-1", model="NVIDIA H100 80GB HBM3 MIG 3g.40gb",
                      parent_uuid="GPU-p", mig_profile="3g.40gb", architecture="Hopper",
                      utilization_ratio=0.25, memory_used_bytes=5 * GIB,
                      memory_total_bytes=40 * GIB)
    obs = as_dict(Observer(Identity(host="h", cluster_name="c")).observe(
        snapshot(1.0, [parent, sl]), None))
    parent_names = {n for n, d in obs if dict(d).get("index") == "7"}
    slice_names = {n for n, d in obs if dict(d).get("index") == "7/1"}
    # The parent is what nvidia-smi (and the agent) reports: no utilization with MIG on.
    assert "nvidia_smi_utilization_gpu" not in parent_names
    assert "nvidia_smi_power_draw" in parent_names
    assert slice_names == {"nvidia_smi_utilization_gpu", "nvidia_smi_memory_total",
                           "nvidia_smi_memory_used", "nvidia_smi_memory_free"}
    slice_dims = next(dict(d) for n, d in obs if dict(d).get("index") == "7/1")
    assert slice_dims["name"] == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    # The node rollup counts the slice (it reports utilization), not the parent: once under
    # the node's set, once under the cluster's.
    assert [v for (n, _), v in ((k, v) for k, vs in obs.items() for v in vs)
            if n == NODE_UTILIZATION] == [25.0, 25.0]


def test_pod_rollups_sum_containers_per_device() -> None:
    a, b = gpu(0, 0.9), gpu(1, 0.2)
    usages = [
        usage("ml", "train", a.uuid, 0.5, 10 * GIB, container="worker"),
        usage("ml", "train", a.uuid, 0.25, 2 * GIB, container="sidecar"),
        usage("ml", "train", b.uuid, 0.125, 1 * GIB, container="worker"),
        usage("web", "idle", b.uuid, 0.0, 0),
        usage("", "", a.uuid, 0.125, 512 * MIB),  # host process: no pod
        usage("web", "unknown", a.uuid, None, None),  # usage unknown: no value
    ]
    obs = as_dict(Observer(Identity(host="h", cluster_name="c")).observe(
        snapshot(9.0, [a, b]), attribution(9.0, usages)))
    train = (("ClusterName", "c"), ("Namespace", "ml"), ("PodName", "train"))
    idle = (("ClusterName", "c"), ("Namespace", "web"), ("PodName", "idle"))
    assert sorted(obs[(POD_UTILIZATION, train)]) == [12.5, 75.0]
    assert sorted(obs[(POD_MEMORY_USED, train)]) == [1.0 * GIB, 12.0 * GIB]
    assert obs[(POD_UTILIZATION, idle)] == [0.0]
    assert obs[(POD_MEMORY_USED, idle)] == [0.0]
    assert not any(dict(d).get("PodName") == "unknown" for _, d in obs)
    assert sorted(obs[(NODE_UTILIZATION, (("ClusterName", "c"), ("NodeName", "h")))]) == [
        20.0, 90.0]
    # The namespace's and the cluster's series: one value per (pod, device), the same values.
    ml = (("ClusterName", "c"), ("Namespace", "ml"))
    web = (("ClusterName", "c"), ("Namespace", "web"))
    cluster = (("ClusterName", "c"),)
    assert sorted(obs[(POD_UTILIZATION, ml)]) == [12.5, 75.0]
    assert obs[(POD_UTILIZATION, web)] == [0.0]
    assert sorted(obs[(POD_UTILIZATION, cluster)]) == [0.0, 12.5, 75.0]
    assert sorted(obs[(POD_MEMORY_USED, cluster)]) == [0.0, 1.0 * GIB, 12.0 * GIB]
    assert sorted(obs[(NODE_UTILIZATION, cluster)]) == [20.0, 90.0]


def test_pod_rollup_with_an_unknown_container_is_unknown_not_a_partial_sum() -> None:
    # An MPS client whose utilization the driver does not report (None) and a container of
    # the same pod holding another replica, running nothing (0): the pod's utilization on
    # that GPU is unknown. It was published as 0 % (idle) while the client ran at 90 %.
    a, b = gpu(0, 0.9), gpu(1, 0.5)
    usages = [
        usage("ml", "infer", a.uuid, None, 8 * GIB, container="server"),
        usage("ml", "infer", a.uuid, 0.0, 0, container="warmup"),
        usage("ml", "infer", b.uuid, 0.5, 2 * GIB, container="server"),
        usage("ml", "named-late", b.uuid, 0.25, None, container="a"),  # memory unknown
        usage("ml", "named-late", b.uuid, 0.25, 1 * GIB, container="b"),
    ]
    obs = as_dict(Observer(Identity(host="h", cluster_name="c")).observe(
        snapshot(9.0, [a, b]), attribution(9.0, usages)))
    infer = (("ClusterName", "c"), ("Namespace", "ml"), ("PodName", "infer"))
    late = (("ClusterName", "c"), ("Namespace", "ml"), ("PodName", "named-late"))
    assert obs[(POD_UTILIZATION, infer)] == [50.0]  # GPU 1 only: GPU 0's is unknown
    assert sorted(obs[(POD_MEMORY_USED, infer)]) == [2.0 * GIB, 8.0 * GIB]
    assert obs[(POD_UTILIZATION, late)] == [50.0]
    assert (POD_MEMORY_USED, late) not in obs
    assert sorted(obs[(POD_UTILIZATION, (("ClusterName", "c"),))]) == [50.0, 50.0]


def test_every_rollup_dimension_set_carries_the_cluster() -> None:
    # Container Insights' pod_gpu_* sets [ClusterName], [ClusterName, Namespace],
    # [ClusterName, Namespace, PodName]; its node_gpu_* sets [ClusterName] and
    # [ClusterName, NodeName, InstanceId] (only with the instance ID), beside gpuscope's
    # [ClusterName, NodeName, InstanceType].
    assert pod_dimension_sets("c", "ml", "train") == (
        (("ClusterName", "c"), ("Namespace", "ml"), ("PodName", "train")),
        (("ClusterName", "c"), ("Namespace", "ml")),
        (("ClusterName", "c"),))
    with_id = Observer(Identity(host="h", cluster_name="c", instance_id="i-0123456789abcdef0"))
    assert with_id.node_dimension_sets("c", "p5.48xlarge") == (
        (("ClusterName", "c"), ("NodeName", "h"), ("InstanceType", "p5.48xlarge")),
        (("ClusterName", "c"), ("NodeName", "h"), ("InstanceId", "i-0123456789abcdef0")),
        (("ClusterName", "c"),))
    without = Observer(Identity(host="h", cluster_name="c"))
    assert without.node_dimension_sets("c", None) == (
        (("ClusterName", "c"), ("NodeName", "h")), (("ClusterName", "c"),))
    a = gpu(0, 0.5, sm_active_seconds=1.0, tensor_active_seconds=0.0)
    attr = attribution(1.0, [usage("ml", "p", a.uuid, 0.5, GIB)])
    with_id.observe(snapshot(0.0, [a]), None)
    obs = with_id.observe(snapshot(1.0, [a]), attr)
    rollups = [dims for (name, dims), _ in obs if not name.startswith("nvidia_")]
    assert len(rollups) == 3 * 3 + 2 * 3  # three node rollups, two pod rollups; 3 sets each
    assert all(dict(dims)["ClusterName"] == "c" for dims in rollups)


def test_stale_attribution_and_no_cluster_name_give_no_rollups() -> None:
    a = gpu(0, 0.9)
    attr = attribution(1.0, [usage("ml", "p", a.uuid, 0.5, GIB)])
    with_cluster = Observer(Identity(host="h", cluster_name="c"))
    names = {n for (n, _), _ in with_cluster.observe(snapshot(2.0, [a]), attr)}
    assert POD_UTILIZATION not in names  # the join is of another round
    without = Observer(Identity(host="h"))
    names = {n for (n, _), _ in without.observe(snapshot(1.0, [a]), attr)}
    assert not names & {POD_UTILIZATION, POD_MEMORY_USED, NODE_UTILIZATION}


def test_gpm_activity_is_the_counters_mean_between_rounds() -> None:
    from gpuscope.exporter.sinks.cloudwatch.series import (
        NODE_SM_ACTIVE,
        NODE_TENSOR_ACTIVE,
        SM_ACTIVE,
        TENSOR_ACTIVE,
    )

    assert UNITS[SM_ACTIVE] is None and UNITS[TENSOR_ACTIVE] is None  # like the agent's
    assert UNITS[NODE_SM_ACTIVE] == UNITS[NODE_TENSOR_ACTIVE] == "Percent"
    observer = Observer(Identity(host="h", cluster_name="c"))
    dims = (("host", "h"), ("index", "0"), ("name", "NVIDIA A100-SXM4-80GB"), ("arch", "Ampere"))
    node = (("ClusterName", "c"), ("NodeName", "h"))

    def round_at(t: float, sm: float | None, tensor: float | None) -> dict:  # type: ignore[type-arg]
        dev = gpu(0, 1.0, sm_active_seconds=sm, tensor_active_seconds=tensor)
        return as_dict(observer.observe(snapshot(t, [dev]), None))

    # The first round has nothing to compare with: no activity yet (never a made-up 0).
    first = round_at(100.0, 500.0, 20.0)
    assert (SM_ACTIVE, dims) not in first and (NODE_SM_ACTIVE, node) not in first
    # 10 s later: SM counter +1 s (10 %), tensor +0 (a hung collective spins, no tensor work).
    second = round_at(110.0, 501.0, 20.0)
    assert second[(SM_ACTIVE, dims)] == [10.0]
    assert second[(TENSOR_ACTIVE, dims)] == [0.0]
    assert second[(NODE_SM_ACTIVE, node)] == [10.0]
    assert second[(NODE_TENSOR_ACTIVE, node)] == [0.0]
    assert second[(NODE_SM_ACTIVE, (("ClusterName", "c"),))] == [10.0]
    # A device without GPM publishes none.
    third = as_dict(observer.observe(snapshot(120.0, [gpu(1, 0.5)]), None))
    assert not any(name in (SM_ACTIVE, TENSOR_ACTIVE) for name, _ in third)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_gpm_counter_gives_no_activity_not_100_percent(bad: float) -> None:
    # min(1.0, nan) is 1.0: a NaN or infinite counter (a GPM mean NVML gave as NaN or inf is
    # integrated into it, and stays there) must not be published as a GPU 100 % at work.
    from gpuscope.exporter.sinks.cloudwatch.series import NODE_SM_ACTIVE, SM_ACTIVE

    observer = Observer(Identity(host="h", cluster_name="c"))

    def names_at(t: float, sm: float) -> set[str]:
        dev = gpu(0, 1.0, sm_active_seconds=sm)
        return {n for (n, _), _ in observer.observe(snapshot(t, [dev]), None)}

    names_at(100.0, 500.0)
    for t in (101.0, 102.0, 103.0):
        names = names_at(t, bad)
        assert SM_ACTIVE not in names and NODE_SM_ACTIVE not in names
