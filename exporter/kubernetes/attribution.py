"""Per-container GPU usage: joins who was *allocated* a device with who *uses* it.

Three facts are joined for every sampling round (design card, "Attribution"):

1. **Allocations** — which container holds which device, from the kubelet PodResources v1
   ``List()`` (``gpuscope.exporter.kubernetes.podresources``), device IDs resolved to NVML UUIDs.
2. **Processes** — which host PID runs on which device, with its memory and SM utilization,
   from the snapshot (NVML).
3. **PID → container** — ``<proc-root>/<pid>/cgroup`` gives the pod UID and container ID
   (``gpuscope.exporter.kubernetes.cgroups``); the API server gives their names
   (``gpuscope.exporter.kubernetes.apiserver``).

:func:`attribute` is a pure function of those facts, so the per-container numbers are tested
value by value without a cluster. :class:`Attributor` runs it on the sampler thread for every
snapshot, reading inputs that background threads keep fresh: a scrape only renders the stored
result and never waits on the kubelet or the API server.

The rules, and why:

- A container's utilization on a device is the **sum of its own processes'** SM utilization
  (NVML per-process samples over the interval). Under time-slicing every container gets its
  own true number, never a copy of the device value, and the containers' values add up to
  the processes' values.
- A container holding a device with no process on it gets utilization 0 and memory 0 when
  the device reports per-process utilization (allocated-but-idle is a finding, not a gap);
  on a device that cannot report it (a MIG slice without GPM) utilization stays absent.
- Several time-slicing replicas of one GPU held by one container count once (allocated 1).
- A pod that ended (phase ``Succeeded`` or ``Failed``, from the API server) holds nothing:
  kubelets before 1.34 go on listing its devices in ``List()`` after handing them on to the
  next pod, which would count one GPU for two pods and show the ended one as
  allocated-but-idle.
- A process whose cgroup names no pod is a host process: summed per device under empty
  namespace/pod/container labels. So is a pod process whose pod the API server does not
  (yet) know, and a process whose owner could not be read (``UNKNOWN_OWNER``: it exited
  after NVML listed it, or ``/proc`` hides it): it is counted in ``unnamed_processes``
  rather than guessed at, and an allocated container on that device with no named process
  gets no usage values (unknown) rather than 0 (which would read as allocated-but-idle).
- Under CUDA MPS each client is a process of its own container (its cgroup), with its own
  memory. The MPS server (``nvidia-cuda-mps-server``, in the control daemon's pod or on the
  host) is infrastructure: it is in no container's row, not the host row either. Where the
  driver reports the server's utilization samples only, the clients' utilization is unknown:
  a container with a process that lacks a utilization value gets none (never 0).
- Each device's sharing mode (``gpu_sharing_info``): ``mig`` for a GPU in MIG mode and its
  slices, ``mps`` where an MPS server or clients run, ``time-sliced`` where the kubelet hands
  out replicas (``GPU-<uuid>::<n>``, allocated or advertised) or one device to several
  containers (a shared DRA claim), else ``exclusive``.
- Each device handed out as replicas, how many (``gpu_sharing_replicas``): the replica IDs
  the kubelet advertises for it (``GetAllocatableResources()``), else, where the kubelet does
  not answer that or does not list the device, the highest replica number allocated
  (``List()``) + 1, a lower bound. Under MPS each client's default active-thread percentage
  is 100 / that number (NVIDIA's device plugin).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from gpuscope.exporter.cardinality import CONTAINER_FAMILY, DroppedSeries, cap_containers
from gpuscope.exporter.kubernetes.cgroups import ContainerRef
from gpuscope.exporter.kubernetes.dra import DeviceIndex, allocations_from_claims
from gpuscope.exporter.kubernetes.metadata import MetadataSnapshot, NodeInfo, PodInfo
from gpuscope.exporter.kubernetes.podresources.client import AllocatableDevice, Allocation
from gpuscope.exporter.kubernetes.podresources.devices import DeviceRef, resolve
from gpuscope.exporter.model import DeviceSample, PartResult, Snapshot
from gpuscope.exporter.repeats import Repeats

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class ContainerKey:
    """A container by name; all empty for host (non-pod) processes."""

    namespace: str
    pod: str
    container: str


HOST = ContainerKey("", "", "")


@dataclass(frozen=True, slots=True)
class ContainerUsage:
    """One container on one device (``uuid``) in one sampling round.

    ``utilization_ratio``: sum of the container's processes' SM utilization (0..1 each), or
    None where the device cannot report per-process utilization. ``memory_used_bytes``: sum
    of its processes' device memory (None when NVML reported none of them).
    """

    key: ContainerKey
    uuid: str
    allocated: bool
    utilization_ratio: float | None
    memory_used_bytes: int | None
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """A pod that holds a GPU or runs a process on one (``gpu_pod_info``)."""

    namespace: str
    pod: str
    uid: str
    workload: str


Sharing = Literal["exclusive", "time-sliced", "mps", "mig"]


@dataclass(frozen=True, slots=True)
class DeviceSharing:
    """How one device's compute is shared between containers (``gpu_sharing_info``):
    ``mig`` (a GPU in MIG mode, and its slices), ``mps`` (an MPS server or MPS clients run
    on it), ``time-sliced`` (the kubelet hands out time-slicing replicas of it, or the
    device to several containers), else ``exclusive``. ``gpu`` is the device's ``gpu``
    label.

    ``replicas`` (``gpu_sharing_replicas``): for a device the kubelet hands out as replicas
    ``<id>::<n>`` (time-sliced or MPS), how many: the replica IDs of it that the kubelet
    advertises (``GetAllocatableResources()``), else the highest replica number allocated
    (``List()``) + 1, a lower bound; ``None`` for a device not handed out as replicas."""

    gpu: str
    uuid: str
    sharing: Sharing
    replicas: int | None = None


@dataclass(frozen=True, slots=True)
class Attribution:
    """The result of one join. ``node`` is None when nothing is known about the node."""

    timestamp: float
    containers: tuple[ContainerUsage, ...] = ()
    pods: tuple[PodIdentity, ...] = ()
    node: NodeInfo | None = None
    unresolved_allocations: int = 0
    unnamed_processes: int = 0
    parts: tuple[PartResult, ...] = field(default=())
    sharing: tuple[DeviceSharing, ...] = ()


def _supports_process_utilization(dev: DeviceSample) -> bool:
    if any(p.sm_utilization_ratio is not None for p in dev.processes):
        return True
    # No process to ask about: a device that reports its own utilization also reports
    # per-process utilization; a MIG slice without GPM reports neither.
    return dev.utilization_ratio is not None


@dataclass(slots=True)
class _Row:
    """Accumulates one (container, device) pair during a join."""

    allocated: bool = False
    utilization: float | None = None
    memory: int | None = None
    pids: list[int] = field(default_factory=list)
    # Processes with no utilization value (an MPS client whose share the driver does not
    # report, or a round whose utilization read failed).
    unknown: int = 0

    def add(self, pid: int, utilization: float | None, memory: int | None) -> None:
        self.pids.append(pid)
        if utilization is not None:
            self.utilization = (self.utilization or 0.0) + utilization
        else:
            self.unknown += 1
        if memory is not None:
            self.memory = (self.memory or 0) + memory


def attribute(
    snapshot: Snapshot,
    allocations: Sequence[Allocation],
    containers_of: Mapping[int, ContainerRef | None],
    metadata: MetadataSnapshot,
    *,
    node_fallback: NodeInfo | None = None,
    allocatable: Sequence[AllocatableDevice] | None = None,
) -> Attribution:
    """Join one snapshot with the latest allocations, cgroup facts and names. Pure.

    ``allocatable``: the GPU devices the kubelet advertises (``GetAllocatableResources()``),
    ``None`` where unknown; they give the replicas per device."""
    devices = {d.uuid: d for d in snapshot.devices if d.uuid}
    # Pods that ended (Succeeded, Failed): kubelets before 1.34 go on listing them in List()
    # with the devices they held, which the kubelet has handed on to other pods
    # (kubernetes/kubernetes#119423, fixed by #132028). A name also held by a live pod is
    # the live pod's (its allocations, its UID).
    pod_uids: dict[tuple[str, str], str] = {}
    ended: set[tuple[str, str]] = set()
    live: set[tuple[str, str]] = set()
    for p in metadata.pods.values():
        pod_name = (p.namespace, p.name)
        (ended if p.terminal else live).add(pod_name)
        if not p.terminal or pod_name not in pod_uids:
            pod_uids[pod_name] = p.uid
    ended -= live

    rows: dict[tuple[ContainerKey, str], _Row] = {}
    unresolved = 0
    # Devices the kubelet hands out shared: as replicas (GPU-<uuid>::<n>), or to several
    # containers at once (a DRA claim shared between them).
    replicated: set[str] = set()
    holder: dict[str, ContainerKey] = {}
    # Per device handed out as replicas: the highest replica number allocated + 1.
    replicas_seen: dict[str, int] = {}
    for alloc in allocations:
        if ended and (alloc.namespace, alloc.pod) in ended:
            continue
        uuid = resolve(alloc.device, snapshot.devices)
        if uuid is None:
            unresolved += 1
            continue
        key = ContainerKey(alloc.namespace, alloc.pod, alloc.container)
        replica = alloc.device.replica
        if replica is not None:
            replicated.add(uuid)
            if replica >= replicas_seen.get(uuid, 0):
                replicas_seen[uuid] = replica + 1
        elif holder.setdefault(uuid, key) != key:
            replicated.add(uuid)
        rows.setdefault((key, uuid), _Row()).allocated = True
    replicas = _advertised_replicas(allocatable or (), snapshot.devices)
    replicated.update(replicas)
    for uuid, seen in replicas_seen.items():
        replicas.setdefault(uuid, seen)

    unnamed = 0
    # Devices running a pod process we cannot name: an allocated container there with no
    # named process of its own may be the one running it, so its usage is unknown (None),
    # not 0 — reporting 0 would make a busy pod look allocated-but-idle.
    devices_with_unnamed: set[str] = set()
    pods_with_processes: dict[ContainerKey, str] = {}
    # Each container's key, looked up once per join rather than once per process (a node
    # runs many processes per container): None for a process we cannot name.
    keys: dict[tuple[str, str], ContainerKey | None] = {}
    # Static pods: their cgroups carry the kubelet's UID for them (the config hash), the API
    # server knows their mirror pods by another UID. Built on the first miss only.
    mirrors: dict[str, PodInfo] | None = None
    for dev in snapshot.devices:
        if not dev.up:
            continue
        for proc in dev.processes:
            if proc.mps == "server":
                continue  # MPS infrastructure: neither a workload nor a host process
            ref = containers_of.get(proc.pid)
            key = HOST
            if ref is not None:
                ids = (ref.pod_uid, ref.container_id)
                if ids in keys:
                    named = keys[ids]
                else:
                    pod = metadata.pods.get(ref.pod_uid)
                    if pod is None:
                        if mirrors is None:
                            mirrors = {p.mirror_of: p for p in metadata.pods.values()
                                       if p.mirror_of}
                        pod = mirrors.get(ref.pod_uid)
                    name = pod.containers.get(ref.container_id) if pod is not None else None
                    named = keys[ids] = None
                    if pod is not None and name is not None:
                        named = keys[ids] = ContainerKey(pod.namespace, pod.name, name)
                        pods_with_processes[named] = pod.uid
                if named is None:
                    unnamed += 1
                    devices_with_unnamed.add(dev.uuid)
                else:
                    key = named
            row = rows.get((key, dev.uuid))
            if row is None:
                row = rows[(key, dev.uuid)] = _Row()
            row.add(proc.pid, proc.sm_utilization_ratio, proc.memory_used_bytes)

    usages = []
    # Sorted by (namespace, pod, container, uuid), ContainerKey's own order, compared as
    # plain tuples (the dataclass's generated comparisons cost a call per comparison).
    for (key, uuid), row in sorted(
        rows.items(), key=lambda kv: (kv[0][0].namespace, kv[0][0].pod, kv[0][0].container,
                                      kv[0][1])
    ):
        device = devices.get(uuid)
        if device is None or not device.up:
            # A lost device: the allocation is still held and shown, with no usage values.
            usages.append(ContainerUsage(key, uuid, row.allocated, None, None))
            continue
        if not row.pids and uuid in devices_with_unnamed and key != HOST:
            usages.append(ContainerUsage(key, uuid, row.allocated, None, None))
            continue
        # A sum with an unknown term (an MPS client the driver gives no samples for) is
        # unknown; no process at all on a device that reports them is allocated-but-idle.
        util = None if row.unknown else row.utilization
        if util is None and not row.pids and _supports_process_utilization(device):
            util = 0.0
        mem = row.memory if row.memory is not None or row.pids else 0
        usages.append(ContainerUsage(
            key, uuid, row.allocated,
            None if util is None else min(util, 1.0),
            mem,
            tuple(sorted(row.pids)),
        ))

    pods: dict[tuple[str, str], PodIdentity] = {}
    for u in usages:
        if u.key == HOST:
            continue
        ident = (u.key.namespace, u.key.pod)
        if ident in pods:
            continue
        uid = pods_with_processes.get(u.key) or pod_uids.get(ident, "")
        info = metadata.pods.get(uid) if uid else None
        pods[ident] = PodIdentity(ident[0], ident[1], uid, info.workload if info else "")

    node = metadata.node
    if node is None or not node.instance_type:
        node = _merge_node(node, node_fallback)
    return Attribution(
        timestamp=snapshot.timestamp,
        containers=tuple(usages),
        pods=tuple(sorted(pods.values(), key=lambda p: (p.namespace, p.pod))),
        node=node,
        unresolved_allocations=unresolved,
        unnamed_processes=unnamed,
        sharing=_sharing(snapshot.devices, replicated, replicas),
    )


def _advertised_replicas(
    allocatable: Iterable[AllocatableDevice], devices: Sequence[DeviceSample]
) -> dict[str, int]:
    """How many replica IDs (``<id>::<n>``) of each device the kubelet advertises, by the
    device's NVML UUID; devices advertised whole, or not on this node, are left out."""
    ids: dict[str, set[tuple[str, str]]] = {}
    # One resolve() per device named, not per replica (a GPU is advertised 10 times over).
    resolved: dict[tuple[str | None, str | None, int | None, int | None], str | None] = {}
    for item in allocatable:
        ref: DeviceRef = item.device
        if ref.replica is None or ref.error is not None:
            continue
        named = (ref.uuid, ref.parent_uuid, ref.gpu_index, ref.gpu_instance_id)
        if named in resolved:
            uuid = resolved[named]
        else:
            uuid = resolved[named] = resolve(ref, devices)
        if uuid is not None:
            ids.setdefault(uuid, set()).add((item.resource_name, ref.raw))
    return {uuid: len(raw) for uuid, raw in ids.items()}


def _sharing(
    devices: Sequence[DeviceSample], replicated: set[str], replicas: Mapping[str, int]
) -> tuple[DeviceSharing, ...]:
    """Each device's sharing mode and replicas (see :class:`DeviceSharing`); a device that is
    down or was never identified has none (a lost GPU keeps only ``gpu_info`` and
    ``gpu_up``)."""
    mig_parents = {d.parent_uuid for d in devices if d.parent_uuid}
    result = []
    for dev in devices:
        if not dev.up or not dev.uuid:
            continue
        sharing: Sharing
        if dev.mig_mode or dev.uuid in mig_parents or (
                dev.is_mig and dev.uuid not in replicated):
            sharing = "mig"
        elif dev.runs_mps:
            sharing = "mps"
        elif dev.uuid in replicated:
            sharing = "time-sliced"
        else:
            sharing = "exclusive"
        result.append(DeviceSharing(dev.index, dev.uuid, sharing, replicas.get(dev.uuid)))
    return tuple(result)


def _merge_node(node: NodeInfo | None, fallback: NodeInfo | None) -> NodeInfo | None:
    if fallback is None:
        return node
    if node is None:
        return fallback
    return NodeInfo(
        instance_type=node.instance_type or fallback.instance_type,
        zone=node.zone or fallback.zone,
        capacity_type=node.capacity_type or fallback.capacity_type,
    )


class AttributionInputs(Protocol):
    """Where the three facts come from: the live node, or a simulated scenario.
    ``allocatable()``: the GPU devices the kubelet advertises, ``None`` where unknown."""

    def allocations(self) -> Sequence[Allocation]: ...

    def allocatable(self) -> Sequence[AllocatableDevice] | None: ...

    def containers_of(self, pids: Iterable[int]) -> Mapping[int, ContainerRef | None]: ...

    def metadata(self) -> MetadataSnapshot: ...

    def parts(self) -> Sequence[PartResult]: ...

    def close(self) -> None: ...


class Attributor:
    """Runs :func:`attribute` for every snapshot (a :class:`~gpuscope.exporter.sampler.Sampler`
    listener, so on the sampler thread) and keeps the latest result for the collector."""

    def __init__(
        self,
        inputs: AttributionInputs,
        *,
        node_fallback: NodeInfo | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        max_containers: int | None = None,
        dropped: DroppedSeries | None = None,
    ) -> None:
        self._inputs = inputs
        self._node_fallback = node_fallback
        # --max-container-series (exporter/cardinality.py); drops are counted in `dropped`.
        self._max_containers = max_containers
        self._dropped = dropped if dropped is not None else DroppedSeries()
        self._monotonic = monotonic
        self._latest: Attribution | None = None
        # The same round within --max-container-series: what /metrics renders. latest()
        # stays whole: the CloudWatch sink's pod rollups are sums over every container.
        self._series: Attribution | None = None
        self._lock = threading.Lock()
        self._failures = 0  # rounds whose join failed, since start
        self._errors = Repeats(log, "attribution", clock=monotonic)  # (logged, not every round)

    def latest(self) -> Attribution | None:
        """The last round's join, every row (the CloudWatch sink reads it)."""
        return self._latest

    def series(self) -> Attribution | None:
        """The last round's join within ``--max-container-series``: the rows and pods that
        get ``container_gpu_*`` and ``gpu_pod_info`` series."""
        return self._series

    def __call__(self, snapshot: Snapshot) -> None:
        started = self._monotonic()
        try:
            pids = {p.pid for d in snapshot.devices for p in d.processes if p.mps != "server"}
            result = attribute(
                snapshot,
                self._inputs.allocations(),
                self._inputs.containers_of(pids),
                self._inputs.metadata(),
                node_fallback=self._node_fallback,
                allocatable=self._inputs.allocatable(),
            )
            capped = result
            if self._max_containers is not None:
                capped, left_out = cap_containers(result, self._max_containers)
                self._dropped.add(CONTAINER_FAMILY, left_out)
            ok = True
            self._errors.succeeded()
        except Exception:  # never let attribution stop device metrics
            self._errors.failed()
            result = capped = Attribution(timestamp=snapshot.timestamp)
            ok = False
            self._failures += 1
        part = PartResult("attribution", ok, self._monotonic() - started, self._failures)
        parts = (part, *self._inputs.parts())
        latest = replace(result, parts=parts)
        series = latest if capped is result else replace(capped, parts=parts)
        with self._lock:
            # Series first: a reader of latest() after this round finds series() of it too.
            self._series = series
            self._latest = latest

    def parts(self) -> Sequence[PartResult]:
        latest = self._latest
        return latest.parts if latest is not None else ()

    def close(self) -> None:
        self._inputs.close()


class LiveInputs:
    """The three facts on a real node, each refreshed by its own background worker.

    - allocations: :class:`~gpuscope.exporter.kubernetes.podresources.client.PodResourcesWatcher`
      (``List()``, then ``GetAllocatableResources()``, every ``kubelet_interval`` seconds, one
      short connection per call);
    - PID → container: :class:`~gpuscope.exporter.kubernetes.cgroups.PidResolver` on ``proc_root``
      (cached per
      PID and process start time, which is re-checked every round: ~2-5 µs per PID, on the
      sampler thread);
    - names: :class:`~gpuscope.exporter.kubernetes.apiserver.PodMetadataWatcher` (list + watch
      of this node's pods, and of its DRA ResourceSlices), or none when no kubeconfig and no
      in-cluster config exist.

    Devices the kubelet reports as claimed through DRA join the device-plugin allocations,
    each resolved to its NVML UUID through this node's ResourceSlices
    (:func:`~gpuscope.exporter.kubernetes.dra.allocations_from_claims`).
    """

    def __init__(
        self,
        *,
        kubelet_socket: str,
        proc_root: str,
        metadata_watcher: PodMetadataWatcherLike | None,
        resource_names: Sequence[str] | None = None,
        kubelet_interval: float = 10.0,
        node_name: str | None = None,
    ) -> None:
        from gpuscope.exporter.kubernetes.cgroups import PidResolver
        from gpuscope.exporter.kubernetes.podresources.client import (
            DEFAULT_RESOURCES,
            PodResourcesClient,
            PodResourcesWatcher,
        )

        names = (*DEFAULT_RESOURCES, *(resource_names or ()))
        self._kubelet = PodResourcesWatcher(
            PodResourcesClient(kubelet_socket, resource_names=names), interval=kubelet_interval
        )
        self._resolver = PidResolver(proc_root)
        # The last round's cgroup reads: whether every file read, and how long they took.
        self._proc_ok = True
        self._proc_seconds = 0.0
        self._metadata = metadata_watcher
        self._node_name = node_name
        # The DRA device index, rebuilt only when the slices changed (they rarely do).
        self._slices: tuple[Mapping[str, Any], ...] = ()
        self._dra_index = DeviceIndex()
        self._kubelet.start()
        if self._metadata is not None:
            self._metadata.start()

    def allocations(self) -> Sequence[Allocation]:
        assigned = self._kubelet.latest_assignments()
        if not assigned.claim_devices:
            return assigned.allocations
        slices = self.metadata().resource_slices
        if slices != self._slices:
            self._slices = slices
            self._dra_index = DeviceIndex.from_slices(slices, node_name=self._node_name)
        return (*assigned.allocations, *allocations_from_claims(
            assigned.claim_devices, self._dra_index, node_name=self._node_name))

    def allocatable(self) -> Sequence[AllocatableDevice] | None:
        return self._kubelet.latest_assignments().allocatable

    def containers_of(self, pids: Iterable[int]) -> Mapping[int, ContainerRef | None]:
        errors = self._resolver.stats().read_errors
        started = time.monotonic()
        containers = self._resolver.resolve(pids)
        self._proc_seconds = time.monotonic() - started
        self._proc_ok = self._resolver.stats().read_errors == errors
        return containers

    def metadata(self) -> MetadataSnapshot:
        return self._metadata.snapshot() if self._metadata is not None else MetadataSnapshot()

    def parts(self) -> Sequence[PartResult]:
        status = self._kubelet.status()
        parts = [PartResult(
            "kubelet", bool(status.success), status.duration_seconds or 0.0, status.errors_total
        )]
        resolver = self._resolver.stats()
        parts.append(PartResult("proc", self._proc_ok, self._proc_seconds, resolver.read_errors))
        if self._metadata is not None:
            # kube_pods, kube_node, and kube_resourceslices where DRA slices are watched.
            parts.extend(self._metadata.snapshot().parts())
        return parts

    def close(self) -> None:
        self._kubelet.stop()
        if self._metadata is not None:
            self._metadata.stop()
        self._resolver.close()


class PodMetadataWatcherLike(Protocol):
    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def snapshot(self) -> MetadataSnapshot: ...
