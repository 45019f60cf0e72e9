"""The dashboard's data model: time series on a step grid, and what the fleet looks like.

Both data modes (Prometheus, embedded scraping) produce a :class:`FleetData`; the analysis
functions and the views only ever see this, never PromQL or exposition text.

Time series are *bucketed*: a point at time ``t`` summarises the samples in ``(t - step, t]``
(the maximum, for idle detection, or the mean). Points of series from one query share their
timestamps, so values can be joined on time exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Window:
    """The selected time window: ``(start, end]`` evaluated every ``step`` seconds."""

    start: float
    end: float
    step: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def times(self) -> tuple[float, ...]:
        """Evaluation times from ``end`` backwards to ``start`` (inclusive), oldest first.

        Anchored at ``end`` so the newest point always covers the newest data.
        """
        n = int((self.end - self.start) // self.step + 1e-9)
        return tuple(self.end - (n - i) * self.step for i in range(n + 1))


@dataclass(frozen=True, slots=True)
class Series:
    """Values at increasing times (seconds since the epoch)."""

    times: tuple[float, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.times) != len(self.values):
            raise ValueError("times and values differ in length")

    def __len__(self) -> int:
        return len(self.times)

    def at(self) -> dict[float, float]:
        """``{time: value}``, for joining series of one query on their shared timestamps."""
        return dict(zip(self.times, self.values, strict=True))

    @property
    def last(self) -> float | None:
        return self.values[-1] if self.values else None


@dataclass(frozen=True, slots=True, order=True)
class GpuRef:
    """A device (GPU or MIG slice) on a node, by UUID."""

    node: str
    uuid: str


@dataclass(frozen=True, slots=True, order=True)
class ContainerRef:
    """One container's use of one device."""

    node: str
    namespace: str
    pod: str
    container: str
    uuid: str

    @property
    def gpu(self) -> GpuRef:
        return GpuRef(self.node, self.uuid)

    @property
    def pod_key(self) -> PodKey:
        return PodKey(self.node, self.namespace, self.pod)


@dataclass(frozen=True, slots=True, order=True)
class PodKey:
    node: str
    namespace: str
    pod: str


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """``gpu_info`` of one device. ``gpu`` is the index label (``"3"``, or ``"7/1"`` for a
    MIG slice); a full GPU has an empty ``parent_uuid``."""

    node: str
    gpu: str
    uuid: str
    model: str = ""
    parent_uuid: str = ""
    mig_profile: str = ""

    @property
    def ref(self) -> GpuRef:
        return GpuRef(self.node, self.uuid)

    @property
    def is_physical(self) -> bool:
        """A whole GPU (possibly in MIG mode), not a MIG slice."""
        return not self.parent_uuid


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """``gpu_node_info`` of one node; empty strings where unknown."""

    node: str
    instance_type: str = ""
    zone: str = ""
    capacity_type: str = ""


@dataclass(frozen=True, slots=True)
class PodInfo:
    """``gpu_pod_info``: ``workload`` is ``<Kind>/<name>`` of the pod's top owner, or empty."""

    node: str
    namespace: str
    pod: str
    workload: str = ""


@dataclass(frozen=True, slots=True)
class UtilStats:
    """Statistics of one container's raw utilization samples over the window."""

    mean: float
    stddev: float
    samples: int
    memory_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class FleetData:
    """Everything the fleet page needs, for one window.

    - ``gpu_busy_max``: per step, the highest utilization sample of each device (a step is
      idle only if every sample in it was below the threshold). Steps at or above the idle
      threshold may be left out (Prometheus mode sends only idle steps): a missing step
      breaks an idle run either way.
    - ``gpu_now``: each device's highest utilization in the latest step; a device is
      reporting (has data) when it is here.
    - ``gpu_mean``: each device's mean utilization over the whole window.
    - ``gpu_step_mean``: per step, the mean device utilization (at least for devices shared by
      several containers: time-slicing starvation needs it).
    - ``allocated``: per step, 1 where a container held the device (at least for the steps in
      which the device was idle: the waste split needs no more).
    - ``containers``: per step, each container's mean utilization of each device it uses.
    - ``container_stats``: mean / stddev / count of each container's raw samples, and the
      most device memory it held, over the window.
    - ``history_start``: where collected data begins (>= window start); every "for >= D"
      verdict holds over ``min(D, window, end - history_start)``.
    - ``queries``: how many backend queries this took (Prometheus mode).
    """

    window: Window
    history_start: float
    gpus: Mapping[GpuRef, GpuInfo] = field(default_factory=dict)
    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    gpu_busy_max: Mapping[GpuRef, Series] = field(default_factory=dict)
    gpu_now: Mapping[GpuRef, float] = field(default_factory=dict)
    gpu_mean: Mapping[GpuRef, float] = field(default_factory=dict)
    gpu_step_mean: Mapping[GpuRef, Series] = field(default_factory=dict)
    allocated: Mapping[GpuRef, Series] = field(default_factory=dict)
    containers: Mapping[ContainerRef, Series] = field(default_factory=dict)
    container_stats: Mapping[ContainerRef, UtilStats] = field(default_factory=dict)
    pods: Mapping[PodKey, PodInfo] = field(default_factory=dict)
    queries: int = 0
    notes: tuple[str, ...] = ()

    @property
    def history_seconds(self) -> float:
        return max(0.0, self.window.end - self.history_start)


@dataclass(frozen=True, slots=True)
class NodeDetail:
    """Drill-down for one node: per-device utilization and memory, per-container use."""

    node: str
    window: Window
    utilization: Mapping[str, Series] = field(default_factory=dict)     # gpu index -> series
    memory_used: Mapping[str, Series] = field(default_factory=dict)     # gpu index -> bytes
    containers: Mapping[str, Series] = field(default_factory=dict)      # "ns/pod/container gpu"
    queries: int = 0


@dataclass(frozen=True, slots=True)
class PodDetail:
    """Drill-down for one pod: each container's utilization and memory per device."""

    namespace: str
    pod: str
    window: Window
    utilization: Mapping[str, Series] = field(default_factory=dict)     # "container@node/gpu"
    memory_used: Mapping[str, Series] = field(default_factory=dict)
    queries: int = 0
