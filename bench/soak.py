"""Soak test of gpuscope-exporter on a live node with pods and processes churning.

Not a test (CI does not run it; ``make soak`` does). It runs the real exporter as a separate
process, sampling every ``--interval`` (0.1 s) on the live path: ``NvmlSource`` and real
pynvml over the FakeNvml double of libnvidia-ml (``bench/soak_exporter.py``), and live
attribution against a node this process plays:

* the kubelet: a real grpcio PodResources v1 server on a unix socket (``KubeletServer`` of
  ``tests/exporter/kubernetes/podresources/test_client.py``), answering with the pods alive now;
* ``/proc``: a tree in a temporary directory, ``<pid>/stat`` (start time) and
  ``<pid>/cgroup`` in the seven cgroup formats of ``tests/e2e/test_attribution_live.py``;
* the API server: ``FakeApi`` of ``tests/exporter/kubernetes/test_apiserver.py`` over HTTP (list +
watch of
  this node's pods, GET of the node), through a kubeconfig file.

Churn, every ``--churn-every`` seconds: pods whose lifetime (``--pod-lifetime``, uniform) is
over end (their processes leave NVML and ``/proc``, the API server sends DELETED, the kubelet
stops listing them); free time-slicing replicas (``--gpus`` x ``--replicas``) get new pods
with new names and UIDs (ADDED, then the kubelet lists them, then 1-3 processes start);
processes inside living pods restart; host processes (no pod) come and go. A new process takes
a PID that just ended (another pod's, maybe on another GPU) with probability
``--pid-reuse``, with a new start time. Faults, one every ``--faults-every`` seconds in turn:
a GPU lost and back, XID events, the kubelet restarting, the API server ending the watch,
``410 Gone`` (relist), the driver unloading and coming back.

Every ``--measure-every`` seconds (10) it reads the exporter's ``/proc/<pid>``: RSS
(``VmRSS``), open fds, threads, CPU; and scrapes ``/metrics`` and checks that every
``container_gpu_*``, ``gpu_pod_info`` and ``gpu_process_*`` series belongs to a pod (or
process) alive now, or gone for less than ``--grace`` seconds. For a pod the grace starts
when the kubelet first answered ``List()`` without it (so the kubelet's 10 s poll period is
allowed for on top); for a process when it left NVML.

At the end it prints a table and exits 1 when: a stale series was seen; the fd or thread
count grew (max of the last quarter above the max of the first quarter after warm-up, plus
``--fd-tolerance`` / ``--thread-tolerance``; fds counted beyond the one ``stat`` file held per
live GPU process, which follows the churn); or the RSS slope over the second half of the
run exceeds ``--max-rss-slope`` KiB/hour (default 1024: see bench/README.md). ``--json PATH``
writes the figures and the time series.

Run from the repository root::

    .venv/bin/python bench/soak.py                       # 65 minutes
    .venv/bin/python bench/soak.py --duration 120 --faults-every 15
    .venv/bin/python bench/soak.py --duration 1900 --json /tmp/soak.json
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: bench/ is on sys.path, not the repository
    sys.path.insert(0, str(REPO))

import grpc  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from bench.exporter_bench import sigterm_as_exit  # noqa: E402
from bench.soak_exporter import (  # noqa: E402
    DRIVER_THREAD_NAME,
    MAX_PROCESSES_PER_GPU,
    gpu_uuid,
)
from tests.exporter.kubernetes.test_apiserver import NODE, TOKEN, FakeApi, write_kubeconfig  # noqa: E402
from tests.exporter.kubernetes.test_cgroups import remove_proc, write_proc  # noqa: E402
from tests.kubelet_api import podresources_v1_pb2 as pb2  # noqa: E402
from tests.kubelet_api import podresources_v1_pb2_grpc as pb2_grpc  # noqa: E402
from tests.ports import free_port  # noqa: E402


class PodSpecLike(Protocol):
    """``PodSpec`` of tests/e2e/test_attribution_live.py: one pod, its cgroup file text in
    seven formats, its API object and its kubelet entry."""

    namespace: str
    name: str
    uid: str
    container: str

    def cgroup(self, *, conmon: bool = False) -> str: ...

    def api_object(self) -> dict[str, Any]: ...

    def kubelet_entry(self) -> pb2.PodResources: ...


# Loaded at run time only: these test modules import test code that mypy cannot check from
# here (grpc_tools has no type stubs), so their names are typed by what the soak uses.
_live: Any = importlib.import_module("tests.e2e.test_attribution_live")
_podresources: Any = importlib.import_module("tests.exporter.kubernetes.podresources.test_client")
PodSpec: Callable[..., PodSpecLike] = _live.PodSpec
owner: Callable[[str, str, str], dict[str, Any]] = _live.owner
RUNTIMES: dict[str, str] = _live.RUNTIMES
NODE_LABELS: dict[str, str] = _live.NODE_LABELS
response: Callable[..., pb2.ListPodResourcesResponse] = _podresources.response
KubeletServer: Callable[[str], Any] = _podresources.KubeletServer

GIB = 1024**3
CLK_TCK = os.sysconf("SC_CLK_TCK")
PID_MAX = 4_194_304
HOST_CGROUPS = (
    "0::/system.slice/ollama.service\n",
    "0::/user.slice/user-1000.slice/session-4.scope\n",
    "0::/system.slice/dcgm.service\n",
)
XID_CODES = (13, 31, 43, 48, 63, 64, 74, 79, 94, 95)
NAMESPACES = ("ml", "team-a", "team-b", "research", "batch")
QOS = ("guaranteed", "burstable", "besteffort")
FAULTS = ("gpu_lost", "xid", "watch_close", "kubelet_restart", "xid", "relist_410",
          "driver_reload")
CONTAINER_FAMILIES = (
    "container_gpu_allocated", "container_gpu_utilization_ratio",
    "container_gpu_memory_used_bytes",
)
PROCESS_FAMILIES = ("gpu_process_utilization_ratio", "gpu_process_memory_used_bytes")


# ---------------------------------------------------------------------------------------------
# The node: kubelet, /proc, API server, and (through the exporter's stdin) NVML


class Kubelet(pb2_grpc.PodResourcesListerServicer):
    """The kubelet's PodResources v1 service (served by ``KubeletServer`` of
    tests/exporter/kubernetes/podresources/test_client.py). Its answer carries a generation; each
    ``List()`` answered is recorded as (monotonic time, generation) for the soak to learn when
    the kubelet stopped listing a pod. Bounded: the soak drains the record every loop."""

    def __init__(self) -> None:
        self.calls = 0
        self.generation = 0
        self._current: tuple[int, pb2.ListPodResourcesResponse] = (0, response())
        self.answered: deque[tuple[float, int]] = deque(maxlen=10_000)

    def publish(self, answer: pb2.ListPodResourcesResponse) -> int:
        self.generation += 1
        self._current = (self.generation, answer)
        return self.generation

    def List(  # the generated servicer's method name
        self, request: pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb2.ListPodResourcesResponse:
        self.calls += 1
        generation, answer = self._current
        self.answered.append((time.monotonic(), generation))
        return answer


@dataclass
class SoakPod:
    spec: PodSpecLike
    gpu: int
    replica: int
    ends_at: float
    pids: list[int] = field(default_factory=list)


@dataclass
class Ended:
    """A pod that ended: its series may stay until ``grace_from + grace``; ``grace_from``
    is infinite until the kubelet answers without it."""

    uid: str
    container: str
    ended_at: float
    generation: int  # the kubelet answer generation without it
    grace_from: float = math.inf


@dataclass
class Totals:
    pods_started: int = 0
    pods_ended: int = 0
    processes_started: int = 0
    processes_ended: int = 0
    pid_reuses: int = 0
    host_processes_started: int = 0
    gpu_lost: int = 0
    xid_events: int = 0
    kubelet_restarts: int = 0
    watch_closes: int = 0
    relists_410: int = 0
    driver_reloads: int = 0
    kubelet_lists: int = 0


class Node:
    def __init__(self, workdir: Path, args: argparse.Namespace, rng: random.Random) -> None:
        self.args = args
        self.rng = rng
        self.proc_root = workdir / "proc"
        self.proc_root.mkdir()
        self.socket_path = workdir / "kubelet.sock"
        self.kubelet_server = KubeletServer(str(self.socket_path))
        self.kubelet = Kubelet()
        self.kubelet_up = False
        self.api = FakeApi(port=0)
        self.api.node_labels = dict(NODE_LABELS)
        self.kubeconfig = workdir / "kubeconfig"
        self.stdin: Any = None  # the exporter's stdin, once started
        self.pods: dict[str, SoakPod] = {}  # by name
        self.slots: dict[tuple[int, int], str | None] = {
            (g, r): None for g in range(args.gpus) for r in range(args.replicas)
        }
        self.host_pids: dict[int, float] = {}  # pid -> ends_at
        self.live_pids: dict[int, int] = {}  # pid -> GPU index
        self.ended_pods: dict[str, Ended] = {}
        self.ended_procs: dict[tuple[int, int], float] = {}  # (pid, gpu) -> ended at
        self.freed_pids: deque[int] = deque(maxlen=256)
        self.pending_grace: list[str] = []
        self.next_pid = 10_000
        self.start_ticks = 5_000_000
        self.seq = 0
        self.lost_gpu: int | None = None
        self.driver_down = False
        self.totals = Totals()

    # -- services --------------------------------------------------------------------------

    def start(self) -> None:
        self.api.start()
        write_kubeconfig(self.kubeconfig, self.api.url, {"token": TOKEN})
        self.kubelet_server.start(self.kubelet)
        self.kubelet_up = True
        self.publish_kubelet()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.kubelet_server.stop()
        with contextlib.suppress(Exception):
            self.api.stop()

    def send(self, command: str) -> None:
        if self.stdin is not None:
            with contextlib.suppress(BrokenPipeError, ValueError):
                self.stdin.write(f"{command}\n".encode())
                self.stdin.flush()

    def publish_kubelet(self) -> int:
        return self.kubelet.publish(
            response(*(p.spec.kubelet_entry() for p in self.pods.values()))
        )

    # -- processes -------------------------------------------------------------------------

    def _new_pid(self) -> int:
        if self.freed_pids and self.rng.random() < self.args.pid_reuse:
            pid = self.freed_pids.popleft()
            if pid not in self.live_pids and pid not in self.host_pids:
                self.totals.pid_reuses += 1
                return pid
        while True:
            self.next_pid = self.next_pid + 1 if self.next_pid < PID_MAX else 10_000
            if self.next_pid not in self.live_pids:
                return self.next_pid

    def start_process(self, gpu: int, cgroup: str, comm: str = "python3") -> int:
        pid = self._new_pid()
        self.start_ticks += self.rng.randint(1, 5000)  # a new process: a new start time
        write_proc(self.proc_root, pid, cgroup, start=self.start_ticks, comm=comm)
        memory = self.rng.randint(1, 40) * GIB // 4
        self.send(f"add {gpu} {pid} {memory} {self.rng.randint(0, 95)}")
        self.live_pids[pid] = gpu
        self.ended_procs.pop((pid, gpu), None)
        self.totals.processes_started += 1
        return pid

    def end_process(self, pid: int, now: float) -> None:
        gpu = self.live_pids.pop(pid)
        self.send(f"del {gpu} {pid}")  # first NVML forgets it, then /proc
        remove_proc(self.proc_root, pid)
        self.ended_procs[(pid, gpu)] = now
        self.freed_pids.append(pid)
        self.totals.processes_ended += 1

    # -- pods --------------------------------------------------------------------------------

    def _new_spec(self, device_ids: tuple[str, ...]) -> PodSpecLike:
        self.seq += 1
        fmt = self.rng.choice(sorted(RUNTIMES))
        qos = "burstable" if fmt == "v2-cgroupns" else self.rng.choice(QOS)
        namespace = self.rng.choice(NAMESPACES)
        kind = self.seq % 3
        uid = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        if kind == 0:  # a Deployment's pod
            rs = f"serve-{self.seq % 7}-{self.seq // 50 % 100000:05x}"
            name = f"{rs}-{self.seq:06x}"
            owners: tuple[dict[str, Any], ...] = (owner("apps/v1", "ReplicaSet", rs),)
            labels: tuple[tuple[str, str], ...] = (("pod-template-hash", rs.rsplit("-", 1)[1]),)
        elif kind == 1:  # a Job's pod
            job = f"train-{self.seq // 4:06x}"
            name = f"{job}-{self.seq:06x}"
            owners = (owner("batch/v1", "Job", job),)
            labels = (("batch.kubernetes.io/job-name", job),)
        else:  # a bare pod
            name = f"notebook-{self.seq:06x}"
            owners, labels = (), ()
        return PodSpec(namespace, name, uid, "main", fmt, qos, "nvidia.com/gpu", device_ids, owners,
                       labels, sidecars=("sidecar",) if self.seq % 4 == 0 else ())

    def start_pod(self, slot: tuple[int, int], now: float) -> SoakPod:
        gpu, replica = slot
        spec = self._new_spec((f"{gpu_uuid(gpu)}::{replica}",))
        lo, hi = self.args.pod_lifetime
        pod = SoakPod(spec, gpu, replica, now + self.rng.uniform(lo, hi))
        self.api.put(spec.api_object(), event="ADDED")
        self.pods[spec.name] = pod
        self.slots[slot] = spec.name
        for _ in range(self.rng.choice((1, 1, 2, 3))):
            pod.pids.append(self.start_process(gpu, spec.cgroup()))
        self.totals.pods_started += 1
        return pod

    def end_pod(self, pod: SoakPod, now: float) -> None:
        for pid in pod.pids:
            self.end_process(pid, now)
        pod.pids.clear()
        self.api.delete(pod.spec.uid)  # DELETED on the watch
        del self.pods[pod.spec.name]
        self.slots[(pod.gpu, pod.replica)] = None
        self.ended_pods[pod.spec.name] = Ended(
            pod.spec.uid, pod.spec.container, now, self.kubelet.generation + 1
        )
        self.totals.pods_ended += 1

    # -- churn -------------------------------------------------------------------------------

    def churn(self, now: float) -> None:
        changed = False
        for pod in [p for p in self.pods.values() if p.ends_at <= now]:
            self.end_pod(pod, now)
            changed = True
        # Processes restart inside living pods (a new PID in the same container).
        for pod in self.pods.values():
            if pod.pids and self.rng.random() < self.args.process_restart:
                self.end_process(pod.pids.pop(self.rng.randrange(len(pod.pids))), now)
                if len(self.pods_pids_on(pod.gpu)) < MAX_PROCESSES_PER_GPU:
                    pod.pids.append(self.start_process(pod.gpu, pod.spec.cgroup()))
        # Host processes (no pod): a few come and go.
        for pid, ends_at in list(self.host_pids.items()):
            if ends_at <= now:
                del self.host_pids[pid]
                self.end_process(pid, now)
        if len(self.host_pids) < 3 and self.rng.random() < 0.3:
            gpu = self.rng.randrange(self.args.gpus)
            pid = self.start_process(gpu, self.rng.choice(HOST_CGROUPS), comm="ollama")
            self.host_pids[pid] = now + self.rng.uniform(5, 60)
            self.totals.host_processes_started += 1
        # Free replicas get new pods (most of them: the node is never quite full).
        for slot, name in list(self.slots.items()):
            if name is None and self.rng.random() < 0.7:
                self.start_pod(slot, now)
                changed = True
        if changed:
            self.publish_kubelet()

    def pods_pids_on(self, gpu: int) -> list[int]:
        return [pid for pid, g in self.live_pids.items() if g == gpu]

    def note_kubelet_answers(self) -> None:
        """Start the grace of ended pods the kubelet has now answered without."""
        while self.kubelet.answered:
            at, generation = self.kubelet.answered.popleft()
            self.totals.kubelet_lists += 1
            for ended in self.ended_pods.values():
                if ended.grace_from == math.inf and generation >= ended.generation:
                    ended.grace_from = at

    def prune(self, now: float) -> None:
        """Forget ended pods and processes long past their grace (bounded memory)."""
        keep = 10 * self.args.grace + 60
        self.ended_pods = {
            k: v for k, v in self.ended_pods.items()
            if v.grace_from == math.inf or now - v.grace_from < keep
        }
        self.ended_procs = {k: v for k, v in self.ended_procs.items() if now - v < keep}

    # -- faults ------------------------------------------------------------------------------

    def fault(self, kind: str, now: float) -> tuple[float, str] | None:
        """Start one fault; returns (when it ends, the undo action) when it lasts."""
        if kind == "gpu_lost":
            self.lost_gpu = self.rng.randrange(self.args.gpus)
            self.send(f"lost {self.lost_gpu} 1")
            self.totals.gpu_lost += 1
            return now + 5.0, "gpu_back"
        if kind == "xid":
            for _ in range(3):
                gpus = [g for g in range(self.args.gpus) if g != self.lost_gpu]
                self.send(f"xid {self.rng.choice(gpus)} {self.rng.choice(XID_CODES)}")
                self.totals.xid_events += 1
            return None
        if kind == "watch_close":  # the API server's timeoutSeconds: a clean end
            self.api.watch_actions.put(("close", None))
            self.totals.watch_closes += 1
            return None
        if kind == "relist_410":
            self.api.gone()
            self.api.watch_actions.put(("close", None))  # the handler that sent it ends
            self.totals.relists_410 += 1
            return None
        if kind == "kubelet_restart":
            self.kubelet_server.stop()
            self.kubelet_up = False
            self.totals.kubelet_restarts += 1
            return now + 3.0, "kubelet_back"
        if kind == "driver_reload":
            self.send("driver 0")
            self.driver_down = True
            self.totals.driver_reloads += 1
            return now + 4.0, "driver_back"
        raise ValueError(kind)

    def undo(self, action: str) -> None:
        if action == "gpu_back":
            self.send(f"lost {self.lost_gpu} 0")
            self.lost_gpu = None
        elif action == "kubelet_back":
            self.kubelet_server.start(self.kubelet)
            self.kubelet_up = True
        elif action == "driver_back":
            self.send("driver 1")
            self.driver_down = False


# ---------------------------------------------------------------------------------------------
# The exporter process


def start_exporter(node: Node, workdir: Path, args: argparse.Namespace,
                   port: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "bench.soak_exporter", "--gpus", str(args.gpus),
        "--driver-tick", str(args.driver_tick), "--",
        "--listen", f"127.0.0.1:{port}", "--interval", str(args.interval),
        "--kubelet-socket", str(node.socket_path), "--proc-root", str(node.proc_root),
        "--kubeconfig", str(node.kubeconfig), "--node-name", NODE, "--process-metrics",
        "--log-level", "info",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    if args.as_image:  # the exporter only; the harness runs as it is
        from bench.exporter_bench import IMAGE_ENV

        env.update(IMAGE_ENV)
    if args.tracemalloc:
        env["SOAK_TRACEMALLOC"] = str(args.tracemalloc)
    log = (workdir / "exporter.log").open("wb")
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    node.stdin = proc.stdin
    return proc


def stop_exporter(proc: subprocess.Popen[bytes]) -> int | None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Accept-Encoding": "identity"})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass
class ProcStat:
    rss_kib: int
    fds: int
    threads: int
    cpu_ticks: int


def read_proc(pid: int) -> ProcStat:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(
        rss_kib=rss,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=len(os.listdir(f"/proc/{pid}/task")),
        cpu_ticks=int(fields[11]) + int(fields[12]),
    )


def thread_ticks(pid: int, name: str) -> int:
    """CPU ticks (utime + stime) of the threads called ``name``."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if (task / "comm").read_text().strip() == name:
                text = (task / "stat").read_text()
                fields = text[text.rindex(")") + 2 :].split()
                total += int(fields[11]) + int(fields[12])
    return total


def thread_names(pid: int) -> dict[str, int]:
    names: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            name = (task / "comm").read_text().strip()
            names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))


Labels = dict[str, str]


def parse(text: str) -> dict[str, list[tuple[Labels, float]]]:
    out: dict[str, list[tuple[Labels, float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


@dataclass
class Check:
    container_series: int = 0  # container_gpu_* series naming a pod
    host_series: int = 0  # container_gpu_* series of host processes (no pod)
    pod_info_series: int = 0
    process_series: int = 0
    in_grace: int = 0  # series of ended pods/processes still within their grace
    stale: list[str] = field(default_factory=list)
    bound: int = 0  # what container_series may be at most now


def check(samples: dict[str, list[tuple[Labels, float]]], node: Node, at: float,
          grace: float) -> Check:
    """Every pod or process a series names is alive, or ended less than ``grace`` ago."""
    c = Check()

    def pod_ok(name: str, uid: str | None, container: str | None, what: str) -> None:
        pod = node.pods.get(name)
        if pod is not None:
            if (uid and uid != pod.spec.uid) or (container and container != pod.spec.container):
                c.stale.append(f"{what}: labels of another pod named {name}")
            return
        ended = node.ended_pods.get(name)
        if ended is not None and at - ended.grace_from <= grace:
            if (uid and uid != ended.uid) or (container and container != ended.container):
                c.stale.append(f"{what}: labels of another pod named {name}")
            c.in_grace += 1
            return
        how = "never existed" if ended is None else (
            f"ended {at - ended.ended_at:.1f} s ago, kubelet stopped listing it "
            f"{at - ended.grace_from:.1f} s ago")
        c.stale.append(f"{what} {name}: {how}")

    for family in CONTAINER_FAMILIES:
        for labels, _ in samples.get(family, ()):
            if not labels.get("pod"):
                c.host_series += 1
                continue
            c.container_series += 1
            pod_ok(labels["pod"], None, labels.get("container"), family)
    for labels, _ in samples.get("gpu_pod_info", ()):
        c.pod_info_series += 1
        pod_ok(labels["pod"], labels.get("uid"), None, "gpu_pod_info")
    gpu_index = {gpu_uuid(i): i for i in range(node.args.gpus)}
    for family in PROCESS_FAMILIES:
        for labels, _ in samples.get(family, ()):
            c.process_series += 1
            pid, gpu = int(labels["pid"]), gpu_index.get(labels.get("uuid", ""), -1)
            if node.live_pids.get(pid) == gpu:
                continue
            ended_at = node.ended_procs.get((pid, gpu))
            if ended_at is not None and at - ended_at <= grace:
                c.in_grace += 1
                continue
            c.stale.append(f"{family} pid {pid} on GPU {gpu}: not running there")
    in_grace_pods = sum(1 for e in node.ended_pods.values() if at - e.grace_from <= grace
                        or e.grace_from == math.inf)
    c.bound = len(CONTAINER_FAMILIES) * (len(node.pods) + in_grace_pods)
    return c


def value(samples: dict[str, list[tuple[Labels, float]]], name: str,
          **labels: str) -> float | None:
    for got, v in samples.get(name, ()):
        if all(got.get(k) == want for k, want in labels.items()):
            return v
    return None


@dataclass
class Point:
    t: float  # seconds since the exporter was ready
    rss_kib: int
    fds: int
    threads: int
    cpu_percent: float
    load1: float
    alive_pods: int
    alive_processes: int
    container_series: int
    container_bound: int
    host_series: int
    pod_info_series: int
    process_series: int
    in_grace: int
    stale: int
    missed_rounds: float
    scrape_ms: float

    @property
    def fds_beyond_processes(self) -> int:
        """Open fds less one per live GPU process: the PID resolver holds each process's
        ``stat`` file open while NVML lists it, so the raw count follows the churn of
        processes (47-78 over a run) and only what is left over can show a leak."""
        return self.fds - self.alive_processes


# ---------------------------------------------------------------------------------------------
# Statistics


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value), per hour."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return 0.0
    return sum((t - mt) * (v - mv) for t, v in points) / den * 3600.0


def stats(points: Sequence[Point], attr: str, warmup: float, duration: float) -> dict[str, Any]:
    after = [p for p in points if p.t >= warmup]
    series = [(p.t, float(getattr(p, attr))) for p in after]
    span = duration - warmup
    first = [v for t, v in series if t < warmup + span / 4]
    last = [v for t, v in series if t >= duration - span / 4]
    values = [v for _, v in series]
    return {
        "min": min(values, default=0), "max": max(values, default=0),
        "first_quarter_max": max(first, default=0), "last_quarter_max": max(last, default=0),
        "slope_per_hour": slope_per_hour(series),
    }


# ---------------------------------------------------------------------------------------------
# The run


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench/soak.py", description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    # 65 minutes: glibc's per-thread arenas take ~35 minutes of this churn to settle, so
    # the RSS slope of a 30-minute run's second half still measures the allocator warming
    # up (+3 MiB/h), not the exporter (docs/reliability.md#soak).
    p.add_argument("--duration", type=float, default=3900.0,
                   help="seconds of churn and measurement (default 3900)")
    p.add_argument("--interval", type=float, default=0.1, help="exporter --interval (0.1)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--replicas", type=int, default=4,
                   help="time-slicing replicas per GPU: pods alive at most (default 4)")
    p.add_argument("--churn-every", type=float, default=2.0, metavar="SECONDS")
    p.add_argument("--pod-lifetime", type=float, nargs=2, default=(6.0, 40.0),
                   metavar=("MIN", "MAX"), help="seconds, uniform (default 6 40)")
    p.add_argument("--process-restart", type=float, default=0.05,
                   help="chance per pod per churn step that a process restarts (0.05)")
    p.add_argument("--pid-reuse", type=float, default=0.3,
                   help="chance a new process gets a PID that just ended (0.3)")
    p.add_argument("--faults-every", type=float, default=60.0, metavar="SECONDS",
                   help=f"one fault every SECONDS, in turn: {', '.join(FAULTS)} (60; >= 6)")
    p.add_argument("--driver-tick", type=float, default=0.1,
                   help="seconds between the fake driver's per-process samples (0.1)")
    p.add_argument("--measure-every", type=float, default=10.0, metavar="SECONDS")
    p.add_argument("--warmup", type=float, default=None, metavar="SECONDS",
                   help="excluded from the fd/thread checks (default: 10%% of the run, "
                        "30 to 300 s)")
    p.add_argument("--grace", type=float, default=2.0, metavar="SECONDS",
                   help="how long after the kubelet stopped listing a pod (or NVML a "
                        "process) its series may remain (default 2 = 20 sampling intervals)")
    p.add_argument("--max-rss-slope", type=float, default=1024.0, metavar="KIB_PER_HOUR",
                   help="fail above this RSS slope over the second half (default 1024)")
    p.add_argument("--fd-tolerance", type=int, default=3)
    p.add_argument("--thread-tolerance", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, metavar="PATH", help="write figures and time series")
    p.add_argument("--as-image", action="store_true",
                   help="run the exporter with the exporter image's interpreter settings "
                        "(PYTHONOPTIMIZE=2, MALLOC_ARENA_MAX=2: bench/exporter_bench.py's "
                        "IMAGE_ENV); the soak's own kubelet and API server run as they are")
    p.add_argument("--tracemalloc", type=Path, metavar="FILE",
                   help="trace allocations in the exporter, top growth into FILE every 60 s "
                        "(diagnosis only: perturbs RSS and CPU)")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = p.parse_args(argv)
    # 6 s: ten times the default rate; a fault lasts up to 5 s, so two never overlap.
    if args.faults_every < 6:
        p.error("--faults-every must be >= 6 s (faults last up to 5 s)")
    if args.warmup is None:
        args.warmup = min(300.0, max(30.0, args.duration * 0.1))
    if args.duration <= args.warmup + 4 * args.measure_every:
        p.error(f"--duration must leave a few measurements after the warm-up: more than "
                f"{args.warmup + 4 * args.measure_every:g} s ({args.warmup:g} s of warm-up, "
                f"4 x --measure-every {args.measure_every:g} s)")
    if not 0 < args.pod_lifetime[0] <= args.pod_lifetime[1]:
        p.error("--pod-lifetime needs 0 < MIN <= MAX")
    if args.replicas * 3 > MAX_PROCESSES_PER_GPU:
        p.error(f"--replicas at most {MAX_PROCESSES_PER_GPU // 3}")
    return args


def wait_ready(proc: subprocess.Popen[bytes], port: int, node: Node, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited with {proc.returncode}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            if http_get(port, "/readyz", 1.0)[0] == 200:
                return
        node.note_kubelet_answers()
        time.sleep(0.1)
    raise RuntimeError(f"the exporter was not ready within {timeout:.0f} s")


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    node = Node(workdir, args, rng)
    node.start()
    port = free_port()
    proc = start_exporter(node, workdir, args, port)
    try:
        return _run(args, node, proc, port, workdir)
    finally:
        node.stdin = None
        with contextlib.suppress(OSError):
            proc.stdin.close()  # type: ignore[union-attr]
        code = stop_exporter(proc)
        node.stop()
        if code not in (0, None):
            print(f"soak: the exporter exited with {code}", file=sys.stderr)


def _run(args: argparse.Namespace, node: Node, proc: subprocess.Popen[bytes], port: int,
         workdir: Path) -> dict[str, Any]:
    wait_ready(proc, port, node, 60.0)
    pid = proc.pid
    t0 = time.monotonic()
    end = t0 + args.duration
    points: list[Point] = []
    stale_examples: list[str] = []
    stale_total = 0
    scrape_failures = 0
    last = read_proc(pid)
    last_at = t0
    driver_ticks = thread_ticks(pid, DRIVER_THREAD_NAME)
    first_threads = thread_names(pid)
    next_churn = t0
    next_measure = t0 + args.measure_every
    next_fault = t0 + args.faults_every
    fault_n = 0
    undo: tuple[float, str] | None = None
    loads: list[float] = []
    samples: dict[str, list[tuple[Labels, float]]] = {}
    print(f"soak: exporter pid {pid} on 127.0.0.1:{port}, {args.duration:.0f} s, "
          f"{args.gpus} GPUs x {args.replicas} replicas, work dir {workdir}", flush=True)
    while True:
        now = time.monotonic()
        if proc.poll() is not None:
            raise RuntimeError(f"the exporter exited with {proc.returncode} during the soak")
        node.note_kubelet_answers()
        if undo is not None and now >= undo[0]:
            node.undo(undo[1])
            undo = None
        if now >= end:
            break
        if now >= next_churn:
            node.churn(now)
            node.prune(now)
            next_churn += args.churn_every
        if undo is None and now >= next_fault:
            undo = node.fault(FAULTS[fault_n % len(FAULTS)], now)
            fault_n += 1
            next_fault += args.faults_every
        if now >= next_measure:
            next_measure += args.measure_every
            stat = read_proc(pid)
            cpu = (stat.cpu_ticks - last.cpu_ticks) / CLK_TCK / (now - last_at) * 100
            last, last_at = stat, now
            load1 = os.getloadavg()[0]
            loads.append(load1)
            started = time.monotonic()
            try:
                status, text = http_get(port, "/metrics")
            except (OSError, http.client.HTTPException) as exc:
                scrape_failures += 1
                print(f"soak: scrape failed: {exc}", file=sys.stderr)
                continue
            scrape_ms = (time.monotonic() - started) * 1000
            if status != 200:
                scrape_failures += 1
                continue
            node.note_kubelet_answers()
            samples = parse(text)
            c = check(samples, node, started, args.grace)
            stale_total += len(c.stale)
            for s in c.stale:
                if len(stale_examples) < 50:
                    stale_examples.append(f"t={started - t0:.0f}s {s}")
                print(f"soak: STALE t={started - t0:.0f}s {s}", file=sys.stderr)
            missed = value(samples, "gpu_exporter_missed_rounds_total") or 0.0
            point = Point(
                t=round(now - t0, 1), rss_kib=stat.rss_kib, fds=stat.fds, threads=stat.threads,
                cpu_percent=round(cpu, 1), load1=load1, alive_pods=len(node.pods),
                alive_processes=len(node.live_pids), container_series=c.container_series,
                container_bound=c.bound, host_series=c.host_series,
                pod_info_series=c.pod_info_series, process_series=c.process_series,
                in_grace=c.in_grace, stale=len(c.stale), missed_rounds=missed,
                scrape_ms=round(scrape_ms, 1),
            )
            points.append(point)
            print(f"soak: t={point.t:6.0f}s rss={stat.rss_kib} KiB fds={stat.fds} "
                  f"threads={stat.threads} cpu={cpu:.0f}% pods={len(node.pods)} "
                  f"series={c.container_series}/{c.bound} stale={len(c.stale)} "
                  f"load={load1:.2f} started={node.totals.pods_started}", flush=True)
            continue
        wake = min(next_churn, next_measure, next_fault, end,
                   undo[0] if undo is not None else end)
        time.sleep(max(0.0, min(wake - time.monotonic(), 0.25)))
    elapsed = time.monotonic() - t0
    driver_cpu = (thread_ticks(pid, DRIVER_THREAD_NAME) - driver_ticks) / CLK_TCK / elapsed * 100
    result = summarize(args, node, pid, points, samples, stale_total, stale_examples,
                       scrape_failures, loads, first_threads, workdir)
    result["fake_driver_thread_cpu_percent"] = round(driver_cpu, 1)
    return result


def summarize(args: argparse.Namespace, node: Node, pid: int, points: list[Point],
              samples: dict[str, list[tuple[Labels, float]]], stale_total: int,
              stale_examples: list[str], scrape_failures: int, loads: list[float],
              first_threads: dict[str, int], workdir: Path) -> dict[str, Any]:
    duration, warmup = args.duration, args.warmup
    second_half = [(p.t, float(p.rss_kib)) for p in points if p.t >= max(duration / 2, warmup)]
    rss_slope = slope_per_hour(second_half)
    fds = stats(points, "fds", warmup, duration)
    fds_net = stats(points, "fds_beyond_processes", warmup, duration)
    threads = stats(points, "threads", warmup, duration)
    errors = {labels["collector"]: v
              for labels, v in samples.get("gpu_exporter_collector_errors_total", ())}
    dropped = {labels.get("family", ""): v
               for labels, v in samples.get("gpu_exporter_series_dropped_total", ())}
    log_text = (workdir / "exporter.log").read_text(errors="replace")
    over_bound = sum(1 for p in points if p.container_series > p.container_bound)
    failures: list[str] = []
    if stale_total:
        failures.append(f"{stale_total} stale series")
    if over_bound:
        failures.append(f"container series above the live-pod bound in {over_bound} scrapes")
    if fds_net["last_quarter_max"] > fds_net["first_quarter_max"] + args.fd_tolerance:
        failures.append("open fds grew")
    if threads["last_quarter_max"] > threads["first_quarter_max"] + args.thread_tolerance:
        failures.append("threads grew")
    if rss_slope > args.max_rss_slope:
        failures.append(f"RSS slope {rss_slope:.0f} KiB/h > {args.max_rss_slope:.0f}")
    if scrape_failures:
        failures.append(f"{scrape_failures} failed scrapes")
    tracebacks = log_text.count("Traceback")
    if tracebacks:
        failures.append(f"{tracebacks} tracebacks in the exporter's log")
    rss_after_warmup = next((p.rss_kib for p in points if p.t >= warmup), 0)
    return {
        "verdict": "fail" if failures else "pass",
        "failures": failures,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "exporter_pid": pid,
        "rss_kib": {
            "after_warmup": rss_after_warmup, "end": points[-1].rss_kib if points else 0,
            "max": max((p.rss_kib for p in points), default=0),
            "slope_kib_per_hour_second_half": round(rss_slope, 1),
            "slope_kib_per_hour_after_warmup": round(slope_per_hour(
                [(p.t, float(p.rss_kib)) for p in points if p.t >= warmup]), 1),
        },
        "fds": fds,
        "fds_beyond_processes": fds_net,
        "threads": threads,
        "thread_names": {"start": first_threads, "end": thread_names(pid)},
        "cpu_percent_mean": round(sum(p.cpu_percent for p in points) / max(1, len(points)), 1),
        "load1": {"mean": round(sum(loads) / max(1, len(loads)), 2),
                  "max": round(max(loads, default=0.0), 2)},
        "totals": asdict(node.totals),
        "distinct_pods": node.totals.pods_started,
        "distinct_processes": node.totals.processes_started,
        "stale_series": stale_total,
        "stale_examples": stale_examples,
        "container_series_max": max((p.container_series for p in points), default=0),
        "process_series_max": max((p.process_series for p in points), default=0),
        "scrapes": len(points),
        "scrape_failures": scrape_failures,
        "scrape_ms_max": max((p.scrape_ms for p in points), default=0.0),
        "collector_errors_total": errors,
        "series_dropped_total": dropped,
        "missed_rounds": value(samples, "gpu_exporter_missed_rounds_total"),
        "unnamed_processes_end": value(samples, "gpu_exporter_attribution_unnamed_processes"),
        "exporter_log": {"warnings": log_text.count(" WARNING "),
                         "errors": log_text.count(" ERROR "), "tracebacks": tracebacks},
        "series": [asdict(p) for p in points],
    }


def print_report(r: dict[str, Any]) -> None:
    t, rss, fds, th = r["totals"], r["rss_kib"], r["fds"], r["threads"]
    fn = r["fds_beyond_processes"]
    s = r["settings"]
    rows = [
        ("duration", f"{s['duration']:.0f} s (warm-up {s['warmup']:.0f} s), interval "
                     f"{s['interval']} s, {s['gpus']} GPUs x {s['replicas']} replicas"),
        ("RSS", f"{rss['after_warmup']} KiB after warm-up, {rss['end']} KiB at the end, "
                f"max {rss['max']} KiB"),
        ("RSS slope (2nd half)", f"{rss['slope_kib_per_hour_second_half']:+.0f} KiB/h "
                                 f"(limit {s['max_rss_slope']:.0f})"),
        ("open fds", f"min {fds['min']:.0f}, max {fds['max']:.0f}, first/last quarter max "
                     f"{fds['first_quarter_max']:.0f}/{fds['last_quarter_max']:.0f}, slope "
                     f"{fds['slope_per_hour']:+.1f}/h"),
        ("  beyond 1 per process", f"min {fn['min']:.0f}, max {fn['max']:.0f}, first/last quarter "
                                   f"max {fn['first_quarter_max']:.0f}/"
                                   f"{fn['last_quarter_max']:.0f} (the gate), slope "
                                   f"{fn['slope_per_hour']:+.1f}/h"),
        ("threads", f"min {th['min']:.0f}, max {th['max']:.0f}, first/last quarter max "
                    f"{th['first_quarter_max']:.0f}/{th['last_quarter_max']:.0f}, slope "
                    f"{th['slope_per_hour']:+.1f}/h"),
        ("CPU (exporter)", f"{r['cpu_percent_mean']:.1f} % of one core, mean (of which the "
                           f"fake driver thread {r['fake_driver_thread_cpu_percent']:.1f} %)"),
        ("load average (1 min)", f"mean {r['load1']['mean']}, max {r['load1']['max']}"),
        ("pods started / ended", f"{t['pods_started']} / {t['pods_ended']}"),
        ("processes started / ended", f"{t['processes_started']} / {t['processes_ended']} "
                                      f"({t['pid_reuses']} PID reuses, "
                                      f"{t['host_processes_started']} host)"),
        ("faults", f"{t['gpu_lost']} GPU lost, {t['xid_events']} XID, {t['kubelet_restarts']} "
                   f"kubelet restarts, {t['watch_closes']} watch ends, {t['relists_410']} "
                   f"410 relists, {t['driver_reloads']} driver reloads"),
        ("kubelet List() answered", str(t["kubelet_lists"])),
        ("scrapes (failed)", f"{r['scrapes']} ({r['scrape_failures']}), max "
                             f"{r['scrape_ms_max']:.0f} ms"),
        ("container series max", f"{r['container_series_max']} (process series max "
                                 f"{r['process_series_max']})"),
        ("stale series", str(r["stale_series"])),
        ("collector errors", ", ".join(f"{k}={v:.0f}" for k, v in
                                       sorted(r["collector_errors_total"].items())) or "-"),
        ("missed rounds", f"{r['missed_rounds'] or 0:.0f}"),
        ("exporter log", f"{r['exporter_log']['warnings']} warnings, "
                         f"{r['exporter_log']['errors']} errors, "
                         f"{r['exporter_log']['tracebacks']} tracebacks"),
        ("verdict", r["verdict"].upper() + (": " + "; ".join(r["failures"])
                                             if r["failures"] else "")),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="gpuscope-soak-"))  # short: a unix socket inside
    try:
        with sigterm_as_exit():
            try:
                result = run(args, workdir)
            except RuntimeError as exc:
                print(f"soak: error: {exc}", file=sys.stderr)
                with contextlib.suppress(OSError):
                    tail = (workdir / "exporter.log").read_text(errors="replace")
                    print("\n".join(tail.splitlines()[-30:]), file=sys.stderr)
                return 2
    finally:
        if args.keep:
            print(f"soak: work directory kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"soak: figures and time series written to {args.json}")
    return 1 if result["failures"] else 0


if __name__ == "__main__":
    threading.current_thread().name = "soak"
    sys.exit(main())
