"""Which container holds which GPU, from the kubelet's PodResources v1 API.

Source: the kubelet serves ``v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock`` by default; ``--kubelet-socket``). Each
``List()`` answer names, per pod and container, the device IDs the device plugins allocated.
We keep those of the GPU resources (:data:`DEFAULT_RESOURCES` plus user-configured names)
and return them as frozen :class:`Allocation` values; ``devices.py`` takes the IDs apart.

Two classes:

:class:`PodResourcesClient`
    One ``List()`` call per :meth:`~PodResourcesClient.list_allocations`, on a new HTTP/2
    connection to the unix socket (``grpc_call.py``), with a deadline, and a receive limit far
    above gRPC's 4 MiB default (big nodes answer with more: dcgm-exporter issue 509). A
    connection per call every few seconds on a local socket costs well under a millisecond
    and carries no state that can go stale across a kubelet restart. Raises
    :class:`PodResourcesError` on failure.
:class:`PodResourcesWatcher`
    Calls the client every ``interval`` seconds in its own daemon thread and keeps the last
    good answer. :meth:`PodResourcesWatcher.latest` never blocks and never talks to the
    kubelet, so a scrape cannot wait on a slow or absent kubelet; failures only count.

No grpcio and no protobuf runtime on the node: the call is made by ``grpc_call.py`` (HTTP/2
and HPACK in pure Python) and the answer decoded by ``wire.py`` (protobuf wire format, by
hand, for the four messages we read). Together they cost a fraction of a MiB where grpcio and
protobuf cost ~19.6 MiB of resident memory on every GPU node (docs/benchmarks.md). The
``.proto`` and the stubs generated from it live with the tests, which serve ``List()`` from a
real grpcio server and check the decoder against the protobuf runtime.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuscope.exporter.kubernetes.podresources import wire
from gpuscope.exporter.kubernetes.podresources.devices import DeviceRef, parse_device_id
from gpuscope.exporter.kubernetes.podresources.grpc_call import (
    GrpcError,
    UnixGrpcCall,
    check_limits,
)

__all__ = [
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_RESOURCES",
    "Allocation",
    "AllocationLister",
    "PodResourcesClient",
    "PodResourcesError",
    "PodResourcesWatcher",
    "WatcherStatus",
    "matches_resource",
]

log = logging.getLogger(__name__)

DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"

#: Resource names counted as GPUs. A trailing ``*`` makes a prefix pattern: the NVIDIA device
#: plugin exposes MIG slices as ``nvidia.com/mig-<profile>`` (``nvidia.com/mig-1g.10gb``, and
#: ``...gb.shared`` when time-sliced), and time-sliced GPUs as ``nvidia.com/gpu`` or, with
#: ``renameByDefault``, ``nvidia.com/gpu.shared``. GKE's plugin uses ``nvidia.com/gpu``.
DEFAULT_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")

# The gRPC method path of List(): "/<proto package>.<service>/<method>", as the kubelet
# registers it.
_LIST_METHOD = "/v1.PodResourcesLister/List"


class PodResourcesError(Exception):
    """A ``List()`` call failed; the message is one line fit for a log or a status page."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One GPU device ID allocated to one container.

    A container holding two GPUs appears twice; a container holding two time-slicing replicas
    of one GPU also appears twice (``device.replica`` 0 and 1, the same GPU). ``device`` may
    be unrecognised (``device.error`` set); it then resolves to no NVML device.
    """

    namespace: str
    pod: str
    container: str
    resource_name: str
    device: DeviceRef


def matches_resource(resource_name: str, patterns: Sequence[str]) -> bool:
    """True when ``resource_name`` equals a pattern, or starts with a pattern ending in ``*``."""
    for pattern in patterns:
        if pattern.endswith("*"):
            if resource_name.startswith(pattern[:-1]):
                return True
        elif resource_name == pattern:
            return True
    return False


class AllocationLister(Protocol):
    """What :class:`PodResourcesWatcher` needs; :class:`PodResourcesClient` is one."""

    def list_allocations(self) -> tuple[Allocation, ...]: ...

    def close(self) -> None: ...


class PodResourcesClient:
    """Calls the kubelet's ``List()`` on its unix socket, one short connection per call.

    ``socket_path``: the kubelet's pod-resources socket. ``timeout``: the deadline of each
    call, seconds. ``max_receive_bytes``: the largest answer accepted (gRPC's default of
    4 MiB is too small for nodes with many pods). ``resource_names``: which resources count
    as GPUs (see :data:`DEFAULT_RESOURCES`; pass ``(*DEFAULT_RESOURCES, "example.com/gpu")``
    to add one). Thread-safe; :meth:`close` is final and cancels a call in flight.
    """

    def __init__(
        self,
        socket_path: str,
        timeout: float = 5.0,
        max_receive_bytes: int = 64 * 1024 * 1024,
        resource_names: Sequence[str] = DEFAULT_RESOURCES,
    ) -> None:
        if not socket_path:
            raise ValueError("socket_path must not be empty")
        check_limits(timeout, max_receive_bytes)  # refused now, not at the first call
        self.socket_path = socket_path
        self.timeout = timeout
        self.max_receive_bytes = max_receive_bytes
        self.resource_names: tuple[str, ...] = tuple(resource_names)
        self._lock = threading.Lock()
        self._call: UnixGrpcCall | None = None
        self._connections = 0
        self._closed = False

    @property
    def connections_made(self) -> int:
        """How many connections to the socket this client has opened (one per call)."""
        return self._connections

    def list_allocations(self) -> tuple[Allocation, ...]:
        """Call ``List()`` once and return the GPU allocations, in the kubelet's order.

        Raises :class:`PodResourcesError` when the socket is absent, the call fails, the
        deadline passes or the answer is malformed.
        """
        if not os.path.exists(self.socket_path):
            # Checked before dialling: a clearer reason than "connection refused".
            if self._closed:
                raise PodResourcesError("client closed")
            raise PodResourcesError(f"kubelet socket {self.socket_path} absent")
        call = UnixGrpcCall(
            self.socket_path,
            _LIST_METHOD,
            wire.encode_list_request(),
            timeout=self.timeout,
            max_receive_bytes=self.max_receive_bytes,
        )
        with self._lock:
            if self._closed:
                raise PodResourcesError("client closed")
            self._call = call
            self._connections += 1
        try:
            answer = call.run()
        except GrpcError as error:
            raise PodResourcesError(f"List() failed: {error}") from error
        finally:
            with self._lock:
                self._call = None
        try:
            pods = wire.decode_list_response(answer)
        except wire.WireError as error:
            raise PodResourcesError(f"List() failed: INTERNAL: bad answer: {error}") from error
        return self._allocations(pods)

    def close(self) -> None:
        """Cancel a call in flight; later calls raise."""
        with self._lock:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()

    def _allocations(self, pods: tuple[wire.PodResources, ...]) -> tuple[Allocation, ...]:
        patterns = self.resource_names
        found: list[Allocation] = []
        for pod in pods:
            for container in pod.containers:
                for devices in container.devices:
                    if not matches_resource(devices.resource_name, patterns):
                        continue  # CPUs, NICs, other vendors' devices: not ours
                    for raw in devices.device_ids:
                        found.append(
                            Allocation(
                                namespace=pod.namespace,
                                pod=pod.name,
                                container=container.name,
                                resource_name=devices.resource_name,
                                device=parse_device_id(raw),
                            )
                        )
        return tuple(found)


@dataclass(frozen=True, slots=True)
class WatcherStatus:
    """How the background refresh is doing, for self-metrics and ``/readyz``-style checks.

    ``success``: whether the last refresh succeeded (``None`` before the first one);
    ``duration_seconds``: how long the last refresh took, success or not (seconds, from the
    watcher's monotonic clock); ``refreshes_total`` / ``errors_total``: counts since start;
    ``last_error``: the last failure's one-line reason (kept after a recovery);
    ``last_success_age_seconds``: seconds since the last good answer (``None``: never);
    ``in_flight``: a ``List()`` call is running now.
    """

    success: bool | None
    duration_seconds: float | None
    refreshes_total: int
    errors_total: int
    last_error: str | None
    last_success_age_seconds: float | None
    in_flight: bool


@dataclass(frozen=True, slots=True)
class _Progress:
    # Replaced as a whole, never mutated, so readers need no lock (one reference read).
    success: bool | None = None
    duration_seconds: float | None = None
    refreshes_total: int = 0
    errors_total: int = 0
    last_error: str | None = None
    last_success_at: float | None = None


class PodResourcesWatcher:
    """Refreshes the allocations in the background and serves the last good answer.

    ``client``: anything with ``list_allocations()`` and ``close()`` (a
    :class:`PodResourcesClient` in production); the watcher owns it and closes it in
    :meth:`stop`. ``interval``: seconds between the end of one refresh and the start of the
    next (a fixed delay, so a slow kubelet is never called back to back). ``clock``: a
    monotonic clock in seconds, for durations and ages.

    A failed refresh (socket absent, kubelet down or hanging past the client's deadline)
    counts an error and keeps the previous allocations: the kubelet being briefly away does
    not mean every GPU was freed. Nothing raised by the client escapes the thread.
    """

    def __init__(
        self,
        client: AllocationLister,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        thread_name: str = "gpuscope-podresources",
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self._client = client
        self._interval = interval
        self._clock = clock
        self._thread_name = thread_name
        self._allocations: tuple[Allocation, ...] = ()
        self._progress = _Progress()
        self._in_flight = False
        self._refresh_lock = threading.Lock()  # one refresh at a time; readers never take it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> tuple[Allocation, ...]:
        """The last good allocations (empty before the first success). Never blocks."""
        return self._allocations

    def status(self) -> WatcherStatus:
        """A consistent view of the refresh counters. Never blocks."""
        progress = self._progress
        age = None
        if progress.last_success_at is not None:
            age = max(0.0, self._clock() - progress.last_success_at)
        return WatcherStatus(
            success=progress.success,
            duration_seconds=progress.duration_seconds,
            refreshes_total=progress.refreshes_total,
            errors_total=progress.errors_total,
            last_error=progress.last_error,
            last_success_age_seconds=age,
            in_flight=self._in_flight,
        )

    def refresh_once(self) -> bool:
        """Call ``List()`` now, in the calling thread; True on success. Never raises."""
        with self._refresh_lock:
            self._in_flight = True
            started = self._clock()
            try:
                allocations = self._client.list_allocations()
            except Exception as error:  # any failure is a counted error, never a crash
                self._record_failure(started, error)
                return False
            finally:
                self._in_flight = False
            self._record_success(started, allocations)
            return True

    def start(self) -> None:
        """Start the daemon thread; its first refresh runs at once. Idempotent."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the thread and close the client (which cancels a call in flight)."""
        self._stop.set()
        self._client.close()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh_once()
            self._stop.wait(self._interval)

    def _record_success(self, started: float, allocations: tuple[Allocation, ...]) -> None:
        now = self._clock()
        previous = self._progress
        if previous.success is False:
            log.info("kubelet pod-resources: List() works again (%d GPU allocations)",
                     len(allocations))
        self._allocations = allocations
        self._progress = _Progress(
            success=True,
            duration_seconds=max(0.0, now - started),
            refreshes_total=previous.refreshes_total + 1,
            errors_total=previous.errors_total,
            last_error=previous.last_error,
            last_success_at=now,
        )

    def _record_failure(self, started: float, error: Exception) -> None:
        now = self._clock()
        previous = self._progress
        reason = str(error) if isinstance(error, PodResourcesError) else repr(error)
        # Log the change from working to failing once; repeats only at debug level, so an
        # absent socket on a non-Kubernetes host does not flood the log every interval.
        if previous.success is not False:
            log.warning("kubelet pod-resources: %s; keeping the last known allocations", reason)
        else:
            log.debug("kubelet pod-resources: %s", reason)
        self._progress = _Progress(
            success=False,
            duration_seconds=max(0.0, now - started),
            refreshes_total=previous.refreshes_total + 1,
            errors_total=previous.errors_total + 1,
            last_error=reason,
            last_success_at=previous.last_success_at,
        )
