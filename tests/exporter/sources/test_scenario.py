"""Scenario format: loading, defaults, units, patterns, and one-line errors with key paths."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest

from gpuscope.exporter.sources.scenario import (
    DEFAULT_SCENARIO_NAME,
    ActivitySpec,
    BurstyPattern,
    ConstantPattern,
    DeviceRef,
    EccFault,
    Lifetime,
    LostFault,
    NotSupportedFault,
    NvmlDownFault,
    RandomPattern,
    RemappedRows,
    RowRemapFault,
    Scenario,
    ScenarioError,
    SinePattern,
    SteppedPattern,
    Window,
    XidFault,
    load_default_scenario,
    load_scenario,
    scenario_from_dict,
    scenario_from_yaml,
    synthetic_scenario,
)

GIB = 2**30
MIB = 2**20
GPU_UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
MIG_UUID = re.compile(r"^MIG-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def parse(text: str) -> Scenario:
    return scenario_from_yaml(textwrap.dedent(text), "scenario.yaml")


def error_of(text: str) -> str:
    with pytest.raises(ScenarioError) as info:
        parse(text)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("scenario.yaml: ")
    return message


# -- loading ---------------------------------------------------------------------------------


def test_default_scenario_loads_and_describes_a_p5_node() -> None:
    s = load_scenario(None)
    assert s == load_default_scenario()
    assert s.source == DEFAULT_SCENARIO_NAME
    assert s.node.instance_type == "p5.48xlarge"
    assert s.node.capacity_type == "on-demand"
    assert s.node.zone == "us-east-1a"
    assert len(s.gpus) == 8
    assert all(g.model == "NVIDIA H100 80GB HBM3" for g in s.gpus)
    assert [g.mig_enabled for g in s.gpus] == [False] * 7 + [True]
    assert [sl.index for sl in s.gpus[7].mig] == ["7/1", "7/5", "7/13", "7/14"]
    assert s.gpus[7].mig[0].utilization_supported
    assert len({g.uuid for g in s.gpus}) == 8
    # every process that names a pod names one that exists
    containers = {(p.namespace, p.name, c.name) for p in s.pods for c in p.containers}
    for proc in s.processes:
        assert proc.pod is not None
        assert (proc.pod.namespace, proc.pod.pod, proc.pod.container) in containers
    assert any(isinstance(f, XidFault) and f.every for f in s.faults)
    # time-slicing: three containers hold replicas of GPU 4
    replicas = [r for p in s.pods for c in p.containers for r in c.devices if r.replica is not None]
    assert sorted(str(r) for r in replicas) == ["4::0", "4::1", "4::2"]


def test_load_from_path_minimal_file_gets_a100_defaults(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("gpus: [{}]\n")
    s = load_scenario(path)
    assert s.source == str(path)
    assert s.node.name == "gpuscope-sim"
    assert s.node.seed == 0
    assert s.node.capacity_type == "on-demand"
    g = s.gpus[0]
    assert g.model == "NVIDIA A100-SXM4-80GB"
    assert g.architecture == "Ampere"
    assert g.memory_total_bytes == 80 * GIB
    assert g.power_limit_watts == 400.0
    assert g.power_idle_watts == 60.0
    assert g.sm_clock_busy_hertz == 1410e6
    assert g.memory_clock_hertz == 1593e6
    assert g.fan_idle_ratio is None
    assert g.pci_bus_id == "00000000:10:00.0"
    assert GPU_UUID.match(g.uuid)
    assert s.processes == () and s.pods == () and s.faults == ()


def test_units_sizes_durations_frequencies_percentages() -> None:
    s = parse("""
        gpus:
          - memory_total: 40GB
            memory_reserved: 512MiB
            power_limit: 300W
            sm_clock: {idle: 0.3GHz, busy: 1410MHz}
            memory_clock: 1215000000Hz
            base_utilization: 5%
        processes:
          - {pid: 1, gpu: 0, memory: 1048576, start: 1m30s, stop: 1h, utilization: "50%"}
          - {pid: 2, gpu: 0, memory: 1.5GiB, start: 250ms, every: {period: 2m, on: 30s}}
    """)
    g = s.gpus[0]
    assert g.memory_total_bytes == 40 * 10**9
    assert g.memory_reserved_bytes == 512 * MIB
    assert g.power_limit_watts == 300.0
    assert g.sm_clock_idle_hertz == pytest.approx(0.3e9)
    assert g.memory_clock_hertz == 1.215e9
    assert g.base_utilization == pytest.approx(0.05)
    p1, p2 = s.processes
    assert p1.memory_bytes == MIB
    assert p1.lifetime == Lifetime(90.0, 3600.0)
    assert p1.utilization == ConstantPattern(0.5)
    assert p2.memory_bytes == int(1.5 * GIB)
    assert p2.lifetime == Lifetime(0.25, None, 120.0, 30.0)


def test_count_replicates_with_distinct_indices_uuids_and_bus_ids() -> None:
    s = parse("""
        node: {seed: 7}
        gpus:
          - {count: 3, model: NVIDIA H100 80GB HBM3}
          - {model: Tesla T4, memory_total: 16GiB}
    """)
    assert [g.index for g in s.gpus] == [0, 1, 2, 3]
    assert [g.architecture for g in s.gpus] == ["Hopper"] * 3 + ["Turing"]
    assert len({g.uuid for g in s.gpus}) == 4
    assert len({g.pci_bus_id for g in s.gpus}) == 4


def test_uuids_are_deterministic_from_seed_and_index() -> None:
    text = "node: {seed: %d}\ngpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 9}]}, {}]\n"
    a = scenario_from_yaml(text % 1)
    b = scenario_from_yaml(text % 1)
    c = scenario_from_yaml(text % 2)
    assert [g.uuid for g in a.gpus] == [g.uuid for g in b.gpus]
    assert a.gpus[0].mig[0].uuid == b.gpus[0].mig[0].uuid
    assert MIG_UUID.match(a.gpus[0].mig[0].uuid)
    assert a.gpus[0].uuid != c.gpus[0].uuid
    assert a.gpus[0].uuid != a.gpus[1].uuid


def test_mig_slices_default_memory_from_profile_and_sorted_by_instance_id() -> None:
    s = parse("""
        gpus:
          - mig:
              - {profile: 1g.10gb, gpu_instance_id: 13}
              - {profile: 3g.40gb, gpu_instance_id: 2, memory: 39.5GiB}
    """)
    slices = s.gpus[0].mig
    assert [(sl.index, sl.profile, sl.compute_slices) for sl in slices] == [
        ("0/2", "3g.40gb", 3), ("0/13", "1g.10gb", 1)]
    assert slices[0].memory_total_bytes == int(39.5 * GIB)
    assert slices[1].memory_total_bytes == 10 * GIB
    assert s.device_uuid(DeviceRef(0, 13)) == slices[1].uuid


def test_pods_uid_and_container_id_derived_and_refs_resolved() -> None:
    s = parse("""
        gpus: [{}, {}]
        pods:
          - namespace: ml
            name: ddp-0
            workload: PyTorchJob/ddp-run
            containers: [{name: trainer, gpus: [0]}, {name: sidecar}]
          - namespace: ml
            name: share-a
            uid: 0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d
            containers: [{name: c, id: "%s", gpus: ["1::0"]}]
          - namespace: ml
            name: share-b
            containers: [{name: c, gpus: ["1::1"]}]
        processes:
          - {pid: 10, gpu: 0, pod: ml/ddp-0/trainer}
          - {pid: 11, gpu: 1}
    """ % ("ab" * 32))
    ddp, share_a, _ = s.pods
    assert re.match(r"^[0-9a-f-]{36}$", ddp.uid)
    assert re.match(r"^[0-9a-f]{64}$", ddp.containers[0].id)
    assert ddp.containers[0].devices == (DeviceRef(0),)
    assert ddp.containers[1].devices == ()
    assert ddp.workload == "PyTorchJob/ddp-run"
    assert ddp.qos == "guaranteed"
    assert share_a.uid == "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
    assert share_a.containers[0].id == "ab" * 32
    assert share_a.containers[0].devices == (DeviceRef(1, replica=0),)
    assert s.device_uuid(DeviceRef(1, replica=0)) == s.gpus[1].uuid + "::0"
    assert str(s.processes[0].pod) == "ml/ddp-0/trainer"
    assert s.processes[1].pod is None
    assert s.pod("ml", "ddp-0") is ddp
    assert s.pod("ml", "nope") is None


def test_on_key_and_yaml_12_booleans() -> None:
    # YAML 1.1 would read the key `on` as True and `no` as False: this loader does not.
    s = parse("""
        node: {name: no}
        gpus: [{}]
        processes: [{pid: 1, gpu: 0, every: {period: 60, on: 20}}]
    """)
    assert s.node.name == "no"
    assert s.processes[0].lifetime.on == 20.0


def test_yaml_anchors_and_merge_keys_work() -> None:
    s = parse("""
        gpus:
          - &a {model: NVIDIA L4, memory_total: 24GB, power_limit: 72}
          - {<<: *a, power_limit: 60}
    """)
    assert [g.power_limit_watts for g in s.gpus] == [72.0, 60.0]
    assert s.gpus[1].model == "NVIDIA L4"
    assert s.gpus[1].architecture == "Ada Lovelace"


def test_faults_parse() -> None:
    s = parse("""
        gpus: [{}, {mig: [{profile: 7g.80gb, gpu_instance_id: 0}]}]
        faults:
          - {type: lost, gpu: 0, at: 10, for: 5}
          - {type: xid, gpu: 0, code: 79, at: 10}
          - {type: xid, gpu: 1, code: 13, every: 1m, count: 3}
          - {type: nvml_down, at: 100, for: 10, every: 60}
          - {type: not_supported, gpu: "1/0", fields: [memory_used_bytes]}
    """)
    assert s.faults == (
        LostFault(0, Window(10.0, 5.0)),
        XidFault(0, 79, 10.0, None, 1),
        XidFault(1, 13, 0.0, 60.0, 3),
        NvmlDownFault(Window(100.0, 10.0, 60.0)),
        NotSupportedFault(DeviceRef(1, 0), frozenset({"memory_used_bytes"}), Window()),
    )


def test_health_faults_parse() -> None:
    s = parse("""
        gpus:
          - {remapped_rows: {correctable: 3, uncorrectable: 1}}
          - {}
        faults:
          - {type: ecc, gpu: 0, uncorrected: 2, at: 5m}
          - {type: ecc, gpu: 1, corrected: 10, at: 1m, every: 30s, count: 4}
          - {type: row_remap, gpu: 0, at: 5m, for: 10m, uncorrectable: 1, pending: true}
          - {type: row_remap, gpu: 0, at: 15m, uncorrectable: 1}
          - {type: row_remap, gpu: 1, at: 1h, failed: true}
    """)
    assert [g.remapped_rows for g in s.gpus] == [RemappedRows(3, 1), RemappedRows(0, 0)]
    assert s.faults == (
        EccFault(0, 300.0, None, 1, corrected=0, uncorrected=2),
        EccFault(1, 60.0, 30.0, 4, corrected=10, uncorrected=0),
        RowRemapFault(0, Window(300.0, 600.0), uncorrectable=1, pending=True),
        RowRemapFault(0, Window(900.0), uncorrectable=1),
        RowRemapFault(1, Window(3600.0), failed=True),
    )
    assert [s.faults[1].count_at(t) for t in (59, 60, 89, 90, 1000)] == [0, 1, 1, 2, 4]


def test_row_remapper_by_architecture_unless_the_entry_says() -> None:
    s = parse("""
        gpus:
          - {model: NVIDIA A100-SXM4-80GB}
          - {model: NVIDIA H100 80GB HBM3}
          - {model: NVIDIA L4}
          - {model: Tesla V100-SXM2-32GB}
          - {model: Tesla T4}
          - {model: Some Future GPU}
          - {model: Tesla V100-SXM2-32GB, remapped_rows: {uncorrectable: 2}}
          - {model: NVIDIA A100-SXM4-80GB, unsupported: [row_remapping]}
          - {model: NVIDIA B200, remapped_rows: {}}
    """)
    assert [g.remapped_rows for g in s.gpus] == [
        RemappedRows(), RemappedRows(), RemappedRows(), None, None, None,
        RemappedRows(0, 2), None, RemappedRows(),
    ]


def test_synthetic_scenario_size_and_validity() -> None:
    s = synthetic_scenario(8, 64, seed=3)
    assert len(s.gpus) == 8
    assert len(s.processes) == 8 * 64
    assert len(s.pods) == 8 * 4
    assert s.node.seed == 3
    per_gpu = [sum(1 for p in s.processes if p.device.gpu == g) for g in range(8)]
    assert per_gpu == [64] * 8
    kinds = {type(p.utilization) for p in s.processes}
    assert kinds == {ConstantPattern, BurstyPattern, SteppedPattern, RandomPattern, SinePattern}
    assert any(p.lifetime.period for p in s.processes)
    assert synthetic_scenario(1, 1).pods[0].containers[0].devices == (DeviceRef(0),)
    assert synthetic_scenario(2, 0).processes == ()
    with pytest.raises(ValueError):
        synthetic_scenario(-1, 1)


# -- patterns and time, value by value ------------------------------------------------------


def test_stepped_pattern_values() -> None:
    p = SteppedPattern(((10.0, 0.2), (30.0, 0.8), (60.0, 0.0)))
    assert [p.value_at(t) for t in (0, 9.99, 10, 29.9, 30, 59, 60, 1e6)] == [
        0.0, 0.0, 0.2, 0.2, 0.8, 0.8, 0.0, 0.0]
    r = SteppedPattern(((0.0, 0.1), (30.0, 0.9)), repeat=60.0)
    assert [r.value_at(t) for t in (0, 29, 30, 59, 60, 95, 120)] == [
        0.1, 0.1, 0.9, 0.9, 0.1, 0.9, 0.1]


def test_bursty_pattern_values() -> None:
    p = BurstyPattern(low=0.1, high=0.9, period=20.0, duty=0.25)
    assert [p.value_at(t) for t in (0, 4.9, 5, 19.9, 20, 25, 44)] == [
        0.9, 0.9, 0.1, 0.1, 0.9, 0.1, 0.9]
    shifted = BurstyPattern(low=0.0, high=1.0, period=10.0, duty=0.5, phase=5.0)
    assert [shifted.value_at(t) for t in (0, 4.9, 5, 9.9)] == [0.0, 0.0, 1.0, 1.0]


def test_sine_pattern_values() -> None:
    p = SinePattern(low=0.2, high=0.6, period=100.0)
    assert p.value_at(0) == pytest.approx(0.4)
    assert p.value_at(25) == pytest.approx(0.6)
    assert p.value_at(75) == pytest.approx(0.2)
    assert p.value_at(100) == pytest.approx(0.4)


def test_random_pattern_is_a_pure_function_of_seed_and_bucket() -> None:
    p = RandomPattern(low=0.2, high=0.4, interval=10.0, seed=42)
    values = [p.value_at(t) for t in range(0, 100)]
    assert all(0.2 <= v <= 0.4 for v in values)
    assert values[0] == values[9] != values[10]  # held for a bucket
    assert len(set(values)) == 10
    assert [p.value_at(t) for t in range(99, -1, -1)] == values[::-1]
    assert RandomPattern(0.2, 0.4, 10.0, 43).value_at(0) != values[0]
    smooth = RandomPattern(low=0.2, high=0.4, interval=10.0, seed=42, smooth=True)
    assert smooth.value_at(0) == values[0]
    assert smooth.value_at(10) == pytest.approx(values[10])
    assert smooth.value_at(5) == pytest.approx((values[0] + values[10]) / 2)


def test_lifetime_start_stop_and_every() -> None:
    once = Lifetime(start=10.0, stop=20.0)
    assert [once.incarnation_start(t) for t in (9.9, 10, 19.9, 20, 100)] == [
        None, 10.0, 10.0, None, None]
    periodic = Lifetime(start=5.0, period=60.0, on=20.0)
    assert [periodic.incarnation_start(t) for t in (4, 5, 24.9, 25, 64.9, 65, 84.9, 85)] == [
        None, 5.0, 5.0, None, None, 65.0, 65.0, None]
    assert Lifetime().always and not once.always


def test_window_and_xid_counts() -> None:
    w = Window(at=100.0, duration=10.0, every=60.0)
    assert [w.contains(t) for t in (99, 100, 109.9, 110, 160, 170, 175)] == [
        False, True, True, False, True, False, False]
    assert Window(at=5.0).contains(1e9) and not Window(at=5.0).contains(4.9)
    x = XidFault(gpu=0, code=13, at=100.0, every=50.0, count=None)
    assert [x.count_at(t) for t in (0, 99.9, 100, 149.9, 150, 1000)] == [0, 0, 1, 1, 2, 19]
    assert XidFault(0, 13, 100.0, 50.0, 3).count_at(1e6) == 3
    assert XidFault(0, 79, 5.0, None, 1).count_at(1e6) == 1


def test_scenario_from_dict_accepts_plain_python() -> None:
    s = scenario_from_dict({"gpus": [{"count": 2}], "processes": [
        {"pid": 5, "gpu": 1, "utilization": {"pattern": "constant", "value": 0.5}}]})
    assert s.processes[0].device == DeviceRef(1)
    assert s.processes[0].memory_bytes == 512 * MIB
    assert s.processes[0].kinds == ("compute",)


# -- errors: one line, naming the file and the key path --------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: [{}, {}, {memory_total: lots}]",
         "scenario.yaml: gpus[2].memory_total: expected a size like '80GiB', got 'lots'"),
        ("gpus: [{memroy_total: 80GiB}]",
         "scenario.yaml: gpus[0].memroy_total: unknown key; did you mean 'memory_total'?"),
        ("gpu: []", "scenario.yaml: gpu: unknown key; did you mean 'gpus'?"),
        ("node: {seed: 1}", "scenario.yaml: missing required key 'gpus'"),
        ("gpus: {}", "scenario.yaml: gpus: expected a list, got a mapping"),
        ("version: 2\ngpus: []", "scenario.yaml: version: unsupported scenario version 2"),
        ("node: {capacity_type: reserved}\ngpus: []",
         "node.capacity_type: expected one of on-demand, spot, got 'reserved'"),
        ("node: {driver_version: 550.9}\ngpus: []",
         "node.driver_version: expected a string (quote it"),
        ("node: {seed: -1}\ngpus: []", "node.seed: must be >= 0, got -1"),
        ("gpus: [{count: 0}]", "gpus[0].count: must be >= 1, got 0"),
        ("gpus: [{count: 2, uuid: GPU-00000000-0000-4000-8000-000000000000}]",
         "gpus[0].uuid: cannot be set on an entry with count 2"),
        ("gpus: [{uuid: gpu-1}]", "gpus[0].uuid: expected 'GPU-' and a lowercase UUID"),
        ("gpus: [{power_idle: 500}]", "gpus[0].power_idle: must not exceed power_limit"),
        ("gpus: [{power_limit: hot}]", "gpus[0].power_limit: expected watts"),
        ("gpus: [{sm_clock: {busy: 1410}}]",
         "gpus[0].sm_clock.busy: expected a frequency like '1410MHz', got 1410"),
        ("gpus: [{temperature: {idle: 30, max: 80}}]",
         "gpus[0].temperature.max: unknown key"),
        ("gpus: [{base_utilization: 1.5}]", "gpus[0].base_utilization: must be <= 1"),
        ("gpus: [{unsupported: [power]}]",
         "gpus[0].unsupported[0]: unknown field 'power'; did you mean 'power_watts'?"),
        ("gpus: [{fan_speed: {idle: 0.3}}]",
         "gpus[0].fan_speed: missing required key 'busy'"),
        ("gpus: [{ecc: {corrected: -1}}]", "gpus[0].ecc.corrected: must be >= 0"),
        ("gpus: [{mig: [{profile: big, gpu_instance_id: 1}]}]",
         "gpus[0].mig[0].profile: expected a MIG profile like '3g.40gb', got 'big'"),
        ("gpus: [{mig: [{profile: 1g.10gb}]}]",
         "gpus[0].mig[0]: missing required key 'gpu_instance_id'"),
        ("gpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 1}, "
         "{profile: 1g.10gb, gpu_instance_id: 1}]}]",
         "gpus[0].mig[1].gpu_instance_id: gpu_instance_id 1 is used twice"),
        ("gpus: [{mig: [{profile: 7g.80gb, gpu_instance_id: 0}, "
         "{profile: 1g.10gb, gpu_instance_id: 9}]}]",
         "gpus[0].mig[1].memory: the slices' memory adds up to 90GiB, more than"),
        ("gpus: [{mig: []}]", "gpus[0].mig: must list at least one slice"),
        ("gpus: [{}]\nprocesses: [{gpu: 0}]", "processes[0]: missing required key 'pid'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 3}]",
         "processes[0].gpu: no GPU 3 (the scenario has 1 GPUs, 0..0)"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: zero}]",
         "processes[0].gpu: expected a device like 0, '0/1' (MIG slice) or '0::1'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: '0/1'}]",
         "processes[0].gpu: GPU 0 is not in MIG mode"),
        ("gpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 9}]}]\n"
         "processes: [{pid: 1, gpu: 0}]",
         "processes[0].gpu: GPU 0 is in MIG mode; run processes on one of its slices, "
         "e.g. '0/9'"),
        ("gpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 9}]}]\n"
         "processes: [{pid: 1, gpu: '0/2'}]",
         "processes[0].gpu: GPU 0 has no MIG slice with gpu_instance_id 2 (it has 9)"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: '0::1'}]",
         "processes[0].gpu: a process runs on a device, not on a time-slicing replica"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0}, {pid: 1, gpu: 0}]",
         "processes[1].pid: pid 1 is already listed on device 0"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, kind: render}]",
         "processes[0].kind: expected one of compute, graphics, got 'render'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, memory: 90GiB}]",
         "processes[0].memory: the processes on device 0 need 90GiB, more than its 80GiB"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, utilization: 2}]",
         "processes[0].utilization: must be <= 1, got 2"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, utilization: {value: 0.5}}]",
         "processes[0].utilization: missing required key 'pattern'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, utilization: {pattern: square}}]",
         "processes[0].utilization.pattern: expected one of constant, stepped, bursty, random, "
         "sine, got 'square'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, "
         "utilization: {pattern: bursty, high: 1, period: 10}}]",
         "processes[0].utilization: missing required key 'duty'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, "
         "utilization: {pattern: constant, value: 0.5, period: 3}}]",
         "processes[0].utilization.period: unknown key"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, "
         "utilization: {pattern: stepped, steps: [[0, 0.1], [0, 0.2]]}}]",
         "processes[0].utilization.steps[1][0]: step times must increase"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, "
         "utilization: {pattern: stepped, steps: [[0, 0.1, 3]]}}]",
         "processes[0].utilization.steps[0]: expected [t_seconds, value]"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, "
         "utilization: {pattern: stepped, steps: [[0, 0.1], [60, 0.2]], repeat: 30}}]",
         "processes[0].utilization.repeat: must be longer than the last step's time"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, "
         "utilization: {pattern: random, low: 0.8, high: 0.2}}]",
         "processes[0].utilization.low: must not exceed high"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, start: soon}]",
         "processes[0].start: expected seconds or a duration like '90s'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, start: 60, stop: 30}]",
         "processes[0].stop: must be after start (60 s), got 30"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, every: {period: 60, on: 90}}]",
         "processes[0].every.on: must not exceed period (60 s), got 90"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, pod: a/b}]",
         "processes[0].pod: expected 'namespace/pod/container', got 'a/b'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, pod: ns/p/c}]",
         "processes[0].pod: no container ns/p/c in 'pods'"),
        ("gpus: [{}, {}]\npods: [{namespace: ns, name: p, containers: [{name: c}]}]\n"
         "processes: [{pid: 1, gpu: 0, pod: ns/p/c}, {pid: 1, gpu: 1}]",
         "processes[1].pod: pid 1 is listed elsewhere with pod ns/p/c"),
        ("gpus: [{}]\npods: [{namespace: NS, name: p, containers: [{name: c}]}]",
         "pods[0].namespace: not a valid namespace name: 'NS'"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, containers: []}]",
         "pods[0].containers: a pod needs at least one container"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, workload: ddp, containers: [{name: c}]}]",
         "pods[0].workload: expected '<Kind>/<name>' like 'PyTorchJob/ddp-run', got 'ddp'"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, uid: x, containers: [{name: c}]}]",
         "pods[0].uid: expected a lowercase UUID, got 'x'"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, containers: [{name: c, id: abc}]}]",
         "pods[0].containers[0].id: expected 64 lowercase hex digits, got 'abc'"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, containers: [{name: c}, {name: c}]}]",
         "pods[0].containers[1].name: container 'c' is listed twice"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, containers: [{name: c}]}, "
         "{namespace: ns, name: p, containers: [{name: c}]}]",
         "pods[1].name: pod ns/p is listed twice"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, containers: [{name: c, gpus: [0]}]}, "
         "{namespace: ns, name: q, containers: [{name: c, gpus: [0]}]}]",
         "pods[1].containers[0].gpus[0]: device 0 is already allocated to ns/p/c"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, containers: [{name: c, gpus: [0]}]}, "
         "{namespace: ns, name: q, containers: [{name: c, gpus: ['0::1']}]}]",
         "pods[1].containers[0].gpus[0]: GPU 0 is already allocated whole to ns/p/c"),
        ("gpus: [{}]\npods: [{namespace: ns, name: p, containers: [{name: c, "
         "gpus: ['0::1', '0::1']}]}]",
         "pods[0].containers[0].gpus[1]: device 0::1 is listed twice"),
        ("gpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 9}]}]\n"
         "pods: [{namespace: ns, name: p, containers: [{name: c, gpus: [0]}]}]",
         "pods[0].containers[0].gpus[0]: GPU 0 is in MIG mode; allocate one of its slices"),
        ("gpus: [{}]\nfaults: [{gpu: 0}]", "faults[0]: missing required key 'type'"),
        ("gpus: [{}]\nfaults: [{type: melt, gpu: 0}]",
         "faults[0].type: expected one of lost, xid, ecc, row_remap, nvml_down, "
         "not_supported, got 'melt'"),
        ("gpus: [{}]\nfaults: [{type: xid, gpu: 0}]",
         "faults[0]: missing required key 'code'"),
        ("gpus: [{}]\nfaults: [{type: lost, gpu: 1}]", "faults[0].gpu: no GPU 1"),
        ("gpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 9}]}]\n"
         "faults: [{type: lost, gpu: '0/9'}]",
         "faults[0].gpu: this fault hits a whole GPU; use 0"),
        ("gpus: [{}]\nfaults: [{type: nvml_down, at: 10, every: 60}]",
         "faults[0].every: a repeating window needs 'for'"),
        ("gpus: [{}]\nfaults: [{type: nvml_down, for: 60, every: 60}]",
         "faults[0].for: must be shorter than every (60 s), got 60"),
        ("gpus: [{}]\nfaults: [{type: nvml_down, gpu: 0}]", "faults[0].gpu: unknown key"),
        ("gpus: [{}]\nfaults: [{type: not_supported, gpu: 0, fields: [fan]}]",
         "faults[0].fields[0]: unknown field 'fan'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, mps: daemon}]",
         "processes[0].mps: expected one of server, client, got 'daemon'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, mps: server}, {pid: 2, gpu: 0, mps: server}]",
         "processes[1].mps: GPU 0 already has an MPS server (pid 1)"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, kind: graphics, mps: client}]",
         "processes[0].mps: an MPS process is a compute process"),
        ("gpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 1}]}]\n"
         "processes: [{pid: 1, gpu: '0/1', mps: client}]",
         "processes[0].mps: MPS runs on a whole GPU, not on a MIG slice"),
        ("gpus: [{mps_client_utilization: sometimes}]",
         "gpus[0].mps_client_utilization: expected true or false"),
    ],
)
def test_errors_name_the_key_path(text: str, expected: str) -> None:
    message = error_of(text)
    assert expected in message, message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: [{remapped_rows: {uncorected: 1}}]",
         "gpus[0].remapped_rows.uncorected: unknown key; did you mean 'uncorrectable'?"),
        ("gpus: [{remapped_rows: {correctable: 4294967296}}]",
         "gpus[0].remapped_rows.correctable: must be <= 4294967295"),
        ("gpus: [{remapped_rows: 3}]", "gpus[0].remapped_rows: expected a mapping, got 3"),
        ("gpus: [{remapped_rows: {}, unsupported: [row_remapping]}]",
         "gpus[0].remapped_rows: cannot be set on a GPU whose 'unsupported' lists "
         "row_remapping"),
        ("gpus: [{unsupported: [row_remaping]}]",
         "gpus[0].unsupported[0]: unknown field 'row_remaping'; did you mean 'row_remapping'?"),
        ("gpus: [{}]\nfaults: [{type: ecc, gpu: 0, at: 10}]",
         "faults[0]: needs 'uncorrected' or 'corrected': the errors each event adds"),
        ("gpus: [{}]\nfaults: [{type: ecc, gpu: 0, uncorrected: 0}]",
         "faults[0]: adds no error: set 'uncorrected' or 'corrected' to 1 or more"),
        ("gpus: [{}]\nfaults: [{type: ecc, gpu: 0, uncorrected: -1}]",
         "faults[0].uncorrected: must be >= 0, got -1"),
        ("gpus: [{}]\nfaults: [{type: ecc, gpu: 0, uncorrected: 1, for: 5m}]",
         "faults[0].for: unknown key"),
        ("gpus: [{}]\nfaults: [{type: ecc, gpu: 1, uncorrected: 1}]", "faults[0].gpu: no GPU 1"),
        ("gpus: [{}]\nfaults: [{type: row_remap, gpu: 0, at: 10}]",
         "faults[0]: changes nothing: set 'pending', 'failed', 'correctable' or "
         "'uncorrectable'"),
        ("gpus: [{}]\nfaults: [{type: row_remap, gpu: 0, pending: maybe}]",
         "faults[0].pending: expected true or false, got 'maybe'"),
        ("gpus: [{}]\nfaults: [{type: row_remap, gpu: 0, failed: true, every: 1h}]",
         "faults[0].every: a repeating window needs 'for'"),
        ("gpus: [{model: Tesla V100-SXM2-32GB}]\n"
         "faults: [{type: row_remap, gpu: 0, pending: true}]",
         "faults[0].gpu: GPU 0 has no row remapper (architecture Volta: NVML has one on "
         "Ampere and newer; give its entry 'remapped_rows: {}' to add one)"),
        ("gpus: [{unsupported: [row_remapping]}]\n"
         "faults: [{type: row_remap, gpu: 0, pending: true}]",
         "faults[0].gpu: GPU 0 has no row remapper (its 'unsupported' lists row_remapping)"),
        ("gpus: [{mig: [{profile: 1g.10gb, gpu_instance_id: 9}]}]\n"
         "faults: [{type: row_remap, gpu: '0/9', pending: true}]",
         "faults[0].gpu: this fault hits a whole GPU; use 0"),
        ("gpus: [{}]\nfaults: [{type: row_remapping, gpu: 0}]",
         "faults[0].type: expected one of lost, xid, ecc, row_remap, nvml_down, "
         "not_supported, got 'row_remapping'"),
    ],
)
def test_health_fault_errors(text: str, expected: str) -> None:
    message = error_of(text)
    assert expected in message, message


def test_bad_yaml_is_one_line_with_position() -> None:
    message = error_of("gpus: [{}\nnode: {")
    assert "invalid YAML" in message
    assert re.search(r"line \d+, column \d+", message)


def test_duplicate_keys_are_errors() -> None:
    message = error_of("gpus: []\nnode: {seed: 1, seed: 2}")
    assert "duplicate key 'seed'" in message


def test_empty_and_non_mapping_files() -> None:
    assert "empty scenario" in error_of("")
    assert "expected a mapping, got a list" in error_of("- 1\n- 2\n")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError) as info:
        load_scenario(tmp_path / "missing.yaml")
    assert str(info.value) == f"{tmp_path / 'missing.yaml'}: cannot read: No such file or directory"
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00gpus")
    with pytest.raises(ScenarioError, match="not UTF-8"):
        load_scenario(binary)


def test_error_message_from_file_uses_the_path(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text("gpus:\n  - {}\n  - {}\n  - memory_total: lots\n")
    with pytest.raises(ScenarioError) as info:
        load_scenario(str(path))
    assert str(info.value) == (
        f"{path}: gpus[2].memory_total: expected a size like '80GiB', got 'lots'")


def test_non_finite_numbers_rejected() -> None:
    assert "expected a finite number" in error_of("gpus: [{power_limit: .inf}]")
    assert "must be <= 1" in error_of("gpus: [{base_utilization: 1e3}]")
    assert math.isfinite(parse("gpus: [{power_limit: 4.5e2}]").gpus[0].power_limit_watts)


def test_the_example_in_the_docs_is_valid() -> None:
    doc = (Path(__file__).resolve().parents[3] / "docs" / "scenarios.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", doc, re.DOTALL)
    assert blocks
    for block in blocks:
        s = scenario_from_yaml(block, "docs/scenarios.md")
        assert s.gpus
    example_text = re.search(r"## Example\n\n```yaml\n(.*?)```", doc, re.DOTALL)
    assert example_text is not None
    example = scenario_from_yaml(example_text.group(1))
    assert example.node.capacity_type == "spot"
    assert [g.mig_enabled for g in example.gpus] == [False, False, True]
    assert len(example.faults) == 6


# -- work signals: gpm, throttle, activity ---------------------------------------------------


def test_work_signal_keys_and_their_defaults() -> None:
    s = scenario_from_yaml(textwrap.dedent("""
        gpus:
          - {model: NVIDIA H100 80GB HBM3, throttle: {thermal: 0.5, hw_power_brake: "10%"}}
          - {model: NVIDIA H100 80GB HBM3, gpm: false}
          - {model: NVIDIA A100-SXM4-80GB}
          - {model: NVIDIA A100-SXM4-80GB, gpm: true}
          - {model: NVIDIA B200}
        processes:
          - {pid: 1, gpu: 0, utilization: 0.9,
             activity: {sm: 0.7, tensor: "40%", pcie_tx: 512MiB, nvlink_rx: 2GB, power: 0.5}}
          - {pid: 2, gpu: 1, utilization: 0.9}
    """))
    assert [g.gpm for g in s.gpus] == [True, False, False, True, True]
    assert s.gpus[0].throttle == (
        ("thermal", ConstantPattern(0.5)), ("hw_power_brake", ConstantPattern(0.1)),
    )
    assert s.gpus[1].throttle == ()
    a = s.processes[0].activity
    assert (a.sm, a.tensor, a.dram, a.graphics, a.occupancy, a.power) == (
        0.7, 0.4, 0.0, 1.0, 0.0, 0.5)
    assert (a.pcie_rx, a.pcie_tx, a.nvlink_rx, a.nvlink_tx) == (0.0, 512 * MIB, 2e9, 0.0)
    assert s.processes[1].activity == ActivitySpec()  # sm and graphics follow utilization


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpus: [{gpm: yes}]", "gpus[0].gpm: expected true or false, got 'yes'"),
        ("gpus: [{throttle: {thermals: 0.5}}]",
         "gpus[0].throttle.thermals: unknown key; did you mean 'thermal'?"),
        ("gpus: [{throttle: {power: 1.5}}]", "gpus[0].throttle.power: must be <= 1"),
        ("gpus: [{throttle: {power: {pattern: bursty, high: 1}}}]",
         "gpus[0].throttle.power: missing required key 'period'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, activity: {tensr: 0.1}}]",
         "processes[0].activity.tensr: unknown key; did you mean 'tensor'?"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, activity: {sm: 2}}]",
         "processes[0].activity.sm: must be <= 1"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, activity: {pcie_rx: fast}}]",
         "processes[0].activity.pcie_rx: expected a size like '80GiB', got 'fast'"),
        ("gpus: [{}]\nprocesses: [{pid: 1, gpu: 0, activity: [sm]}]",
         "processes[0].activity: expected a mapping, got a list"),
        ("gpus: [{unsupported: [sm_active]}]",
         "gpus[0].unsupported[0]: unknown field 'sm_active'; did you mean 'sm_active_seconds'?"),
    ],
)
def test_work_signal_errors(text: str, expected: str) -> None:
    assert expected in error_of(text)


def test_random_throttle_patterns_get_their_own_seeds() -> None:
    s = scenario_from_yaml(textwrap.dedent("""
        node: {seed: 3}
        gpus:
          - count: 2
            throttle:
              power: {pattern: random, low: 0, high: 0.2}
              thermal: {pattern: random, low: 0, high: 0.2}
    """))
    seeds = {p.seed for g in s.gpus for _, p in g.throttle if isinstance(p, RandomPattern)}
    assert len(seeds) == 4
