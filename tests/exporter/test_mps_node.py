"""An MPS node end to end: two client pods sharing one GPU through CUDA MPS (issue 31).

Real components but the hardware and the API server: the C double of libnvidia-ml
(``bench/fake_libnvml``) behind the real pynvml, planting the node an H200 with driver
580.159.04 showed (``FAKE_NVML_MPS``: the ``nvidia-cuda-mps-server`` PID 787 with 66 MiB, the
clients 752 and 754 with 4968 and 1704 MiB); the kubelet's PodResources v1 on a unix socket
(``KubeletServer``) handing out MPS replicas ``GPU-<uuid>::<n>`` of the renamed resource
``nvidia.com/gpu.shared``, as NVIDIA's device plugin does with ``sharing.mps``; a ``/proc``
tree with the clients' cgroups, the server's in the device plugin's control daemon pod and
its name. Pod names come from a fixed metadata snapshot. Wired as ``exporter.cli.run()`` wires
them (``parse_config``, ``LiveInputs``, ``Attributor``, ``build_registry``), one sampling
round at a time, then ``/metrics`` is parsed.

Both behaviours NVML may have under MPS: samples for the server's PID only (the H200's:
``FAKE_NVML_MPS_CLIENT_UTILIZATION=0``), and samples per client (``=1``).
"""

from __future__ import annotations

import ctypes
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.nvml_c_exporter import load_library
from gpuscope.exporter.cli import build_registry
from gpuscope.exporter.config import parse_config
from gpuscope.exporter.kubernetes.attribution import Attributor, LiveInputs
from gpuscope.exporter.kubernetes.metadata import MetadataSnapshot, PodInfo
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.exporter.kubernetes.podresources.test_client import (
    FakeKubelet,
    KubeletServer,
    allocatable,
    container,
    devices,
    pod,
    replicas,
    response,
)
from tests.exporter.kubernetes.test_cgroups import systemd_pod, write_proc
from tests.exporter.sources.fake_nvml import restored_pynvml
from tests.kubelet_api import podresources_v1_pb2 as pb2

GPU0 = "GPU-00000000-0000-0000-0000-0000a1000000"  # the C double's GPU 0: MPS
GPU1 = "GPU-00000000-0000-0000-0000-0000a1000001"  # GPU 1: one exclusive pod
SERVER, HEAVY, LIGHT = 787, 752, 754
BYTES = {SERVER: 69_206_016, HEAVY: 5_209_325_568, LIGHT: 1_786_773_504}
MPS_NODE = "0:server:787:66;0:client:752:4968:70;0:client:754:1704:25"
SHARED = "nvidia.com/gpu.shared"

# (namespace, pod, container, pod UID, container ID): the pods with a process on a GPU.
HEAVY_POD = ("ml", "heavy", "main", "6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b", "a1" * 32)
LIGHT_POD = ("ml", "light", "main", "7a2d3b4c-5e6f-4071-9b8c-0d1e2f3a4b5c", "b2" * 32)
DAEMON_POD = ("nvidia", "nvidia-device-plugin-mps-control-daemon-x7k2p", "mps-control-daemon-ctr",
              "8b3e4c5d-6f70-4182-ac9d-1e2f3a4b5c6d", "c3" * 32)
IDLE_POD = ("ml", "idle", "main", "9c4f5d6e-7081-4293-bdae-2f3a4b5c6d7e", "d4" * 32)
SOLO_POD = ("ml", "solo", "main", "0d5a6e7f-8192-43a4-8ebf-3a4b5c6d7e8f", "e5" * 32)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def library(fake_libnvml_path: Path) -> ctypes.CDLL:
    return load_library(fake_libnvml_path)


class FixedMetadata:
    """The API server's answer for this node's pods, fixed (PodMetadataWatcherLike)."""

    def __init__(self, *pods: tuple[str, str, str, str, str]) -> None:
        infos = {uid: PodInfo(uid=uid, namespace=ns, name=name, containers=MappingProxyType(
            {cid: ctr}), workload="DaemonSet/nvidia-device-plugin" if ns == "nvidia" else "")
            for ns, name, ctr, uid, cid in pods}
        self._snapshot = MetadataSnapshot(pods=MappingProxyType(infos), synced=True)

    def start(self) -> None:
        pass

    def stop(self, timeout: float = 5.0) -> None:
        pass

    def snapshot(self) -> MetadataSnapshot:
        return self._snapshot


def write_process(root: Path, pid: int, who: tuple[str, str, str, str, str], comm: str,
                  argv0: str) -> None:
    """/proc/<pid>: the cgroup of ``who``'s container (cgroup v2, systemd, containerd), its
    start time, and its name."""
    uid, cid = who[3], who[4]
    write_proc(root, pid, f"0::{systemd_pod('burstable', uid)}/cri-containerd-{cid}.scope\n",
               start=100_000 + pid, comm=comm)
    (root / str(pid) / "comm").write_text(comm + "\n")
    (root / str(pid) / "cmdline").write_bytes(argv0.encode() + b"\0")


class MpsNode:
    """``held``: how many of GPU 0's MPS replicas pods hold (heavy, light, idle: the first
    ``held``); ``allocatable``: the kubelet's GetAllocatableResources() answer (``None``:
    UNIMPLEMENTED, a kubelet before 1.21)."""

    def __init__(self, tmp: Path, sock_dir: Path, library: ctypes.CDLL, *, held: int = 3,
                 allocatable: pb2.AllocatableResourcesResponse | None = None) -> None:
        self.library = library
        self.proc_root = tmp / "proc"
        write_process(self.proc_root, SERVER, DAEMON_POD, "nvidia-cuda-mps",
                      "/usr/bin/nvidia-cuda-mps-server")
        write_process(self.proc_root, HEAVY, HEAVY_POD, "python3", "/usr/bin/python3")
        write_process(self.proc_root, LIGHT, LIGHT_POD, "python3", "/usr/bin/python3")
        self.kubelet = KubeletServer(str(sock_dir / "kubelet.sock"))
        # As the device plugin with sharing.mps (renamed gpu.shared) answers.
        clients = [pod("ml", name, container("main", devices(SHARED, f"{GPU0}::{n}")))
                   for n, name in enumerate(("heavy", "light", "idle")[:held])]
        self.kubelet.start(FakeKubelet(response(
            *clients,
            pod("ml", "solo", container("main", devices("nvidia.com/gpu", GPU1))),
            pod("nvidia", DAEMON_POD[1], container(DAEMON_POD[2])),
        ), allocatable=allocatable))
        cfg = parse_config([
            "--kubelet-socket", self.kubelet.path, "--proc-root", str(self.proc_root),
            "--node-name", "gpu-node-1", "--process-metrics",
        ], environ={})
        self.inputs = LiveInputs(
            kubelet_socket=cfg.kubelet_socket, proc_root=cfg.proc_root,
            metadata_watcher=FixedMetadata(HEAVY_POD, LIGHT_POD, DAEMON_POD, IDLE_POD,
                                           SOLO_POD),
            kubelet_interval=0.05,
        )
        self.attributor = Attributor(self.inputs)
        # As cli.build_source makes it (the proc root names the MPS server), on the double.
        self.source = NvmlSource(library_loader=lambda: library, proc_root=cfg.proc_root,
                                 xid_events=False)
        self.sampler = Sampler(self.source, cfg.interval, listeners=(self.attributor,))
        self.registry = build_registry(cfg, self.sampler, self.attributor)
        deadline = time.monotonic() + 10
        while len(self.inputs.allocations()) < held + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(self.inputs.allocations()) == held + 1

    def round(self) -> Series:
        self.sampler.run_once()
        got: Series = {}
        text = generate_latest(self.registry).decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                got[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return got

    def close(self) -> None:
        self.attributor.close()
        self.source.close()
        self.kubelet.stop()


@pytest.fixture
def node_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("FAKE_NVML_GPUS", "2")
    monkeypatch.setenv("FAKE_NVML_PROCESSES_PER_GPU", "0")
    for name in ("FAKE_NVML_LOST", "FAKE_NVML_XIDS", "FAKE_NVML_REMAPPED_ROWS",
                 "FAKE_NVML_MEMORY_RESERVED_MIB", "FAKE_NVML_NO_MEMORY_V2"):
        monkeypatch.delenv(name, raising=False)
    with restored_pynvml():
        yield monkeypatch


@pytest.fixture
def make_node(tmp_path: Path, library: ctypes.CDLL, node_env: pytest.MonkeyPatch
              ) -> Iterator[type[MpsNode]]:
    sock_dir = tmp_path if len(str(tmp_path)) < 80 else Path(tempfile.mkdtemp(prefix="gpuscope-"))
    made: list[MpsNode] = []

    class Made(MpsNode):
        def __init__(  # type: ignore[override]
            self, held: int = 3, allocatable: pb2.AllocatableResourcesResponse | None = None
        ) -> None:
            super().__init__(tmp_path, sock_dir, library, held=held, allocatable=allocatable)
            made.append(self)

    yield Made  # type: ignore[misc]
    for node in made:
        node.close()
    assert library.fakeNvmlInitCount() == 0
    if sock_dir != tmp_path:
        shutil.rmtree(sock_dir, ignore_errors=True)


def containers(got: Series, name: str) -> dict[tuple[str, str, str], float]:
    """``name``'s samples by (namespace/pod/container, uuid, ...) for a container family."""
    out: dict[tuple[str, str, str], float] = {}
    for (metric, labels), value in got.items():
        if metric == name:
            d = dict(labels)
            out[(f"{d['namespace']}/{d['pod']}/{d['container']}", d["uuid"], "")] = value
    return out


def one(got: Series, name: str, **labels: str) -> float | None:
    want = set(labels.items())
    hits = [v for (m, ls), v in got.items() if m == name and want <= set(ls)]
    assert len(hits) <= 1, (name, labels, hits)
    return hits[0] if hits else None


@pytest.mark.parametrize("per_client", [False, True], ids=["server-samples", "client-samples"])
def test_two_client_pods_on_one_gpu_through_mps(
    make_node: type[MpsNode], node_env: pytest.MonkeyPatch, per_client: bool
) -> None:
    node_env.setenv("FAKE_NVML_MPS", MPS_NODE)
    node_env.setenv("FAKE_NVML_MPS_CLIENT_UTILIZATION", str(int(per_client)))
    got = make_node().round()

    # Each client's memory exact, in its own container; allocated-idle beside them.
    assert containers(got, "container_gpu_memory_used_bytes") == {
        ("ml/heavy/main", GPU0, ""): float(BYTES[HEAVY]),
        ("ml/light/main", GPU0, ""): float(BYTES[LIGHT]),
        ("ml/idle/main", GPU0, ""): 0.0,
        ("ml/solo/main", GPU1, ""): 0.0,
    }
    assert set(containers(got, "container_gpu_allocated")) == set(
        containers(got, "container_gpu_memory_used_bytes"))
    # The server: infrastructure, its own series; not a host row, not the daemon's pod.
    assert one(got, "gpu_mps_server_memory_used_bytes", gpu="0", uuid=GPU0) == BYTES[SERVER]
    assert not any(k[0] == "//" for k in containers(got, "container_gpu_memory_used_bytes"))
    assert {dict(ls)["pod"] for (m, ls) in got if m == "gpu_pod_info"} == {
        "heavy", "light", "idle", "solo"}
    # No double counting: the containers' and the server's bytes are NVML's, once each.
    assert sum(containers(got, "container_gpu_memory_used_bytes").values()) + BYTES[
        SERVER] == sum(BYTES.values())
    assert sum(v for (m, _), v in got.items() if m == "gpu_process_memory_used_bytes") == sum(
        BYTES.values())
    # Sharing stated per GPU; the replicas of GPU 0 from List() alone (this kubelet does not
    # serve GetAllocatableResources()): ::0..::2 held, 3 at least.
    assert {(dict(ls)["gpu"], dict(ls)["sharing"]) for (m, ls) in got
            if m == "gpu_sharing_info"} == {("0", "mps"), ("1", "exclusive")}
    assert {dict(ls)["gpu"]: v for (m, ls), v in got.items()
            if m == "gpu_sharing_replicas"} == {"0": 3.0}

    utilization = containers(got, "container_gpu_utilization_ratio")
    assert one(got, "gpu_mps_client_utilization_reported", uuid=GPU0) == float(per_client)
    if per_client:
        assert utilization == {
            ("ml/heavy/main", GPU0, ""): 0.7, ("ml/light/main", GPU0, ""): 0.25,
            ("ml/idle/main", GPU0, ""): 0.0, ("ml/solo/main", GPU1, ""): 0.0,
        }
    else:
        # The H200's behaviour: the clients' shares are unknown: no series, never 0; the
        # server's PID carries their work.
        assert utilization == {
            ("ml/idle/main", GPU0, ""): 0.0, ("ml/solo/main", GPU1, ""): 0.0,
        }
        assert one(got, "gpu_process_utilization_ratio", pid=str(SERVER)) == 0.95
        assert one(got, "gpu_process_utilization_ratio", pid=str(HEAVY)) is None
        assert one(got, "gpu_process_utilization_ratio", pid=str(LIGHT)) is None


def test_a_client_pod_exiting(make_node: type[MpsNode], node_env: pytest.MonkeyPatch) -> None:
    # The light client's process exits 1.5 s after nvmlInit; its pod keeps its replica.
    node_env.setenv("FAKE_NVML_MPS", MPS_NODE.replace(":25", ":25@1.5"))
    node = make_node()
    got = node.round()
    assert one(got, "container_gpu_memory_used_bytes", pod="light") == BYTES[LIGHT]
    deadline = time.monotonic() + 10
    while one(got, "gpu_process_memory_used_bytes", pid=str(LIGHT)) is not None:
        assert time.monotonic() < deadline, "the light client never exited"
        time.sleep(0.1)
        got = node.round()
    # Allocated, no process: idle for certain, 0 and 0; the heavy client and the server
    # unchanged; the server's samples now carry the heavy client's work alone.
    assert one(got, "container_gpu_memory_used_bytes", pod="light") == 0.0
    assert one(got, "container_gpu_utilization_ratio", pod="light") == 0.0
    assert one(got, "container_gpu_allocated", pod="light") == 1.0
    assert one(got, "container_gpu_memory_used_bytes", pod="heavy") == BYTES[HEAVY]
    assert one(got, "container_gpu_utilization_ratio", pod="heavy") is None
    assert one(got, "gpu_mps_server_memory_used_bytes", uuid=GPU0) == BYTES[SERVER]
    time.sleep(1.0)  # a whole second of samples after the exit
    got = node.round()
    assert one(got, "gpu_process_utilization_ratio", pid=str(SERVER)) == 0.7
    assert one(got, "gpu_sharing_info", gpu="0", sharing="mps") == 1.0


@pytest.mark.parametrize("served", [True, False], ids=["allocatable", "unimplemented"])
def test_replicas_of_the_mps_gpu(
    make_node: type[MpsNode], node_env: pytest.MonkeyPatch, served: bool
) -> None:
    # The device plugin with sharing.mps, replicas: 10: GPU 0 advertised as GPU0::0..9 under
    # nvidia.com/gpu.shared (each client's default active-thread percentage 100 / 10), two of
    # them held (heavy, light); GPU 1 whole. A kubelet that serves GetAllocatableResources()
    # says 10; one that does not (UNIMPLEMENTED) leaves List()'s highest replica + 1 = 2, a
    # lower bound. GPU 1, exclusive, has none.
    node_env.setenv("FAKE_NVML_MPS", MPS_NODE)
    node_env.setenv("FAKE_NVML_MPS_CLIENT_UTILIZATION", "0")
    advertised = allocatable(replicas(SHARED, GPU0, 10), devices("nvidia.com/gpu", GPU1))
    node = make_node(held=2, allocatable=advertised if served else None)
    got = node.round()
    assert {(dict(ls)["gpu"], dict(ls)["uuid"]): v for (m, ls), v in got.items()
            if m == "gpu_sharing_replicas"} == {("0", GPU0): 10.0 if served else 2.0}
    assert one(got, "gpu_sharing_info", gpu="0", sharing="mps") == 1.0
    assert one(got, "gpu_sharing_info", gpu="1", sharing="exclusive") == 1.0
    assert one(got, "gpu_exporter_collector_success", collector="kubelet") == 1.0
    assert one(got, "gpu_exporter_collector_errors_total", collector="kubelet") == 0.0
