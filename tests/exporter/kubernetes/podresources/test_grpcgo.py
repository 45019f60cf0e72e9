"""The PodResources client against grpc-go, the gRPC server real kubelets run.

``tests/kubelet_api/grpcgo.py`` builds a small PodResources v1 server on grpc-go from
Debian's Go packages (cached under ``build/``) with Go stubs generated from the exporter's
``api.proto``, and runs it on a unix socket; each test scripts its answers, delays, errors
and crashes through the server's control file. The Go toolchain missing fails these tests
(``scripts/setup --test`` installs it); it never skips them. Every wait is bounded.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuscope.exporter.kubernetes.attribution import attribute
from gpuscope.exporter.kubernetes.metadata import MetadataSnapshot
from gpuscope.exporter.kubernetes.podresources.client import (
    AllocatableUnsupported,
    Assignments,
    ClaimDevice,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesWatcher,
)
from gpuscope.exporter.kubernetes.podresources.devices import NodeDevice, resolve
from gpuscope.exporter.model import DeviceSample, ProcessSample, Snapshot
from tests.exporter.kubernetes.podresources.test_client import (
    GPU0,
    GPU1,
    GPU2,
    MIG_A,
    MIG_B,
    allocatable,
    claim,
    claim_device,
    container,
    devices,
    gpu_pod,
    open_fds,
    pod,
    replicas,
    response,
    summary,
    wait_until,
)
from tests.kubelet_api import grpcgo
from tests.kubelet_api.grpcgo import GoKubelet

MakeClient = Callable[..., PodResourcesClient]
MIB = 1024 * 1024


@pytest.fixture(scope="session")
def grpcgo_binary() -> Path:
    try:
        return grpcgo.build()
    except grpcgo.GoToolchainMissing as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture
def go_kubelet(grpcgo_binary: Path, socket_dir: Path) -> Iterator[GoKubelet]:
    server = GoKubelet(grpcgo_binary, str(socket_dir / "kubelet.sock"), socket_dir)
    yield server
    server.stop()


@pytest.fixture
def make_client(go_kubelet: GoKubelet) -> Iterator[MakeClient]:
    made: list[PodResourcesClient] = []

    def make(**kwargs: object) -> PodResourcesClient:
        kwargs.setdefault("timeout", 2.0)
        client = PodResourcesClient(go_kubelet.path, **kwargs)  # type: ignore[arg-type]
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


def test_toolchain_missing_is_a_clear_failure(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no go, no protoc
    with pytest.raises(grpcgo.GoToolchainMissing, match=r"scripts/setup --test.*golang-go"):
        grpcgo.build()


def test_the_server_is_grpc_go(go_kubelet: GoKubelet, grpcgo_binary: Path) -> None:
    # What the binary was built from: grpc-go's server and stubs generated from api.proto.
    assert b"google.golang.org/grpc" in grpcgo_binary.read_bytes()
    assert b"k8s.io/kubelet/pkg/apis/podresources/v1" in grpcgo_binary.read_bytes()


def test_device_plugin_time_sliced_mig_and_dra(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    go_kubelet.serve(response(
        pod("ml", "trainer-0",
            container("main", devices("nvidia.com/gpu", GPU0, numa=0),
                      devices("example.com/sriov-nic", "0000:3b:00.2")),
            container("sidecar")),
        *(pod("team-a", f"notebook-{n}",
              container("jupyter", devices("nvidia.com/gpu", f"{GPU1}::{n}")))
          for n in range(2)),
        pod("team-b", "svc", container("app", devices("nvidia.com/gpu.shared", f"{GPU1}::7"))),
        pod("research", "exp-a", container("cuda", devices("nvidia.com/mig-1g.10gb", MIG_A))),
        pod("research", "exp-b", container("cuda", devices("nvidia.com/mig-3g.40gb.shared",
                                                          f"{MIG_B}::1"))),
        pod("g", "gke", container("c", devices("nvidia.com/gpu", "nvidia2"))),
        pod("dra", "infer-0", container("server", claims=(
            claim("dra", "infer-0-gpu",
                  claim_device("gpu.nvidia.com", "node-a", "gpu-0", "nvidia.com/gpu=0"),
                  claim_device("gpu.nvidia.com", "node-a", "gpu-1-mig-9", "nvidia.com/gpu=1:9",
                               "nvidia.com/gpu=all")),
        ))),
    ))
    go_kubelet.start()
    found = make_client().list_resources()
    assert summary(found.allocations) == [
        ("ml", "trainer-0", "main", "nvidia.com/gpu", GPU0),
        ("team-a", "notebook-0", "jupyter", "nvidia.com/gpu", f"{GPU1}::0"),
        ("team-a", "notebook-1", "jupyter", "nvidia.com/gpu", f"{GPU1}::1"),
        ("team-b", "svc", "app", "nvidia.com/gpu.shared", f"{GPU1}::7"),
        ("research", "exp-a", "cuda", "nvidia.com/mig-1g.10gb", MIG_A),
        ("research", "exp-b", "cuda", "nvidia.com/mig-3g.40gb.shared", f"{MIG_B}::1"),
        ("g", "gke", "c", "nvidia.com/gpu", "nvidia2"),
    ]
    node = [NodeDevice("0", GPU0), NodeDevice("1", GPU1), NodeDevice("1/3", MIG_A, GPU1),
            NodeDevice("1/5", MIG_B, GPU1), NodeDevice("2", GPU2)]
    assert [resolve(a.device, node) for a in found.allocations] == [
        GPU0, GPU1, GPU1, GPU1, MIG_A, MIG_B, GPU2]
    assert [a.device.replica for a in found.allocations] == [None, 0, 1, 7, None, 1, None]
    assert found.claim_devices == (
        ClaimDevice("dra", "infer-0", "server", "dra", "infer-0-gpu", "gpu.nvidia.com",
                    "node-a", "gpu-0", ("nvidia.com/gpu=0",)),
        ClaimDevice("dra", "infer-0", "server", "dra", "infer-0-gpu", "gpu.nvidia.com",
                    "node-a", "gpu-1-mig-9", ("nvidia.com/gpu=1:9", "nvidia.com/gpu=all")),
    )
    assert go_kubelet.wait_calls(1)  # the server reports a call after answering it
    (call,) = go_kubelet.calls
    assert call["method"] == "List"
    assert 1000 < call["deadline_ms"] <= 2000  # our 2 s deadline reached the kubelet


def test_allocatable_replicas_through_grpc_go(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    # NVIDIA's device plugin with sharing.mps (replicas 10, renamed resource): GPU0 advertised
    # as GPU0::0..9 under nvidia.com/gpu.shared, two of them allocated; GPU1 whole.
    go_kubelet.serve(
        response(*(pod("ml", f"client-{n}", container("main", devices(
            "nvidia.com/gpu.shared", f"{GPU0}::{n}"))) for n in range(2)),
            gpu_pod("ml", "solo", GPU1)),
        allocatable=allocatable(replicas("nvidia.com/gpu.shared", GPU0, 10),
                                devices("nvidia.com/gpu", GPU1),
                                devices("example.com/sriov-nic", "0000:3b:00.2")))
    go_kubelet.start()
    client = make_client()
    found = client.list_allocatable()
    assert [d.device.raw for d in found] == [*(f"{GPU0}::{n}" for n in range(10)), GPU1]
    # The server reports a call as it answers; its line may come a moment after the answer.
    assert wait_until(lambda: len(go_kubelet.allocatable_calls) == 1)
    (call,) = go_kubelet.allocatable_calls
    assert call["code"] == 0
    assert 1000 < call["deadline_ms"] <= 2000  # the same 2 s deadline as List()'s

    # The watcher asks both at every refresh; the join counts GPU0's ten replicas.
    watcher = PodResourcesWatcher(client, interval=60.0)
    assert watcher.refresh_once() and watcher.refresh_once()
    assert go_kubelet.wait_calls(2)
    assert wait_until(lambda: len(go_kubelet.allocatable_calls) == 3)
    assert sharing_of(watcher.latest_assignments()) == {
        "0": ("mps", 10), "1": ("exclusive", None)}


@pytest.mark.parametrize(("code", "message"), [
    (0, ""),  # nothing to answer with: the generated UnimplementedPodResourcesListerServer's
    (2, "Pod Resources API GetAllocatableResources disabled"),  # 1.21-1.22, gate off
])
def test_allocatable_not_served_falls_back_to_list(
    go_kubelet: GoKubelet, make_client: MakeClient, code: int, message: str
) -> None:
    go_kubelet.serve(
        response(*(pod("ml", f"client-{n}", container("main", devices(
            "nvidia.com/gpu.shared", f"{GPU0}::{n}"))) for n in range(2))),
        allocatable_error_code=code, allocatable_error_message=message)
    go_kubelet.start()
    client = make_client()
    with pytest.raises(AllocatableUnsupported):
        client.list_allocatable()
    watcher = PodResourcesWatcher(client, interval=60.0)
    assert watcher.refresh_once() is True  # not served is no failure
    assert watcher.status().errors_total == 0
    assert watcher.latest_assignments().allocatable is None
    # The highest replica allocated (::1) + 1: a lower bound.
    assert sharing_of(watcher.latest_assignments()) == {"0": ("mps", 2), "1": ("exclusive", None)}
    assert wait_until(lambda: len(go_kubelet.allocatable_calls) == 2)
    assert [c["code"] for c in go_kubelet.allocatable_calls] == [code or 12, code or 12]


def test_allocatable_slower_than_the_deadline(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    go_kubelet.serve(response(gpu_pod("a", "p", f"{GPU0}::0")),
                     allocatable=allocatable(replicas("nvidia.com/gpu", GPU0, 4)))
    go_kubelet.start()
    watcher = PodResourcesWatcher(make_client(timeout=0.5), interval=60.0)
    assert watcher.refresh_once() is True
    go_kubelet.serve(response(gpu_pod("a", "q", f"{GPU0}::1")),
                     allocatable=allocatable(replicas("nvidia.com/gpu", GPU0, 8)),
                     allocatable_delay_ms=30_000)
    started = time.monotonic()
    assert watcher.refresh_once() is False
    assert 0.45 <= time.monotonic() - started < 10.0
    status = watcher.status()
    assert status.errors_total == 1
    assert (status.last_error or "").startswith(
        "GetAllocatableResources() failed: DEADLINE_EXCEEDED")
    latest = watcher.latest_assignments()
    assert [a.pod for a in latest.allocations] == ["q"]  # List() answered: used
    assert latest.allocatable is not None and len(latest.allocatable) == 4  # the last good
    assert wait_until(lambda: len(go_kubelet.allocatable_calls) == 2)
    assert go_kubelet.allocatable_calls[1]["cancelled"] is True


def sharing_of(assignments: Assignments) -> dict[str, tuple[str, int | None]]:
    """The join's sharing mode and replicas per GPU, on a node with GPU0 (running MPS
    clients) and GPU1."""
    node = (DeviceSample(index="0", uuid=GPU0, model="NVIDIA H200", processes=(
                ProcessSample(752, ("compute",), 1 << 30, None, mps="client"),)),
            DeviceSample(index="1", uuid=GPU1, model="NVIDIA H200"))
    result = attribute(Snapshot(timestamp=1.0, source_up=True, devices=node),
                       assignments.allocations, {}, MetadataSnapshot(),
                       allocatable=assignments.allocatable)
    return {d.gpu: (d.sharing, d.replicas) for d in result.sharing}


def test_answer_of_20_mib(go_kubelet: GoKubelet, make_client: MakeClient) -> None:
    # A node full of pods: 20 MiB of non-GPU filler after the GPU pods. gRPC's default 4 MiB
    # limit would refuse it (dcgm-exporter issue 509); ours is 64 MiB.
    go_kubelet.serve(response(gpu_pod("a", "first", GPU0), gpu_pod("b", "second", GPU1)),
                     pad_to_bytes=20 * MIB)
    go_kubelet.start()
    client = make_client(timeout=10.0)
    started = time.perf_counter()
    found = client.list_resources()
    took = time.perf_counter() - started
    assert [(a.pod, a.device.uuid) for a in found.allocations] == [("first", GPU0),
                                                                    ("second", GPU1)]
    assert go_kubelet.wait_calls(1)
    assert go_kubelet.calls[0]["answer_bytes"] >= 20 * MIB
    assert took < 5.0, took

    with pytest.raises(PodResourcesError, match=r"RESOURCE_EXHAUSTED: Received message larger "
                                                r"than max \(2\d{7} vs. 4194304\)"):
        make_client(max_receive_bytes=4 * MIB).list_allocations()
    # The same client works on: a refused answer breaks nothing.
    assert len(client.list_allocations()) == 2


def test_kubelet_slower_than_the_deadline_then_the_next_call_works(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    # The kubelet would answer after 30 s (it stops waiting when the call ends); the client
    # gives up at its 0.5 s deadline. The bounds are far apart, so a slow host cannot blur them.
    go_kubelet.serve(response(gpu_pod("a", "p", GPU0)), delay_ms=30_000)
    go_kubelet.start()
    client = make_client(timeout=0.5)
    started = time.monotonic()
    with pytest.raises(PodResourcesError, match=r"^List\(\) failed: DEADLINE_EXCEEDED"):
        client.list_allocations()
    assert 0.45 <= time.monotonic() - started < 10.0
    # grpc-go got our deadline with the request and saw the call cancelled when it passed.
    assert go_kubelet.wait_calls(1)
    assert 0 < go_kubelet.calls[0]["deadline_ms"] <= 500
    assert go_kubelet.calls[0]["cancelled"] is True

    go_kubelet.serve(response(gpu_pod("a", "p", GPU0)))
    assert [a.pod for a in client.list_allocations()] == ["p"]


def test_kubelet_status_is_passed_through(go_kubelet: GoKubelet, make_client: MakeClient) -> None:
    go_kubelet.serve(response(), error_code=14, error_message="pod resources not ready")
    go_kubelet.start()
    with pytest.raises(PodResourcesError) as raised:
        make_client().list_allocations()
    assert str(raised.value) == "List() failed: UNAVAILABLE: pod resources not ready"


def test_kubelet_killed_and_restarted_on_the_same_socket(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    go_kubelet.serve(response(gpu_pod("a", "before", GPU0)))
    go_kubelet.start()
    client = make_client(timeout=30.0)
    assert [a.pod for a in client.list_allocations()] == ["before"]
    first_pid = go_kubelet.pid

    # Killed: the socket file stays, nobody listens. Refused at once, not at the 30 s deadline.
    go_kubelet.kill()
    assert os.path.exists(go_kubelet.path)
    started = time.monotonic()
    with pytest.raises(PodResourcesError, match="UNAVAILABLE"):
        client.list_allocations()
    assert time.monotonic() - started < 10.0

    # A new kubelet on the same path (removing the stale file first, as the kubelet does).
    go_kubelet.serve(response(gpu_pod("a", "after", GPU1)))
    go_kubelet.start()
    assert go_kubelet.pid != first_pid
    assert [(a.pod, a.device.uuid) for a in client.list_allocations()] == [("after", GPU1)]

    # Stopped cleanly: the socket file is gone.
    go_kubelet.stop()
    assert wait_until(lambda: not os.path.exists(go_kubelet.path))
    with pytest.raises(PodResourcesError, match="absent"):
        client.list_allocations()
    go_kubelet.start()
    assert [a.pod for a in client.list_allocations()] == ["after"]


def test_kubelet_crashing_right_after_answering(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    # The kubelet answers, then dies (exit 3); a restart later serves again. The watcher keeps
    # the last answer in between and counts the failures. Two calls: the refresh's List() and
    # GetAllocatableResources() (UNIMPLEMENTED here).
    go_kubelet.serve(response(gpu_pod("a", "p", GPU0)), exit_after_calls=2)
    go_kubelet.start()
    watcher = PodResourcesWatcher(make_client(timeout=1.0), interval=60.0)
    assert watcher.refresh_once() is True
    assert go_kubelet.wait_exit() == 3
    assert watcher.refresh_once() is False
    assert watcher.refresh_once() is False
    assert [a.pod for a in watcher.latest()] == ["p"]
    status = watcher.status()
    assert (status.errors_total, status.refreshes_total) == (2, 3)
    assert "UNAVAILABLE" in (status.last_error or "")

    go_kubelet.serve(response(gpu_pod("a", "q", GPU1)))
    go_kubelet.start()
    assert watcher.refresh_once() is True
    assert [a.pod for a in watcher.latest()] == ["q"]
    watcher.stop()


def test_500_calls_in_a_row_keep_files_and_threads_flat(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    go_kubelet.serve(response(gpu_pod("a", "p", GPU0), gpu_pod("b", "q", f"{GPU1}::3")))
    go_kubelet.start()
    client = make_client()
    client.list_allocations()  # imports h2 and protobuf
    fds_before, threads_before = open_fds(), set(threading.enumerate())
    for _ in range(500):  # their cost per call: bench/hot_paths.py
        assert len(client.list_allocations()) == 2
    assert client.connections_made == 501
    assert go_kubelet.wait_calls(501)
    # One connection and one event loop per call, each closed by the call's end.
    assert open_fds() <= fds_before, (open_fds(), fds_before)
    assert set(threading.enumerate()) == threads_before
    client.close()
    assert open_fds() <= fds_before


def test_socket_absent(go_kubelet: GoKubelet, make_client: MakeClient) -> None:
    # Never started: no socket file. An error per refresh, no exception, nothing dialled.
    client = make_client()
    watcher = PodResourcesWatcher(client, interval=60.0)
    assert watcher.refresh_once() is False
    status = watcher.status()
    assert status.last_error == f"kubelet socket {go_kubelet.path} absent"
    assert watcher.latest_assignments() == Assignments()
    assert client.connections_made == 0

    go_kubelet.serve(response(gpu_pod("a", "p", GPU0)))
    go_kubelet.start()
    assert watcher.refresh_once() is True
    assert [a.pod for a in watcher.latest()] == ["p"]


def test_watcher_thread_over_a_slow_kubelet_and_stop(
    go_kubelet: GoKubelet, make_client: MakeClient
) -> None:
    # The watcher's thread is inside a call held by the kubelet; latest() answers at once,
    # and stop() ends the call and the thread without waiting for the deadline.
    go_kubelet.serve(response(gpu_pod("a", "p", GPU0)))
    go_kubelet.start()
    watcher = PodResourcesWatcher(make_client(timeout=30.0), interval=0.05)
    watcher.start()
    assert wait_until(lambda: watcher.status().success is True)
    # Counted before the answer is held back: the watcher asks every 0.05 s, so a List()
    # can arrive between the two (counted after, a held call already in flight was missed
    # and the wait below waited for a next one that the 20 s hold kept from coming).
    seen = len(go_kubelet.started)
    go_kubelet.serve(response(gpu_pod("a", "p", GPU0)), delay_ms=20_000)

    def unanswered() -> set[object]:
        answered = {c.get("call") for c in go_kubelet.calls}
        return {s["started"] for s in go_kubelet.started[seen:]} - answered

    # A call arrived that the kubelet has not answered, and is still unanswered half a
    # second on (any undelayed one is answered within milliseconds): the watcher is waiting
    # on it.
    def held() -> bool:
        waiting = unanswered()
        time.sleep(0.5)
        return bool(waiting & unanswered())

    assert wait_until(held, timeout=20.0)
    assert watcher.status().in_flight and len(go_kubelet.started) > len(go_kubelet.calls)
    started = time.perf_counter()
    assert [a.pod for a in watcher.latest()] == ["p"]
    # The call in flight is held for 20 s: a read that waited on it would take that long
    # (5 s leaves a busy host room and stays far from 20).
    assert time.perf_counter() - started < 5.0
    started = time.perf_counter()
    watcher.stop()
    assert time.perf_counter() - started < 5.0
    assert not any(t.name == "gpuscope-podresources" for t in threading.enumerate())
