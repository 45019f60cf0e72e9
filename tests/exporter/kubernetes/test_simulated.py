"""The scenario's pods feed the same join as a live node."""

from __future__ import annotations

import pytest

from gpuscope.exporter.kubernetes.attribution import HOST, ContainerKey, attribute
from gpuscope.exporter.kubernetes.simulated import ScenarioInputs
from gpuscope.exporter.sources.scenario import scenario_from_yaml
from gpuscope.exporter.sources.simulated import SimulatedSource

SCENARIO = """
node: {name: n1, instance_type: g5.12xlarge, zone: us-east-1b, capacity_type: spot, seed: 3}
gpus:
  - {count: 2, model: NVIDIA A10G, memory_total: 24GiB}
  - model: NVIDIA A100-SXM4-40GB
    memory_total: 40GiB
    mig: [{profile: 3g.20gb, gpu_instance_id: 1}, {profile: 3g.20gb, gpu_instance_id: 2}]
processes:
  - {pid: 100, gpu: 0, memory: 1GiB, utilization: 0.3, pod: s/a/app}
  - {pid: 101, gpu: 0, memory: 2GiB, utilization: 0.5, pod: s/b/app}
  - {pid: 102, gpu: 0, memory: 1GiB, utilization: 0.1}
  - {pid: 200, gpu: "2/1", memory: 3GiB, utilization: 0.4, pod: m/slice/c}
pods:
  - {namespace: s, name: a, workload: Deployment/a, containers: [{name: app, gpus: ["0::0"]}]}
  - {namespace: s, name: b, workload: Deployment/b, containers: [{name: app, gpus: ["0::1"]}]}
  - {namespace: s, name: idle, containers: [{name: app, gpus: [1]}]}
  - {namespace: m, name: slice, containers: [{name: c, gpus: ["2/1"]}]}
"""


def test_scenario_pods_attribute_like_a_live_node() -> None:
    scenario = scenario_from_yaml(SCENARIO)
    inputs = ScenarioInputs(scenario)
    snap = SimulatedSource(scenario, clock=lambda: 10.0, start=0.0).sample()
    pids = {p.pid for d in snap.devices for p in d.processes}
    result = attribute(snap, inputs.allocations(), inputs.containers_of(pids), inputs.metadata())
    g0, g1 = scenario.gpus[0].uuid, scenario.gpus[1].uuid
    mig = scenario.gpus[2].mig[0].uuid
    got = {(u.key, u.uuid): (u.allocated, u.utilization_ratio, u.memory_used_bytes)
           for u in result.containers}
    gib = 1024**3
    assert got == {
        (ContainerKey("s", "a", "app"), g0): (True, pytest.approx(0.3), gib),
        (ContainerKey("s", "b", "app"), g0): (True, pytest.approx(0.5), 2 * gib),
        (HOST, g0): (False, pytest.approx(0.1), gib),
        (ContainerKey("s", "idle", "app"), g1): (True, 0.0, 0),
        (ContainerKey("m", "slice", "c"), mig): (True, None, 3 * gib),
    }
    assert {(p.namespace, p.pod, p.workload) for p in result.pods} == {
        ("s", "a", "Deployment/a"), ("s", "b", "Deployment/b"), ("s", "idle", ""),
        ("m", "slice", ""),
    }
    assert all(p.uid for p in result.pods)
    assert result.node is not None
    assert (result.node.instance_type, result.node.zone, result.node.capacity_type) == (
        "g5.12xlarge", "us-east-1b", "spot")
    assert result.unresolved_allocations == 0
    resources = {a.resource_name for a in inputs.allocations()}
    assert resources == {"nvidia.com/gpu", "nvidia.com/mig-3g.20gb"}


MPS_SCENARIO = """
node: {name: mps-node, seed: 4}
gpus:
  - {model: NVIDIA H200, memory_total: 141GiB, mps_client_utilization: %s}
  - {model: NVIDIA H200, memory_total: 141GiB}
processes:
  - {pid: 787, gpu: 0, memory: 66MiB, mps: server, pod: nvidia/mps-daemon/mps-control-daemon-ctr}
  - {pid: 752, gpu: 0, memory: 4968MiB, utilization: 0.7, mps: client, pod: ml/heavy/main}
  - {pid: 754, gpu: 0, memory: 1704MiB, utilization: 0.25, mps: client, pod: ml/light/main}
pods:
  - {namespace: nvidia, name: mps-daemon, containers: [{name: mps-control-daemon-ctr}]}
  - {namespace: ml, name: heavy, containers: [{name: main, gpus: ["0::0"]}]}
  - {namespace: ml, name: light, containers: [{name: main, gpus: ["0::1"]}]}
  - {namespace: ml, name: other, containers: [{name: main, gpus: ["1::0", "1::1"]}]}
"""


@pytest.mark.parametrize("per_client", [False, True])
def test_an_mps_scenario_attributes_like_a_live_mps_node(per_client: bool) -> None:
    scenario = scenario_from_yaml(MPS_SCENARIO % str(per_client).lower())
    inputs = ScenarioInputs(scenario)
    snap = SimulatedSource(scenario, clock=lambda: 10.0, start=0.0).sample()
    gpu0 = snap.devices[0]
    assert {p.pid: p.mps for p in gpu0.processes} == {752: "client", 754: "client",
                                                        787: "server"}
    assert gpu0.mps_client_utilization_reported is per_client
    assert snap.devices[1].mps_client_utilization_reported is None
    pids = {p.pid for d in snap.devices for p in d.processes}
    result = attribute(snap, inputs.allocations(), inputs.containers_of(pids), inputs.metadata())
    g0, g1 = scenario.gpus[0].uuid, scenario.gpus[1].uuid
    got = {(u.key, u.uuid): (u.allocated, u.utilization_ratio, u.memory_used_bytes)
           for u in result.containers}
    mib = 1024**2
    assert got == {
        (ContainerKey("ml", "heavy", "main"), g0): (
            True, pytest.approx(0.7) if per_client else None, 4968 * mib),
        (ContainerKey("ml", "light", "main"), g0): (
            True, pytest.approx(0.25) if per_client else None, 1704 * mib),
        (ContainerKey("ml", "other", "main"), g1): (True, 0.0, 0),
    }
    server = next(p for p in gpu0.processes if p.mps == "server")
    assert server.memory_used_bytes == 66 * mib
    assert server.sm_utilization_ratio == (0.0 if per_client else pytest.approx(0.95))
    assert [(d.gpu, d.sharing) for d in result.sharing] == [("0", "mps"), ("1", "time-sliced")]
