"""The PodResources client and watcher against a real gRPC server on a unix socket: grpcio.

The server is grpcio serving the servicer generated from the exporter's ``api.proto``
(``tests/kubelet_api``), or, for the wire tests, hand-encoded bytes; the client is the
exporter's (h2 and protobuf), so deadlines, message limits, connection handling and
decoding all run for real. ``test_grpcgo.py`` runs the same client against grpc-go, the server
real kubelets run. ``KubeletServer``, ``FakeKubelet`` and the response builders here are also
the kubelet of ``tests/e2e`` and ``bench/soak.py``. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpuscope.exporter.kubernetes.podresources.client import (
    DEFAULT_MAX_RECEIVE_BYTES,
    DEFAULT_RESOURCES,
    AllocatableUnsupported,
    Allocation,
    Assignments,
    ClaimDevice,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesWatcher,
    matches_resource,
)
from gpuscope.exporter.kubernetes.podresources.devices import NodeDevice, parse_device_id, resolve
from tests.kubelet_api import podresources_v1_pb2 as pb2
from tests.kubelet_api import podresources_v1_pb2_grpc as pb2_grpc

MakeClient = Callable[..., PodResourcesClient]

GPU0 = "GPU-5fd4f087-86f3-7a43-b711-4771313afc50"
GPU1 = "GPU-0c8a5b4e-12f0-4d6e-9b77-0e5d1c3f2a11"
GPU2 = "GPU-7d2e4a90-3b1c-4f5e-8a6d-9c0b1e2f3a44"
MIG_A = "MIG-bf3b4cdb-6b93-5b34-9a1b-4a6e9b6d6ad3"
MIG_B = "MIG-1e0d9c3a-77f2-5a18-8c4e-2f6a9b0d4e51"


# ---------------------------------------------------------------------------------------------
# Response builders


def devices(resource: str, *ids: str, numa: int | None = None) -> pb2.ContainerDevices:
    topology = pb2.TopologyInfo(nodes=[pb2.NUMANode(ID=numa)]) if numa is not None else None
    return pb2.ContainerDevices(resource_name=resource, device_ids=ids, topology=topology)


def container(
    name: str, *devs: pb2.ContainerDevices, claims: tuple[pb2.DynamicResource, ...] = ()
) -> pb2.ContainerResources:
    return pb2.ContainerResources(name=name, devices=devs, dynamic_resources=claims)


def claim(namespace: str, name: str, *resources: pb2.ClaimResource) -> pb2.DynamicResource:
    """A DRA ResourceClaim used by a container, with the devices allocated through it."""
    return pb2.DynamicResource(claim_namespace=namespace, claim_name=name,
                               claim_resources=resources)


def claim_device(driver: str, pool: str, device: str, *cdi: str) -> pb2.ClaimResource:
    return pb2.ClaimResource(driver_name=driver, pool_name=pool, device_name=device,
                             cdi_devices=[pb2.CDIDevice(name=name) for name in cdi])


def pod(namespace: str, name: str, *containers: pb2.ContainerResources) -> pb2.PodResources:
    return pb2.PodResources(namespace=namespace, name=name, containers=containers)


def response(*pods: pb2.PodResources) -> pb2.ListPodResourcesResponse:
    return pb2.ListPodResourcesResponse(pod_resources=pods)


def allocatable(*devs: pb2.ContainerDevices) -> pb2.AllocatableResourcesResponse:
    """A ``GetAllocatableResources()`` answer: the devices the plugins advertise."""
    return pb2.AllocatableResourcesResponse(devices=devs)


def replicas(resource: str, uuid: str, count: int) -> pb2.ContainerDevices:
    """``count`` replicas ``<uuid>::0..count-1`` of one GPU, as NVIDIA's device plugin
    advertises a GPU with ``sharing.timeSlicing`` or ``sharing.mps``."""
    return devices(resource, *(f"{uuid}::{n}" for n in range(count)))


def gpu_pod(namespace: str, name: str, device_id: str) -> pb2.PodResources:
    """A pod with one container ("c") holding one nvidia.com/gpu device ID."""
    return pod(namespace, name, container("c", devices("nvidia.com/gpu", device_id)))


def summary(allocations: tuple[Allocation, ...]) -> list[tuple[str, str, str, str, str]]:
    return [(a.namespace, a.pod, a.container, a.resource_name, a.device.raw) for a in allocations]


# ---------------------------------------------------------------------------------------------
# The kubelet double


class FakeKubelet(pb2_grpc.PodResourcesListerServicer):
    """Serves a scripted answer; can hang (bounded) to play a stuck kubelet, or fail with a
    gRPC status (``error``).

    ``GetAllocatableResources()`` answers ``allocatable``; ``None`` (the default) answers
    ``UNIMPLEMENTED``, as a kubelet before 1.21 does. ``allocatable_error`` fails it with a
    gRPC status instead; ``allocatable_hang`` holds it (bounded, until ``release``).
    ``calls`` counts ``List()`` calls, ``allocatable_calls`` the others."""

    def __init__(
        self,
        answer: pb2.ListPodResourcesResponse | None = None,
        allocatable: pb2.AllocatableResourcesResponse | None = None,
    ) -> None:
        self.answer = answer if answer is not None else response()
        self.allocatable = allocatable
        self.calls = 0
        self.allocatable_calls = 0
        self.hang = threading.Event()
        self.allocatable_hang = threading.Event()
        self.release = threading.Event()
        self.error: tuple[grpc.StatusCode, str] | None = None
        self.allocatable_error: tuple[grpc.StatusCode, str] | None = None
        self.deadlines: list[float | None] = []  # seconds left when each call arrived
        self.allocatable_deadlines: list[float | None] = []

    def List(  # the generated servicer's method name
        self, request: pb2.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb2.ListPodResourcesResponse:
        self.calls += 1
        self.deadlines.append(context.time_remaining())
        if self.hang.is_set():
            self.release.wait(timeout=5.0)  # bounded: the test tears down well before
        if self.error is not None:
            context.abort(*self.error)
        return self.answer

    def GetAllocatableResources(  # the generated servicer's method name
        self, request: pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pb2.AllocatableResourcesResponse:
        self.allocatable_calls += 1
        self.allocatable_deadlines.append(context.time_remaining())
        if self.allocatable_hang.is_set():
            self.release.wait(timeout=5.0)
        if self.allocatable_error is not None:
            context.abort(*self.allocatable_error)
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        return self.allocatable


class KubeletServer:
    """A grpcio server on a unix socket; start/stop can be repeated on the same path."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._server: grpc.Server | None = None

    def start(self, servicer: FakeKubelet) -> FakeKubelet:
        assert self._server is None
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
        self._bind_and_start(server)
        return servicer

    def start_raw(self, payload: bytes) -> None:
        """Serve fixed wire bytes for List(), as some other protobuf encoder wrote them."""
        assert self._server is None
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {"List": grpc.unary_unary_rpc_method_handler(lambda request, context: payload)},
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[handler])
        self._bind_and_start(server)

    def _bind_and_start(self, server: grpc.Server) -> None:
        # Not inside an assert: under python -O (the soak's harness as the image runs the
        # exporter) the bind would be stripped with it, and the kubelet would never listen.
        if server.add_insecure_port(f"unix://{self.path}") == 0:
            raise RuntimeError(f"the fake kubelet cannot listen on {self.path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=None).wait(timeout=5.0)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[KubeletServer]:
    server = KubeletServer(str(socket_dir / "kubelet.sock"))
    yield server
    server.stop()


@pytest.fixture
def make_client(kubelet: KubeletServer) -> Iterator[MakeClient]:
    made: list[PodResourcesClient] = []

    def make(**kwargs: object) -> PodResourcesClient:
        kwargs.setdefault("timeout", 2.0)
        client = PodResourcesClient(kubelet.path, **kwargs)  # type: ignore[arg-type]
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# ---------------------------------------------------------------------------------------------
# Allocations, case by case


def test_exclusive_gpus_and_non_gpu_resources_ignored(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    kubelet.start(FakeKubelet(response(
        pod("ml", "trainer-0",
            container("main", devices("nvidia.com/gpu", GPU0, GPU1, numa=0),
                      devices("example.com/sriov-nic", "0000:3b:00.2")),
            container("sidecar")),
        pod("ml", "infer-1", container("server", devices("nvidia.com/gpu", GPU2, numa=1))),
        pod("kube-system", "coredns-abc", container("coredns")),
        pod("net", "dpdk-0",
            container("app", devices("intel.com/sriov_netdevice", "0000:af:02.1"))),
    )))
    allocations = make_client().list_allocations()
    assert summary(allocations) == [
        ("ml", "trainer-0", "main", "nvidia.com/gpu", GPU0),
        ("ml", "trainer-0", "main", "nvidia.com/gpu", GPU1),
        ("ml", "infer-1", "server", "nvidia.com/gpu", GPU2),
    ]
    assert [a.device.uuid for a in allocations] == [GPU0, GPU1, GPU2]
    assert all(a.device.replica is None for a in allocations)


def test_three_pods_time_slicing_one_gpu(kubelet: KubeletServer, make_client: MakeClient) -> None:
    kubelet.start(FakeKubelet(response(
        *(pod("team-a", f"notebook-{n}",
              container("jupyter", devices("nvidia.com/gpu", f"{GPU0}::{n}")))
          for n in range(3)),
    )))
    allocations = make_client().list_allocations()
    assert [(a.pod, a.device.uuid, a.device.replica) for a in allocations] == [
        ("notebook-0", GPU0, 0), ("notebook-1", GPU0, 1), ("notebook-2", GPU0, 2),
    ]
    node = [NodeDevice("0", GPU0)]
    # Three distinct holders of one GPU: the attribution can give each its own numbers.
    assert {resolve(a.device, node) for a in allocations} == {GPU0}
    assert len({(a.namespace, a.pod, a.container) for a in allocations}) == 3


def test_gpu_shared_resource_is_a_gpu(kubelet: KubeletServer, make_client: MakeClient) -> None:
    kubelet.start(FakeKubelet(response(
        pod("team-b", "svc-0", container("app", devices("nvidia.com/gpu.shared", f"{GPU1}::3"))),
        pod("team-b", "svc-1", container("app", devices("nvidia.com/gpu.shared", f"{GPU1}::0"))),
    )))
    allocations = make_client().list_allocations()
    assert summary(allocations) == [
        ("team-b", "svc-0", "app", "nvidia.com/gpu.shared", f"{GPU1}::3"),
        ("team-b", "svc-1", "app", "nvidia.com/gpu.shared", f"{GPU1}::0"),
    ]
    assert all(a.device.uuid == GPU1 and a.device.is_shared for a in allocations)


def test_two_mig_slices_for_two_pods(kubelet: KubeletServer, make_client: MakeClient) -> None:
    kubelet.start(FakeKubelet(response(
        pod("research", "exp-a", container("cuda", devices("nvidia.com/mig-1g.10gb", MIG_A))),
        pod("research", "exp-b", container("cuda", devices("nvidia.com/mig-1g.10gb", MIG_B))),
        pod("research", "exp-c", container("cuda", devices("nvidia.com/mig-3g.40gb.shared",
                                                          f"{MIG_B}::1"))),
    )))
    allocations = make_client().list_allocations()
    node = [NodeDevice("1", GPU1), NodeDevice("1/3", MIG_A, GPU1), NodeDevice("1/5", MIG_B, GPU1)]
    assert [(a.pod, a.resource_name, resolve(a.device, node)) for a in allocations] == [
        ("exp-a", "nvidia.com/mig-1g.10gb", MIG_A),
        ("exp-b", "nvidia.com/mig-1g.10gb", MIG_B),
        ("exp-c", "nvidia.com/mig-3g.40gb.shared", MIG_B),
    ]
    assert all(a.device.is_mig for a in allocations)


def test_gke_device_ids(kubelet: KubeletServer, make_client: MakeClient) -> None:
    kubelet.start(FakeKubelet(response(
        pod("g", "p0", container("c", devices("nvidia.com/gpu", "nvidia0"))),
        pod("g", "p1", container("c", devices("nvidia.com/gpu", "nvidia1/gi3"))),
        pod("g", "p2", container("c", devices("nvidia.com/gpu", "nvidia2/vgpu1"))),
    )))
    node = [NodeDevice("0", GPU0), NodeDevice("1/3", MIG_A, GPU1), NodeDevice("2", GPU2)]
    allocations = make_client().list_allocations()
    assert [resolve(a.device, node) for a in allocations] == [GPU0, MIG_A, GPU2]


def test_unrecognised_device_id_is_kept_with_a_reason(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    kubelet.start(FakeKubelet(response(
        pod("x", "odd", container("c", devices("nvidia.com/gpu", "weird-id", GPU0))),
    )))
    allocations = make_client().list_allocations()
    assert [a.device.raw for a in allocations] == ["weird-id", GPU0]
    assert allocations[0].device.error
    assert resolve(allocations[0].device, [NodeDevice("0", GPU0)]) is None


def test_user_configured_resource_names(kubelet: KubeletServer, make_client: MakeClient) -> None:
    kubelet.start(FakeKubelet(response(
        pod("x", "a", container("c", devices("nvidia.com/gpu", GPU0))),
        pod("x", "b", container("c", devices("example.com/renamed-gpu", f"{GPU1}::0"))),
    )))
    assert [a.pod for a in make_client().list_allocations()] == ["a"]
    custom = make_client(resource_names=(*DEFAULT_RESOURCES, "example.com/renamed-gpu"))
    assert [a.pod for a in custom.list_allocations()] == ["a", "b"]


def test_dynamic_resources_are_returned_per_container(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    # Kubernetes 1.34+ with DRA: a container's GPUs come through ResourceClaims; a pod may mix
    # them with device-plugin GPUs. Every claim device is returned, whatever its driver.
    kubelet.start(FakeKubelet(response(
        pod("ml", "trainer-0",
            container("main", devices("nvidia.com/gpu", GPU0), claims=(
                claim("ml", "trainer-0-gpus",
                      claim_device("gpu.nvidia.com", "node-a", "gpu-1", "nvidia.com/gpu=1"),
                      claim_device("gpu.nvidia.com", "node-a", "gpu-2", "nvidia.com/gpu=2",
                                   "nvidia.com/gpu=all")),
                claim("ml", "trainer-0-nic", claim_device("dra.net", "node-a", "eth1")),
            )),
            container("sidecar", claims=(
                claim("ml", "shared-mig",
                      claim_device("gpu.nvidia.com", "node-a", "gpu-3-mig-1g10gb-5")),))),
        pod("batch", "empty-claim", container("c", claims=(claim("batch", "pending"),))),
    )))
    client = make_client()
    found = client.list_resources()
    assert isinstance(found, Assignments)
    assert summary(found.allocations) == [("ml", "trainer-0", "main", "nvidia.com/gpu", GPU0)]
    assert found.claim_devices == (
        ClaimDevice("ml", "trainer-0", "main", "ml", "trainer-0-gpus", "gpu.nvidia.com",
                    "node-a", "gpu-1", ("nvidia.com/gpu=1",)),
        ClaimDevice("ml", "trainer-0", "main", "ml", "trainer-0-gpus", "gpu.nvidia.com",
                    "node-a", "gpu-2", ("nvidia.com/gpu=2", "nvidia.com/gpu=all")),
        ClaimDevice("ml", "trainer-0", "main", "ml", "trainer-0-nic", "dra.net", "node-a",
                    "eth1", ()),
        ClaimDevice("ml", "trainer-0", "sidecar", "ml", "shared-mig", "gpu.nvidia.com",
                    "node-a", "gpu-3-mig-1g10gb-5", ()),
    )
    # list_allocations() is the same call, allocations only.
    assert client.list_allocations() == found.allocations

    watcher = PodResourcesWatcher(client, interval=60.0)
    assert watcher.latest_assignments() == Assignments()
    assert watcher.refresh_once()
    assert watcher.latest_assignments() == found
    assert watcher.latest() == found.allocations


def test_matches_resource_patterns() -> None:
    assert matches_resource("nvidia.com/gpu", DEFAULT_RESOURCES)
    assert matches_resource("nvidia.com/gpu.shared", DEFAULT_RESOURCES)
    assert matches_resource("nvidia.com/mig-1g.10gb", DEFAULT_RESOURCES)
    assert matches_resource("nvidia.com/mig-7g.80gb.shared", DEFAULT_RESOURCES)
    assert not matches_resource("nvidia.com/gpu-foo", DEFAULT_RESOURCES)
    assert not matches_resource("nvidia.com/mig", DEFAULT_RESOURCES)
    assert not matches_resource("amd.com/gpu", DEFAULT_RESOURCES)
    assert not matches_resource("cpu", DEFAULT_RESOURCES)
    assert matches_resource("amd.com/gpu", ("amd.com/*",))


# ---------------------------------------------------------------------------------------------
# GetAllocatableResources(): the devices the kubelet can allocate (replicas per GPU)


def test_allocatable_gpu_devices(kubelet: KubeletServer, make_client: MakeClient) -> None:
    # A GPU advertised as ten MPS replicas under the renamed resource, one whole, a MIG slice;
    # CPUs, memory and other vendors' devices are not ours.
    servicer = kubelet.start(FakeKubelet(
        response(*(gpu_pod("ml", f"client-{n}", f"{GPU0}::{n}") for n in range(2))),
        allocatable=pb2.AllocatableResourcesResponse(
            devices=[replicas("nvidia.com/gpu.shared", GPU0, 10),
                     devices("nvidia.com/gpu", GPU1, numa=1),
                     devices("nvidia.com/mig-1g.10gb", MIG_A),
                     devices("example.com/sriov-nic", "0000:3b:00.2")],
            cpu_ids=[0, 1, 2, 3],
            memory=[pb2.ContainerMemory(memory_type="memory", size=1 << 34)]),
    ))
    client = make_client(timeout=3.0)
    found = client.list_allocatable()
    assert [(d.resource_name, d.device.raw) for d in found] == [
        *(("nvidia.com/gpu.shared", f"{GPU0}::{n}") for n in range(10)),
        ("nvidia.com/gpu", GPU1), ("nvidia.com/mig-1g.10gb", MIG_A)]
    assert [d.device.replica for d in found[:10]] == list(range(10))
    assert {d.device.uuid for d in found[:10]} == {GPU0}
    # One call, one connection, with the same deadline as List()'s.
    (left,) = servicer.allocatable_deadlines
    assert left is not None and 2.0 < left <= 3.0
    assert (servicer.calls, servicer.allocatable_calls, client.connections_made) == (0, 1, 1)


@pytest.mark.parametrize(("code", "message", "unsupported"), [
    # A kubelet before 1.21: the method is unknown to its service.
    (grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources", True),
    # 1.21-1.22 with the feature gate KubeletPodResourcesGetAllocatable off: the kubelet's
    # handler returns a plain Go error, which grpc-go sends as UNKNOWN.
    (grpc.StatusCode.UNKNOWN, "Pod Resources API GetAllocatableResources disabled", True),
    (grpc.StatusCode.UNKNOWN, "something else", False),
    (grpc.StatusCode.UNAVAILABLE, "kubelet shutting down", False),
])
def test_allocatable_not_served_or_failing(
    kubelet: KubeletServer, make_client: MakeClient, code: grpc.StatusCode, message: str,
    unsupported: bool,
) -> None:
    servicer = kubelet.start(FakeKubelet(allocatable=allocatable()))
    servicer.allocatable_error = (code, message)
    with pytest.raises(PodResourcesError) as raised:
        make_client().list_allocatable()
    assert isinstance(raised.value, AllocatableUnsupported) is unsupported
    assert str(raised.value) == (
        f"GetAllocatableResources() failed: {code.name}: {message}")


def test_allocatable_unimplemented_by_default(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    kubelet.start(FakeKubelet())  # the double's default: a kubelet before 1.21
    with pytest.raises(AllocatableUnsupported, match="UNIMPLEMENTED"):
        make_client().list_allocatable()


def test_watcher_keeps_the_allocatable_devices(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    answer = response(gpu_pod("ml", "a", f"{GPU0}::0"), gpu_pod("ml", "b", f"{GPU0}::1"))
    servicer = kubelet.start(FakeKubelet(
        answer, allocatable=allocatable(replicas("nvidia.com/gpu.shared", GPU0, 10))))
    watcher = PodResourcesWatcher(make_client(timeout=0.5), interval=60.0)
    assert watcher.refresh_once()
    latest = watcher.latest_assignments()
    assert [a.pod for a in latest.allocations] == ["a", "b"]
    assert latest.allocatable is not None and len(latest.allocatable) == 10
    # Both calls in every refresh: the same cadence.
    assert watcher.refresh_once()
    assert (servicer.calls, servicer.allocatable_calls) == (2, 2)

    # GetAllocatableResources() hanging past the deadline: a counted error; the refresh's
    # allocations are used, the allocatable devices are the last good ones.
    servicer.answer = response(gpu_pod("ml", "c", f"{GPU0}::2"))
    servicer.allocatable_hang.set()
    assert watcher.refresh_once() is False
    status = watcher.status()
    assert (status.success, status.errors_total) == (False, 1)
    assert status.last_error is not None and status.last_error.startswith(
        "GetAllocatableResources() failed: DEADLINE_EXCEEDED")
    latest = watcher.latest_assignments()
    assert [a.pod for a in latest.allocations] == ["c"]
    assert latest.allocatable is not None and len(latest.allocatable) == 10

    servicer.allocatable_hang.clear()
    servicer.release.set()
    servicer.allocatable = allocatable(replicas("nvidia.com/gpu.shared", GPU0, 4))
    assert watcher.refresh_once() is True
    latest_allocatable = watcher.latest_assignments().allocatable
    assert latest_allocatable is not None and len(latest_allocatable) == 4
    assert watcher.status().errors_total == 1


def test_watcher_falls_back_when_allocatable_is_unimplemented(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    now = [1000.0]
    servicer = kubelet.start(FakeKubelet(response(gpu_pod("ml", "a", f"{GPU0}::3"))))
    watcher = PodResourcesWatcher(make_client(), interval=10.0, clock=lambda: now[0],
                                  allocatable_retry=600.0)
    # Not served: no error, allocatable unknown (the replicas then come from List()).
    assert watcher.refresh_once() is True
    assert watcher.status().errors_total == 0
    assert watcher.latest_assignments().allocatable is None
    assert [a.pod for a in watcher.latest()] == ["a"]
    assert (servicer.calls, servicer.allocatable_calls) == (1, 1)
    # Not asked again every refresh; asked again once the retry time has passed.
    for _ in range(3):
        now[0] += 10.0
        assert watcher.refresh_once() is True
    assert (servicer.calls, servicer.allocatable_calls) == (4, 1)
    servicer.allocatable = allocatable(replicas("nvidia.com/gpu", GPU0, 8))  # upgraded
    now[0] += 600.0
    assert watcher.refresh_once() is True
    assert servicer.allocatable_calls == 2
    found = watcher.latest_assignments().allocatable
    assert found is not None and len(found) == 8


def test_watcher_asks_allocatable_again_after_the_kubelet_was_away(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    now = [1000.0]
    kubelet.start(FakeKubelet(response(gpu_pod("ml", "a", f"{GPU0}::3"))))
    watcher = PodResourcesWatcher(make_client(timeout=1.0), interval=10.0,
                                  clock=lambda: now[0])
    assert watcher.refresh_once() is True
    assert watcher.latest_assignments().allocatable is None
    kubelet.stop()
    assert watcher.refresh_once() is False
    # Back, upgraded: asked at once, not after the retry time.
    servicer = kubelet.start(FakeKubelet(
        response(gpu_pod("ml", "a", f"{GPU0}::3")),
        allocatable=allocatable(replicas("nvidia.com/gpu", GPU0, 8))))
    assert wait_until(watcher.refresh_once, timeout=5.0)
    assert servicer.allocatable_calls == 1
    found = watcher.latest_assignments().allocatable
    assert found is not None and len(found) == 8


def test_a_failed_list_skips_allocatable(kubelet: KubeletServer, make_client: MakeClient) -> None:
    # One deadline per refresh on a failing kubelet, not two; the last answers kept.
    servicer = kubelet.start(FakeKubelet(
        response(gpu_pod("ml", "a", f"{GPU0}::1")),
        allocatable=allocatable(replicas("nvidia.com/gpu", GPU0, 3))))
    watcher = PodResourcesWatcher(make_client(), interval=60.0)
    assert watcher.refresh_once() is True
    servicer.error = (grpc.StatusCode.UNAVAILABLE, "kubelet shutting down")
    assert watcher.refresh_once() is False
    assert (servicer.calls, servicer.allocatable_calls) == (2, 1)
    latest = watcher.latest_assignments()
    assert [a.pod for a in latest.allocations] == ["a"]
    assert latest.allocatable is not None and len(latest.allocatable) == 3


def test_watcher_without_an_allocatable_lister_and_bad_retry() -> None:
    # A lister without list_allocatable() (test doubles, older adapters): never asked.
    lister = ScriptedLister([0.0], [(0.0, ())])
    watcher = PodResourcesWatcher(lister, interval=10.0)
    assert watcher.refresh_once() is True
    assert watcher.latest_assignments() == Assignments()
    with pytest.raises(ValueError):
        PodResourcesWatcher(lister, interval=10.0, allocatable_retry=0)


# ---------------------------------------------------------------------------------------------
# Wire compatibility with the real kubelet API


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes | int, wire_type: int = 2) -> bytes:
    key = _varint(number << 3 | wire_type)
    if wire_type == 0:
        assert isinstance(payload, int)
        return key + _varint(payload)
    assert isinstance(payload, bytes)
    return key + _varint(len(payload)) + payload


def test_hand_encoded_kubelet_bytes_every_field_and_unknown_ones(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    # Encoded by hand from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, field numbers
    # and all, independently of any protobuf library: every field a current kubelet sends
    # (devices with topology, cpu_ids, memory, dynamic_resources), and fields from a future
    # kubelet that api.proto does not know yet (numbers 90+), which must be skipped.
    numa = _field(3, _field(1, _field(1, 1, wire_type=0)))  # topology{nodes{ID: 1}}
    gpu_devices = _field(1, b"nvidia.com/gpu") + _field(2, GPU0.encode()) + numa
    cpu_ids = _field(3, b"".join(_varint(c) for c in (2, 3, 66, 67)))  # packed int64
    memory = _field(4, _field(1, b"memory") + _field(2, 8 << 30, wire_type=0) + numa)
    claim_bytes = _field(5, _field(2, b"gpu-claim") + _field(3, b"ml")
                         + _field(4, _field(1, _field(1, b"nvidia.com/gpu=gpu0"))
                                  + _field(2, b"gpu.nvidia.com") + _field(3, b"node-a")
                                  + _field(4, b"gpu-0") + _field(91, b"future")))
    future = _field(90, b"a field from a later kubelet") + _field(92, 7, wire_type=0)
    main = (_field(1, b"main") + _field(2, gpu_devices) + cpu_ids + memory + claim_bytes
            + future)
    pod_bytes = _field(1, b"trainer-0") + _field(2, b"ml") + _field(3, main) + future
    kubelet.start_raw(_field(1, pod_bytes) + future)

    found = make_client().list_resources()
    assert summary(found.allocations) == [("ml", "trainer-0", "main", "nvidia.com/gpu", GPU0)]
    assert found.claim_devices == (
        ClaimDevice("ml", "trainer-0", "main", "ml", "gpu-claim", "gpu.nvidia.com", "node-a",
                    "gpu-0", ("nvidia.com/gpu=gpu0",)),
    )


@pytest.mark.parametrize("body", [
    b"\xff\xfe\xfd\x00 not a protobuf message",
    _field(1, _field(1, b"trainer-0"))[:-3],  # cut inside a field
], ids=["garbage", "truncated"])
def test_answer_that_is_not_the_message_is_internal(
    kubelet: KubeletServer, make_client: MakeClient, body: bytes
) -> None:
    kubelet.start_raw(body)
    with pytest.raises(PodResourcesError, match="INTERNAL: bad answer"):
        make_client().list_allocations()


def test_field_numbers_match_the_kubelet_api() -> None:
    # Pinned from k8s.io/kubelet/pkg/apis/podresources/v1/api.proto: changing any of these
    # silently breaks decoding of a real kubelet's answers.
    expected = {
        "ListPodResourcesRequest": {},
        "ListPodResourcesResponse": {"pod_resources": 1},
        "PodResources": {"name": 1, "namespace": 2, "containers": 3},
        "ContainerResources": {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4,
                               "dynamic_resources": 5},
        "ContainerMemory": {"memory_type": 1, "size": 2, "topology": 3},
        "ContainerDevices": {"resource_name": 1, "device_ids": 2, "topology": 3},
        "TopologyInfo": {"nodes": 1},
        "NUMANode": {"ID": 1},
        "DynamicResource": {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4},
        "ClaimResource": {"cdi_devices": 1, "driver_name": 2, "pool_name": 3, "device_name": 4},
        "CDIDevice": {"name": 1},
        "AllocatableResourcesRequest": {},
        "AllocatableResourcesResponse": {"devices": 1, "cpu_ids": 2, "memory": 3},
        "GetPodResourcesRequest": {"pod_name": 1, "pod_namespace": 2},
        "GetPodResourcesResponse": {"pod_resources": 1},
    }
    assert set(pb2.DESCRIPTOR.message_types_by_name) == set(expected)
    for message, fields in expected.items():
        descriptor = pb2.DESCRIPTOR.message_types_by_name[message]
        assert descriptor.full_name == f"v1.{message}"
        assert {f.name: f.number for f in descriptor.fields} == fields
    service = pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest",
                                    "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }


def test_committed_generated_code_matches_the_proto() -> None:
    # Regenerates everything from api.proto into a temporary folder and compares byte for
    # byte: api_pb2.py, api_pb2.pyi (the exporter's) and the grpcio servicer.
    root = Path(__file__).resolve().parents[4]
    script = root / "exporter/kubernetes/podresources/generate.sh"
    done = subprocess.run(["bash", str(script), "--check"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr + done.stdout


# ---------------------------------------------------------------------------------------------
# Size, connection reuse, failures


def test_response_over_4_5_mb_decodes(kubelet: KubeletServer, make_client: MakeClient) -> None:
    # Many pods, most holding non-GPU devices (SR-IOV VFs, say), some holding GPUs.
    pods = []
    for n in range(7000):
        vfs = (f"0000:{n % 256:02x}:{vf:02x}.{vf % 8}-long-vf-name" for vf in range(24))
        devs = [devices("example.com/sriov-vf", *vfs)]
        if n % 1000 == 0:
            devs.append(devices("nvidia.com/gpu", f"{GPU0}::{n // 1000}"))
        pods.append(pod(f"ns-{n % 50}", f"worker-{n:05d}-with-a-long-generated-suffix",
                        container("main", *devs)))
    answer = response(*pods)
    assert answer.ByteSize() > 4_500_000
    kubelet.start(FakeKubelet(answer))

    allocations = make_client().list_allocations()
    assert [(a.pod, a.device.replica) for a in allocations] == [
        (f"worker-{n:05d}-with-a-long-generated-suffix", n // 1000) for n in range(0, 7000, 1000)
    ]
    # The same answer overflows gRPC's default 4 MiB limit: the raised limit is what helps.
    with pytest.raises(PodResourcesError, match="RESOURCE_EXHAUSTED"):
        make_client(max_receive_bytes=4 * 1024 * 1024).list_allocations()


def test_default_receive_limit_is_64_mib() -> None:
    assert DEFAULT_MAX_RECEIVE_BYTES == 64 * 1024 * 1024
    assert PodResourcesClient("/run/kubelet.sock").max_receive_bytes == DEFAULT_MAX_RECEIVE_BYTES


def test_deadline_is_sent_to_the_kubelet(kubelet: KubeletServer, make_client: MakeClient) -> None:
    # grpc-timeout goes with the request, so the kubelet stops working on a call we gave up.
    servicer = kubelet.start(FakeKubelet(response(gpu_pod("a", "p", GPU0))))
    make_client(timeout=3.0).list_allocations()
    (left,) = servicer.deadlines
    assert left is not None and 2.0 < left <= 3.0


@pytest.mark.parametrize(("code", "expected"), [
    (grpc.StatusCode.UNAVAILABLE, "List() failed: UNAVAILABLE: kubelet shutting down"),
    (grpc.StatusCode.PERMISSION_DENIED, "List() failed: PERMISSION_DENIED: kubelet shutting down"),
    (grpc.StatusCode.UNIMPLEMENTED, "List() failed: UNIMPLEMENTED: kubelet shutting down"),
])
def test_kubelet_status_is_passed_through(
    kubelet: KubeletServer, make_client: MakeClient, code: grpc.StatusCode, expected: str
) -> None:
    servicer = kubelet.start(FakeKubelet())
    servicer.error = (code, "kubelet shutting down")
    with pytest.raises(PodResourcesError) as raised:
        make_client().list_allocations()
    assert str(raised.value) == expected


def test_close_cancels_a_call_in_flight(kubelet: KubeletServer, make_client: MakeClient) -> None:
    servicer = kubelet.start(FakeKubelet(response(gpu_pod("a", "p", GPU0))))
    servicer.hang.set()
    client = make_client(timeout=10.0)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            client.list_allocations()
        except BaseException as error:
            errors.append(error)

    caller = threading.Thread(target=call)
    caller.start()
    try:
        assert wait_until(lambda: servicer.calls == 1)
        started = time.monotonic()
        client.close()
        caller.join(8.0)
        assert not caller.is_alive()
        assert time.monotonic() - started < 5.0  # at once, not at the 10 s deadline
    finally:
        servicer.release.set()
        caller.join(5.0)
    assert [str(e) for e in errors] == ["client closed"]
    assert isinstance(errors[0], PodResourcesError)
    with pytest.raises(PodResourcesError, match="closed"):
        client.list_allocations()


def test_many_calls_leave_no_socket_thread_or_loop_behind(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    # A new connection and event loop per call, every few seconds for months: whatever a call
    # opens (socket, epoll, the loop's self-pipe) must be closed by its end, failed or not.
    servicer = kubelet.start(FakeKubelet(response(gpu_pod("a", "p", GPU0))))
    # Answered calls get a deadline no loaded CI machine reaches; the hung ones a short one.
    client, hung = make_client(timeout=5.0), make_client(timeout=0.3)
    client.list_allocations()  # the first call imports h2 and protobuf
    fds_before, threads_before = open_fds(), client_threads()
    for _ in range(200):
        assert len(client.list_allocations()) == 1
    servicer.hang.set()  # and calls that end at their deadline
    for _ in range(3):
        with pytest.raises(PodResourcesError, match="DEADLINE_EXCEEDED"):
            hung.list_allocations()
    servicer.release.set()
    client.close()
    hung.close()
    assert wait_until(lambda: open_fds() <= fds_before), (open_fds(), fds_before)
    assert client_threads() == threads_before


def test_one_short_connection_per_call(kubelet: KubeletServer, make_client: MakeClient) -> None:
    servicer = kubelet.start(FakeKubelet(response(
        pod("a", "p", container("c", devices("nvidia.com/gpu", GPU0))))))
    client = make_client()
    assert client.connections_made == 0  # nothing dialled before the first call
    sockets_before = open_sockets()
    for _ in range(5):
        assert len(client.list_allocations()) == 1
    assert servicer.calls == 5
    assert client.connections_made == 5
    # Every connection was closed after its call (and so the server's end too): the sockets
    # open in this process, client and server together, come back to what they were.
    assert wait_until(lambda: open_sockets() <= sockets_before), (open_sockets(), sockets_before)


def test_socket_absent_then_present(kubelet: KubeletServer, make_client: MakeClient) -> None:
    client = make_client()
    watcher = PodResourcesWatcher(client, interval=60.0)
    assert watcher.refresh_once() is False  # no exception escapes
    assert watcher.refresh_once() is False
    status = watcher.status()
    assert (status.success, status.errors_total, status.refreshes_total) == (False, 2, 2)
    assert "absent" in (status.last_error or "")
    assert status.last_success_age_seconds is None
    assert watcher.latest() == ()
    assert client.connections_made == 0

    kubelet.start(FakeKubelet(response(gpu_pod("a", "p", GPU0))))
    assert watcher.refresh_once() is True
    assert summary(watcher.latest()) == [("a", "p", "c", "nvidia.com/gpu", GPU0)]
    assert watcher.status().success is True
    assert watcher.status().errors_total == 2


def test_stale_socket_file_fails_fast(kubelet: KubeletServer, make_client: MakeClient) -> None:
    # A kubelet that died leaves its socket file behind; nobody listens.
    Path(kubelet.path).touch()
    client = make_client(timeout=5.0)
    started = time.monotonic()
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        client.list_allocations()
    assert time.monotonic() - started < 2.0  # refused at once, not after the deadline


def test_hanging_kubelet_never_delays_latest(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    servicer = kubelet.start(FakeKubelet(response(
        pod("a", "good", container("c", devices("nvidia.com/gpu", GPU0))))))
    watcher = PodResourcesWatcher(make_client(timeout=0.5), interval=0.05)
    watcher.start()
    try:
        assert wait_until(lambda: watcher.status().success is True)
        good = watcher.latest()
        assert [a.pod for a in good] == ["good"]

        servicer.hang.set()
        assert wait_until(lambda: watcher.status().in_flight and servicer.calls >= 2)
        # A List() call is stuck in the kubelet right now; readers must not notice.
        took: list[float] = []
        while watcher.status().in_flight:
            started = time.perf_counter()
            seen = watcher.latest()
            took.append(time.perf_counter() - started)
            assert seen == good
            time.sleep(0.005)
        assert len(took) >= 10  # the loop really ran while the call hung (~0.5 s)
        # A read that waited on the call would take the rest of its 0.5 s deadline; the
        # median, as one read on a busy host can be descheduled for longer than that.
        assert statistics.median(took) < 0.05, took
        assert wait_until(lambda: watcher.status().errors_total >= 1)
        status = watcher.status()
        assert "DEADLINE_EXCEEDED" in (status.last_error or "")
        assert status.duration_seconds is not None and 0.4 <= status.duration_seconds < 2.0
        assert watcher.latest() == good  # the last good answer is kept

        servicer.hang.clear()
        servicer.release.set()
        assert wait_until(lambda: watcher.status().success is True)
    finally:
        servicer.release.set()
        watcher.stop()


def test_kubelet_restart_same_client_recovers(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    kubelet.start(FakeKubelet(response(gpu_pod("a", "before", GPU0))))
    client = make_client(timeout=1.0)
    watcher = PodResourcesWatcher(client, interval=60.0)
    assert watcher.refresh_once()

    kubelet.stop()
    assert watcher.refresh_once() is False
    assert [a.pod for a in watcher.latest()] == ["before"]  # kept while the kubelet is away

    kubelet.start(FakeKubelet(response(gpu_pod("a", "after", GPU1))))
    assert wait_until(watcher.refresh_once, timeout=5.0)
    assert [(a.pod, a.device.uuid) for a in watcher.latest()] == [("after", GPU1)]
    assert watcher.status().errors_total >= 1


def test_kubelet_restart_between_calls(kubelet: KubeletServer, make_client: MakeClient) -> None:
    # No failed call in between: the next call's new connection finds the new server.
    kubelet.start(FakeKubelet(response(pod("a", "before", container("c")))))
    client = make_client(timeout=1.0)
    client.list_allocations()
    kubelet.stop()
    kubelet.start(FakeKubelet(response(gpu_pod("a", "after", GPU1))))
    results: list[tuple[Allocation, ...]] = []

    def attempt() -> bool:
        try:
            results.append(client.list_allocations())
        except PodResourcesError:
            return False
        return True

    assert wait_until(attempt, timeout=5.0)
    assert [a.pod for a in results[-1]] == ["after"]


# ---------------------------------------------------------------------------------------------
# The watcher on its own (a scripted lister and a fake clock)


class ScriptedLister:
    def __init__(self, clock: list[float], script: list[tuple[float, object]]) -> None:
        self.clock = clock
        self.script = script  # (seconds the call takes, result or exception)
        self.closed = False

    def list_allocations(self) -> tuple[Allocation, ...]:
        took, outcome = self.script.pop(0)
        self.clock[0] += took
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, tuple)
        return outcome

    def close(self) -> None:
        self.closed = True


def test_watcher_counts_and_durations_with_a_fake_clock() -> None:
    now = [1000.0]
    one = (Allocation("ns", "p", "c", "nvidia.com/gpu", parse_device_id(GPU0)),)
    lister = ScriptedLister(now, [
        (0.25, one),
        (5.0, PodResourcesError("List() failed: DEADLINE_EXCEEDED: Deadline Exceeded")),
        (0.5, RuntimeError("bug in a lister")),  # anything raised is counted, never escapes
    ])
    watcher = PodResourcesWatcher(lister, interval=10.0, clock=lambda: now[0])
    assert watcher.status().success is None

    assert watcher.refresh_once() is True
    status = watcher.status()
    assert (status.success, status.duration_seconds, status.refreshes_total) == (True, 0.25, 1)
    assert status.last_success_age_seconds == 0.0

    assert watcher.refresh_once() is False
    status = watcher.status()
    assert (status.success, status.duration_seconds, status.errors_total) == (False, 5.0, 1)
    assert status.last_success_age_seconds == 5.0
    assert status.last_error == "List() failed: DEADLINE_EXCEEDED: Deadline Exceeded"

    assert watcher.refresh_once() is False
    status = watcher.status()
    assert (status.errors_total, status.refreshes_total) == (2, 3)
    assert "bug in a lister" in (status.last_error or "")
    assert watcher.latest() == one
    assert not status.in_flight

    watcher.stop()
    assert lister.closed


def test_watcher_thread_refreshes_and_stops() -> None:
    calls = []

    class Counting:
        def list_allocations(self) -> tuple[Allocation, ...]:
            calls.append(time.monotonic())
            return ()

        def close(self) -> None:
            pass

    watcher = PodResourcesWatcher(Counting(), interval=0.02)
    watcher.start()
    watcher.start()  # idempotent: still one thread
    try:
        assert wait_until(lambda: len(calls) >= 3)
    finally:
        watcher.stop()
    stopped_at = len(calls)
    time.sleep(0.1)
    assert len(calls) == stopped_at
    assert not any(t.name == "gpuscope-podresources" for t in threading.enumerate())


def test_closed_client_raises_cleanly(kubelet: KubeletServer, make_client: MakeClient) -> None:
    kubelet.start(FakeKubelet())
    client = make_client()
    client.list_allocations()
    client.close()
    with pytest.raises(PodResourcesError, match="closed"):
        client.list_allocations()


@pytest.mark.parametrize(
    "kwargs",
    [{"timeout": 0}, {"timeout": -1.0}, {"max_receive_bytes": 0}],
)
def test_client_rejects_bad_parameters(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PodResourcesClient("/run/kubelet.sock", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PodResourcesClient("")


def test_watcher_rejects_bad_interval() -> None:
    with pytest.raises(ValueError):
        PodResourcesWatcher(ScriptedLister([0.0], []), interval=0)


def open_sockets() -> int:
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # closed while listing
            count += fd.readlink().name.startswith("socket:")
    return count


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def client_threads() -> set[threading.Thread]:
    """The threads alive now but those of the in-process grpcio server (its worker pool grows
    with calls in flight); the client starts none, the watcher one."""
    return {t for t in threading.enumerate() if not t.name.startswith("ThreadPoolExecutor")}


def test_imports_h2_and_protobuf_at_the_first_call_and_never_grpc_libraries(
    kubelet: KubeletServer,
) -> None:
    # The client speaks gRPC over h2 with the protobuf runtime, never with grpcio (~10 MiB
    # more RSS on every node) nor grpclib (0.7 MiB, and an event loop per call); and only from
    # the first call on, so the types (which the attribution code and the simulated source
    # import) load neither. The server here is grpcio, in this process; the client runs in a
    # fresh interpreter.
    kubelet.start(FakeKubelet(response(gpu_pod("a", "p", GPU0))))
    code = (
        "import sys\n"
        "from gpuscope.exporter.kubernetes.podresources import (\n"
        "    PodResourcesClient, PodResourcesWatcher)\n"
        "def loaded(*names):\n"
        "    return sorted(m for m in sys.modules if m in names\n"
        "                  or m.startswith(tuple(n + '.' for n in names)))\n"
        "w = PodResourcesWatcher(PodResourcesClient('/nonexistent/kubelet.sock'))\n"
        "assert w.refresh_once() is False\n"
        "assert not loaded('google', 'h2', 'grpc'), loaded('google', 'h2', 'grpc')\n"
        f"c = PodResourcesClient({kubelet.path!r})\n"
        "print([(a.pod, a.device.uuid) for a in c.list_allocations()])\n"
        "assert loaded('google.protobuf') and loaded('h2')\n"
        "assert not loaded('grpc', 'grpclib', 'asyncio'), loaded('grpc', 'grpclib', 'asyncio')\n"
    )
    root = Path(__file__).resolve().parents[4]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"[('p', '{GPU0}')]"


def test_call_from_a_thread_running_an_event_loop(
    kubelet: KubeletServer, make_client: MakeClient
) -> None:
    """A caller whose thread already runs an event loop (an embedding application, or
    Playwright's sync API earlier in the same test session) still gets its answer: the call
    runs on a thread of its own instead of failing with "another loop is running"."""
    kubelet.start(FakeKubelet(response(gpu_pod("ml", "a", "GPU-1"))))
    client = make_client()

    async def inside_a_loop() -> tuple[Allocation, ...]:
        return client.list_allocations()

    got: list[tuple[Allocation, ...]] = []
    # A thread of the test's own, whose loop runs while it calls the client (the test
    # process's main thread may hold Playwright's loop already).
    caller = threading.Thread(target=lambda: got.append(asyncio.run(inside_a_loop())))
    caller.start()
    caller.join(10)
    assert [summary(g) for g in got] == [[("ml", "a", "c", "nvidia.com/gpu", "GPU-1")]]
