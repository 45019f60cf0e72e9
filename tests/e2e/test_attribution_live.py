"""Per-container attribution end to end, in-process, on a node made of real components.

Everything the exporter talks to on a GPU node is real here except the hardware:

- the kubelet: a grpcio PodResources v1 server on a unix socket in tmp_path
  (``tests/exporter/kubernetes/podresources/test_client.py``'s ``KubeletServer``/``FakeKubelet``);
- ``/proc``: a tree in tmp_path with realistic ``cgroup`` and ``stat`` files in every format
  the exporter must read (cgroup v1 cgroupfs, v1 systemd with containerd and docker, v2
  systemd with containerd, cri-o with its conmon monitor, v2 cgroupfs, a relative path under a
  private cgroup namespace, host services);
- the API server: ``tests/exporter/kubernetes/test_apiserver.py``'s ``FakeApi`` over real HTTP,
  reached
  through a kubeconfig file read by ``gpuscope.exporter.kubernetes.apiserver.load_config`` and
  served to the real
  ``PodMetadataWatcher`` (list + watch of this node's pods, GET of the node);
- NVML: the real ``NvmlSource`` through real pynvml, over the ``FakeNvml`` C-library double.

They are wired exactly as ``exporter.cli.run()`` wires them (``parse_config`` flags,
``Attributor(LiveInputs(...))`` as the sampler's listener, ``build_registry``), only with
short refresh intervals. Each test drives sampling rounds with ``sampler.run_once()``,
renders ``/metrics`` with ``generate_latest`` and checks the parsed series value by value.
Every wait is bounded.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.exporter.cli import build_registry
from gpuscope.exporter.config import parse_config
from gpuscope.exporter.kubernetes.apiserver import (
    MetadataDisabled,
    NodeInfo,
    PodMetadataWatcher,
    load_config,
)
from gpuscope.exporter.kubernetes.attribution import Attributor, LiveInputs
from gpuscope.exporter.kubernetes.podresources import client as podresources_client
from gpuscope.exporter.kubernetes.podresources.client import PodResourcesClient
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sources.nvml import NvmlSource
from tests.conftest import free_port
from tests.exporter.kubernetes.podresources.test_client import (
    FakeKubelet,
    KubeletServer,
    container,
    devices,
    pod,
    response,
)
from tests.exporter.kubernetes.test_apiserver import (
    NODE,
    OTHER_NODE,
    TOKEN,
    FakeApi,
    write_kubeconfig,
)
from tests.exporter.kubernetes.test_cgroups import remove_proc, systemd_pod, v1_file, write_proc
from tests.exporter.sources.fake_nvml import (
    GIB,
    MIB,
    FakeGpu,
    FakeMigSlice,
    FakeNvml,
    restored_pynvml,
)
from tests.kubelet_api import podresources_v1_pb2 as pb2

T0 = 1_780_000_000.0  # the wall clock of the first sampling round
KUBELET_DEADLINE_S = 0.5  # the List() deadline in these tests (production: 5 s)

# Realistic identifiers: NVML UUIDs, version-4 pod UIDs; container IDs are 64-hex digests.
GPU0 = "GPU-5fd4f087-86f3-7a43-b711-4771313afc50"
GPU1 = "GPU-0c8a5b4e-12f0-4d6e-9b77-0e5d1c3f2a11"
GPU2 = "GPU-7d2e4a90-3b1c-4f5e-8a6d-9c0b1e2f3a44"
GPU3 = "GPU-c41f6e2a-8d3b-4a7c-9e15-2b7d0f4a6c83"
GPU4 = "GPU-9a1e3c5d-7f2b-4d6a-8c0e-5f3a1b9d7e22"  # MIG mode on: two 1g.10gb slices
GPU5 = "GPU-e2b7d9f1-4c6a-4e8b-a3d5-7c9e1f3b5a64"
MIG_A = "MIG-bf3b4cdb-6b93-5b34-9a1b-4a6e9b6d6ad3"  # GPU4, GPU instance 9
MIG_B = "MIG-1e0d9c3a-77f2-5a18-8c4e-2f6a9b0d4e51"  # GPU4, GPU instance 10 (GPM: utilization)

NODE_LABELS = {
    "kubernetes.io/hostname": NODE,
    "node.kubernetes.io/instance-type": "p4de.24xlarge",
    "topology.kubernetes.io/zone": "us-east-1b",
    "karpenter.sh/capacity-type": "spot",
    "nvidia.com/gpu.present": "true",
}
NODE_INFO = ("p4de.24xlarge", "us-east-1b", "spot")

# cgroup format → the runtime prefix of status.containerStatuses[].containerID
RUNTIMES = {
    "v1-cgroupfs": "containerd",
    "v1-systemd": "containerd",
    "v1-systemd-docker": "docker",
    "v2-systemd": "containerd",
    "v2-crio": "cri-o",
    "v2-cgroupfs": "containerd",
    "v2-cgroupns": "containerd",
}


# ---------------------------------------------------------------------------------------------
# The node's pods


@dataclass(frozen=True)
class PodSpec:
    """One pod with one GPU container (``container``) and optional GPU-less sidecars."""

    namespace: str
    name: str
    uid: str
    container: str
    fmt: str  # how its processes' cgroup files read (a key of RUNTIMES)
    qos: str  # guaranteed, burstable, besteffort
    resource: str | None = None
    device_ids: tuple[str, ...] = ()
    owners: tuple[dict[str, Any], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    sidecars: tuple[str, ...] = ()
    node: str = NODE

    def cid(self, name: str | None = None) -> str:
        return hashlib.sha256(f"{self.uid}/{name or self.container}".encode()).hexdigest()

    def cgroup(self, *, conmon: bool = False) -> str:
        """The ``/proc/<pid>/cgroup`` text of a process in this pod's GPU container."""
        cid, uid = self.cid(), self.uid
        scope = systemd_pod(self.qos, uid)
        cgroupfs = f"/kubepods/pod{uid}" if self.qos == "guaranteed" else (
            f"/kubepods/{self.qos}/pod{uid}"
        )
        if conmon:  # cri-o's container monitor, in a sibling scope of the container's
            assert self.fmt == "v2-crio"
            return f"0::{scope}/crio-conmon-{cid}.scope\n"
        match self.fmt:
            case "v1-cgroupfs":
                return v1_file(f"{cgroupfs}/{cid}")
            case "v1-systemd":
                return v1_file(f"{scope}/cri-containerd-{cid}.scope")
            case "v1-systemd-docker":
                return v1_file(f"{scope}/docker-{cid}.scope")
            case "v2-systemd":
                return f"0::{scope}/cri-containerd-{cid}.scope\n"
            case "v2-crio":
                return f"0::{scope}/crio-{cid}.scope\n"
            case "v2-cgroupfs":
                return f"0::{cgroupfs}/{cid}\n"
            case "v2-cgroupns":
                # Read from inside the exporter's own private cgroup namespace, rooted at its
                # container scope in another burstable pod: up two levels, then across.
                assert self.qos == "burstable"
                return (f"0::/../../kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
                        f"cri-containerd-{cid}.scope\n")
        raise AssertionError(f"unknown cgroup format {self.fmt}")

    def api_object(self) -> dict[str, Any]:
        """The Pod as the API server returns it."""
        runtime = RUNTIMES[self.fmt]
        names = (self.container, *self.sidecars)
        limits = {self.resource: str(len(self.device_ids))} if self.resource else {}
        return {
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": self.uid,
                "resourceVersion": "1",
                "creationTimestamp": "2026-07-20T10:00:00Z",
                "labels": dict(self.labels),
                "ownerReferences": list(self.owners),
            },
            "spec": {
                "nodeName": self.node,
                "containers": [
                    {"name": n, "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                     "resources": {"limits": limits if n == self.container else {}}}
                    for n in names
                ],
            },
            "status": {
                "phase": "Running",
                "qosClass": self.qos.capitalize(),
                "containerStatuses": [
                    {"name": n, "containerID": f"{runtime}://{self.cid(n)}", "ready": True,
                     "restartCount": 0}
                    for n in names
                ],
            },
        }

    def kubelet_entry(self) -> pb2.PodResources:
        gpu = (devices(self.resource, *self.device_ids),) if self.resource else ()
        return pod(self.namespace, self.name, container(self.container, *gpu),
                   *(container(s) for s in self.sidecars))


def owner(api_version: str, kind: str, name: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name,
            "uid": hashlib.md5(name.encode()).hexdigest(), "controller": True,
            "blockOwnerDeletion": True}


PYTORCHJOB = (owner("kubeflow.org/v1", "PyTorchJob", "ddp-run"),)
PYTORCH_LABELS = (("training.kubeflow.org/job-name", "ddp-run"),
                  ("training.kubeflow.org/replica-type", "worker"))
JUPYTER_RS = (owner("apps/v1", "ReplicaSet", "jupyter-7d9f8b6c5d"),)
INFERENCE_STS = (owner("apps/v1", "StatefulSet", "inference"),)
RAY = (owner("ray.io/v1", "RayCluster", "rc-mig"),)

WORKER0 = PodSpec("ml", "ddp-run-worker-0", "7c3b5a1e-9f2d-4c8b-a1e3-5d6f7a8b9c0d", "pytorch",
                  "v1-cgroupfs", "burstable", "nvidia.com/gpu", (GPU0,), PYTORCHJOB,
                  PYTORCH_LABELS, sidecars=("log-shipper",))
WORKER1 = PodSpec("ml", "ddp-run-worker-1", "2f8e6d4c-1b3a-4e5f-9a7b-c8d6e4f2a0b1", "pytorch",
                  "v1-systemd", "guaranteed", "nvidia.com/gpu", (GPU1,), PYTORCHJOB,
                  PYTORCH_LABELS)
NOTEBOOKS = tuple(
    PodSpec("team-a", f"jupyter-7d9f8b6c5d-{suffix}", uid, "jupyter", fmt, "burstable",
            "nvidia.com/gpu", (f"{GPU2}::{n}",), JUPYTER_RS,
            (("app", "jupyter"), ("pod-template-hash", "7d9f8b6c5d")))
    for n, (suffix, uid, fmt) in enumerate((
        ("x2k9p", "b5d9e1f3-7a2c-4d6e-8f0a-1c3e5a7b9d2f", "v2-systemd"),
        ("q7w4z", "91a3c5e7-2b4d-4f6a-8c0e-1d3f5a7b9c2e", "v2-crio"),
        ("m3n8v", "e04c7a39-5b1d-4f8e-a6c2-3d9b0f7e1a54", "v1-systemd-docker"),
    ))
)
SVC0 = PodSpec("team-b", "inference-0", "3a6c9e1b-5d7f-4b2a-9c4e-6f8a0b2d4c6e", "server",
               "v2-cgroupns", "burstable", "nvidia.com/gpu.shared", (f"{GPU3}::0",),
               INFERENCE_STS)
# Two time-slicing replicas of one GPU in one container: allocated once.
SVC1 = PodSpec("team-b", "inference-1", "8d0f2b4a-6c8e-4a1c-b3d5-7e9f1a3c5b7d", "server",
               "v2-cgroupfs", "besteffort", "nvidia.com/gpu.shared",
               (f"{GPU3}::1", f"{GPU3}::2"), INFERENCE_STS)
EXP_A = PodSpec("research", "rc-mig-worker-a", "4b7d1f3a-9c2e-4f6b-8a0d-2c4e6a8b0d1f", "cuda",
                "v2-systemd", "guaranteed", "nvidia.com/mig-1g.10gb", (MIG_A,), RAY,
                (("ray.io/cluster", "rc-mig"),))
EXP_B = PodSpec("research", "rc-mig-worker-b", "6e9a3c5b-1d7f-4a2c-9e4b-8f0a2c4e6b8d", "cuda",
                "v1-cgroupfs", "besteffort", "nvidia.com/mig-1g.10gb", (MIG_B,), RAY,
                (("ray.io/cluster", "rc-mig"),))
IDLE = PodSpec("ml", "idle-reservation", "0f2d4b6a-8c1e-4a3f-b5d7-9e1a3c5f7b9d", "main",
               "v2-systemd", "besteffort", "nvidia.com/gpu", (GPU5,))
# No GPU: in the kubelet's answer (no GPU devices) and the API server's list, never in a series.
COREDNS = PodSpec("kube-system", "coredns-5d78c9869d-8xk2p", "c1e3a5b7-9d2f-4b6a-8e0c-2a4c6e8a0b2d",
                  "coredns", "v2-systemd", "burstable",
                  owners=(owner("apps/v1", "ReplicaSet", "coredns-5d78c9869d"),),
                  labels=(("pod-template-hash", "5d78c9869d"),))
ELSEWHERE = PodSpec("ml", "on-another-node", "d7f9b1c3-5e2a-4c8d-a0f6-4b8d0f2a6c9e", "pytorch",
                    "v2-systemd", "burstable", node=OTHER_NODE)

ALL_PODS = (WORKER0, WORKER1, *NOTEBOOKS, SVC0, SVC1, EXP_A, EXP_B, IDLE, COREDNS, ELSEWHERE)


# ---------------------------------------------------------------------------------------------
# The bench: a node plus the exporter wired as cli.run() wires it


class WallClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Kubelet(FakeKubelet):
    """FakeKubelet that also tells how many List() calls are inside the handler right now."""

    def __init__(self) -> None:
        super().__init__()
        self.active = 0
        self._lock = threading.Lock()

    def List(  # the generated servicer's method name
        self, request: pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb2.ListPodResourcesResponse:
        with self._lock:
            self.active += 1
        try:
            return super().List(request, context)
        finally:
            with self._lock:
                self.active -= 1


@dataclass(frozen=True)
class Proc:
    pid: int
    uuid: str
    mem: int
    sm: tuple[int, ...]  # per-process SM samples (percent) the driver records each round


@dataclass
class Scrape:
    """One parsed ``/metrics`` exposition: sample name → {sorted label pairs: value}."""

    text: str
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> Scrape:
        out = cls(text)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                key = tuple(sorted(s.labels.items()))
                assert key not in out.samples.get(s.name, {}), f"duplicate series {s}"
                out.samples.setdefault(s.name, {})[key] = s.value
        return out

    def containers(self, name: str) -> dict[tuple[str, str, str, str], float]:
        """``container_gpu_*`` as {(namespace, pod, container, uuid): value}."""
        rows = {}
        for key, value in self.samples.get(name, {}).items():
            labels = dict(key)
            assert set(labels) == {"namespace", "pod", "container", "uuid"}
            rows[(labels["namespace"], labels["pod"], labels["container"], labels["uuid"])] = value
        return rows

    def rows(self, name: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {tuple(dict(k)[n] for n in labels): v for k, v in self.samples.get(name, {}).items()}

    def part(self, name: str, collector: str) -> float:
        return self.samples[name][(("collector", collector),)]


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Bench:
    """A GPU node in tmp_path (NVML double, /proc, kubelet socket, API server) and the
    exporter's live attribution wired to it. Nothing runs until the test starts it."""

    def __init__(self, tmp: Path, sock_dir: Path) -> None:
        self.proc_root = tmp / "proc"
        self.proc_root.mkdir()
        self.wall = WallClock(T0)
        self.fake = FakeNvml()
        self.kubelet = KubeletServer(str(sock_dir / "kubelet.sock"))
        self.servicer = Kubelet()
        self.api = FakeApi(port=free_port())
        self.api.node_labels = dict(NODE_LABELS)
        self.kubeconfig = write_kubeconfig(tmp / "kubeconfig", self.api.url, {"token": TOKEN})
        self.pods: list[PodSpec] = []
        self.filler: list[pb2.PodResources] = []  # extra kubelet entries with no GPU
        self.procs: dict[int, Proc] = {}
        self.rounds = 0
        self._start_ticks = 4_000_000
        self._closers: list[Callable[[], None]] = []
        self.gpus = self._build_gpus()

    def _build_gpus(self) -> dict[str, FakeGpu | FakeMigSlice]:
        f = self.fake
        gpus: dict[str, FakeGpu | FakeMigSlice] = {
            GPU0: f.add_gpu(uuid=GPU0, util_gpu=75),
            GPU1: f.add_gpu(uuid=GPU1, util_gpu=88),
            GPU2: f.add_gpu(uuid=GPU2, util_gpu=80),
            GPU3: f.add_gpu(uuid=GPU3, util_gpu=60),
            GPU4: f.add_gpu(uuid=GPU4),
            GPU5: f.add_gpu(uuid=GPU5, util_gpu=0),
        }
        parent = gpus[GPU4]
        assert isinstance(parent, FakeGpu)
        gpus[MIG_A] = f.add_mig_slice(parent, "1g.10gb", gpu_instance_id=9, uuid=MIG_A)
        # A GPM-capable slice: it reports utilization, also per process.
        gpus[MIG_B] = f.add_mig_slice(parent, "1g.10gb", gpu_instance_id=10, uuid=MIG_B,
                                      util_gpu=30, util_memory=10,
                                      process_utilization_supported=True)
        return gpus

    # -- the node ------------------------------------------------------------------------

    def add_pods(self, *specs: PodSpec, event: bool = False) -> None:
        for spec in specs:
            self.pods.append(spec)
            self.api.put(spec.api_object(), event="ADDED" if event else None)
        self.publish_kubelet()

    def publish_kubelet(self) -> None:
        """What List() answers from now on: this node's pods, GPU pods among the filler."""
        mine = [p.kubelet_entry() for p in self.pods if p.node == NODE]
        entries = list(self.filler)
        for i, entry in enumerate(mine):  # spread over the answer: first, middle, last
            entries.insert(i * len(entries) // max(1, len(mine) - 1), entry)
        self.servicer.answer = response(*entries)

    def allocations_expected(self) -> int:
        return sum(len(p.device_ids) for p in self.pods if p.node == NODE)

    def add_process(
        self, pid: int, uuid: str, cgroup: str, *, mem: int, sm: tuple[int, ...] = (),
        kinds: tuple[str, ...] = ("compute",), comm: str = "python3",
    ) -> None:
        """A process on a device: /proc/<pid>/{cgroup,stat} and NVML's process list; from
        the next sampling round on, ``sm`` are its per-process utilization samples."""
        self._start_ticks += 1000  # a new process: a new start time in /proc/<pid>/stat
        write_proc(self.proc_root, pid, cgroup, start=self._start_ticks, comm=comm)
        self.gpus[uuid].add_process(pid, used_memory=mem, kinds=kinds)
        self.procs[pid] = Proc(pid, uuid, mem, sm)

    def end_process(self, pid: int) -> None:
        proc = self.procs.pop(pid)
        self.gpus[proc.uuid].remove_process(pid)
        remove_proc(self.proc_root, pid)

    def _drive_interval(self) -> None:
        """One sampling interval (1 s) passes (none before the first round): the driver
        records each process's samples inside it, after the cursor NvmlSource keeps."""
        if self.rounds:
            self.wall.now += 1.0
        for proc in self.procs.values():
            for i, sm in enumerate(proc.sm, start=1):
                ts = int((self.wall.now - 1.0 + i / (len(proc.sm) + 1)) * 1_000_000)
                self.gpus[proc.uuid].add_util_sample(proc.pid, ts, sm)

    # -- the outside services --------------------------------------------------------------

    def start_kubelet(self) -> None:
        self.kubelet.start(self.servicer)

    def start_api(self) -> None:
        self.api.start()

    # -- the exporter ----------------------------------------------------------------------

    def start_exporter(self, *flags: str, kubelet_interval: float = 0.1) -> None:
        """Wire the exporter as ``exporter.cli.run()`` does, from real command-line flags."""
        cfg = parse_config([
            "--kubelet-socket", self.kubelet.path,
            "--proc-root", str(self.proc_root),
            "--kubeconfig", str(self.kubeconfig),
            "--node-name", NODE,
            *flags,
        ], environ={})
        kube = load_config(cfg.kubeconfig)
        assert not isinstance(kube, MetadataDisabled)
        self.watcher = PodMetadataWatcher(
            kube, cfg.node_name, request_timeout_s=2.0, backoff_initial_s=0.02,
            backoff_max_s=0.2, node_refresh_s=0.1, node_retry_s=0.05,
        )
        self.inputs = LiveInputs(
            kubelet_socket=cfg.kubelet_socket, proc_root=cfg.proc_root,
            metadata_watcher=self.watcher, resource_names=cfg.gpu_resources,
            kubelet_interval=kubelet_interval,
        )
        self.attributor = Attributor(
            self.inputs, node_fallback=NodeInfo(instance_type=cfg.instance_type or "")
        )
        self._closers.append(self.attributor.close)
        self.source = NvmlSource(
            library_loader=lambda: self.fake, clock=self.wall, xid_wait_timeout_ms=50
        )
        self._closers.append(self.source.close)
        self.sampler = Sampler(self.source, cfg.interval, clock=self.wall,
                               listeners=(self.attributor,))
        self.registry = build_registry(cfg, self.sampler, self.attributor)

    def kubelet_part(self) -> tuple[bool, int]:
        part = next(p for p in self.inputs.parts() if p.name == "kubelet")
        return part.success, part.errors_total

    def wait_synced(self) -> None:
        """Bounded wait until the pod list, the node and the kubelet's allocations arrived."""
        want = self.allocations_expected()
        wait_for(lambda: self.watcher.snapshot().synced, "the pod list")
        wait_for(lambda: self.watcher.snapshot().node is not None, "the node's labels")
        wait_for(lambda: len(self.inputs.allocations()) == want, f"{want} allocations")

    def scrape(self) -> Scrape:
        return Scrape.parse(generate_latest(self.registry).decode())

    def sample(self) -> None:
        """One sampling interval passes and the sampler runs its round (``run_once``)."""
        self._drive_interval()
        self.sampler.run_once()
        self.rounds += 1

    def round(self) -> Scrape:
        """One sampling round, then a scrape."""
        self.sample()
        return self.scrape()

    def close(self) -> None:
        self.servicer.release.set()  # a hanging handler returns at once
        for close in reversed(self._closers):
            close()
        self.kubelet.stop()
        self.api.stop()


@pytest.fixture(autouse=True)
def pynvml_state() -> Iterator[None]:
    with restored_pynvml():
        yield


@pytest.fixture(autouse=True)
def kubelet_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """LiveInputs builds its PodResourcesClient with the production 5 s List() deadline; a
    shorter one keeps the hanging-kubelet test short. Nothing else about the client changes."""
    monkeypatch.setattr(
        podresources_client, "PodResourcesClient",
        functools.partial(podresources_client.PodResourcesClient, timeout=KUBELET_DEADLINE_S),
    )


@pytest.fixture
def callers(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads that call the kubelet's List(), recorded from before the exporter starts:
    a scrape's own thread must never be one of them."""
    seen: set[int] = set()
    real_list = PodResourcesClient._list

    def recording_list(self: PodResourcesClient) -> Any:
        seen.add(threading.get_ident())
        return real_list(self)

    monkeypatch.setattr(PodResourcesClient, "_list", recording_list)
    return seen


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    # A unix socket path holds 107 bytes; pytest's tmp_path can be longer on some hosts.
    sock_dir = tmp_path if len(str(tmp_path)) < 80 else Path(tempfile.mkdtemp(prefix="gpuscope-"))
    b = Bench(tmp_path, sock_dir)
    try:
        yield b
    finally:
        b.close()
        if sock_dir != tmp_path:
            shutil.rmtree(sock_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# The whole node: pods, processes and what the exporter must say about them

HOST_SERVICE = "0::/system.slice/ollama.service\n"
HOST_SESSION = "0::/user.slice/user-1000.slice/session-4.scope\n"
HOST_XORG = v1_file("/system.slice/gdm.service")


def populate(b: Bench) -> None:
    b.add_pods(*ALL_PODS)
    # GPU0, exclusive: the trainer and its data loader, plus a host service.
    b.add_process(1001, GPU0, WORKER0.cgroup(), mem=30 * GIB, sm=(60, 70))
    b.add_process(1002, GPU0, WORKER0.cgroup(), mem=1 * GIB, sm=(4, 6))
    b.add_process(9001, GPU0, HOST_SERVICE, mem=2 * GIB, sm=(10, 10), comm="ollama")
    # GPU1, exclusive.
    b.add_process(1101, GPU1, WORKER1.cgroup(), mem=40 * GIB, sm=(85, 91))
    # GPU2, time-sliced by three notebooks; cri-o's conmon sits in its own scope (were it ever
    # on a GPU, it must not be charged to the container it monitors).
    b.add_process(1201, GPU2, NOTEBOOKS[0].cgroup(), mem=2 * GIB, sm=(8, 12))
    b.add_process(1202, GPU2, NOTEBOOKS[1].cgroup(), mem=4 * GIB, sm=(20, 30))
    b.add_process(1203, GPU2, NOTEBOOKS[2].cgroup(), mem=6 * GIB, sm=(40, 50))
    b.add_process(1299, GPU2, NOTEBOOKS[1].cgroup(conmon=True), mem=16 * MIB, comm="conmon")
    # GPU3, nvidia.com/gpu.shared, plus two host processes.
    b.add_process(1301, GPU3, SVC0.cgroup(), mem=3 * GIB, sm=(15, 25))
    b.add_process(1302, GPU3, SVC1.cgroup(), mem=5 * GIB, sm=(30, 40))
    b.add_process(9002, GPU3, HOST_SESSION, mem=1 * GIB, sm=(5, 5))
    b.add_process(9003, GPU3, HOST_XORG, mem=512 * MIB, kinds=("graphics",), comm="Xorg")
    # GPU4's MIG slices: slice A reports no per-process utilization, slice B does.
    b.add_process(1401, MIG_A, EXP_A.cgroup(), mem=3 * GIB)
    b.add_process(1402, MIG_B, EXP_B.cgroup(), mem=5 * GIB, sm=(30, 30))
    # GPU5: allocated to IDLE, nothing runs on it.


def key(spec: PodSpec, uuid: str) -> tuple[str, str, str, str]:
    return (spec.namespace, spec.name, spec.container, uuid)


def host(uuid: str) -> tuple[str, str, str, str]:
    return ("", "", "", uuid)


ALLOCATED = {
    key(WORKER0, GPU0): 1.0,
    key(WORKER1, GPU1): 1.0,
    **{key(nb, GPU2): 1.0 for nb in NOTEBOOKS},
    key(SVC0, GPU3): 1.0,
    key(SVC1, GPU3): 1.0,
    key(EXP_A, MIG_A): 1.0,
    key(EXP_B, MIG_B): 1.0,
    key(IDLE, GPU5): 1.0,
}
UTILIZATION = {
    key(WORKER0, GPU0): 0.65 + 0.05,
    host(GPU0): 0.10,
    key(WORKER1, GPU1): 0.88,
    key(NOTEBOOKS[0], GPU2): 0.10,
    key(NOTEBOOKS[1], GPU2): 0.25,
    key(NOTEBOOKS[2], GPU2): 0.45,
    host(GPU2): 0.0,  # conmon
    key(SVC0, GPU3): 0.20,
    key(SVC1, GPU3): 0.35,
    host(GPU3): 0.05,
    key(EXP_B, MIG_B): 0.30,
    key(IDLE, GPU5): 0.0,
}
MEMORY = {
    key(WORKER0, GPU0): 31 * GIB,
    host(GPU0): 2 * GIB,
    key(WORKER1, GPU1): 40 * GIB,
    key(NOTEBOOKS[0], GPU2): 2 * GIB,
    key(NOTEBOOKS[1], GPU2): 4 * GIB,
    key(NOTEBOOKS[2], GPU2): 6 * GIB,
    host(GPU2): 16 * MIB,
    key(SVC0, GPU3): 3 * GIB,
    key(SVC1, GPU3): 5 * GIB,
    host(GPU3): 1 * GIB + 512 * MIB,
    key(EXP_A, MIG_A): 3 * GIB,
    key(EXP_B, MIG_B): 5 * GIB,
    key(IDLE, GPU5): 0,
}
POD_INFO = {
    (WORKER0.namespace, WORKER0.name, WORKER0.uid, "PyTorchJob/ddp-run"): 1.0,
    (WORKER1.namespace, WORKER1.name, WORKER1.uid, "PyTorchJob/ddp-run"): 1.0,
    **{(nb.namespace, nb.name, nb.uid, "Deployment/jupyter"): 1.0 for nb in NOTEBOOKS},
    (SVC0.namespace, SVC0.name, SVC0.uid, "StatefulSet/inference"): 1.0,
    (SVC1.namespace, SVC1.name, SVC1.uid, "StatefulSet/inference"): 1.0,
    (EXP_A.namespace, EXP_A.name, EXP_A.uid, "RayCluster/rc-mig"): 1.0,
    (EXP_B.namespace, EXP_B.name, EXP_B.uid, "RayCluster/rc-mig"): 1.0,
    (IDLE.namespace, IDLE.name, IDLE.uid, ""): 1.0,
}


def ratios(expected: dict[Any, float] | list[float]) -> Any:
    """Exact up to float rounding of the sums (0.65 + 0.05 is 0.7000000000000001)."""
    return pytest.approx(expected, rel=0, abs=1e-12)


def only(table: dict[Any, Any], *uuids: str) -> dict[Any, Any]:
    return {k: v for k, v in table.items() if k[3] in uuids}


@pytest.fixture
def node(bench: Bench) -> Scrape:
    """The whole node after one sampling round with every service up and synced."""
    populate(bench)
    bench.start_kubelet()
    bench.start_api()
    bench.start_exporter()
    bench.wait_synced()
    return bench.round()


# ---------------------------------------------------------------------------------------------
# Cases, value by value


def test_exclusive_gpus(node: Scrape) -> None:
    assert only(node.containers("container_gpu_allocated"), GPU0, GPU1) == {
        key(WORKER0, GPU0): 1.0, key(WORKER1, GPU1): 1.0,
    }
    # The container's value is the sum of its own two processes (trainer 65 %, loader 5 %),
    # each the mean of its samples over the interval; the host service is not in it.
    assert only(node.containers("container_gpu_utilization_ratio"), GPU0, GPU1) == ratios({
        key(WORKER0, GPU0): 0.70, host(GPU0): 0.10, key(WORKER1, GPU1): 0.88,
    })
    assert only(node.containers("container_gpu_memory_used_bytes"), GPU0, GPU1) == {
        key(WORKER0, GPU0): 31 * GIB, host(GPU0): 2 * GIB, key(WORKER1, GPU1): 40 * GIB,
    }
    # The GPU-less sidecar of the same pod has no series at all.
    assert not [k for k in node.containers("container_gpu_allocated") if k[2] == "log-shipper"]


def test_three_pods_time_slicing_one_gpu(node: Scrape) -> None:
    assert only(node.containers("container_gpu_allocated"), GPU2) == {
        key(nb, GPU2): 1.0 for nb in NOTEBOOKS
    }
    util = node.containers("container_gpu_utilization_ratio")
    mem = node.containers("container_gpu_memory_used_bytes")
    mine = [util[key(nb, GPU2)] for nb in NOTEBOOKS]
    assert mine == ratios([0.10, 0.25, 0.45])  # three different, true values
    assert [mem[key(nb, GPU2)] for nb in NOTEBOOKS] == [2 * GIB, 4 * GIB, 6 * GIB]
    # They add up to what the processes used, and none is the device's value copied.
    device = node.rows("gpu_utilization_ratio", "uuid")[(GPU2,)]
    assert device == 0.80
    assert sum(mine) == pytest.approx(0.80, abs=1e-12)
    assert device not in mine
    # cri-o's conmon (same pod, own scope) is not charged to the notebook it monitors.
    assert util[host(GPU2)] == 0.0 and mem[host(GPU2)] == 16 * MIB


def test_gpu_shared_resource(node: Scrape) -> None:
    # inference-1 holds two replicas (GPU3::1 and ::2) of the GPU: allocated once.
    assert only(node.containers("container_gpu_allocated"), GPU3) == {
        key(SVC0, GPU3): 1.0, key(SVC1, GPU3): 1.0,
    }
    assert only(node.containers("container_gpu_utilization_ratio"), GPU3) == ratios({
        key(SVC0, GPU3): 0.20, key(SVC1, GPU3): 0.35, host(GPU3): 0.05,
    })
    assert only(node.containers("container_gpu_memory_used_bytes"), GPU3) == {
        key(SVC0, GPU3): 3 * GIB, key(SVC1, GPU3): 5 * GIB, host(GPU3): 1 * GIB + 512 * MIB,
    }


def test_two_mig_slices_for_two_pods(node: Scrape, bench: Bench) -> None:
    assert only(node.containers("container_gpu_allocated"), GPU4, MIG_A, MIG_B) == {
        key(EXP_A, MIG_A): 1.0, key(EXP_B, MIG_B): 1.0,
    }
    assert only(node.containers("container_gpu_memory_used_bytes"), GPU4, MIG_A, MIG_B) == {
        key(EXP_A, MIG_A): 3 * GIB, key(EXP_B, MIG_B): 5 * GIB,
    }
    # Slice A cannot report per-process utilization: absent, not a made-up 0. Slice B can.
    assert only(node.containers("container_gpu_utilization_ratio"), GPU4, MIG_A, MIG_B) == (
        ratios({key(EXP_B, MIG_B): 0.30})
    )
    # Processes per slice, to the pod holding that slice.
    latest = bench.attributor.latest()
    assert latest is not None
    assert {(u.key.pod, u.uuid): u.pids for u in latest.containers
            if u.uuid in (GPU4, MIG_A, MIG_B)} == {
        (EXP_A.name, MIG_A): (1401,), (EXP_B.name, MIG_B): (1402,),
    }
    info = node.rows("gpu_info", "uuid", "parent_uuid", "mig_profile")
    assert info[(MIG_A, GPU4, "1g.10gb")] == 1.0 and info[(MIG_B, GPU4, "1g.10gb")] == 1.0


def test_allocation_without_process(node: Scrape) -> None:
    assert node.containers("container_gpu_allocated")[key(IDLE, GPU5)] == 1.0
    assert node.containers("container_gpu_utilization_ratio")[key(IDLE, GPU5)] == 0.0
    assert node.containers("container_gpu_memory_used_bytes")[key(IDLE, GPU5)] == 0.0
    assert only(node.containers("container_gpu_utilization_ratio"), GPU5) == {
        key(IDLE, GPU5): 0.0
    }


def test_host_processes(node: Scrape) -> None:
    util = node.containers("container_gpu_utilization_ratio")
    mem = node.containers("container_gpu_memory_used_bytes")
    hosts = {k for k in {*util, *mem} if k[:3] == ("", "", "")}
    assert hosts == {host(GPU0), host(GPU2), host(GPU3)}
    assert {k: util[k] for k in hosts} == ratios({
        host(GPU0): 0.10, host(GPU2): 0.0, host(GPU3): 0.05 + 0.0,
    })
    assert {k: mem[k] for k in hosts} == {
        host(GPU0): 2 * GIB, host(GPU2): 16 * MIB, host(GPU3): 1 * GIB + 512 * MIB,
    }
    assert not [k for k in node.containers("container_gpu_allocated") if k[:3] == ("", "", "")]
    assert node.samples["gpu_exporter_attribution_unnamed_processes"][()] == 0.0


def test_whole_node_and_pod_and_node_info(node: Scrape) -> None:
    # Every series of the node, nothing more (no coredns, no pod from another node).
    assert node.containers("container_gpu_allocated") == ALLOCATED
    assert node.containers("container_gpu_utilization_ratio") == ratios(UTILIZATION)
    assert node.containers("container_gpu_memory_used_bytes") == MEMORY
    assert node.rows("gpu_pod_info", "namespace", "pod", "uid", "workload") == POD_INFO
    assert node.rows("gpu_node_info", "instance_type", "zone", "capacity_type") == {
        NODE_INFO: 1.0
    }
    assert node.samples["gpu_exporter_attribution_unresolved_devices"][()] == 0.0
    for part in ("kubelet", "kube_pods", "kube_node", "proc", "attribution"):
        assert node.part("gpu_exporter_collector_success", part) == 1.0, part
        assert node.part("gpu_exporter_collector_errors_total", part) == 0.0, part


# ---------------------------------------------------------------------------------------------
# Changes over time, and faults


def test_pid_reuse(bench: Bench) -> None:
    populate(bench)
    bench.start_kubelet()
    bench.start_api()
    bench.start_exporter()
    bench.wait_synced()
    first = bench.round()
    assert first.containers("container_gpu_utilization_ratio")[key(WORKER0, GPU0)] == (
        pytest.approx(0.70, abs=1e-12)
    )

    # The trainer (PID 1001) exits; the kernel hands PID 1001 to a new process in the idle
    # pod's container (new start time, new cgroup file), which starts using its GPU5.
    bench.end_process(1001)
    bench.add_process(1001, GPU5, IDLE.cgroup(), mem=7 * GIB, sm=(50, 60))
    second = bench.round()
    util = second.containers("container_gpu_utilization_ratio")
    mem = second.containers("container_gpu_memory_used_bytes")
    assert util[key(IDLE, GPU5)] == pytest.approx(0.55, abs=1e-12)
    assert mem[key(IDLE, GPU5)] == 7 * GIB
    assert util[key(WORKER0, GPU0)] == pytest.approx(0.05, abs=1e-12)  # its loader only
    assert mem[key(WORKER0, GPU0)] == 1 * GIB
    assert util == ratios({**UTILIZATION, key(WORKER0, GPU0): 0.05, key(IDLE, GPU5): 0.55})
    assert mem == {**MEMORY, key(WORKER0, GPU0): 1 * GIB, key(IDLE, GPU5): 7 * GIB}

    # And once more: PID 1001 now goes to a host process on the same GPU.
    bench.end_process(1001)
    bench.add_process(1001, GPU5, HOST_SERVICE, mem=256 * MIB, sm=(3, 5), comm="ollama")
    third = bench.round()
    util = third.containers("container_gpu_utilization_ratio")
    assert only(util, GPU5) == ratios({key(IDLE, GPU5): 0.0, host(GPU5): 0.04})
    assert only(third.containers("container_gpu_memory_used_bytes"), GPU5) == {
        key(IDLE, GPU5): 0, host(GPU5): 256 * MIB,
    }


def test_kubelet_socket_absent_then_appears(bench: Bench) -> None:
    populate(bench)
    bench.start_api()
    bench.start_exporter()  # no kubelet socket yet
    wait_for(lambda: bench.watcher.snapshot().synced, "the pod list")
    wait_for(lambda: bench.kubelet_part()[1] >= 2, "two failed List() refreshes")
    absent = bench.round()
    assert absent.containers("container_gpu_allocated") == {}
    assert absent.part("gpu_exporter_collector_success", "kubelet") == 0.0
    assert absent.part("gpu_exporter_collector_errors_total", "kubelet") >= 2
    # Usage needs no kubelet: processes are still attributed through cgroups and names.
    # The idle container, known only from its allocation, has no series yet.
    assert absent.containers("container_gpu_utilization_ratio") == ratios(
        {k: v for k, v in UTILIZATION.items() if k != key(IDLE, GPU5)}
    )
    assert absent.containers("container_gpu_memory_used_bytes") == {
        k: v for k, v in MEMORY.items() if k != key(IDLE, GPU5)
    }

    bench.start_kubelet()
    want = bench.allocations_expected()
    wait_for(lambda: len(bench.inputs.allocations()) == want, "allocations after the socket")
    present = bench.round()
    assert present.containers("container_gpu_allocated") == ALLOCATED
    assert present.containers("container_gpu_utilization_ratio") == ratios(UTILIZATION)
    assert present.containers("container_gpu_memory_used_bytes") == MEMORY
    assert present.part("gpu_exporter_collector_success", "kubelet") == 1.0
    errors = present.part("gpu_exporter_collector_errors_total", "kubelet")
    assert errors >= absent.part("gpu_exporter_collector_errors_total", "kubelet")


def test_kubelet_hanging_scrape_stays_fast(bench: Bench, callers: set[int]) -> None:
    populate(bench)
    bench.start_kubelet()
    bench.start_api()
    bench.start_exporter()
    bench.wait_synced()
    good = bench.round()
    assert good.containers("container_gpu_allocated") == ALLOCATED

    bench.servicer.hang.set()  # List() handlers now sleep well past the client's deadline
    wait_for(lambda: bench.kubelet_part()[0] is False and bench.kubelet_part()[1] >= 1,
             "the first List() past its deadline")
    # Time whole scrapes (a sampling round, then rendering) while a call hangs in the kubelet.
    timings: list[float] = []
    wait_for(lambda: bench.servicer.active > 0, "a List() call inside the hung handler")
    while bench.servicer.active > 0 and len(timings) < 20:
        started = time.perf_counter()
        bench.sample()  # Sampler.run_once(), plus the NVML double recording samples (µs)
        text = generate_latest(bench.registry).decode()
        timings.append(time.perf_counter() - started)
        scrape = Scrape.parse(text)
        # The last known allocations are served, and the failure shows.
        assert scrape.containers("container_gpu_allocated") == ALLOCATED
        assert scrape.containers("container_gpu_utilization_ratio") == ratios(UTILIZATION)
        assert scrape.part("gpu_exporter_collector_success", "kubelet") == 0.0
        assert scrape.part("gpu_exporter_collector_errors_total", "kubelet") >= 1.0
        time.sleep(0.02)
    assert len(timings) >= 5, "the kubelet stopped hanging before the scrapes ran"
    # The scrape never waits on the kubelet: no List() ran on this (the scrape's) thread,
    # while calls were made on the watcher's.
    assert callers and threading.get_ident() not in callers
    # And it stays fast: a scrape held by the call would take up to the 0.5 s deadline.
    # The median, not the max: one scrape on a busy CI host read 0.24 s (stop 20).
    assert statistics.median(timings) < 0.1, timings

    bench.servicer.hang.clear()
    bench.servicer.release.set()
    wait_for(lambda: bench.kubelet_part()[0], "List() working again")
    recovered = bench.round()
    assert recovered.part("gpu_exporter_collector_success", "kubelet") == 1.0
    assert recovered.part("gpu_exporter_collector_errors_total", "kubelet") >= 1.0
    assert recovered.containers("container_gpu_allocated") == ALLOCATED


def test_api_server_down_at_start_then_back(bench: Bench) -> None:
    populate(bench)
    bench.start_kubelet()
    bench.start_exporter("--instance-type", "p4de.24xlarge")  # the API server is not up
    want = bench.allocations_expected()
    wait_for(lambda: len(bench.inputs.allocations()) == want, "allocations")
    wait_for(lambda: bench.watcher.snapshot().stats.pod_list_errors_total >= 2, "list errors")
    wait_for(lambda: bench.watcher.snapshot().stats.node_errors_total >= 2, "node errors")
    down = bench.round()

    # The kubelet names the allocations by itself.
    assert down.containers("container_gpu_allocated") == ALLOCATED
    # No pod process can be named without the API server: they count as unnamed, and their
    # usage under host labels, per device.
    unnamed = [p for p in bench.procs if p < 9000 and p != 1299]
    assert down.samples["gpu_exporter_attribution_unnamed_processes"][()] == len(unnamed)
    util = down.containers("container_gpu_utilization_ratio")
    mem = down.containers("container_gpu_memory_used_bytes")
    assert {k: v for k, v in util.items() if k[:3] == ("", "", "")} == ratios({
        host(GPU0): 0.70 + 0.10, host(GPU1): 0.88, host(GPU2): 0.80, host(GPU3): 0.60,
        host(MIG_B): 0.30,
    })
    assert {k: v for k, v in mem.items() if k[:3] == ("", "", "")} == {
        host(GPU0): 33 * GIB, host(GPU1): 40 * GIB, host(GPU2): 12 * GIB + 16 * MIB,
        host(GPU3): 9 * GIB + 512 * MIB, host(MIG_A): 3 * GIB, host(MIG_B): 5 * GIB,
    }
    # An allocated container on a device that runs unnamed pod processes may be the one
    # running them: its usage is unknown (absent), never a 0 that reads as allocated-idle.
    # Elsewhere an allocated container with nothing running reads 0 (MIG slice A reports no
    # per-process utilization: absent there, as always).
    busy = {bench.procs[p].uuid for p in unnamed}
    assert {k: v for k, v in util.items() if k[:3] != ("", "", "")} == {
        k: 0.0 for k in ALLOCATED if k[3] not in busy and k[3] != MIG_A
    }
    assert {k: v for k, v in mem.items() if k[:3] != ("", "", "")} == {
        k: 0 for k in ALLOCATED if k[3] not in busy
    }
    assert busy  # the case above is exercised
    # Pods are known by name (from the kubelet) but not by UID or workload yet.
    assert down.rows("gpu_pod_info", "namespace", "pod", "uid", "workload") == {
        (ns, p, "", ""): 1.0 for (ns, p, _, _) in POD_INFO
    }
    # The node's labels are unknown: --instance-type fills in.
    assert down.rows("gpu_node_info", "instance_type", "zone", "capacity_type") == {
        ("p4de.24xlarge", "", ""): 1.0
    }
    for part in ("kube_pods", "kube_node"):
        assert down.part("gpu_exporter_collector_success", part) == 0.0
        assert down.part("gpu_exporter_collector_errors_total", part) >= 2.0

    bench.start_api()
    bench.wait_synced()
    back = bench.round()
    assert back.containers("container_gpu_allocated") == ALLOCATED
    assert back.containers("container_gpu_utilization_ratio") == ratios(UTILIZATION)
    assert back.containers("container_gpu_memory_used_bytes") == MEMORY
    assert back.rows("gpu_pod_info", "namespace", "pod", "uid", "workload") == POD_INFO
    assert back.rows("gpu_node_info", "instance_type", "zone", "capacity_type") == {
        NODE_INFO: 1.0
    }
    assert back.samples["gpu_exporter_attribution_unnamed_processes"][()] == 0.0
    for part in ("kube_pods", "kube_node"):
        assert back.part("gpu_exporter_collector_success", part) == 1.0


def test_api_server_down_after_sync_keeps_names(bench: Bench) -> None:
    populate(bench)
    bench.start_kubelet()
    bench.start_api()
    bench.start_exporter()
    bench.wait_synced()
    assert bench.round().containers("container_gpu_utilization_ratio") == ratios(UTILIZATION)

    bench.api.stop()
    wait_for(lambda: bench.watcher.snapshot().stats.pod_list_errors_total >= 2,
             "pod list failing after the API server went away")
    wait_for(lambda: bench.watcher.snapshot().stats.node_errors_total >= 2,
             "node GET failing after the API server went away")
    # A new process in a container the API server named before it went away.
    bench.add_process(1003, GPU0, WORKER0.cgroup(), mem=2 * GIB, sm=(10, 20))
    down = bench.round()
    assert down.containers("container_gpu_allocated") == ALLOCATED
    assert down.containers("container_gpu_utilization_ratio") == ratios(
        {**UTILIZATION, key(WORKER0, GPU0): 0.65 + 0.05 + 0.15}
    )
    assert down.containers("container_gpu_memory_used_bytes") == {
        **MEMORY, key(WORKER0, GPU0): 33 * GIB,
    }
    assert down.rows("gpu_pod_info", "namespace", "pod", "uid", "workload") == POD_INFO
    assert down.rows("gpu_node_info", "instance_type", "zone", "capacity_type") == {
        NODE_INFO: 1.0
    }
    assert down.samples["gpu_exporter_attribution_unnamed_processes"][()] == 0.0
    for part in ("kube_pods", "kube_node"):
        assert down.part("gpu_exporter_collector_success", part) == 0.0
        assert down.part("gpu_exporter_collector_errors_total", part) >= 2.0


def test_list_response_over_4_5_mb(bench: Bench) -> None:
    # Thousands of pods on the node, each holding many non-GPU devices (SR-IOV VFs); a few
    # of them, spread over the answer, hold the GPUs.
    for n in range(3000):
        vfs = [f"0000:{n % 256:02x}:{vf // 8:02x}.{vf % 8}-vf-{n:05d}" for vf in range(64)]
        bench.filler.append(pod(f"tenant-{n % 40}", f"batch-{n:05d}",
                                container("worker", devices("example.com/sriov-vf", *vfs))))
    for n in range(3000):  # the API server knows these pods too
        uid = f"{n:08x}-0000-4000-8000-{n:012x}"
        bench.api.put(PodSpec(f"tenant-{n % 40}", f"batch-{n:05d}", uid, "worker",
                              "v2-systemd", "besteffort").api_object())
    populate(bench)
    assert bench.servicer.answer.ByteSize() > 4_500_000
    bench.start_kubelet()
    bench.start_api()
    bench.start_exporter(kubelet_interval=1.0)
    bench.wait_synced()
    assert len(bench.watcher.snapshot().pods) == 3000 + len(ALL_PODS) - 1
    big = bench.round()
    assert big.containers("container_gpu_allocated") == ALLOCATED
    assert big.containers("container_gpu_utilization_ratio") == ratios(UTILIZATION)
    assert big.containers("container_gpu_memory_used_bytes") == MEMORY
    assert big.rows("gpu_pod_info", "namespace", "pod", "uid", "workload") == POD_INFO
    assert big.part("gpu_exporter_collector_success", "kubelet") == 1.0
