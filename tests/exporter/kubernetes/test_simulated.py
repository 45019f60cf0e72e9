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
