"""Which container holds which GPU, from the kubelet's PodResources v1 API.

Source: the kubelet serves ``v1.PodResourcesLister/List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock`` by default; ``--kubelet-socket``). Each
``List()`` answer names, per pod and container, the device IDs the device plugins allocated
and the devices of the DRA ResourceClaims the container uses. We keep the device-plugin IDs of
the GPU resources (:data:`DEFAULT_RESOURCES` plus user-configured names) as frozen
:class:`Allocation` values (``devices.py`` takes the IDs apart), and every DRA device as a
:class:`ClaimDevice` (read and returned; not yet attributed).

``GetAllocatableResources()`` (the same service; Kubernetes 1.21+ behind the feature gate
``KubeletPodResourcesGetAllocatable``, on by default from 1.23) names every device the device
plugins advertise, allocated or not (their healthy devices): the GPU resources' IDs are kept as
:class:`AllocatableDevice` values. They say how many replicas ``GPU-<uuid>::<n>`` the plugin
makes of a time-sliced or MPS GPU (``gpu_sharing_replicas``). A kubelet that does not serve it
(``UNIMPLEMENTED``; ``UNKNOWN`` "... GetAllocatableResources disabled" with the gate off)
raises :class:`AllocatableUnsupported`.

Two classes:

:class:`PodResourcesClient`
    One ``List()`` call per :meth:`~PodResourcesClient.list_allocations` (one
    ``GetAllocatableResources()`` per :meth:`~PodResourcesClient.list_allocatable`), over
    ``h2`` with the protobuf runtime (``call.py``), on a new connection each time, in the
    calling thread, with a deadline, and a receive limit far above gRPC's 4 MiB default (big
    nodes answer with more: dcgm-exporter issue 509). A connection per call every few seconds
    on a local socket costs about a millisecond and carries no state that can go stale across
    a kubelet restart.
    Raises :class:`PodResourcesError` on failure.
:class:`PodResourcesWatcher`
    Calls the client every ``interval`` seconds in its own daemon thread (``List()``, then
    ``GetAllocatableResources()``) and keeps the last good answers.
    :meth:`PodResourcesWatcher.latest` never blocks and never talks to the kubelet, so a
    scrape cannot wait on a slow or absent kubelet; failures only count.

h2 and protobuf are imported by the first call, not by this module: the types here (and
so the attribution code and the simulated source, which import them) load neither. The
``.proto`` is ``api.proto``, a copy of the kubelet's; the messages generated from it are committed
(``generate.sh``). The tests serve both calls from grpc-go (what kubelets run) and grpcio.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuscope.exporter.kubernetes.podresources.devices import DeviceRef, parse_device_id

if TYPE_CHECKING:
    from gpuscope.exporter.kubernetes.podresources import api_pb2
    from gpuscope.exporter.kubernetes.podresources.call import Response, UnaryCall

__all__ = [
    "DEFAULT_ALLOCATABLE_RETRY",
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_MAX_RECEIVE_BYTES",
    "DEFAULT_RESOURCES",
    "AllocatableDevice",
    "AllocatableLister",
    "AllocatableUnsupported",
    "Allocation",
    "AllocationLister",
    "Assignments",
    "ClaimDevice",
    "PodResourcesClient",
    "PodResourcesError",
    "PodResourcesWatcher",
    "ResourceLister",
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

#: The largest ``List()`` answer accepted, bytes: 16 times gRPC's default of 4 MiB.
DEFAULT_MAX_RECEIVE_BYTES = 64 * 1024 * 1024

#: Seconds before a kubelet that did not serve ``GetAllocatableResources()`` is asked again
#: (it may have been upgraded, or its feature gate turned on, in the meantime).
DEFAULT_ALLOCATABLE_RETRY = 600.0


class PodResourcesError(Exception):
    """A call failed; the message is one line fit for a log or a status page."""


class AllocatableUnsupported(PodResourcesError):
    """The kubelet does not serve ``GetAllocatableResources()``: before Kubernetes 1.21
    (``UNIMPLEMENTED``), or 1.21-1.22 with the feature gate
    ``KubeletPodResourcesGetAllocatable`` off (``UNKNOWN``: "Pod Resources API
    GetAllocatableResources disabled")."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """One GPU device ID allocated to one container by a device plugin.

    A container holding two GPUs appears twice; a container holding two time-slicing replicas
    of one GPU also appears twice (``device.replica`` 0 and 1, the same GPU). ``device`` may
    be unrecognised (``device.error`` set); it then resolves to no NVML device.
    """

    namespace: str
    pod: str
    container: str
    resource_name: str
    device: DeviceRef


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device allocated to one container through a DRA ResourceClaim (Kubernetes 1.34+:
    ``ContainerResources.dynamic_resources``), as the kubelet reports it.

    ``driver_name``/``pool_name``/``device_name`` identify the device as the claim's
    ``status.allocation.devices.results`` and the driver's ResourceSlices do (``device_name``
    is empty for a resource that is not a device); ``cdi_devices`` are the fully qualified CDI
    names it was handed to the container runtime as (``nvidia.com/gpu=0``...), maybe none.
    Every driver's devices are kept, GPU or not: which are GPUs is for the caller to decide.
    """

    namespace: str
    pod: str
    container: str
    claim_namespace: str
    claim_name: str
    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AllocatableDevice:
    """One GPU device ID a device plugin advertises, allocated or not, as the kubelet's
    ``GetAllocatableResources()`` names it (the plugin's healthy devices): ``GPU-<uuid>``,
    or ``GPU-<uuid>::<n>``, replica ``n`` of a time-sliced or MPS GPU (``device.replica``)."""

    resource_name: str
    device: DeviceRef


@dataclass(frozen=True, slots=True)
class Assignments:
    """Everything one ``List()`` answer assigns to containers, in the kubelet's order, and
    (from the watcher) the GPU devices the kubelet can assign: ``allocatable`` is the last
    good ``GetAllocatableResources()`` answer, ``None`` while none is known (not asked yet,
    not served by this kubelet, or failing since the start)."""

    allocations: tuple[Allocation, ...] = ()
    claim_devices: tuple[ClaimDevice, ...] = ()
    allocatable: tuple[AllocatableDevice, ...] | None = None


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


@runtime_checkable
class ResourceLister(AllocationLister, Protocol):
    """A lister that also returns DRA claim devices; the watcher then keeps those too."""

    def list_resources(self) -> Assignments: ...


@runtime_checkable
class AllocatableLister(AllocationLister, Protocol):
    """A lister that also asks ``GetAllocatableResources()``; the watcher then keeps its
    answer too (``Assignments.allocatable``)."""

    def list_allocatable(self) -> tuple[AllocatableDevice, ...]: ...


class PodResourcesClient:
    """Calls the kubelet's ``List()`` and ``GetAllocatableResources()`` on its unix socket,
    one short connection per call.

    ``socket_path``: the kubelet's pod-resources socket. ``timeout``: the deadline of each
    call, seconds. ``max_receive_bytes``: the largest answer accepted (gRPC's default of
    4 MiB is too small for nodes with many pods). ``resource_names``: which resources count
    as GPUs (see :data:`DEFAULT_RESOURCES`; pass ``(*DEFAULT_RESOURCES, "example.com/gpu")``
    to add one). Thread-safe, one call at a time; :meth:`close` is final and cancels a call in
    flight.
    """

    def __init__(
        self,
        socket_path: str,
        timeout: float = 5.0,
        max_receive_bytes: int = DEFAULT_MAX_RECEIVE_BYTES,
        resource_names: Sequence[str] = DEFAULT_RESOURCES,
    ) -> None:
        if not socket_path:
            raise ValueError("socket_path must not be empty")
        # Refused now, not at the first call (call.check_limits, without importing h2).
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if max_receive_bytes <= 0:
            raise ValueError(f"max_receive_bytes must be > 0, got {max_receive_bytes}")
        self.socket_path = socket_path
        self.timeout = timeout
        self.max_receive_bytes = max_receive_bytes
        self.resource_names: tuple[str, ...] = tuple(resource_names)
        self._lock = threading.Lock()  # guards _call, _closed, _connections
        self._one_call = threading.Lock()  # held for a whole call: one at a time
        self._call: UnaryCall[Any] | None = None
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
        return self.list_resources().allocations

    def list_resources(self) -> Assignments:
        """Call ``List()`` once and return the GPU allocations and every DRA claim device.

        Raises :class:`PodResourcesError` like :meth:`list_allocations`.
        """
        with self._one_call:
            return _assignments(self._list(), self.resource_names)

    def list_allocatable(self) -> tuple[AllocatableDevice, ...]:
        """Call ``GetAllocatableResources()`` once and return the GPU resources' devices, in
        the kubelet's order.

        Raises :class:`AllocatableUnsupported` when the kubelet does not serve the call, and
        :class:`PodResourcesError` on any other failure, as :meth:`list_allocations` does.
        """
        with self._one_call:
            return _allocatable(self._allocatable(), self.resource_names)

    def close(self) -> None:
        """Cancel a call in flight; later calls raise."""
        with self._lock:
            self._closed = True
            call = self._call
        if call is not None:
            call.cancel()

    def _list(self) -> api_pb2.ListPodResourcesResponse:
        def make() -> UnaryCall[api_pb2.ListPodResourcesResponse]:
            # Imported here, not at the top: h2 and protobuf load with the first call.
            from gpuscope.exporter.kubernetes.podresources.call import ListCall

            return ListCall(self.socket_path, self.timeout, self.max_receive_bytes)

        return self._run(make, "List()")

    def _allocatable(self) -> api_pb2.AllocatableResourcesResponse:
        def make() -> UnaryCall[api_pb2.AllocatableResourcesResponse]:
            from gpuscope.exporter.kubernetes.podresources.call import AllocatableCall

            return AllocatableCall(self.socket_path, self.timeout, self.max_receive_bytes)

        try:
            return self._run(make, "GetAllocatableResources()")
        except PodResourcesError as error:
            # The call's CallError: its gRPC status code and details.
            code = getattr(error.__cause__, "code", None)
            details = getattr(error.__cause__, "details", "")
            if code == "UNIMPLEMENTED" or (
                    code == "UNKNOWN" and "GetAllocatableResources disabled" in details):
                raise AllocatableUnsupported(str(error)) from error.__cause__
            raise

    def _run(self, make: Callable[[], UnaryCall[Response]], method: str) -> Response:
        if not os.path.exists(self.socket_path):
            # Checked before dialling: a clearer reason than "connection refused".
            if self._closed:
                raise PodResourcesError("client closed")
            raise PodResourcesError(f"kubelet socket {self.socket_path} absent")
        call = make()
        from gpuscope.exporter.kubernetes.podresources.call import CallError

        with self._lock:
            if self._closed:
                raise PodResourcesError("client closed")
            self._call = call
            self._connections += 1
        try:
            return call.run()
        except CallError as error:
            if error.code == "CANCELLED" and self._closed:
                raise PodResourcesError("client closed") from error
            raise PodResourcesError(f"{method} failed: {error}") from error
        finally:
            with self._lock:
                self._call = None


def _assignments(
    answer: api_pb2.ListPodResourcesResponse, patterns: Sequence[str]
) -> Assignments:
    allocations: list[Allocation] = []
    claim_devices: list[ClaimDevice] = []
    for pod in answer.pod_resources:
        for container in pod.containers:
            for devices in container.devices:
                if not matches_resource(devices.resource_name, patterns):
                    continue  # CPUs, NICs, other vendors' devices: not ours
                for raw in devices.device_ids:
                    allocations.append(
                        Allocation(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            resource_name=devices.resource_name,
                            device=parse_device_id(raw),
                        )
                    )
            for claim in container.dynamic_resources:
                for resource in claim.claim_resources:
                    claim_devices.append(
                        ClaimDevice(
                            namespace=pod.namespace,
                            pod=pod.name,
                            container=container.name,
                            claim_namespace=claim.claim_namespace,
                            claim_name=claim.claim_name,
                            driver_name=resource.driver_name,
                            pool_name=resource.pool_name,
                            device_name=resource.device_name,
                            cdi_devices=tuple(cdi.name for cdi in resource.cdi_devices),
                        )
                    )
    return Assignments(tuple(allocations), tuple(claim_devices))


def _allocatable(
    answer: api_pb2.AllocatableResourcesResponse, patterns: Sequence[str]
) -> tuple[AllocatableDevice, ...]:
    return tuple(
        AllocatableDevice(devices.resource_name, parse_device_id(raw))
        for devices in answer.devices
        if matches_resource(devices.resource_name, patterns)
        for raw in devices.device_ids
    )


@dataclass(frozen=True, slots=True)
class WatcherStatus:
    """How the background refresh is doing, for self-metrics and ``/readyz``-style checks.

    ``success``: whether the last refresh succeeded (``None`` before the first one): its
    ``List()`` and, where asked, its ``GetAllocatableResources()`` (a kubelet that does not
    serve that call is no failure);
    ``duration_seconds``: how long the last refresh took, success or not (seconds, from the
    watcher's monotonic clock); ``refreshes_total`` / ``errors_total``: counts since start;
    ``last_error``: the last failure's one-line reason (kept after a recovery);
    ``last_success_age_seconds``: seconds since the last refresh that succeeded (``None``:
    never); ``in_flight``: a refresh's call is running now.
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
    :meth:`stop`. A client that also has ``list_resources()`` (:class:`ResourceLister`, as
    :class:`PodResourcesClient` has) is called through it, and the DRA claim devices are kept
    too (:meth:`latest_assignments`). A client that also has ``list_allocatable()``
    (:class:`AllocatableLister`, as :class:`PodResourcesClient` has) is asked it after each
    good ``List()``, in the same refresh, and its answer is kept as
    ``Assignments.allocatable``. ``interval``: seconds between the end of one refresh
    and the start of the next (a fixed delay, so a slow kubelet is never called back to
    back). ``clock``: a monotonic clock in seconds, for durations and ages.
    ``allocatable_retry``: seconds before a kubelet that did not serve
    ``GetAllocatableResources()`` is asked it again (sooner after a failed ``List()``: the
    kubelet was away, and may be back as another version).

    A failed refresh (socket absent, kubelet down or hanging past the client's deadline)
    counts an error and keeps the previous allocations: the kubelet being briefly away does
    not mean every GPU was freed. A failed ``List()`` skips ``GetAllocatableResources()``
    (one deadline per refresh, not two, on a hanging kubelet). A ``GetAllocatableResources()``
    that fails after a good ``List()`` counts an error too and keeps the previous allocatable
    devices, the new allocations being used. Nothing raised by the client escapes the
    thread.
    """

    def __init__(
        self,
        client: AllocationLister,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        thread_name: str = "gpuscope-podresources",
        allocatable_retry: float = DEFAULT_ALLOCATABLE_RETRY,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        if allocatable_retry <= 0:
            raise ValueError(f"allocatable_retry must be > 0 seconds, got {allocatable_retry}")
        self._client = client
        self._interval = interval
        self._clock = clock
        self._thread_name = thread_name
        self._allocatable_retry = allocatable_retry
        # GetAllocatableResources() not served: ask again from this clock reading (None: at
        # the next refresh); whether that was logged already.
        self._allocatable_retry_at: float | None = None
        self._allocatable_unsupported = False
        self._assignments = Assignments()
        self._progress = _Progress()
        self._in_flight = False
        self._refresh_lock = threading.Lock()  # one refresh at a time; readers never take it
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self) -> tuple[Allocation, ...]:
        """The last good allocations (empty before the first success). Never blocks."""
        return self._assignments.allocations

    def latest_assignments(self) -> Assignments:
        """The last good answer, allocations and DRA claim devices of the same ``List()``
        (empty before the first success), and the last good ``GetAllocatableResources()``
        answer (``None`` while none is known). Never blocks."""
        return self._assignments

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
        """Call ``List()`` now, then ``GetAllocatableResources()`` where the client can and
        it is due, in the calling thread; True on success. Never raises."""
        with self._refresh_lock:
            self._in_flight = True
            started = self._clock()
            client = self._client
            try:
                if isinstance(client, ResourceLister):
                    assignments = client.list_resources()
                else:
                    assignments = Assignments(client.list_allocations())
            except Exception as error:  # any failure is a counted error, never a crash
                self._in_flight = False
                self._allocatable_retry_at = None  # the kubelet may come back another version
                self._record_failure(started, error, "allocations")
                return False
            failure: Exception | None = None
            try:
                allocatable = self._assignments.allocatable
                if isinstance(client, AllocatableLister) and self._allocatable_due(started):
                    allocatable = self._ask_allocatable(client)
            except Exception as error:  # counted, the last good answer kept
                failure = error
            finally:
                self._in_flight = False
            assignments = Assignments(assignments.allocations, assignments.claim_devices,
                                      allocatable)
            if failure is not None:
                self._record_failure(started, failure, "allocatable devices", assignments)
                return False
            self._record_success(started, assignments)
            return True

    def _allocatable_due(self, now: float) -> bool:
        return self._allocatable_retry_at is None or now >= self._allocatable_retry_at

    def _ask_allocatable(
        self, client: AllocatableLister
    ) -> tuple[AllocatableDevice, ...] | None:
        """``GetAllocatableResources()``'s GPU devices; ``None`` where the kubelet does not
        serve the call (then asked again after ``allocatable_retry``). Raises on a failure."""
        try:
            allocatable = client.list_allocatable()
        except AllocatableUnsupported as error:
            self._allocatable_retry_at = self._clock() + self._allocatable_retry
            if not self._allocatable_unsupported:
                self._allocatable_unsupported = True
                log.info("kubelet pod-resources: %s; replicas per GPU from List() alone (a "
                         "lower bound); asked again every %g s", error, self._allocatable_retry)
            else:
                log.debug("kubelet pod-resources: %s", error)
            return None
        self._allocatable_retry_at = None
        if self._allocatable_unsupported:
            self._allocatable_unsupported = False
            log.info("kubelet pod-resources: GetAllocatableResources() answers now")
        return allocatable

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

    def _record_success(self, started: float, assignments: Assignments) -> None:
        now = self._clock()
        previous = self._progress
        if previous.success is False:
            log.info("kubelet pod-resources: List() works again (%d GPU allocations)",
                     len(assignments.allocations))
        self._assignments = assignments
        self._progress = _Progress(
            success=True,
            duration_seconds=max(0.0, now - started),
            refreshes_total=previous.refreshes_total + 1,
            errors_total=previous.errors_total,
            last_error=previous.last_error,
            last_success_at=now,
        )

    def _record_failure(self, started: float, error: Exception, kept: str,
                        assignments: Assignments | None = None) -> None:
        """A failed refresh: ``kept`` names what the last good answer still gives;
        ``assignments``, where given, are the refresh's own (its ``List()`` answered)."""
        now = self._clock()
        previous = self._progress
        reason = str(error) if isinstance(error, PodResourcesError) else repr(error)
        # Log the change from working to failing once; repeats only at debug level, so an
        # absent socket on a non-Kubernetes host does not flood the log every interval.
        if previous.success is not False:
            log.warning("kubelet pod-resources: %s; keeping the last known %s", reason, kept)
        else:
            log.debug("kubelet pod-resources: %s", reason)
        if assignments is not None:
            self._assignments = assignments
        self._progress = _Progress(
            success=False,
            duration_seconds=max(0.0, now - started),
            refreshes_total=previous.refreshes_total + 1,
            errors_total=previous.errors_total + 1,
            last_error=reason,
            last_success_at=previous.last_success_at,
        )
