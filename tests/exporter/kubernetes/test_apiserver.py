"""Pod and node metadata from the API server, against a fake API server over real HTTP(S).

The fake serves what the watcher asks a real API server for: ``GET /api/v1/pods`` lists
(field selector honoured, ``limit``/``continue`` pagination), watches as chunked JSON lines
(ADDED, MODIFIED, DELETED, BOOKMARK, ERROR 410, a clean end or a dropped connection), and
``GET /api/v1/nodes/<name>``. It checks the bearer token like the API server does (401).
Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import yaml

from gpuscope.exporter.kubernetes import apiserver as kube
from gpuscope.exporter.kubernetes.apiserver import (
    KubeConfig,
    KubeConfigError,
    MetadataDisabled,
    NodeInfo,
    OwnerRef,
    PodMetadataWatcher,
    derive_workload,
    in_cluster_config,
    load_config,
    load_kubeconfig,
    node_info_from_labels,
    pod_from_json,
)
from tests.pki import TestCA

NODE = "ip-10-0-12-34.ec2.internal"
OTHER_NODE = "ip-10-0-99-1.ec2.internal"
TOKEN = "eyJhbGciOiJSUzI1NiIsImtpZCI6InRlc3QifQ.sa-token-1"
CID = [
    "4f1c9a2be8d7c6b5a49382716f5e4d3c2b1a0f9e8d7c6b5a4938271605f4e3d2",
    "a3e2c1d0b9f8e7d6c5b4a3928170f6e5d4c3b2a1908f7e6d5c4b3a2918071f6e",
    "0b7d5e3f1a9c8b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d",
    "e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8",
    "5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d",
]
UID_A = "7c3b5a1e-9f2d-4c8b-a1e3-5d6f7a8b9c0d"
UID_B = "2f8e6d4c-1b3a-4e5f-9a7b-c8d6e4f2a0b1"
UID_C = "b5d9e1f3-7a2c-4d6e-8f0a-1c3e5a7b9d2f"
UID_OTHER = "e04c7a39-5b1d-4f8e-a6c2-3d9b0f7e1a54"

NODE_LABELS = {
    "kubernetes.io/hostname": NODE,
    "node.kubernetes.io/instance-type": "p4d.24xlarge",
    "topology.kubernetes.io/zone": "us-east-1a",
    "eks.amazonaws.com/capacityType": "SPOT",
    "nvidia.com/gpu.present": "true",
}


def pod_json(
    name: str,
    uid: str,
    *,
    node: str = NODE,
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
    containers: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """A Pod object as the API server returns it (the parts the watcher reads, plus noise)."""
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1",
            "creationTimestamp": "2026-07-20T10:00:00Z",
            "labels": labels or {},
            "ownerReferences": owners or [],
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-07-20T09:59:00Z"},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": n, "image": "nvcr.io/nvidia/pytorch:24.05-py3"} for n, _ in containers
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.12.77",
            "containerStatuses": [
                {
                    "name": n,
                    "containerID": f"containerd://{cid}",
                    "ready": True,
                    "restartCount": 0,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                }
                for n, cid in containers
            ],
        },
    }


def rs_owner(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": name,
        "uid": "0d9a8c1e-3f4b-4a5c-9d6e-7f8a9b0c1d2e",
        "controller": True,
        "blockOwnerDeletion": True,
    }


# --------------------------------------------------------------------------------------
# Fake API server
# --------------------------------------------------------------------------------------


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


class FakeApi:
    """A minimal API server: pods (list, watch), nodes (get), bearer-token auth."""

    def __init__(self, *, port: int = 0, tls: ssl.SSLContext | None = None) -> None:
        self.port = port
        self.tls = tls
        self.token: str | None = TOKEN
        self.pods: dict[str, dict[str, Any]] = {}
        self.node_labels = dict(NODE_LABELS)
        self.rv = 1000
        self.seen: list[Seen] = []
        self.unauthorized = 0
        self.watch_actions: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.watch_statuses: list[int] = []  # answer the next watch requests with these
        self.list_gate: threading.Event | None = None  # set → list requests wait on it
        self.watch_connection_close = False  # answer watches with "Connection: close"
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None

    # -- state changes -----------------------------------------------------------------

    def _bump(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        pod = json.loads(json.dumps(pod))
        pod["metadata"]["resourceVersion"] = str(self.rv)
        return pod

    def put(self, pod: dict[str, Any], event: str | None = None) -> None:
        with self.lock:
            pod = self._bump(pod)
            self.pods[pod["metadata"]["uid"]] = pod
        if event:
            self.watch_actions.put(("event", {"type": event, "object": pod}))

    def delete(self, uid: str, event: bool = True) -> None:
        with self.lock:
            pod = self._bump(self.pods.pop(uid))
        if event:
            self.watch_actions.put(("event", {"type": "DELETED", "object": pod}))

    def bookmark(self, rv: str) -> None:
        self.watch_actions.put(
            (
                "event",
                {
                    "type": "BOOKMARK",
                    "object": {
                        "kind": "Pod",
                        "apiVersion": "v1",
                        "metadata": {
                            "resourceVersion": rv,
                            "annotations": {"k8s.io/initial-events-end": "true"},
                        },
                    },
                },
            )
        )

    def gone(self) -> None:
        self.watch_actions.put(
            (
                "event",
                {
                    "type": "ERROR",
                    "object": {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": "too old resource version: 1001 (1500)",
                        "reason": "Expired",
                        "code": 410,
                    },
                },
            )
        )

    # -- requests seen -----------------------------------------------------------------

    def lists(self) -> list[Seen]:
        with self.lock:
            return [
                s for s in self.seen if s.path == "/api/v1/pods" and s.query.get("watch") != "1"
            ]

    def watches(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.query.get("watch") == "1"]

    def node_gets(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.path.startswith("/api/v1/nodes/")]

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> FakeApi:
        self.stopping.clear()
        httpd = _QuietServer(("127.0.0.1", self.port), _handler(self))
        httpd.daemon_threads = True
        if self.tls is not None:
            httpd.socket = self.tls.wrap_socket(httpd.socket, server_side=True)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        """Go down: refuse new connections and break the streams in flight."""
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that aborts (stop(), read timeouts) leaves the handler writing to a
        # closed socket: expected here. Anything else is a bug in the fake: show it.
        if not isinstance(sys.exc_info()[1], (ConnectionError, ssl.SSLError)):
            super().handle_error(request, client_address)


def _handler(api: FakeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # chunked transfer for watches

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, doc: dict[str, Any]) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._json(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": message,
                    "reason": reason,
                    "code": code,
                },
            )

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            with api.lock:
                api.seen.append(Seen(url.path, query, dict(self.headers.items())))
            if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
                with api.lock:
                    api.unauthorized += 1
                self._status(401, "Unauthorized", "Unauthorized")
                return
            if url.path == "/api/v1/pods":
                selector = query.get("fieldSelector", "")
                node = selector.removeprefix("spec.nodeName=") if selector else None
                if query.get("watch") == "1":
                    self._watch(query)
                else:
                    self._list(query, node)
            elif url.path.startswith("/api/v1/nodes/"):
                name = urllib.parse.unquote(url.path.rsplit("/", 1)[1])
                if name != NODE:
                    self._status(404, "NotFound", f'nodes "{name}" not found')
                    return
                self._json(
                    200,
                    {
                        "kind": "Node",
                        "apiVersion": "v1",
                        "metadata": {
                            "name": NODE,
                            "uid": "5d1c9e2f-0a3b-4c5d-8e6f-7a8b9c0d1e2f",
                            "labels": api.node_labels,
                        },
                        "status": {"capacity": {"nvidia.com/gpu": "8"}},
                    },
                )
            else:
                self._status(404, "NotFound", "the server could not find the requested resource")

        def _list(self, query: dict[str, str], node: str | None) -> None:
            if api.list_gate is not None:
                api.list_gate.wait(10)
            with api.lock:
                items = [
                    p for p in api.pods.values() if node is None or p["spec"]["nodeName"] == node
                ]
                rv = str(api.rv)
            start = int(query.get("continue", "0"))
            limit = int(query.get("limit", "0")) or len(items) or 1
            page = items[start : start + limit]
            meta: dict[str, Any] = {"resourceVersion": rv}
            if start + limit < len(items):
                meta["continue"] = str(start + limit)
            self._json(
                200, {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page}
            )

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _watch(self, query: dict[str, str]) -> None:
            with api.lock:
                status = api.watch_statuses.pop(0) if api.watch_statuses else None
            if status == 410:
                self._status(410, "Expired", "too old resource version")
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            if api.watch_connection_close:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
            while True:
                if api.stopping.is_set():
                    self._drop()
                    return
                try:
                    action, arg = api.watch_actions.get(timeout=0.02)
                except queue.Empty:
                    continue
                if action == "event":
                    self._chunk(json.dumps(arg).encode() + b"\n")
                elif action == "close":  # the server's timeoutSeconds: a clean end
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    self.close_connection = True
                    return
                elif action == "drop":  # connection lost mid-stream
                    self._drop()
                    return

        def _drop(self) -> None:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


@pytest.fixture
def api() -> Iterator[FakeApi]:
    server = FakeApi().start()
    yield server
    server.stop()


def wait_until(pred: Callable[[], bool], timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or pred}")


def make_watcher(url: str, **kw: Any) -> PodMetadataWatcher:
    config = kw.pop("config", None) or KubeConfig(server=url, source="test", token=TOKEN)
    defaults: dict[str, Any] = dict(
        request_timeout_s=2.0,
        backoff_initial_s=0.02,
        backoff_max_s=0.2,
        node_retry_s=0.05,
    )
    defaults.update(kw)
    return PodMetadataWatcher(config, NODE, **defaults)


@pytest.fixture
def watcher_factory() -> Iterator[Callable[..., PodMetadataWatcher]]:
    made: list[PodMetadataWatcher] = []

    def factory(url: str, **kw: Any) -> PodMetadataWatcher:
        w = make_watcher(url, **kw)
        made.append(w)
        w.start()
        return w

    yield factory
    for w in made:
        w.stop(2.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------------------
# Workload derivation, pod parsing, node labels (pure)
# --------------------------------------------------------------------------------------


def owner(kind: str, name: str, api_version: str, controller: bool = True) -> OwnerRef:
    return OwnerRef(api_version, kind, name, "1f2e3d4c-5b6a-4798-8a9b-0c1d2e3f4a5b", controller)


WORKLOADS: list[tuple[str, list[OwnerRef], dict[str, str], str]] = [
    (
        "deployment",
        [owner("ReplicaSet", "llm-serve-7d9f8b6c5d", "apps/v1")],
        {"app": "llm-serve", "pod-template-hash": "7d9f8b6c5d"},
        "Deployment/llm-serve",
    ),
    (
        "deployment-dashed-name",
        [owner("ReplicaSet", "vllm-llama-3-70b-5f6c7d8e9", "apps/v1")],
        {"pod-template-hash": "5f6c7d8e9"},
        "Deployment/vllm-llama-3-70b",
    ),
    (
        "replicaset-alone",
        [owner("ReplicaSet", "standalone-rs", "apps/v1")],
        {"pod-template-hash": "abc12"},
        "ReplicaSet/standalone-rs",
    ),
    (
        "argo-rollout",
        [owner("ReplicaSet", "canary-api-6b8d9f7c4", "apps/v1")],
        {"rollouts-pod-template-hash": "6b8d9f7c4"},
        "Rollout/canary-api",
    ),
    (
        "cronjob",
        [owner("Job", "nightly-finetune-29417280", "batch/v1")],
        {"batch.kubernetes.io/job-name": "nightly-finetune-29417280"},
        "CronJob/nightly-finetune",
    ),
    (
        "job-with-date-suffix",
        [owner("Job", "train-20240101", "batch/v1")],
        {"job-name": "train-20240101"},
        "Job/train-20240101",
    ),
    ("job", [owner("Job", "eval-bert", "batch/v1")], {}, "Job/eval-bert"),
    (
        "jobset",
        [owner("Job", "llama-pretrain-workers-0", "batch/v1")],
        {
            "jobset.sigs.k8s.io/jobset-name": "llama-pretrain",
            "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        },
        "JobSet/llama-pretrain",
    ),
    (
        "jobset-owner",
        [owner("JobSet", "llama-pretrain", "jobset.x-k8s.io/v1alpha2")],
        {},
        "JobSet/llama-pretrain",
    ),
    (
        "pytorchjob-owner",
        [owner("PyTorchJob", "ddp-run", "kubeflow.org/v1")],
        {
            "training.kubeflow.org/job-name": "ddp-run",
            "training.kubeflow.org/replica-type": "worker",
        },
        "PyTorchJob/ddp-run",
    ),
    (
        "pytorchjob-label-only",
        [],
        {
            "training.kubeflow.org/job-name": "ddp-run",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
        },
        "PyTorchJob/ddp-run",
    ),
    ("pytorchjob-old-label", [], {"pytorch-job-name": "old-ddp"}, "PyTorchJob/old-ddp"),
    (
        "mpijob-launcher-job",
        [owner("Job", "allreduce-launcher", "batch/v1")],
        {
            "training.kubeflow.org/job-name": "allreduce",
            "training.kubeflow.org/operator-name": "mpi-operator",
        },
        "MPIJob/allreduce",
    ),
    (
        "raycluster-owner",
        [owner("RayCluster", "rc-a100", "ray.io/v1")],
        {"ray.io/cluster": "rc-a100", "ray.io/node-type": "worker"},
        "RayCluster/rc-a100",
    ),
    ("raycluster-label-only", [], {"ray.io/cluster": "rc-a100"}, "RayCluster/rc-a100"),
    (
        "statefulset",
        [owner("StatefulSet", "triton", "apps/v1")],
        {"statefulset.kubernetes.io/pod-name": "triton-0"},
        "StatefulSet/triton",
    ),
    (
        "leaderworkerset",
        [owner("StatefulSet", "vllm-405b-0", "apps/v1")],
        {"leaderworkerset.sigs.k8s.io/name": "vllm-405b"},
        "LeaderWorkerSet/vllm-405b",
    ),
    (
        "daemonset",
        [owner("DaemonSet", "nvidia-device-plugin", "apps/v1")],
        {},
        "DaemonSet/nvidia-device-plugin",
    ),
    ("static-pod", [owner("Node", NODE, "v1")], {"tier": "control-plane"}, ""),
    (
        "volcano-job-no-cron-heuristic",
        [owner("Job", "sweep-29417280", "batch.volcano.sh/v1alpha1")],
        {"volcano.sh/job-name": "sweep-29417280"},
        "Job/sweep-29417280",
    ),
    (
        "controller-owner-wins",
        [owner("ConfigMap", "x", "v1", controller=False), owner("StatefulSet", "db", "apps/v1")],
        {},
        "StatefulSet/db",
    ),
    (
        "orphaned-job-pod",
        [],
        {
            "batch.kubernetes.io/job-name": "orphan-job",
            "batch.kubernetes.io/controller-uid": "9c8b7a6d",
        },
        "Job/orphan-job",
    ),
    ("bare-pod", [], {"app": "debug"}, ""),
]


@pytest.mark.parametrize(
    ("owners", "labels", "expected"), [w[1:] for w in WORKLOADS], ids=[w[0] for w in WORKLOADS]
)
def test_derive_workload(owners: list[OwnerRef], labels: dict[str, str], expected: str) -> None:
    assert derive_workload(owners, labels) == expected


def test_pod_from_json_container_map() -> None:
    obj = pod_json(
        "ddp-run-worker-0",
        UID_A,
        labels={"training.kubeflow.org/job-name": "ddp-run"},
        owners=[
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "ddp-run",
                "uid": "3a4b5c6d-7e8f-4a0b-9c1d-2e3f4a5b6c7d",
                "controller": True,
            }
        ],
        containers=[("pytorch", CID[0])],
    )
    status = obj["status"]
    status["containerStatuses"].append(
        {  # a sidecar restarted: both IDs map to its name
            "name": "metrics",
            "containerID": f"cri-o://{CID[1]}",
            "lastState": {"terminated": {"exitCode": 137, "containerID": f"cri-o://{CID[2]}"}},
        }
    )
    status["containerStatuses"].append({"name": "waiting", "state": {"waiting": {}}})
    status["initContainerStatuses"] = [
        {"name": "fetch-weights", "containerID": f"docker://{CID[3]}"}
    ]
    status["ephemeralContainerStatuses"] = [
        {"name": "debugger-x7k2p", "containerID": f"containerd://{CID[4]}"}
    ]
    pod = pod_from_json(obj)
    assert pod is not None
    assert (pod.uid, pod.namespace, pod.name) == (UID_A, "ml", "ddp-run-worker-0")
    assert pod.workload == "PyTorchJob/ddp-run"
    assert dict(pod.containers) == {
        CID[0]: "pytorch",
        CID[1]: "metrics",
        CID[2]: "metrics",
        CID[3]: "fetch-weights",
        CID[4]: "debugger-x7k2p",
    }
    assert pod.owners[0].kind == "PyTorchJob" and pod.owners[0].controller
    assert pod.labels["training.kubeflow.org/job-name"] == "ddp-run"
    with pytest.raises(TypeError):
        pod.labels["x"] = "y"  # type: ignore[index]
    assert pod_from_json({"metadata": {"name": "no-uid"}}) is None


NODES: list[tuple[str, dict[str, str], NodeInfo]] = [
    ("eks-spot", NODE_LABELS, NodeInfo("p4d.24xlarge", "us-east-1a", "spot")),
    (
        "eks-on-demand",
        {
            "node.kubernetes.io/instance-type": "g5.xlarge",
            "topology.kubernetes.io/zone": "us-west-2b",
            "eks.amazonaws.com/capacityType": "ON_DEMAND",
        },
        NodeInfo("g5.xlarge", "us-west-2b", "on-demand"),
    ),
    ("karpenter-spot", {"karpenter.sh/capacity-type": "spot"}, NodeInfo("", "", "spot")),
    (
        "karpenter-on-demand",
        {"karpenter.sh/capacity-type": "on-demand"},
        NodeInfo("", "", "on-demand"),
    ),
    (
        "karpenter-reserved",
        {"karpenter.sh/capacity-type": "reserved"},
        NodeInfo("", "", "on-demand"),
    ),
    (
        "gke-spot",
        {
            "cloud.google.com/gke-spot": "true",
            "cloud.google.com/gke-nodepool": "a3-spot",
            "node.kubernetes.io/instance-type": "a3-highgpu-8g",
            "topology.kubernetes.io/zone": "us-central1-a",
        },
        NodeInfo("a3-highgpu-8g", "us-central1-a", "spot"),
    ),
    ("gke-preemptible", {"cloud.google.com/gke-preemptible": "true"}, NodeInfo("", "", "spot")),
    ("gke-regular", {"cloud.google.com/gke-nodepool": "a2-pool"}, NodeInfo("", "", "on-demand")),
    (
        "aks-spot",
        {
            "kubernetes.azure.com/scalesetpriority": "spot",
            "kubernetes.azure.com/agentpool": "gpuspot",
        },
        NodeInfo("", "", "spot"),
    ),
    (
        "aks-regular",
        {
            "kubernetes.azure.com/agentpool": "gpu",
            "node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4",
        },
        NodeInfo("Standard_NC24ads_A100_v4", "", "on-demand"),
    ),
    (
        "beta-labels",
        {
            "beta.kubernetes.io/instance-type": "p3.8xlarge",
            "failure-domain.beta.kubernetes.io/zone": "eu-west-1c",
        },
        NodeInfo("p3.8xlarge", "eu-west-1c", ""),
    ),
    ("unknown", {"kubernetes.io/hostname": "bare-metal-7"}, NodeInfo("", "", "")),
]


@pytest.mark.parametrize(("labels", "expected"), [n[1:] for n in NODES], ids=[n[0] for n in NODES])
def test_node_info_from_labels(labels: dict[str, str], expected: NodeInfo) -> None:
    assert node_info_from_labels(labels) == expected


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def write_kubeconfig(
    path: Path, server: str, user: dict[str, Any], cluster_extra: dict[str, Any] | None = None
) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "gpu-admin@prod",
        "clusters": [
            {"name": "staging", "cluster": {"server": "https://staging.invalid"}},
            {"name": "prod", "cluster": {"server": server, **(cluster_extra or {})}},
        ],
        "contexts": [
            {
                "name": "gpu-admin@prod",
                "context": {"cluster": "prod", "user": "gpu-admin", "namespace": "ml"},
            }
        ],
        "users": [
            {"name": "someone-else", "user": {"token": "wrong"}},
            {"name": "gpu-admin", "user": user},
        ],
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_token_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "certs").mkdir()
    path = write_kubeconfig(
        tmp_path / "config",
        "https://api.prod.example:6443",
        {
            "tokenFile": "certs/token",
            "client-certificate": "certs/c.crt",
            "client-key": "/abs/c.key",
        },
        {"certificate-authority": "certs/ca.crt"},
    )
    cfg = load_kubeconfig(str(path))
    assert cfg.server == "https://api.prod.example:6443"
    assert cfg.ca_file == str(tmp_path / "certs" / "ca.crt")
    assert cfg.token_file == str(tmp_path / "certs" / "token")
    assert cfg.client_cert_file == str(tmp_path / "certs" / "c.crt")
    assert cfg.client_key_file == "/abs/c.key"
    assert cfg.token is None
    assert "gpu-admin@prod" in cfg.source


def test_kubeconfig_data_fields_and_insecure(tmp_path: Path) -> None:
    import base64

    def b64(s: str) -> str:
        return base64.b64encode(s.encode()).decode()

    path = write_kubeconfig(
        tmp_path / "config",
        "https://10.0.0.1",
        {"token": " abc \n", "client-certificate-data": b64("CERT"), "client-key-data": b64("KEY")},
        {
            "certificate-authority-data": b64("-----BEGIN CERTIFICATE-----"),
            "insecure-skip-tls-verify": True,
        },
    )
    cfg = load_kubeconfig(str(path))
    assert cfg.token == "abc"
    assert cfg.ca_data == "-----BEGIN CERTIFICATE-----"
    assert cfg.client_cert_data == b"CERT" and cfg.client_key_data == b"KEY"
    assert cfg.insecure_skip_tls_verify


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("current-context"), "no current-context"),
        (lambda d: d.update({"current-context": "nope"}), "no context named 'nope'"),
        (
            lambda d: d["users"][1].update({"user": {"auth-provider": {"name": "oidc"}}}),
            "auth-provider is not supported",
        ),
        (
            lambda d: d["clusters"][1]["cluster"].update(
                {"certificate-authority-data": "not base64!"}
            ),
            "not valid base64",
        ),
    ],
)
def test_kubeconfig_errors(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], Any], message: str
) -> None:
    path = write_kubeconfig(tmp_path / "config", "https://x", {"token": "t"})
    doc = yaml.safe_load(path.read_text())
    mutate(doc)
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(KubeConfigError, match=message):
        load_config(str(path))
    with pytest.raises(KubeConfigError, match="kubeconfig"):
        load_config(str(tmp_path / "missing"))


def test_in_cluster_and_disabled(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    env = {"KUBERNETES_SERVICE_HOST": "172.20.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    # No token mounted.
    result = in_cluster_config(env, str(sa))
    assert isinstance(result, MetadataDisabled) and "token" in result.reason
    (sa / "token").write_text(TOKEN)
    (sa / "ca.crt").write_text("pem")
    cfg = load_config(None, environ=env, serviceaccount_dir=str(sa))
    assert isinstance(cfg, KubeConfig)
    assert cfg.server == "https://172.20.0.1:443"
    assert cfg.token_file == str(sa / "token") and cfg.ca_file == str(sa / "ca.crt")
    v6 = in_cluster_config(
        {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "443"}, str(sa)
    )
    assert isinstance(v6, KubeConfig) and v6.server == "https://[fd00:10:96::1]:443"
    off = load_config(None, environ={}, serviceaccount_dir=str(sa))
    assert isinstance(off, MetadataDisabled)
    assert "metadata disabled" in off.reason and "KUBERNETES_SERVICE_HOST" in off.reason


def test_private_key_file_is_0600_and_removed(tmp_path: Path) -> None:
    path = kube._write_private(str(tmp_path), "client.key", b"secret")
    assert os.stat(path).st_mode & 0o777 == 0o600


# --------------------------------------------------------------------------------------
# Watcher against the fake API server
# --------------------------------------------------------------------------------------


def seed(api: FakeApi) -> None:
    api.put(
        pod_json(
            "llm-serve-7d9f8b6c5d-x2k9p",
            UID_A,
            labels={"pod-template-hash": "7d9f8b6c5d"},
            owners=[rs_owner("llm-serve-7d9f8b6c5d")],
            containers=[("server", CID[0]), ("envoy", CID[1])],
        )
    )
    api.put(pod_json("elsewhere", UID_OTHER, node=OTHER_NODE, containers=[("x", CID[4])]))


def test_list_watch_bookmark_and_rewatch(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    snap = w.snapshot()
    assert set(snap.pods) == {UID_A}  # the other node's pod is filtered by the selector
    pod = snap.pods[UID_A]
    assert (pod.namespace, pod.name, pod.workload) == (
        "ml",
        "llm-serve-7d9f8b6c5d-x2k9p",
        "Deployment/llm-serve",
    )
    assert snap.container_name(UID_A, CID[1]) == "envoy"
    first = api.lists()[0]
    assert first.query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert first.query["resourceVersion"] == "0"
    assert first.headers["Authorization"] == f"Bearer {TOKEN}"
    assert first.headers["User-Agent"].startswith("gpuscope-exporter/")

    wait_until(lambda: len(api.watches()) == 1, what="watch request")
    watch = api.watches()[0]
    assert watch.query["fieldSelector"] == f"spec.nodeName={NODE}"
    assert watch.query["allowWatchBookmarks"] == "true"
    assert watch.query["resourceVersion"] == str(api.rv)
    assert int(watch.query["timeoutSeconds"]) >= 300
    assert watch.headers["Authorization"] == f"Bearer {TOKEN}"

    api.put(
        pod_json(
            "ddp-run-worker-0",
            UID_B,
            owners=[
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "ddp-run",
                    "uid": "u",
                    "controller": True,
                }
            ],
            containers=[("pytorch", CID[2])],
        ),
        event="ADDED",
    )
    # The serving pod's container restarted: a new container ID for the same name.
    restarted = pod_json(
        "llm-serve-7d9f8b6c5d-x2k9p",
        UID_A,
        labels={"pod-template-hash": "7d9f8b6c5d", "canary": "true"},
        owners=[rs_owner("llm-serve-7d9f8b6c5d")],
        containers=[("server", CID[3]), ("envoy", CID[1])],
    )
    api.put(restarted, event="MODIFIED")
    wait_until(
        lambda: (
            UID_B in w.snapshot().pods and w.snapshot().container_name(UID_A, CID[3]) == "server"
        ),
        what="events",
    )
    assert w.snapshot().pods[UID_B].workload == "PyTorchJob/ddp-run"
    assert w.snapshot().pods[UID_A].labels["canary"] == "true"

    api.delete(UID_B)
    wait_until(lambda: UID_B not in w.snapshot().pods, what="DELETED")
    api.bookmark("987654")
    api.watch_actions.put(("close", None))
    wait_until(lambda: len(api.watches()) == 2, what="re-watch")
    assert api.watches()[1].query["resourceVersion"] == "987654"  # resumed from the bookmark
    assert len(api.lists()) == 1  # a clean end is not a relist
    stats = w.snapshot().stats
    assert stats.watch_events_total == 3 and stats.watch_errors_total == 0
    assert stats.pods_success and stats.pod_lists_total == 1


def test_node_info_fetched_and_refreshed(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    w = watcher_factory(api.url, node_refresh_s=0.05)
    wait_until(lambda: w.snapshot().node is not None, what="node")
    assert w.snapshot().node == NodeInfo("p4d.24xlarge", "us-east-1a", "spot")
    assert api.node_gets()[0].path == f"/api/v1/nodes/{NODE}"
    assert api.node_gets()[0].headers["Authorization"] == f"Bearer {TOKEN}"
    api.node_labels["eks.amazonaws.com/capacityType"] = "ON_DEMAND"
    wait_until(
        lambda: w.snapshot().node == NodeInfo("p4d.24xlarge", "us-east-1a", "on-demand"),
        what="node refresh",
    )
    parts = {p.name: p for p in w.snapshot().parts()}
    assert parts["kube_node"].success and parts["kube_node"].duration_seconds >= 0


def test_gone_event_and_gone_status_force_consistent_relist(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url, page_size=1)
    api.put(pod_json("second", UID_B, containers=[("main", CID[2])]))
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    # While the watch is broken, a pod goes away without an event reaching us.
    api.delete(UID_B, event=False)
    api.watch_statuses.append(410)  # the next watch request is answered 410 itself
    api.gone()
    wait_until(lambda: w.snapshot().stats.relists_gone_total == 2, what="two 410s")
    wait_until(lambda: len(api.lists()) >= 3 and UID_B not in w.snapshot().pods, what="relist")
    for relist in api.lists()[1:]:
        assert "resourceVersion" not in relist.query  # consistent read after 410
    assert all(s.query["limit"] == "1" for s in api.lists())
    assert w.snapshot().stats.watch_errors_total == 0


def test_pagination(api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]) -> None:
    for i, uid in enumerate((UID_A, UID_B, UID_C)):
        api.put(pod_json(f"p{i}", uid, containers=[("c", CID[i])]))
    w = watcher_factory(api.url, page_size=2)
    assert w.wait_synced(5)
    assert set(w.snapshot().pods) == {UID_A, UID_B, UID_C}
    lists = api.lists()
    assert len(lists) == 2 and lists[1].query["continue"] == "2"
    assert "resourceVersion" not in lists[1].query  # continue carries it


def test_watch_disconnect_relists(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    api.put(pod_json("new", UID_C, containers=[("c", CID[2])]))  # no event: stream breaks
    api.watch_actions.put(("drop", None))
    wait_until(lambda: len(api.lists()) == 2 and UID_C in w.snapshot().pods, what="relist")
    stats = w.snapshot().stats
    assert stats.watch_errors_total == 1 and stats.pod_lists_total == 2 and stats.pods_success


def test_api_down_at_start_then_back(watcher_factory: Callable[..., PodMetadataWatcher]) -> None:
    port = free_port()
    w = watcher_factory(f"http://127.0.0.1:{port}")
    wait_until(lambda: w.snapshot().stats.pod_list_errors_total >= 2, what="list errors")
    snap = w.snapshot()
    assert not snap.synced and not snap.pods and snap.node is None
    assert not snap.stats.pods_success and snap.stats.node_errors_total >= 1
    assert {p.name: p.success for p in snap.parts()} == {"kube_pods": False, "kube_node": False}
    api = FakeApi(port=port)
    seed(api)
    api.start()
    try:
        assert w.wait_synced(5)
        wait_until(lambda: w.snapshot().node is not None, what="node after outage")
        assert set(w.snapshot().pods) == {UID_A} and w.snapshot().stats.pods_success
    finally:
        w.stop(2)
        api.stop()


def test_api_down_after_list_keeps_last_names(
    watcher_factory: Callable[..., PodMetadataWatcher],
) -> None:
    api = FakeApi()
    seed(api)
    api.start()
    w = watcher_factory(api.url, node_refresh_s=0.05)
    try:
        assert w.wait_synced(5)
        wait_until(lambda: w.snapshot().node is not None)
        wait_until(lambda: len(api.watches()) == 1)
        api.stop()
        wait_until(
            lambda: (
                w.snapshot().stats.pod_list_errors_total >= 2
                and w.snapshot().stats.node_errors_total >= 1
            ),
            what="errors while down",
        )
        snap = w.snapshot()
        assert snap.stats.watch_errors_total == 1
        assert not snap.stats.pods_success and not snap.stats.node_success
        assert snap.pods[UID_A].name == "llm-serve-7d9f8b6c5d-x2k9p"  # kept
        assert snap.node == NodeInfo("p4d.24xlarge", "us-east-1a", "spot")  # kept
        api.start()  # back, same port
        wait_until(
            lambda: w.snapshot().stats.pods_success and w.snapshot().stats.node_success,
            what="recovery",
        )
        assert w.snapshot().pods[UID_A].workload == "Deployment/llm-serve"
    finally:
        w.stop(2)
        api.stop()


def test_idle_watch_outlives_request_timeout_and_stops_fast(api: FakeApi) -> None:
    # "Connection: close" makes http.client drop conn.sock; the read timeout and stop()
    # must still reach the socket the stream reads from.
    seed(api)
    api.watch_connection_close = True
    w = make_watcher(api.url, request_timeout_s=0.3)
    w.start()
    try:
        assert w.wait_synced(5)
        wait_until(lambda: len(api.watches()) == 1)
        time.sleep(0.8)  # a quiet watch, longer than the request timeout: not an error
        assert w.snapshot().stats.watch_errors_total == 0 and len(api.watches()) == 1
        api.put(pod_json("late", UID_C, containers=[("c", CID[2])]), event="ADDED")
        wait_until(lambda: UID_C in w.snapshot().pods, what="event on the quiet watch")
    finally:
        t0 = time.perf_counter()
        w.stop(5)
        assert time.perf_counter() - t0 < 1.0


def test_silent_watch_hits_read_timeout_and_relists(api: FakeApi) -> None:
    seed(api)
    w = make_watcher(api.url, watch_read_timeout_s=0.2)
    w.start()
    try:
        assert w.wait_synced(5)
        wait_until(lambda: len(api.lists()) >= 2, what="relist after the read timeout")
        assert w.snapshot().stats.watch_errors_total >= 1
        assert UID_A in w.snapshot().pods
    finally:
        w.stop(2)


def test_snapshot_never_blocks_and_stop_aborts_hung_request(api: FakeApi) -> None:
    api.list_gate = threading.Event()  # the API server accepts and never answers
    w = make_watcher(api.url, request_timeout_s=30.0)
    w.start()
    try:
        wait_until(lambda: len(api.lists()) == 1, what="list in flight")
        t0 = time.perf_counter()
        snap = w.snapshot()
        assert time.perf_counter() - t0 < 0.01
        assert not snap.synced
        t0 = time.perf_counter()
        w.stop(5)
        assert time.perf_counter() - t0 < 1.0
    finally:
        api.list_gate.set()


def test_snapshot_is_immutable(
    api: FakeApi, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    w = watcher_factory(api.url)
    assert w.wait_synced(5)
    snap = w.snapshot()
    with pytest.raises(TypeError):
        snap.pods["x"] = snap.pods[UID_A]  # type: ignore[index]
    assert isinstance(snap.pods, MappingProxyType)
    api.put(pod_json("later", UID_C, containers=[("c", CID[2])]), event="ADDED")
    wait_until(lambda: UID_C in w.snapshot().pods)
    assert UID_C not in snap.pods  # an old snapshot does not change under its reader


def test_token_file_rotation_and_401(
    api: FakeApi, tmp_path: Path, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    now = [1000.0]
    path = write_kubeconfig(tmp_path / "config", api.url, {"tokenFile": "token"})
    w = watcher_factory(
        api.url, config=load_kubeconfig(str(path)), clock=lambda: now[0], token_refresh_s=60.0
    )
    assert w.wait_synced(5)
    wait_until(lambda: len(api.watches()) == 1)
    # The kubelet rotates the token and the API server stops accepting the old one before
    # our refresh is due: one 401, then the file is re-read.
    token_file.write_text("rotated-token-2")
    api.token = "rotated-token-2"
    api.watch_actions.put(("drop", None))
    wait_until(lambda: len(api.watches()) == 2, what="watch after 401")
    assert api.unauthorized == 1
    assert api.lists()[-1].headers["Authorization"] == "Bearer rotated-token-2"
    # Rotated again; this time the refresh interval has passed: no 401 at all.
    token_file.write_text("rotated-token-3")
    api.token = "rotated-token-3"
    now[0] += 61
    api.watch_actions.put(("drop", None))
    wait_until(lambda: len(api.watches()) == 3, what="watch after refresh")
    assert api.unauthorized == 1
    assert api.watches()[-1].headers["Authorization"] == "Bearer rotated-token-3"


def test_exec_credential_plugin(
    api: FakeApi, tmp_path: Path, watcher_factory: Callable[..., PodMetadataWatcher]
) -> None:
    seed(api)
    api.token = "k8s-aws-v1.exec-token"
    script = tmp_path / "get-token.py"
    script.write_text(
        "import json, os, sys\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "assert info['kind'] == 'ExecCredential' and os.environ['AWS_PROFILE'] == 'gpu'\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "  'status': {'token': 'k8s-aws-v1.exec-token',\n"
        "             'expirationTimestamp': '2999-01-01T00:00:00Z'}}))\n"
    )
    path = write_kubeconfig(
        tmp_path / "config",
        api.url,
        {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": sys.executable,
                "args": [str(script)],
                "env": [{"name": "AWS_PROFILE", "value": "gpu"}],
                "interactiveMode": "Never",
            }
        },
    )
    cfg = load_kubeconfig(str(path))
    assert cfg.exec_credential is not None
    w = watcher_factory(api.url, config=cfg)
    assert w.wait_synced(5)
    assert api.lists()[0].headers["Authorization"] == "Bearer k8s-aws-v1.exec-token"


# --------------------------------------------------------------------------------------
# HTTPS
# --------------------------------------------------------------------------------------


@dataclass
class Pki:
    ca: bytes
    server_cert: Path
    server_key: Path
    client_cert: bytes
    client_key: bytes


def _pki_cryptography(tmp: Path) -> Pki:
    ca = TestCA("kubernetes")
    server = ca.issue("kube-apiserver", server=True, sans=["127.0.0.1"])
    client = ca.issue("gpuscope", server=False)
    (tmp / "server.crt").write_bytes(server.cert_pem)
    (tmp / "server.key").write_bytes(server.key_pem)
    return Pki(ca.cert_pem, tmp / "server.crt", tmp / "server.key", client.cert_pem,
               client.key_pem)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    tmp = tmp_path / "pki"
    tmp.mkdir()
    return _pki_cryptography(tmp)


def server_tls(p: Pki, require_client_cert: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(p.server_cert), str(p.server_key))
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=p.ca.decode())
    return ctx


def test_https_ca_data_token_and_client_cert_data(
    pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import base64

    api = FakeApi(tls=server_tls(pki, require_client_cert=True))
    seed(api)
    api.start()
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    written: list[tuple[str, int, int]] = []
    real_write = kube._write_private

    def spy(directory: str, name: str, data: bytes) -> str:
        path = real_write(directory, name, data)
        written.append((path, os.stat(path).st_mode & 0o777, os.stat(directory).st_mode & 0o777))
        return path

    monkeypatch.setattr(kube, "_write_private", spy)
    path = write_kubeconfig(
        tmp_path / "config",
        api.url,
        {
            "token": TOKEN,
            "client-certificate-data": base64.b64encode(pki.client_cert).decode(),
            "client-key-data": base64.b64encode(pki.client_key).decode(),
        },
        {"certificate-authority-data": base64.b64encode(pki.ca).decode()},
    )
    w = make_watcher(api.url, config=load_config(str(path)))
    try:
        # The key material went to private files (0600 in a 0700 directory) only while
        # ssl loaded it; nothing is left behind.
        assert [(Path(p).name, m, d) for p, m, d in written] == [
            ("client.crt", 0o600, 0o700),
            ("client.key", 0o600, 0o700),
        ]
        assert not any(Path(p).exists() for p, _, _ in written)
        assert list(private_tmp.iterdir()) == []
        w.start()
        assert w.wait_synced(5)
        assert set(w.snapshot().pods) == {UID_A}
        assert api.lists()[0].headers["Authorization"] == f"Bearer {TOKEN}"
        wait_until(lambda: w.snapshot().node is not None, what="node over TLS")
    finally:
        w.stop(2)
        api.stop()


def test_https_verifies_the_server(pki: Pki, tmp_path: Path) -> None:
    api = FakeApi(tls=server_tls(pki, require_client_cert=False))
    seed(api)
    api.start()
    try:
        # Trusting only the system CAs: the self-made CA is rejected, nothing syncs.
        w = make_watcher(api.url)
        w.start()
        try:
            wait_until(lambda: w.snapshot().stats.pod_list_errors_total >= 1)
            assert not w.snapshot().synced and not api.lists()
        finally:
            w.stop(2)
        # insecure-skip-tls-verify accepts it.
        path = write_kubeconfig(
            tmp_path / "config", api.url, {"token": TOKEN}, {"insecure-skip-tls-verify": True}
        )
        w = make_watcher(api.url, config=load_kubeconfig(str(path)))
        w.start()
        try:
            assert w.wait_synced(5)
        finally:
            w.stop(2)
        # The CA as a file, as in-cluster's ca.crt.
        (tmp_path / "ca.crt").write_bytes(pki.ca)
        w = make_watcher(
            api.url,
            config=KubeConfig(
                server=api.url, source="t", ca_file=str(tmp_path / "ca.crt"), token=TOKEN
            ),
        )
        w.start()
        try:
            assert w.wait_synced(5)
        finally:
            w.stop(2)
    finally:
        api.stop()


def test_bad_tls_material_is_a_config_error(tmp_path: Path) -> None:
    cfg = KubeConfig(
        server="https://127.0.0.1:1", source="t", ca_file=str(tmp_path / "missing-ca.crt")
    )
    with pytest.raises(KubeConfigError, match="TLS"):
        PodMetadataWatcher(cfg, NODE)
    with pytest.raises(KubeConfigError, match="not http"):
        PodMetadataWatcher(KubeConfig(server="ftp://x", source="t"), NODE)
    with pytest.raises(ValueError, match="node_name"):
        PodMetadataWatcher(KubeConfig(server="http://x", source="t"), "")
