"""What gpuscope publishes to CloudWatch: metric names, units, dimension sets, and the
observations one snapshot contributes to each series.

Device metrics copy the CloudWatch agent's ``nvidia_gpu`` plugin (namespace ``CWAgent``):
the same names, the same value scale (percent 0..100, MiB, degrees C, W, MHz), no CloudWatch
``Unit`` (the agent sets none, so an alarm or dashboard built on its data matches ours), and
the dimensions ``host``, ``index``, ``name``, ``arch``. Pod and node rollups copy Container
Insights' names and dimensions (``pod_gpu_utilization`` in ``Percent``,
``pod_gpu_memory_used`` in ``Bytes``, ``node_gpu_utilization`` in ``Percent``), each under
several dimension sets, all with ``ClusterName`` (:func:`pod_dimension_sets`,
:meth:`Observer.node_dimension_sets`): per pod, per namespace and per cluster; per node, per
instance (with ``InstanceId``) and per cluster. The per-namespace and per-cluster series are
the same name and dimensions on every node of the cluster, so CloudWatch merges every node's
datums into one metric.

It adds the devices' work signals from GPM (Hopper and newer) under the agent's dimensions,
``nvidia_gpm_sm_active`` and ``nvidia_gpm_tensor_active`` (percent, no Unit), and their node
rollups ``node_gpu_sm_active`` and ``node_gpu_tensor_active`` (``Percent``, Container Insights'
node dimensions), so an alarm can tell a GPU that works from one that spins at "100 %".

The conversion from the snapshot's base units (ratios 0..1, bytes, hertz) to the agent's
scale happens here and only here. The same snapshot and attribution always give the same
observations, except the activities: each is the mean between two rounds, the increase of the
device's ``*_active_seconds`` counter over the time between them, so the observer keeps each
device's last counters (a device's first round gives none).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from gpuscope.exporter.kubernetes.attribution import HOST, Attribution
from gpuscope.exporter.model import DeviceSample, Snapshot

#: A dimension set: ``((name, value), ...)`` in publishing order.
Dims = tuple[tuple[str, str], ...]
#: One series: a metric name and its dimension set.
SeriesKey = tuple[str, Dims]
#: One observation of one series in one sampling round.
Observation = tuple[SeriesKey, float]

DeviceDimensions = Literal["agent", "extended", "both"]

_MIB = float(1 << 20)


def percent(ratio: float | None) -> float | None:
    """A ratio 0..1 as the agent's percent 0..100, rounded to 0.001 (NVML's own
    resolution is 1 %); None stays None (the series is left out, never 0)."""
    if ratio is None or not math.isfinite(ratio):
        return None
    return round(ratio * 100.0, 3)


def mib(n_bytes: int | float | None) -> float | None:
    """Bytes as MiB (what nvidia-smi and the agent report as "MB"); exact for whole MiB."""
    if n_bytes is None:
        return None
    value = float(n_bytes) / _MIB
    return value if math.isfinite(value) else None


def megahertz(hertz: float | None) -> float | None:
    """Hertz as MHz, rounded to 0.001 MHz."""
    if hertz is None or not math.isfinite(hertz):
        return None
    return round(hertz / 1e6, 3)


def plain(value: float | None) -> float | None:
    """A value already on the agent's scale (degrees C, W), rounded to 0.001."""
    if value is None or not math.isfinite(value):
        return None
    return round(float(value), 3)


def _memory_free(d: DeviceSample) -> float | None:
    # nvidia-smi's memory.free: total - used (MiB). NVML's own "free" additionally subtracts
    # the driver reserve on newer drivers; the snapshot does not carry it, so free + used
    # always equals total here.
    if d.memory_total_bytes is None or d.memory_used_bytes is None:
        return None
    return mib(max(0, d.memory_total_bytes - d.memory_used_bytes))


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One published metric: CloudWatch name, CloudWatch ``Unit`` (None: none sent, as the
    agent does), the unit of its values for the docs, and how one device gives a value."""

    name: str
    unit: str | None
    scale: str
    value: Callable[[DeviceSample], float | None]
    help: str


#: The CloudWatch agent's ``nvidia_smi_*`` metrics, in the agent's own scale.
DEVICE_METRICS: tuple[MetricDef, ...] = (
    MetricDef("nvidia_smi_utilization_gpu", None, "percent",
              lambda d: percent(d.utilization_ratio),
              "time a kernel ran on the GPU during the last sample period"),
    MetricDef("nvidia_smi_utilization_memory", None, "percent",
              lambda d: percent(d.memory_utilization_ratio),
              "time device memory was read or written during the last sample period"),
    MetricDef("nvidia_smi_memory_total", None, "MiB",
              lambda d: mib(d.memory_total_bytes), "device memory installed (or of the slice)"),
    MetricDef("nvidia_smi_memory_used", None, "MiB",
              lambda d: mib(d.memory_used_bytes), "device memory in use"),
    MetricDef("nvidia_smi_memory_free", None, "MiB", _memory_free, "total minus used"),
    MetricDef("nvidia_smi_temperature_gpu", None, "degrees C",
              lambda d: plain(d.temperature_celsius), "GPU core temperature"),
    MetricDef("nvidia_smi_power_draw", None, "W",
              lambda d: plain(d.power_watts), "board power draw"),
    MetricDef("nvidia_smi_fan_speed", None, "percent",
              lambda d: percent(d.fan_speed_ratio), "intended fan speed (absent on SXM boards)"),
    MetricDef("nvidia_smi_clocks_current_sm", None, "MHz",
              lambda d: megahertz(d.sm_clock_hertz), "current SM clock"),
    MetricDef("nvidia_smi_clocks_current_memory", None, "MHz",
              lambda d: megahertz(d.memory_clock_hertz), "current memory clock"),
)

POD_UTILIZATION = "pod_gpu_utilization"
POD_MEMORY_USED = "pod_gpu_memory_used"
NODE_UTILIZATION = "node_gpu_utilization"

#: The devices' GPM activities, percent 0..100 of the time between two rounds: (device metric
#: under the agent's dimensions, node rollup, the counter in :class:`DeviceSample`).
ACTIVITY_METRICS: tuple[tuple[str, str, str], ...] = (
    ("nvidia_gpm_sm_active", "node_gpu_sm_active", "sm_active_seconds"),
    ("nvidia_gpm_tensor_active", "node_gpu_tensor_active", "tensor_active_seconds"),
)
SM_ACTIVE, NODE_SM_ACTIVE = ACTIVITY_METRICS[0][:2]
TENSOR_ACTIVE, NODE_TENSOR_ACTIVE = ACTIVITY_METRICS[1][:2]

#: CloudWatch ``Unit`` of every metric name (None: no unit sent).
UNITS: dict[str, str | None] = {
    **{m.name: m.unit for m in DEVICE_METRICS},
    POD_UTILIZATION: "Percent",
    POD_MEMORY_USED: "Bytes",
    NODE_UTILIZATION: "Percent",
    **{device: None for device, _, _ in ACTIVITY_METRICS},
    **{node: "Percent" for _, node, _ in ACTIVITY_METRICS},
}


@dataclass(frozen=True, slots=True)
class Identity:
    """What the dimensions say about this node.

    ``host`` is the agent's ``host`` dimension and Container Insights' ``NodeName``: the
    Kubernetes node name, which on EKS is the instance's private DNS name, the host name the
    agent reports. ``instance_type`` is the fallback when node labels are unavailable.
    ``device_dimensions`` picks the device dimension sets: ``agent`` (host, index, name,
    arch), ``extended`` (those plus InstanceId, InstanceType, ClusterName where known) or
    ``both`` (two datums per device metric).
    """

    host: str
    cluster_name: str | None = None
    instance_id: str | None = None
    instance_type: str | None = None
    device_dimensions: DeviceDimensions = "both"


class Observer:
    """Turns one snapshot (and the attribution of the same round) into observations.

    Dimension sets are cached per device identity, so a round costs one dict lookup per
    device plus one tuple per value.
    """

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self._device_dims: dict[tuple[str, str, str | None, str | None], tuple[Dims, ...]] = {}
        # Each device's last round: its timestamp and GPM counters (None where absent). Only
        # the devices of the last snapshot: a MIG slice destroyed leaves with its UUID.
        self._counters: dict[str, tuple[float, tuple[float | None, ...]]] = {}

    def _instance_type(self, attribution: Attribution | None) -> str | None:
        node = attribution.node if attribution is not None else None
        if node is not None and node.instance_type:
            return node.instance_type
        return self.identity.instance_type or None

    def device_dimension_sets(self, device: DeviceSample, instance_type: str | None
                              ) -> tuple[Dims, ...]:
        """The dimension sets one device's metrics are published under."""
        cache_key = (device.index, device.model, device.architecture, instance_type)
        cached = self._device_dims.get(cache_key)
        if cached is not None:
            return cached
        ident = self.identity
        base: list[tuple[str, str]] = [("host", ident.host), ("index", device.index)]
        if device.model:
            base.append(("name", device.model))
        if device.architecture:
            base.append(("arch", device.architecture))
        extra = [(k, v) for k, v in (
            ("InstanceId", ident.instance_id),
            ("InstanceType", instance_type),
            ("ClusterName", ident.cluster_name),
        ) if v]
        agent: Dims = tuple(base)
        extended: Dims = tuple(base + extra)
        sets: tuple[Dims, ...]
        if ident.device_dimensions == "agent" or not extra:
            sets = (agent,)
        elif ident.device_dimensions == "extended":
            sets = (extended,)
        else:
            sets = (agent, extended)
        self._device_dims[cache_key] = sets
        return sets

    def observe(self, snapshot: Snapshot, attribution: Attribution | None) -> list[Observation]:
        """Every observation of one round. ``attribution`` is used only when it belongs to
        this very snapshot (same timestamp), so a stale join is never counted twice."""
        if attribution is not None and attribution.timestamp != snapshot.timestamp:
            attribution = None
        out: list[Observation] = []
        instance_type = self._instance_type(attribution)
        activity: list[tuple[str, float]] = []  # (node rollup, percent) of this round
        for device in snapshot.devices:
            if not device.up:
                continue
            sets = self.device_dimension_sets(device, instance_type)
            for metric in DEVICE_METRICS:
                value = metric.value(device)
                if value is None:
                    continue
                for dims in sets:
                    out.append(((metric.name, dims), value))
            for (name, rollup, _), value in zip(
                    ACTIVITY_METRICS, self._activities(device, snapshot.timestamp), strict=True):
                if value is None:
                    continue
                activity.append((rollup, value))
                for dims in sets:
                    out.append(((name, dims), value))
        if len(self._counters) > len(snapshot.devices):
            present = {device.uuid for device in snapshot.devices}
            self._counters = {k: v for k, v in self._counters.items() if k in present}
        cluster = self.identity.cluster_name
        if cluster:
            node_sets = self.node_dimension_sets(cluster, instance_type)
            out.extend(self._node_rollup(snapshot, node_sets))
            out.extend(((rollup, dims), value) for rollup, value in activity
                       for dims in node_sets)
            if attribution is not None:
                out.extend(self._pod_rollups(attribution, cluster))
        return out

    def _activities(self, device: DeviceSample, timestamp: float) -> list[float | None]:
        """Each GPM activity of ``device`` between its last round and this one, in percent:
        the counter's increase over the elapsed time (None on its first round, where the
        counter is absent, not finite, or if it went backwards)."""
        counters = tuple(getattr(device, field) for _, _, field in ACTIVITY_METRICS)
        last = self._counters.get(device.uuid)
        self._counters[device.uuid] = (timestamp, counters)
        if last is None or timestamp <= last[0]:
            return [None] * len(counters)
        elapsed = timestamp - last[0]
        out: list[float | None] = []
        for now, before in zip(counters, last[1], strict=True):
            # A NaN or infinite counter is unknown: min(1.0, nan) would make it 100 %.
            if (now is None or before is None or not math.isfinite(now)
                    or not math.isfinite(before) or now < before):
                out.append(None)
            else:
                out.append(percent(min(1.0, (now - before) / elapsed)))
        return out

    def node_dimension_sets(self, cluster: str, instance_type: str | None
                            ) -> tuple[Dims, ...]:
        """The dimension sets every node rollup is published under: gpuscope's node set
        (``ClusterName``, ``NodeName``, ``InstanceType`` while known), Container Insights'
        node set (``ClusterName``, ``NodeName``, ``InstanceId``) when the instance ID is
        known, and the cluster (``ClusterName``)."""
        node: list[tuple[str, str]] = [("ClusterName", cluster), ("NodeName", self.identity.host)]
        if instance_type:
            node.append(("InstanceType", instance_type))
        sets: list[Dims] = [tuple(node)]
        if self.identity.instance_id:
            sets.append((("ClusterName", cluster), ("NodeName", self.identity.host),
                         ("InstanceId", self.identity.instance_id)))
        sets.append((("ClusterName", cluster),))
        return tuple(sets)

    def _node_rollup(self, snapshot: Snapshot, sets: tuple[Dims, ...]) -> Iterator[Observation]:
        # One observation per device that reports utilization (a GPU, or a MIG slice with
        # GPM; a MIG parent reports none): Average is the node's mean, Maximum its busiest.
        for device in snapshot.devices:
            if device.up:
                value = percent(device.utilization_ratio)
                if value is not None:
                    for dims in sets:
                        yield (NODE_UTILIZATION, dims), value

    def _pod_rollups(self, attribution: Attribution, cluster: str) -> Iterator[Observation]:
        # A pod's value on each device it holds or runs on: the sum over its containers
        # (time-sliced containers of one pod add up). One observation per (pod, device),
        # as Container Insights publishes one value per GPU under the pod dimensions.
        # A sum with an unknown term is unknown (docs/attribution.md): a pod whose MPS
        # client's utilization the driver does not report, beside a container of the same
        # pod that holds a replica and runs nothing (a known 0), has no value, not 0.
        util: dict[tuple[str, str, str], float | None] = {}
        memory: dict[tuple[str, str, str], float | None] = {}
        for usage in attribution.containers:
            if usage.key == HOST or not usage.key.pod:
                continue
            k = (usage.key.namespace, usage.key.pod, usage.uuid)
            _add_known(util, k, usage.utilization_ratio)
            _add_known(memory, k, usage.memory_used_bytes)
        # The same observation under the pod's, its namespace's and its cluster's dimension
        # sets: the namespace and cluster series hold one value per (pod, device), so their
        # Average is the mean per pod and GPU, their Maximum the busiest pod's GPU.
        for (namespace, pod, _uuid), ratio in util.items():
            value = None if ratio is None else percent(min(ratio, 1.0))
            if value is not None:
                for dims in pod_dimension_sets(cluster, namespace, pod):
                    yield (POD_UTILIZATION, dims), value
        for (namespace, pod, _uuid), total in memory.items():
            if total is not None:
                for dims in pod_dimension_sets(cluster, namespace, pod):
                    yield (POD_MEMORY_USED, dims), total


def _add_known(sums: dict[tuple[str, str, str], float | None], key: tuple[str, str, str],
               value: float | None) -> None:
    """Adds ``value`` to ``sums[key]``: unknown (None) once any term is."""
    total = sums.get(key, 0.0)
    sums[key] = None if value is None or total is None else total + value


def pod_dimension_sets(cluster: str, namespace: str, pod: str) -> tuple[Dims, Dims, Dims]:
    """The dimension sets of a pod's rollups, as Container Insights publishes its
    ``pod_gpu_*``: the pod (``ClusterName``, ``Namespace``, ``PodName``), its namespace
    (``ClusterName``, ``Namespace``) and its cluster (``ClusterName``)."""
    return ((("ClusterName", cluster), ("Namespace", namespace), ("PodName", pod)),
            (("ClusterName", cluster), ("Namespace", namespace)),
            (("ClusterName", cluster),))
