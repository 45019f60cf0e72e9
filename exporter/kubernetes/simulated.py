"""Attribution inputs for the simulated source: the scenario's ``pods`` play the kubelet, the
cgroup files and the API server.

The facts are shaped exactly as the live readers return them (kubelet ``Allocation`` with a
device ID parsed by the same normaliser, cgroup ``ContainerRef`` with a pod UID and container
ID, API-server ``PodInfo``), so :func:`gpuscope.exporter.kubernetes.attribution.attribute` joins
them with the same code as on a real node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from gpuscope.exporter.kubernetes.cgroups import ContainerRef
from gpuscope.exporter.kubernetes.metadata import MetadataSnapshot, NodeInfo, PodInfo
from gpuscope.exporter.kubernetes.podresources.client import AllocatableDevice, Allocation
from gpuscope.exporter.kubernetes.podresources.devices import parse_device_id
from gpuscope.exporter.model import PartResult
from gpuscope.exporter.sources.scenario import DeviceRef, Scenario


def _resource_name(scenario: Scenario, ref: DeviceRef) -> str:
    if ref.gpu_instance_id is not None:
        sl = scenario.gpu(ref.gpu).slice(ref.gpu_instance_id)
        return f"nvidia.com/mig-{sl.profile}" if sl is not None else "nvidia.com/mig"
    return "nvidia.com/gpu"


class ScenarioInputs:
    """Static facts derived once from the scenario (pods do not change during a scenario;
    processes come and go, and the join only sees the ones running)."""

    def __init__(self, scenario: Scenario) -> None:
        allocations = []
        pods: dict[str, PodInfo] = {}
        containers: dict[tuple[str, str, str], ContainerRef] = {}
        for pod in scenario.pods:
            pods[pod.uid] = PodInfo(
                uid=pod.uid, namespace=pod.namespace, name=pod.name, workload=pod.workload,
                containers=MappingProxyType({c.id: c.name for c in pod.containers}),
            )
            for c in pod.containers:
                containers[(pod.namespace, pod.name, c.name)] = ContainerRef(
                    pod_uid=pod.uid, container_id=c.id, runtime="containerd"
                )
                for ref in c.devices:
                    allocations.append(Allocation(
                        namespace=pod.namespace, pod=pod.name, container=c.name,
                        resource_name=_resource_name(scenario, ref),
                        device=parse_device_id(scenario.device_uuid(ref)),
                    ))
        self._allocations = tuple(allocations)
        self._pid_refs: dict[int, ContainerRef] = {}
        for proc in scenario.processes:
            if proc.pod is not None:
                key = (proc.pod.namespace, proc.pod.pod, proc.pod.container)
                self._pid_refs[proc.pid] = containers[key]
        node = scenario.node
        self._metadata = MetadataSnapshot(
            pods=MappingProxyType(pods),
            node=NodeInfo(
                instance_type=node.instance_type or "", zone=node.zone or "",
                capacity_type=node.capacity_type,
            ),
            synced=True,
        )

    def allocations(self) -> Sequence[Allocation]:
        return self._allocations

    def allocatable(self) -> Sequence[AllocatableDevice] | None:
        # A scenario names the replicas it allocates, not how many the plugin makes: the
        # replicas per GPU come from the allocations (a lower bound), as on a kubelet that
        # does not serve GetAllocatableResources().
        return None

    def containers_of(self, pids: Iterable[int]) -> Mapping[int, ContainerRef | None]:
        return {pid: self._pid_refs.get(pid) for pid in pids}

    def metadata(self) -> MetadataSnapshot:
        return self._metadata

    def parts(self) -> Sequence[PartResult]:
        return ()

    def close(self) -> None:
        pass
