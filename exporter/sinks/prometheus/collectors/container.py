"""Per-container and per-pod series (``container_gpu_*``, ``gpu_pod_info``, ``gpu_node_info``)
rendered from the latest :class:`~gpuscope.exporter.kubernetes.attribution.Attribution`."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.kubernetes.attribution import Attribution
from gpuscope.exporter.metrics import new_family


class ContainerCollector(Collector):
    """Fresh families per scrape: a pod that went away takes its series with it."""

    def __init__(self, latest: Callable[[], Attribution | None]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        result = self._latest()
        if result is None:
            return
        allocated = new_family("container_gpu_allocated")
        util = new_family("container_gpu_utilization_ratio")
        memory = new_family("container_gpu_memory_used_bytes")
        for usage in result.containers:
            labels = [usage.key.namespace, usage.key.pod, usage.key.container, usage.uuid]
            if usage.allocated:
                allocated.add_metric(labels, 1.0)
            if usage.utilization_ratio is not None:
                util.add_metric(labels, usage.utilization_ratio)
            if usage.memory_used_bytes is not None:
                memory.add_metric(labels, float(usage.memory_used_bytes))
        pods = new_family("gpu_pod_info")
        for pod in result.pods:
            pods.add_metric([pod.namespace, pod.pod, pod.uid, pod.workload], 1.0)
        yield allocated
        yield util
        yield memory
        yield pods
        if result.node is not None and any(
            (result.node.instance_type, result.node.zone, result.node.capacity_type)
        ):
            node = new_family("gpu_node_info")
            node.add_metric(
                [result.node.instance_type, result.node.zone, result.node.capacity_type], 1.0
            )
            yield node
        unresolved = new_family("gpu_exporter_attribution_unresolved_devices")
        unresolved.add_metric([], float(result.unresolved_allocations))
        unnamed = new_family("gpu_exporter_attribution_unnamed_processes")
        unnamed.add_metric([], float(result.unnamed_processes))
        yield unresolved
        yield unnamed
