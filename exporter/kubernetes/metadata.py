"""The plain data types of pod and node metadata, without the API-server client.

:mod:`gpuscope.exporter.kubernetes.apiserver` fills them from the API server and re-exports
them; the attribution code and the simulated source only read them, so they import them from
here and load neither the watcher nor its client (lightkube and httpx2: ~7 MiB of RSS to
import, ~4.5 MiB more once a client is built).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuscope.exporter.model import PartResult

__all__ = ["MetadataSnapshot", "NodeInfo", "OwnerRef", "PodInfo", "WatcherStats"]


def _empty_mapping() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class OwnerRef:
    """One ``metadata.ownerReferences`` entry."""

    api_version: str
    kind: str
    name: str
    uid: str = ""
    controller: bool = False


@dataclass(frozen=True, slots=True)
class PodInfo:
    """What the exporter needs of one pod. ``containers`` maps a bare container ID (64 hex, no
    ``containerd://`` prefix, as :mod:`gpuscope.exporter.kubernetes.cgroups` returns it) to the
    container's name, for regular, init and ephemeral containers, including the previous
    instance of a restarted container. ``phase`` is ``status.phase`` (``""`` when absent):
    ``Succeeded`` and ``Failed`` are terminal, the pod's containers stopped for good.
    ``mirror_of``: for the mirror pod of a static pod, the UID the kubelet runs the static
    pod under (the ``pod<uid>`` of its cgroups: the manifest's own ``metadata.uid``, a UUID,
    where it sets one, else the kubelet's 32-hex hash of the manifest), lowercase, from the
    ``kubernetes.io/config.mirror`` annotation; ``""`` for any other pod."""

    uid: str
    namespace: str
    name: str
    labels: Mapping[str, str] = field(default_factory=_empty_mapping)
    owners: tuple[OwnerRef, ...] = ()
    workload: str = ""
    containers: Mapping[str, str] = field(default_factory=_empty_mapping)
    phase: str = ""
    mirror_of: str = ""

    @property
    def terminal(self) -> bool:
        """True for a pod in phase ``Succeeded`` or ``Failed``: its containers stopped for
        good and the kubelet has handed its devices on."""
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """This node's labels as ``gpu_node_info`` needs them; ``""`` where unknown.
    ``capacity_type`` is ``spot``, ``on-demand`` or ``""``. The series' ``node_name`` is not
    here: the exporter knows its node's name without the API server (``--node-name``,
    ``$NODE_NAME``, the scenario, the hostname) and gives it to the collector itself."""

    instance_type: str = ""
    zone: str = ""
    capacity_type: str = ""


@dataclass(frozen=True, slots=True)
class WatcherStats:
    """Counters and last-attempt results for the exporter's self-metrics.

    ``pods_success``: the last list or watch attempt is healthy (False from the first
    failure until the next successful list). ``pods_duration_seconds``: the last list.
    ``resourceslices_*``: the same for the DRA ResourceSlices' list and watch (a resource the
    API server does not serve, or RBAC does not allow, is healthy: DRA is off);
    ``resourceslices_success`` is ``None`` where they are not watched.
    """

    pod_lists_total: int = 0
    pod_list_errors_total: int = 0
    watch_errors_total: int = 0
    watch_events_total: int = 0
    relists_gone_total: int = 0
    node_requests_total: int = 0
    node_errors_total: int = 0
    pods_success: bool = False
    pods_duration_seconds: float = 0.0
    node_success: bool = False
    node_duration_seconds: float = 0.0
    resourceslices_success: bool | None = None
    resourceslices_duration_seconds: float = 0.0
    resourceslices_errors_total: int = 0


@dataclass(frozen=True, slots=True)
class MetadataSnapshot:
    """The latest known pods (by UID) and node of this node. Immutable.

    ``synced`` is True once a pod list has succeeded; before that ``pods`` is empty and
    means "unknown", not "no pods". ``*_updated_at`` are the watcher clock's readings of
    the last successful list/event and node fetch.
    """

    pods: Mapping[str, PodInfo] = field(default_factory=lambda: MappingProxyType({}))
    node: NodeInfo | None = None
    synced: bool = False
    pods_updated_at: float | None = None
    node_updated_at: float | None = None
    stats: WatcherStats = field(default_factory=WatcherStats)
    #: This node's DRA ResourceSlices as the API server returns them (JSON objects), for
    #: :class:`~gpuscope.exporter.kubernetes.dra.DeviceIndex`; empty where DRA is not served.
    resource_slices: tuple[Mapping[str, Any], ...] = ()

    def container_name(self, pod_uid: str, container_id: str) -> str | None:
        pod = self.pods.get(pod_uid)
        return pod.containers.get(container_id) if pod is not None else None

    def parts(self) -> tuple[PartResult, ...]:
        """``gpu_exporter_collector_success``/``_duration_seconds`` for ``kube_pods``,
        ``kube_node`` and, where DRA ResourceSlices are watched, ``kube_resourceslices``;
        ``errors_total`` as the stats count them."""
        s = self.stats
        parts = [
            PartResult("kube_pods", s.pods_success, s.pods_duration_seconds,
                       s.pod_list_errors_total + s.watch_errors_total),
            PartResult("kube_node", s.node_success, s.node_duration_seconds,
                       s.node_errors_total),
        ]
        if s.resourceslices_success is not None:
            parts.append(PartResult("kube_resourceslices", s.resourceslices_success,
                                    s.resourceslices_duration_seconds,
                                    s.resourceslices_errors_total))
        return tuple(parts)
