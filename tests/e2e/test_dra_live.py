"""GPUs claimed through DRA, attributed end to end through the real parts of a node.

- the kubelet: a grpcio PodResources v1 server on a unix socket, answering per container the
  ``dynamic_resources`` a 1.34 kubelet reports (driver, pool, device, CDI names);
- the API server: the tests' ``FakeApi`` over real HTTP, serving this node's pods and the
  ResourceSlice NVIDIA's DRA driver publishes (with another node's slice beside it), read by
  the real ``PodMetadataWatcher`` (lightkube);
- the join and the collector: ``LiveInputs`` → ``Attributor`` → ``ContainerCollector``,
  rendered as ``/metrics`` text and parsed back.

The cases of issue 13: a container holding a claimed GPU, one holding a claimed MIG slice,
one claim shared by two containers (time-sharing configured on the claim), and a claim of
another driver, which is ignored. Only the NVML snapshot is hand-built.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.kubernetes.apiserver import PodMetadataWatcher
from gpuscope.exporter.kubernetes.attribution import Attributor, LiveInputs
from gpuscope.exporter.model import DeviceSample, ProcessSample, Snapshot
from gpuscope.exporter.sinks.prometheus.collectors.container import ContainerCollector
from tests.exporter.kubernetes.podresources.test_client import (
    FakeKubelet,
    KubeletServer,
    claim,
    claim_device,
    container,
    pod,
    response,
)
from tests.exporter.kubernetes.test_apiserver import (
    NODE,
    OTHER_NODE,
    FakeApi,
    nvidia_slice,
    pod_json,
    token_config,
)
from tests.exporter.kubernetes.test_cgroups import systemd_pod, write_proc

GPU0 = "GPU-5fd4f087-86f3-7a43-b711-4771313afc50"
GPU1 = "GPU-0c8a5b4e-12f0-4d6e-9b77-0e5d1c3f2a11"  # MIG mode: two slices
MIG_A = "MIG-bf3b4cdb-6b93-5b34-9a1b-4a6e9b6d6ad3"
MIG_B = "MIG-1e0d9c3a-77f2-5a18-8c4e-2f6a9b0d4e51"
CLAIM_UID = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"
UIDS = {"trainer": "11111111-1111-4111-8111-111111111111",
        "infer": "22222222-2222-4222-8222-222222222222",
        "pair": "33333333-3333-4333-8333-333333333333",
        "imex": "44444444-4444-4444-8444-444444444444"}


def cid(n: int) -> str:
    return f"{n:064x}"


def nvidia(device: str) -> object:
    return claim_device("gpu.nvidia.com", NODE, device,
                        f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-{device}")


def uses(name: str, *claims: object) -> object:
    """A container with the DRA claims it uses (no device-plugin devices)."""
    return container(name, claims=tuple(claims))  # type: ignore[arg-type]


KUBELET_ANSWER = response(
    pod("ml", "trainer", uses("main", claim("ml", "trainer-gpu", nvidia("gpu-0")))),
    pod("ml", "infer", uses("server", claim("ml", "infer-mig", nvidia("gpu-1-mig-1g10gb-19-0")))),
    # One claim used by two containers of one pod: the kubelet lists it under each.
    pod("ml", "pair",
        uses("a", claim("ml", "shared", nvidia("gpu-1-mig-3g40gb-9-4"))),
        uses("b", claim("ml", "shared", nvidia("gpu-1-mig-3g40gb-9-4")))),
    # Another driver's device (an IMEX channel): not a GPU, ignored.
    pod("ml", "imex", uses("w", claim("ml", "channel", claim_device(
        "compute-domain.nvidia.com", NODE, "channel-0")))),
)


def snapshot() -> Snapshot:
    return Snapshot(timestamp=time.time(), source_up=True, devices=(
        DeviceSample(index="0", uuid=GPU0, model="NVIDIA H100 80GB HBM3", utilization_ratio=0.9,
                     processes=(ProcessSample(pid=101, kinds=("compute",),
                                              memory_used_bytes=8 << 30,
                                              sm_utilization_ratio=0.9),)),
        DeviceSample(index="1", uuid=GPU1, model="NVIDIA H100 80GB HBM3"),
        DeviceSample(index="1/19", uuid=MIG_A, model="NVIDIA H100 80GB HBM3", parent_uuid=GPU1),
        DeviceSample(index="1/9", uuid=MIG_B, model="NVIDIA H100 80GB HBM3", parent_uuid=GPU1,
                     processes=(ProcessSample(pid=202, kinds=("compute",),
                                              memory_used_bytes=2 << 30),)),
    ))


@pytest.fixture
def node() -> Iterator[tuple[FakeApi, KubeletServer, Path]]:
    with tempfile.TemporaryDirectory(prefix="gpuscope-dra-") as tmp:
        api = FakeApi()
        api.put(pod_json("trainer", UIDS["trainer"], containers=[("main", cid(1))]))
        api.put(pod_json("infer", UIDS["infer"], containers=[("server", cid(2))]))
        api.put(pod_json("pair", UIDS["pair"], containers=[("a", cid(3)), ("b", cid(4))]))
        api.put(pod_json("imex", UIDS["imex"], containers=[("w", cid(5))]))
        api.resource_slices = [
            _h100_slice(),
            nvidia_slice(OTHER_NODE, [("gpu-0", "GPU-9e3b1c27-4f0a-4c1e-a6d2-6b7f0e8c5d33")]),
        ]
        api.start()
        kubelet = KubeletServer(str(Path(tmp) / "kubelet.sock"))
        kubelet.start(FakeKubelet(KUBELET_ANSWER))
        proc = Path(tmp) / "proc"
        for pid, uid, container_id in ((101, UIDS["trainer"], cid(1)),
                                       (202, UIDS["pair"], cid(4))):
            cgroup = f"0::{systemd_pod('besteffort', uid)}/cri-containerd-{container_id}.scope\n"
            write_proc(proc, pid, cgroup, start=pid)
        try:
            yield api, kubelet, proc
        finally:
            kubelet.stop()
            api.stop()


def _h100_slice() -> dict[str, object]:
    """This node's slice: GPU 0 whole, GPU 1 in MIG mode with two slices."""
    return nvidia_slice(NODE, [("gpu-0", GPU0), ("gpu-1-mig-1g10gb-19-0", MIG_A),
                               ("gpu-1-mig-3g40gb-9-4", MIG_B)])


def test_dra_claims_are_attributed_like_device_plugin_gpus(
    node: tuple[FakeApi, KubeletServer, Path],
) -> None:
    api, kubelet, proc = node
    watcher = PodMetadataWatcher(token_config(api.url), NODE, request_timeout_s=2.0)
    inputs = LiveInputs(kubelet_socket=kubelet.path, proc_root=str(proc),
                        metadata_watcher=watcher, kubelet_interval=0.05, node_name=NODE)
    attributor = Attributor(inputs)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ContainerCollector(attributor.latest))
    try:
        deadline = time.monotonic() + 10
        series: dict[tuple[str, ...], float] = {}
        while time.monotonic() < deadline:
            attributor(snapshot())
            series = {
                (s.name, s.labels["pod"], s.labels["container"], s.labels["uuid"]): s.value
                for f in text_string_to_metric_families(generate_latest(registry).decode())
                for s in f.samples if s.name.startswith("container_gpu_")
            }
            if sum(1 for k in series if k[0] == "container_gpu_allocated") >= 4:
                break
            time.sleep(0.05)
    finally:
        attributor.close()

    allocated = {k[1:] for k, v in series.items() if k[0] == "container_gpu_allocated"}
    assert allocated == {("trainer", "main", GPU0), ("infer", "server", MIG_A),
                         ("pair", "a", MIG_B), ("pair", "b", MIG_B)}
    # Each container gets its own processes' numbers: the trainer its 0.9, and of the two
    # containers sharing the MIG slice only b (which runs the process) holds memory.
    assert series["container_gpu_utilization_ratio", "trainer", "main", GPU0] == pytest.approx(0.9)
    assert series["container_gpu_memory_used_bytes", "pair", "b", MIG_B] == 2 << 30
    assert series["container_gpu_memory_used_bytes", "pair", "a", MIG_B] == 0
    # The other driver's claim is no GPU: the imex pod has no series at all.
    assert not [k for k in series if k[1] == "imex"]
    latest = attributor.latest()
    assert latest is not None and latest.unresolved_allocations == 0


def test_a_failing_resource_slices_watch_reads_0_in_the_dra_part(
    node: tuple[FakeApi, KubeletServer, Path],
) -> None:
    # The slices' list works, every watch of them fails: the attribution goes on with the
    # slices listed, and gpu_exporter_collector_success{collector="kube_resourceslices"}
    # says the watch is failing (it showed only in the log), with its errors counted.
    api, kubelet, proc = node
    api.resource_slices_watch_status = 500
    watcher = PodMetadataWatcher(token_config(api.url), NODE, request_timeout_s=2.0,
                                 backoff_initial_s=0.02, backoff_max_s=0.1)
    inputs = LiveInputs(kubelet_socket=kubelet.path, proc_root=str(proc),
                        metadata_watcher=watcher, kubelet_interval=0.05, node_name=NODE)
    attributor = Attributor(inputs)
    try:
        deadline = time.monotonic() + 10
        dra = None
        while time.monotonic() < deadline:
            attributor(snapshot())
            dra = next((p for p in attributor.parts() if p.name == "kube_resourceslices"), None)
            latest = attributor.latest()
            if (dra is not None and dra.errors_total >= 2 and not dra.success
                    and latest is not None and len(latest.containers) >= 4):
                break
            time.sleep(0.05)
    finally:
        attributor.close()
    assert dra is not None and not dra.success and dra.errors_total >= 2
    parts = {p.name: p.success for p in attributor.parts()}
    assert parts["kube_pods"] and parts["kube_node"] and parts["attribution"]
