"""Per-container and per-pod series (``container_gpu_*``, ``gpu_pod_info``, ``gpu_node_info``)
and each device's sharing mode and replicas (``gpu_sharing_info``, ``gpu_sharing_replicas``:
they need the kubelet's allocations) rendered from the latest
:class:`~gpuscope.exporter.kubernetes.attribution.Attribution`.

``gpu_node_info`` also carries the node name the exporter knows for itself (``node_name``),
so a scraper without Kubernetes service discovery (the dashboard's embedded mode) can tell
nodes apart. It is not called ``node``: Prometheus' scrape config adds ``node``, and an
exporter label of that name would collide with it (and be renamed ``exported_node``).

With ``--cluster-name``, ``gpu_node_info`` (and no other series) also carries ``cluster``:
the store's external label names the cluster of every series; this one lets a store without
it (one Prometheus per cluster, the dashboard's embedded mode) still say which cluster a node
is in (``docs/metrics.md``, "The cluster label")."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpuscope.exporter.kubernetes.attribution import Attribution
from gpuscope.exporter.metrics import new_family


class ContainerCollector(Collector):
    """Fresh families per scrape: a pod that went away takes its series with it."""

    def __init__(self, latest: Callable[[], Attribution | None], node_name: str = "",
                 cluster: str | None = None) -> None:
        """``node_name``: this exporter's node (``--node-name``, ``$NODE_NAME``, the simulated
        scenario's node, else the hostname); ``""`` leaves the ``node_name`` label out of
        ``gpu_node_info`` and renders it only when the node's labels are known.
        ``cluster``: ``--cluster-name``; when set, ``gpu_node_info`` gains a ``cluster`` label
        with it, else the series has no such label."""
        self._latest = latest
        self._node_name = node_name
        self._cluster = cluster or None

    def collect(self) -> Iterator[Metric]:
        result = self._latest()
        node = self._node_info(result)
        if node is not None:
            # Before the first attribution too: a scrape between the sampler publishing a
            # snapshot and the attributor joining it must still say which node it is.
            yield node
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
        sharing = new_family("gpu_sharing_info")
        replicas = new_family("gpu_sharing_replicas")
        for dev in result.sharing:
            sharing.add_metric([dev.gpu, dev.uuid, dev.sharing], 1.0)
            if dev.replicas is not None:
                replicas.add_metric([dev.gpu, dev.uuid], float(dev.replicas))
        yield allocated
        yield util
        yield memory
        yield pods
        yield sharing
        yield replicas
        unresolved = new_family("gpu_exporter_attribution_unresolved_devices")
        unresolved.add_metric([], float(result.unresolved_allocations))
        unnamed = new_family("gpu_exporter_attribution_unnamed_processes")
        unnamed.add_metric([], float(result.unnamed_processes))
        yield unresolved
        yield unnamed

    def _node_info(self, result: Attribution | None) -> Metric | None:
        """``gpu_node_info``: always when the exporter knows its node name (no API server
        needed; the labels it cannot know are ``""``), else only with some node label."""
        info = result.node if result is not None else None
        labels = ((info.instance_type, info.zone, info.capacity_type) if info is not None
                  else ("", "", ""))
        if not self._node_name and not any(labels):
            return None
        if self._cluster is None:
            family = new_family("gpu_node_info")
            family.add_metric([*labels, self._node_name], 1.0)
        else:
            family = new_family("gpu_node_info", optional=("cluster",))
            family.add_metric([*labels, self._node_name, self._cluster], 1.0)
        return family
