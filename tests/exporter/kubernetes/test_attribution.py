"""The join itself, value by value, on hand-built facts (no kubelet, /proc or API server)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import MappingProxyType

import pytest

from gpuscope.exporter.kubernetes.apiserver import MetadataSnapshot, NodeInfo, PodInfo
from gpuscope.exporter.kubernetes.attribution import (
    HOST,
    Attribution,
    Attributor,
    ContainerKey,
    DeviceSharing,
    LiveInputs,
    attribute,
)
from gpuscope.exporter.kubernetes.cgroups import ContainerRef, PidResolver
from gpuscope.exporter.kubernetes.podresources.client import AllocatableDevice, Allocation
from gpuscope.exporter.kubernetes.podresources.devices import parse_device_id
from gpuscope.exporter.kubernetes.workload import pod_from_json
from gpuscope.exporter.model import DeviceSample, PartResult, ProcessSample, Snapshot

GIB = 1024**3
G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-11111111-1111-1111-1111-111111111111"
G2 = "GPU-22222222-2222-2222-2222-222222222222"
MIG_A = "MIG-aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa"
MIG_B = "MIG-bbbbbbbb-bbbb-bbbb-bbbb-bbbbbbbbbbbb"


def proc(pid: int, util: float | None, mem: int | None) -> ProcessSample:
    return ProcessSample(pid=pid, kinds=("compute",), memory_used_bytes=mem,
                         sm_utilization_ratio=util)


def gpu(index: str, uuid: str, *procs: ProcessSample, util: float | None = 0.5,
        parent: str | None = None, up: bool = True) -> DeviceSample:
    return DeviceSample(index=index, uuid=uuid, model="NVIDIA A100", up=up, parent_uuid=parent,
                        utilization_ratio=util if up else None, processes=procs)


def alloc(ns: str, pod: str, container: str, device_id: str,
          resource: str = "nvidia.com/gpu") -> Allocation:
    return Allocation(ns, pod, container, resource, parse_device_id(device_id))


def cid(n: int) -> str:
    return f"{n:064x}"


def pod_info(uid: str, ns: str, name: str, containers: dict[str, str],
             workload: str = "") -> PodInfo:
    return PodInfo(uid=uid, namespace=ns, name=name, workload=workload,
                   containers=MappingProxyType(containers))


def metadata(*pods: PodInfo, node: NodeInfo | None = None) -> MetadataSnapshot:
    return MetadataSnapshot(pods=MappingProxyType({p.uid: p for p in pods}), node=node,
                            synced=True)


def by_key(result: Attribution) -> dict[tuple[ContainerKey, str], tuple[bool, float | None,
                                                                       int | None]]:
    return {(u.key, u.uuid): (u.allocated, u.utilization_ratio, u.memory_used_bytes)
            for u in result.containers}


def snap(*devices: DeviceSample) -> Snapshot:
    return Snapshot(timestamp=100.0, source_up=True, devices=devices)


def test_exclusive_gpus_and_allocated_idle() -> None:
    s = snap(gpu("0", G0, proc(10, 0.9, 30 * GIB)), gpu("1", G1, util=0.0))
    result = attribute(
        s,
        [alloc("ml", "train-0", "pytorch", G0), alloc("ml", "nb", "jupyter", G1)],
        {10: ContainerRef("u-train", cid(1), "containerd")},
        metadata(pod_info("u-train", "ml", "train-0", {cid(1): "pytorch"}, "PyTorchJob/ft"),
                 pod_info("u-nb", "ml", "nb", {cid(2): "jupyter"})),
    )
    assert by_key(result) == {
        (ContainerKey("ml", "train-0", "pytorch"), G0): (True, 0.9, 30 * GIB),
        # Allocated, no process: utilization 0 and memory 0 (allocated-but-idle), not absent.
        (ContainerKey("ml", "nb", "jupyter"), G1): (True, 0.0, 0),
    }
    assert [(p.pod, p.uid, p.workload) for p in result.pods] == [
        ("nb", "u-nb", ""), ("train-0", "u-train", "PyTorchJob/ft"),
    ]


def test_three_pods_time_slicing_one_gpu_get_their_own_values() -> None:
    s = snap(gpu("0", G0, proc(1, 0.5, 4 * GIB), proc(2, 0.3, 2 * GIB), proc(3, 0.1, GIB),
                 proc(4, 0.05, GIB), util=0.95))
    allocations = [alloc("s", f"api-{i}", "server", f"{G0}::{i}") for i in range(3)]
    refs = {1: ContainerRef("u0", cid(10), "containerd"), 2: ContainerRef("u1", cid(11), "crio"),
            3: ContainerRef("u2", cid(12), "docker"), 4: ContainerRef("u2", cid(12), "docker")}
    meta = metadata(*(pod_info(f"u{i}", "s", f"api-{i}", {cid(10 + i): "server"})
                      for i in range(3)))
    got = by_key(attribute(s, allocations, refs, meta))
    values = [got[(ContainerKey("s", f"api-{i}", "server"), G0)] for i in range(3)]
    assert values[0] == (True, 0.5, 4 * GIB)
    assert values[1] == (True, 0.3, 2 * GIB)
    assert values[2][0] is True
    assert values[2][1] == pytest.approx(0.15)  # its two processes, summed
    assert values[2][2] == 2 * GIB
    assert sum(v[1] for v in values if v[1] is not None) == pytest.approx(0.95)


def test_replicas_held_by_one_container_count_once() -> None:
    s = snap(gpu("0", G0))
    allocations = [alloc("s", "big", "c", f"{G0}::0"), alloc("s", "big", "c", f"{G0}::1"),
                   alloc("s", "big", "c", f"{G0}::2", "nvidia.com/gpu.shared")]
    result = attribute(s, allocations, {}, metadata())
    assert by_key(result) == {(ContainerKey("s", "big", "c"), G0): (True, 0.0, 0)}


def test_mig_slices_for_two_pods_and_no_made_up_utilization() -> None:
    s = snap(
        gpu("0", G0, util=None),  # MIG parent: no util, no processes
        gpu("0/1", MIG_A, proc(21, None, 5 * GIB), util=None, parent=G0),
        gpu("0/2", MIG_B, util=None, parent=G0),
    )
    result = attribute(
        s,
        [alloc("a", "pa", "c", MIG_A, "nvidia.com/mig-1g.10gb"),
         alloc("b", "pb", "c", MIG_B, "nvidia.com/mig-1g.10gb")],
        {21: ContainerRef("ua", cid(1), "containerd")},
        metadata(pod_info("ua", "a", "pa", {cid(1): "c"}), pod_info("ub", "b", "pb", {})),
    )
    assert by_key(result) == {
        (ContainerKey("a", "pa", "c"), MIG_A): (True, None, 5 * GIB),
        (ContainerKey("b", "pb", "c"), MIG_B): (True, None, 0),
    }


def test_a_process_whose_owner_cannot_be_read_is_not_a_host_process(tmp_path: Path) -> None:
    # NVML lists PID 5 on GPU 0, which a pod holds; /proc has no entry for it: it exited
    # after the listing, or /proc hides other users' processes (hidepid=2, where every pod
    # process reads as absent). Read as a host process, it left the pod's container with
    # no process of its own: utilization 0, allocated-but-idle while it ran.
    proc_root = tmp_path / "proc"
    proc_root.mkdir()
    s = snap(gpu("0", G0, proc(5, 0.6, GIB)))
    result = attribute(s, [alloc("ns", "p", "c", G0)],
                       PidResolver(str(proc_root)).resolve([5]), metadata())
    assert result.unnamed_processes == 1
    got = by_key(result)
    assert got[(ContainerKey("ns", "p", "c"), G0)] == (True, None, None)


def test_a_pod_process_on_a_node_whose_runtime_uses_cgroupfs_under_a_systemd_kubelet(
        tmp_path: Path) -> None:
    # kubeadm's kubelet on the systemd driver, containerd's runc on cgroupfs (SystemdCgroup
    # = false): runc puts the container in one directory named after the systemd-style
    # cgroupsPath, under containerd's own cgroup. Read as a host process, the busy pod's
    # container had no process of its own: utilization 0, allocated-but-idle.
    uid = "7c3b5a1e-9f2d-4c8b-a1e3-5d6f7a8b9c0d"
    pid_dir = tmp_path / "proc" / "5"
    pid_dir.mkdir(parents=True)
    (pid_dir / "stat").write_text("5 (python) S" + " 0" * 18 + " 4242 0 0\n")
    (pid_dir / "cgroup").write_text(
        f"0::/system.slice/containerd.service/kubepods-burstable-pod{uid.replace('-', '_')}"
        f".slice:cri-containerd:{cid(1)}\n")
    s = snap(gpu("0", G0, proc(5, 0.6, GIB)))
    result = attribute(s, [alloc("ns", "p", "c", G0)],
                       PidResolver(str(tmp_path / "proc")).resolve([5]),
                       metadata(pod_info(uid, "ns", "p", {cid(1): "c"})))
    assert by_key(result) == {(ContainerKey("ns", "p", "c"), G0): (True, 0.6, GIB)}
    assert result.unnamed_processes == 0


def test_host_processes_are_summed_per_device() -> None:
    s = snap(gpu("0", G0, proc(7, 0.2, GIB), proc(8, 0.1, 2 * GIB)),
             gpu("1", G1, proc(9, 0.4, GIB)))
    result = attribute(s, [], {7: None, 8: None, 9: None}, metadata())
    got = by_key(result)
    assert got[(HOST, G0)][1] == pytest.approx(0.3)
    assert got[(HOST, G0)][2] == 3 * GIB
    assert got[(HOST, G1)] == (False, 0.4, GIB)
    assert result.pods == ()


def test_process_in_unknown_pod_is_counted_not_guessed() -> None:
    s = snap(gpu("0", G0, proc(5, 0.6, GIB)))
    result = attribute(s, [alloc("ns", "p", "c", G0)],
                       {5: ContainerRef("not-yet-known", cid(3), "containerd")}, metadata())
    assert result.unnamed_processes == 1
    got = by_key(result)
    assert got[(HOST, G0)] == (False, 0.6, GIB)
    # The allocated container may be the one running PID 5: unknown, not allocated-idle.
    assert got[(ContainerKey("ns", "p", "c"), G0)] == (True, None, None)


def api_pod(uid: str, ns: str, name: str, containers: dict[str, str], phase: str,
            annotations: dict[str, str] | None = None) -> PodInfo:
    """A PodInfo read from a Pod object as the API server sends it."""
    pod = pod_from_json({
        "metadata": {"uid": uid, "namespace": ns, "name": name,
                     "annotations": annotations or {}},
        "status": {"phase": phase, "containerStatuses": [
            {"name": n, "containerID": f"containerd://{c}"} for c, n in containers.items()]},
    })
    assert pod is not None
    return pod


def test_an_ended_pod_the_kubelet_still_lists_holds_no_gpu() -> None:
    # Kubelets before 1.34 list a Succeeded or Failed pod with the devices it held after
    # handing them on (kubernetes/kubernetes#119423): the GPU is the new pod's alone.
    s = snap(gpu("0", G0, proc(7, 0.8, 10 * GIB)), gpu("1", G1, util=0.0))
    result = attribute(
        s,
        [alloc("ml", "etl-28911", "main", G0), alloc("ml", "train", "main", G0),
         alloc("ml", "crashed", "main", f"{G1}::3"), alloc("ml", "nb", "main", f"{G1}::0")],
        {7: ContainerRef("u-train", cid(2), "containerd")},
        metadata(api_pod("u-etl", "ml", "etl-28911", {cid(1): "main"}, "Succeeded"),
                 api_pod("u-train", "ml", "train", {cid(2): "main"}, "Running"),
                 api_pod("u-crash", "ml", "crashed", {cid(3): "main"}, "Failed"),
                 api_pod("u-nb", "ml", "nb", {cid(4): "main"}, "Running")),
    )
    assert by_key(result) == {
        (ContainerKey("ml", "nb", "main"), G1): (True, 0.0, 0),
        (ContainerKey("ml", "train", "main"), G0): (True, 0.8, 10 * GIB),
    }
    assert [p.pod for p in result.pods] == ["nb", "train"]
    assert result.unresolved_allocations == 0
    # One holder: exclusive, not time-sliced; the ended pod's replica ::3 is no lower bound.
    assert [(d.sharing, d.replicas) for d in result.sharing] == [
        ("exclusive", None), ("time-sliced", 1)]


@pytest.mark.parametrize("ended_first", [True, False])
def test_a_pod_name_held_by_a_live_and_an_ended_pod_is_the_live_one_s(
        ended_first: bool) -> None:
    s = snap(gpu("0", G0))
    pods = [api_pod("u-old", "ml", "web-0", {cid(1): "main"}, "Failed"),
            api_pod("u-new", "ml", "web-0", {cid(2): "main"}, "Pending")]
    result = attribute(s, [alloc("ml", "web-0", "main", G0)], {},
                       metadata(*(pods if ended_first else pods[::-1])))
    assert by_key(result) == {(ContainerKey("ml", "web-0", "main"), G0): (True, 0.0, 0)}
    # Its UID is the live pod's whichever the API server listed last.
    assert [(p.pod, p.uid) for p in result.pods] == [("web-0", "u-new")]


def test_a_static_pod_s_processes_are_named_through_its_mirror_pod() -> None:
    # The kubelet runs a static pod under its config hash (the pod<hash> of its cgroups);
    # the API server has its mirror pod under another UID, the hash in an annotation.
    config_hash = "6f1c0e9d8b7a4c3e2f1a0b9c8d7e6f5a"
    s = snap(gpu("0", G0, proc(7, 0.8, 10 * GIB)))
    result = attribute(
        s, [alloc("kube-system", "infer-node-1", "server", G0)],
        {7: ContainerRef(config_hash, cid(1), "containerd")},
        metadata(api_pod("5d1e3c2b-0a9f-4e8d-b7c6-a5f4e3d2c1b0", "kube-system", "infer-node-1",
                         {cid(1): "server"}, "Running",
                         {"kubernetes.io/config.mirror": config_hash,
                          "kubernetes.io/config.hash": config_hash,
                          "kubernetes.io/config.source": "file"})),
    )
    assert result.unnamed_processes == 0
    assert by_key(result) == {
        (ContainerKey("kube-system", "infer-node-1", "server"), G0): (True, 0.8, 10 * GIB)}
    assert [(p.pod, p.uid) for p in result.pods] == [
        ("infer-node-1", "5d1e3c2b-0a9f-4e8d-b7c6-a5f4e3d2c1b0")]


def test_a_static_pod_with_its_own_uid_is_named_through_its_mirror_pod(tmp_path: Path) -> None:
    # A static pod manifest that sets metadata.uid: the kubelet runs the pod under that UID
    # (its cgroups say pod<uid>, systemd-escaped) and writes it into the mirror pod's
    # kubernetes.io/config.mirror; the API server gives the mirror pod a UID of its own.
    manifest_uid = "0d2f3b4a-5c6d-4e7f-8a9b-0c1d2e3f4a5b"
    pid_dir = tmp_path / "proc" / "7"
    pid_dir.mkdir(parents=True)
    (pid_dir / "stat").write_text("7 (python) S" + " 0" * 18 + " 4242 0 0\n")
    (pid_dir / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
        f"{manifest_uid.replace('-', '_')}.slice/cri-containerd-{cid(1)}.scope\n")
    s = snap(gpu("0", G0, proc(7, 0.8, 10 * GIB)))
    result = attribute(
        s, [alloc("kube-system", "infer-node-1", "server", G0)],
        PidResolver(str(tmp_path / "proc")).resolve([7]),
        metadata(api_pod("5d1e3c2b-0a9f-4e8d-b7c6-a5f4e3d2c1b0", "kube-system", "infer-node-1",
                         {cid(1): "server"}, "Running",
                         {"kubernetes.io/config.mirror": manifest_uid,
                          "kubernetes.io/config.hash": manifest_uid,
                          "kubernetes.io/config.source": "file"})),
    )
    assert result.unnamed_processes == 0
    assert by_key(result) == {
        (ContainerKey("kube-system", "infer-node-1", "server"), G0): (True, 0.8, 10 * GIB)}


def test_unresolvable_allocations_are_counted() -> None:
    s = snap(gpu("0", G0))
    result = attribute(s, [alloc("ns", "p", "c", G2), alloc("ns", "p", "c", "bogus-id")], {},
                       metadata())
    assert result.unresolved_allocations == 2
    assert result.containers == ()


def test_positional_ids_of_a_device_without_a_uuid_are_unresolved() -> None:
    # A GPU NVML never identified and a MIG slice whose UUID read failed have the UUID "":
    # GKE's nvidia<N>[/gi<M>] and the pre-R470 MIG-GPU-<uuid>/<gi>/<ci> land on them by
    # position. They are counted unresolved, not rendered as container_gpu_allocated{uuid=""}.
    s = snap(gpu("0", "", up=False), gpu("1", G1, util=None), gpu("1/3", "", parent=G1))
    result = attribute(
        s,
        [alloc("ns", "a", "c", "nvidia0"), alloc("ns", "b", "c", "nvidia1/gi3"),
         alloc("ns", "d", "c", f"MIG-{G1}/3/0"), alloc("ns", "e", "c", "nvidia0/vgpu1")],
        {}, metadata())
    assert result.unresolved_allocations == 4
    assert result.containers == ()
    assert all(d.uuid for d in result.sharing)


def test_lost_device_keeps_allocation_without_values() -> None:
    s = snap(gpu("0", G0, up=False))
    result = attribute(s, [alloc("ns", "p", "c", G0)], {}, metadata())
    assert by_key(result) == {(ContainerKey("ns", "p", "c"), G0): (True, None, None)}


def test_gke_index_ids_resolve_through_the_snapshot() -> None:
    s = snap(gpu("0", G0), gpu("1", G1, proc(3, 0.7, GIB)))
    result = attribute(s, [alloc("ns", "p", "c", "nvidia1/vgpu2")],
                       {3: ContainerRef("u", cid(4), "containerd")},
                       metadata(pod_info("u", "ns", "p", {cid(4): "c"})))
    assert by_key(result) == {(ContainerKey("ns", "p", "c"), G1): (True, 0.7, GIB)}


def test_node_info_falls_back_to_the_flag() -> None:
    s = snap(gpu("0", G0))
    fallback = NodeInfo(instance_type="p4d.24xlarge")
    assert attribute(s, [], {}, metadata(), node_fallback=fallback).node == fallback
    labelled = NodeInfo("g5.xlarge", "us-east-1a", "spot")
    got = attribute(s, [], {}, metadata(node=labelled), node_fallback=fallback).node
    assert got == labelled


# --- CUDA MPS: clients in their own containers, the server as infrastructure

SERVER, HEAVY, LIGHT = 787, 752, 754


def mps_gpu(reported: bool | None, *, heavy: float | None, light: float | None,
            server: float | None = 0.95) -> DeviceSample:
    """GPU 0 as the H200 showed it under MPS (the server's memory, the clients' bytes)."""
    procs = (
        ProcessSample(HEAVY, ("compute",), 5_209_325_568, heavy, mps="client"),
        ProcessSample(LIGHT, ("compute",), 1_786_773_504, light, mps="client"),
        ProcessSample(SERVER, ("compute",), 69_206_016, server, mps="server"),
    )
    return DeviceSample(index="0", uuid=G0, model="NVIDIA H200", utilization_ratio=0.99,
                        processes=procs, mps_client_utilization_reported=reported)


MPS_REFS = {
    HEAVY: ContainerRef("u-heavy", cid(1), "containerd"),
    LIGHT: ContainerRef("u-light", cid(2), "containerd"),
    # The server runs in the device plugin's MPS control daemon pod.
    SERVER: ContainerRef("u-mps", cid(3), "containerd"),
}
MPS_META = metadata(
    pod_info("u-heavy", "ml", "heavy", {cid(1): "main"}),
    pod_info("u-light", "ml", "light", {cid(2): "main"}),
    pod_info("u-mps", "nvidia", "nvidia-device-plugin-mps-control-daemon-x",
             {cid(3): "mps-control-daemon-ctr"}, "DaemonSet/nvidia-device-plugin"),
)
MPS_ALLOCATIONS = [
    alloc("ml", "heavy", "main", f"{G0}::0", "nvidia.com/gpu.shared"),
    alloc("ml", "light", "main", f"{G0}::1", "nvidia.com/gpu.shared"),
    alloc("ml", "idle", "main", f"{G0}::2", "nvidia.com/gpu.shared"),
]
HEAVY_KEY = ContainerKey("ml", "heavy", "main")
LIGHT_KEY = ContainerKey("ml", "light", "main")
IDLE_KEY = ContainerKey("ml", "idle", "main")


def test_mps_clients_get_their_memory_and_no_utilization_when_only_the_server_has_samples(
) -> None:
    result = attribute(snap(mps_gpu(False, heavy=None, light=None)), MPS_ALLOCATIONS,
                       MPS_REFS, MPS_META)
    assert by_key(result) == {
        (HEAVY_KEY, G0): (True, None, 5_209_325_568),
        (LIGHT_KEY, G0): (True, None, 1_786_773_504),
        # No process at all: idle for certain (allocated-but-idle), MPS or not.
        (IDLE_KEY, G0): (True, 0.0, 0),
    }
    # The server is in no row: not the control daemon's pod, not a host process.
    assert (HOST, G0) not in by_key(result)
    assert [p.pod for p in result.pods] == ["heavy", "idle", "light"]
    assert result.unnamed_processes == 0
    # Replicas ::0..::2 allocated, none advertised known: 3, a lower bound.
    assert result.sharing == (DeviceSharing("0", G0, "mps", 3),)


def test_mps_clients_get_their_own_utilization_when_nvml_reports_it() -> None:
    result = attribute(snap(mps_gpu(True, heavy=0.7, light=0.25, server=0.0)),
                       MPS_ALLOCATIONS, MPS_REFS, MPS_META)
    got = by_key(result)
    assert got[(HEAVY_KEY, G0)] == (True, 0.7, 5_209_325_568)
    assert got[(LIGHT_KEY, G0)] == (True, 0.25, 1_786_773_504)
    assert got[(IDLE_KEY, G0)] == (True, 0.0, 0)
    assert (HOST, G0) not in got


def test_a_host_mps_server_is_not_a_host_process() -> None:
    # The control daemon started on the host (nvidia-cuda-mps-control -d), clients on the
    # host too: the clients are host processes, the server is not one.
    result = attribute(snap(mps_gpu(False, heavy=None, light=None)), [],
                       {HEAVY: None, LIGHT: None, SERVER: None}, metadata())
    assert by_key(result) == {(HOST, G0): (False, None, 5_209_325_568 + 1_786_773_504)}


def test_sharing_mode_of_each_device() -> None:
    s = snap(
        gpu("0", G0),  # exclusive
        gpu("1", G1),  # time-sliced replicas
        DeviceSample(index="2", uuid=G2, model="NVIDIA H200", processes=(
            ProcessSample(SERVER, ("compute",), 69_206_016, 0.0, mps="server"),)),
        gpu("3", "GPU-33333333-3333-3333-3333-333333333333", util=None),  # MIG parent
        gpu("3/1", MIG_A, util=None, parent="GPU-33333333-3333-3333-3333-333333333333"),
        gpu("3/2", MIG_B, util=None, parent="GPU-33333333-3333-3333-3333-333333333333"),
        gpu("4", "GPU-44444444-4444-4444-4444-444444444444", up=False),  # lost: none
    )
    allocations = [alloc("a", "p", "c", f"{G1}::0"), alloc("a", "q", "c", f"{G1}::1"),
                   alloc("a", "r", "c", G0), alloc("a", "s", "c", f"{MIG_B}::1"),
                   alloc("a", "t", "c", f"{G2}::0")]
    assert attribute(s, allocations, {}, metadata()).sharing == (
        DeviceSharing("0", G0, "exclusive"),
        DeviceSharing("1", G1, "time-sliced", 2),
        DeviceSharing("2", G2, "mps", 1),  # an MPS server runs: MPS, whatever the replicas
        DeviceSharing("3", "GPU-33333333-3333-3333-3333-333333333333", "mig"),
        DeviceSharing("3/1", MIG_A, "mig"),
        DeviceSharing("3/2", MIG_B, "time-sliced", 2),  # a slice handed out as replicas
    )
    # One device held by two containers (a DRA claim shared between them): time-sliced; by
    # one container twice (replicas, or GPU and claim): still itself alone.
    shared = [alloc("a", "p", "c", G0), alloc("a", "q", "c", G0), alloc("a", "r", "c", G1),
              alloc("a", "r", "c", G1, "gpu.nvidia.com")]
    assert attribute(snap(gpu("0", G0), gpu("1", G1)), shared, {}, metadata()).sharing == (
        DeviceSharing("0", G0, "time-sliced"), DeviceSharing("1", G1, "exclusive"))


# --- Replicas per device (gpu_sharing_replicas)


def advertised(resource: str, *ids: str) -> list[AllocatableDevice]:
    """What GetAllocatableResources() gives for ``resource``: these device IDs."""
    return [AllocatableDevice(resource, parse_device_id(raw)) for raw in ids]


def replica_ids(uuid: str, count: int) -> list[str]:
    return [f"{uuid}::{n}" for n in range(count)]


G3 = "GPU-33333333-3333-3333-3333-333333333333"


def test_replicas_are_what_the_kubelet_advertises() -> None:
    # GPU 0 advertised as ten MPS replicas (renamed resource), two of them held; GPU 1 as four
    # time-slicing replicas, none held; GPU 2 whole (exclusive); MIG slice B as two
    # replicas (a slice time-sliced); a GPU of another node's ID and a non-GPU resource do not
    # count.
    s = snap(
        mps_gpu(False, heavy=None, light=None), gpu("1", G1), gpu("2", G2),
        gpu("3", G3, util=None), gpu("3/2", MIG_B, util=None, parent=G3),
    )
    allocatable = [
        *advertised("nvidia.com/gpu.shared", *replica_ids(G0, 10)),
        *advertised("nvidia.com/gpu", *replica_ids(G1, 4), G2),
        *advertised("nvidia.com/mig-3g.40gb.shared", *replica_ids(MIG_B, 2)),
        *advertised("nvidia.com/gpu", *replica_ids("GPU-99999999-9999-9999-9999-999999999999",
                                                   3)),
    ]
    allocations = MPS_ALLOCATIONS[:2]  # ::0 and ::1 held
    result = attribute(s, allocations, MPS_REFS, MPS_META, allocatable=allocatable)
    assert result.sharing == (
        DeviceSharing("0", G0, "mps", 10),
        # Advertised as replicas, none held yet: handed out shared all the same.
        DeviceSharing("1", G1, "time-sliced", 4),
        DeviceSharing("2", G2, "exclusive"),
        DeviceSharing("3", G3, "mig"),
        DeviceSharing("3/2", MIG_B, "time-sliced", 2),
    )
    # The same answer repeated (a device listed twice) counts each replica once.
    again = attribute(s, allocations, MPS_REFS, MPS_META, allocatable=allocatable * 2)
    assert again.sharing == result.sharing


def test_replicas_from_the_allocations_where_the_kubelet_advertises_none() -> None:
    # GetAllocatableResources() unknown (None: not served, never answered): the highest
    # replica held + 1, a lower bound: ::7 held -> 8, though the plugin may make more.
    s = snap(gpu("0", G0), gpu("1", G1), gpu("2", G2))
    allocations = [alloc("a", "p", "c", f"{G0}::7", "nvidia.com/gpu.shared"),
                   alloc("a", "q", "c", f"{G0}::2", "nvidia.com/gpu.shared"),
                   alloc("a", "r", "c", G1)]
    want = (DeviceSharing("0", G0, "time-sliced", 8), DeviceSharing("1", G1, "exclusive"),
            DeviceSharing("2", G2, "exclusive"))
    assert attribute(s, allocations, {}, metadata()).sharing == want
    assert attribute(s, allocations, {}, metadata(), allocatable=None).sharing == want
    # Answered, but without that GPU's replicas (the plugin reports it unhealthy: the kubelet
    # leaves unhealthy devices out): the allocations again, for that GPU alone.
    answered = advertised("nvidia.com/gpu", G1, *replica_ids(G2, 5))
    assert attribute(s, allocations, {}, metadata(), allocatable=answered).sharing == (
        DeviceSharing("0", G0, "time-sliced", 8), DeviceSharing("1", G1, "exclusive"),
        DeviceSharing("2", G2, "time-sliced", 5))


def test_no_replicas_for_exclusive_shared_claims_and_lost_devices() -> None:
    # Whole GPUs advertised and held, a DRA claim shared by two containers (time-sliced, but
    # no replicas), a lost GPU advertised as replicas: no replica count for any.
    s = snap(gpu("0", G0), gpu("1", G1), gpu("2", G2, up=False))
    allocations = [alloc("a", "p", "c", G0), alloc("a", "q", "c", G1, "gpu.nvidia.com"),
                   alloc("a", "r", "c", G1, "gpu.nvidia.com"), alloc("a", "s", "c", f"{G2}::0")]
    allocatable = advertised("nvidia.com/gpu", G0, *replica_ids(G2, 4))
    assert attribute(s, allocations, {}, metadata(), allocatable=allocatable).sharing == (
        DeviceSharing("0", G0, "exclusive"), DeviceSharing("1", G1, "time-sliced"))
    assert attribute(s, allocations, {}, metadata(), allocatable=[]).sharing == (
        DeviceSharing("0", G0, "exclusive"), DeviceSharing("1", G1, "time-sliced"))


def test_replicas_of_gke_time_sharing_ids() -> None:
    # GKE's own plugin: nvidia<N>/vgpu<K>, resolved by the GPU's index.
    s = snap(gpu("0", G0), gpu("1", G1))
    allocatable = advertised("nvidia.com/gpu", *(f"nvidia0/vgpu{k}" for k in range(6)),
                             "nvidia1")
    allocations = [alloc("a", "p", "c", "nvidia0/vgpu3")]
    assert attribute(s, allocations, {}, metadata(), allocatable=allocatable).sharing == (
        DeviceSharing("0", G0, "time-sliced", 6), DeviceSharing("1", G1, "exclusive"))


class BrokenInputs:
    def allocations(self) -> list[Allocation]:
        raise RuntimeError("kubelet adapter bug")

    def allocatable(self) -> None:
        return None

    def containers_of(self, pids: object) -> dict[int, ContainerRef | None]:
        return {}

    def metadata(self) -> MetadataSnapshot:
        return MetadataSnapshot()

    def parts(self) -> tuple[()]:
        return ()

    def close(self) -> None:
        pass


def test_attributor_contains_failures() -> None:
    attributor = Attributor(BrokenInputs())
    attributor(snap(gpu("0", G0)))
    latest = attributor.latest()
    assert latest is not None and latest.containers == ()
    assert [(p.name, p.success) for p in attributor.parts()] == [("attribution", False)]


def test_attributor_counts_its_failures_since_start(caplog: pytest.LogCaptureFixture) -> None:
    attributor = Attributor(BrokenInputs())
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            attributor(snap(gpu("0", G0)))
    assert [(p.name, p.success, p.errors_total) for p in attributor.parts()] == [
        ("attribution", False, 3)
    ]
    # Every round counted, one traceback logged (exporter/repeats.py).
    assert [r.exc_info is not None for r in caplog.records] == [True]


def test_live_inputs_proc_part_reports_the_rounds_cgroup_reads(tmp_path: Path) -> None:
    # gpu_exporter_collector_{success,duration_seconds}{collector="proc"} were 1 and 0 in
    # every round, unreadable cgroup files or not: they are the last round's reads.
    from tests.exporter.kubernetes.test_cgroups import stat_line, write_proc

    proc = tmp_path / "proc"
    write_proc(proc, 4242, "0::/kubepods.slice/kubepods-pod" + "1" * 8 + ".slice\n", 100)
    broken = proc / "4343"
    (broken / "cgroup").mkdir(parents=True)  # exists, cannot be read as a file
    (broken / "stat").write_text(stat_line(4343, "python3", 200))
    inputs = LiveInputs(kubelet_socket=str(tmp_path / "absent.sock"), proc_root=str(proc),
                        metadata_watcher=None)
    try:
        def part() -> PartResult:
            return next(p for p in inputs.parts() if p.name == "proc")

        inputs.containers_of([4242])
        good = part()
        assert good.success and good.errors_total == 0 and good.duration_seconds > 0
        inputs.containers_of([4242, 4343])
        bad = part()
        assert not bad.success and bad.errors_total >= 1 and bad.duration_seconds > 0
        inputs.containers_of([4242])
        again = part()
        assert again.success and again.errors_total == bad.errors_total
    finally:
        inputs.close()


def test_a_gpu_in_mig_mode_without_slices_is_shared_by_mig() -> None:
    # No slice to name it as a parent: its own MIG mode says it (it is no exclusive GPU:
    # nothing runs on it until slices are made).
    s = snap(DeviceSample(index="0", uuid=G0, model="NVIDIA A100", mig_mode=True),
             gpu("1", G1))
    assert [(d.uuid, d.sharing) for d in attribute(s, [], {}, metadata()).sharing] == [
        (G0, "mig"), (G1, "exclusive")]
