"""The typed scenario model: frozen dataclasses in base units (bytes, seconds of scenario
time, watts, degrees celsius, hertz, ratios 0..1), as the parser builds them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gpuscope.exporter.model import MEASUREMENTS, MpsRole, ProcessKind
from gpuscope.exporter.sources.scenario.patterns import UtilizationPattern

CapacityType = Literal["on-demand", "spot"]
QosClass = Literal["guaranteed", "burstable", "besteffort"]

#: Names accepted in ``unsupported:`` lists and ``not_supported`` faults. All but the last
#: two are :class:`~gpuscope.exporter.model.DeviceSample` fields (``throttle_seconds``: every
#: reason); ``process_utilization`` and ``process_memory`` blank the per-process
#: ``sm_utilization_ratio`` / ``memory_used_bytes``.
DEVICE_FIELDS: tuple[str, ...] = (
    *MEASUREMENTS, "throttle_seconds", "process_utilization", "process_memory",
)

SCENARIO_VERSION = 1


class ScenarioError(Exception):
    """A scenario that cannot be read or is invalid. ``str()`` is one line naming the file and
    the key path; the CLI prints it and exits 2."""


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


# ----------------------------------------------------------------------------------------
# Time: process lifetimes and fault windows (seconds of scenario time).
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lifetime:
    """When a process exists. It starts at ``start`` and ends at ``stop`` (None: never).
    With ``period``/``on`` (``every:`` in the file) it runs for ``on`` seconds at the start of
    every ``period`` seconds counted from ``start``, each run being a new incarnation."""

    start: float = 0.0
    stop: float | None = None
    period: float | None = None
    on: float | None = None

    @property
    def always(self) -> bool:
        """True when the process runs for the whole scenario."""
        return self.start == 0.0 and self.stop is None and self.period is None

    def incarnation_start(self, t: float) -> float | None:
        """Scenario time at which the incarnation running at ``t`` started, or None when the
        process does not run at ``t``."""
        if t < self.start or (self.stop is not None and t >= self.stop):
            return None
        if self.period is None or self.on is None:
            return self.start
        since = self.start + ((t - self.start) // self.period) * self.period
        return since if t - since < self.on else None


@dataclass(frozen=True, slots=True)
class Window:
    """A fault window: from ``at`` for ``duration`` seconds (None: until the end); with
    ``every``, the window repeats every ``every`` seconds counted from ``at``."""

    at: float = 0.0
    duration: float | None = None
    every: float | None = None

    def contains(self, t: float) -> bool:
        """True when scenario time ``t`` (seconds) is inside the window."""
        if t < self.at:
            return False
        if self.duration is None:
            return True
        d = t - self.at
        if self.every is not None:
            d %= self.every
        return d < self.duration


# ----------------------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """A device as a scenario names it: GPU ``gpu`` (``"3"``), MIG slice ``"3/1"`` (parent
    index / GPU-instance id), or time-slicing replica ``"3::1"`` (pod allocations only)."""

    gpu: int
    gpu_instance_id: int | None = None
    replica: int | None = None

    @property
    def device_index(self) -> str:
        """The ``gpu`` label / ``DeviceSample.index`` of the device (replica dropped)."""
        if self.gpu_instance_id is not None:
            return f"{self.gpu}/{self.gpu_instance_id}"
        return str(self.gpu)

    def __str__(self) -> str:
        if self.replica is not None:
            return f"{self.gpu}::{self.replica}"
        return self.device_index


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """``namespace/pod/container``: the container a process belongs to."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


# ----------------------------------------------------------------------------------------
# The scenario model
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """The simulated node (node metadata: ``gpu_node_info``; driver version: ``gpu_info``)."""

    name: str
    instance_type: str | None
    zone: str | None
    capacity_type: CapacityType
    driver_version: str
    seed: int


@dataclass(frozen=True, slots=True)
class MigSliceSpec:
    """One MIG slice (a GPU instance with its compute instance) of a GPU in MIG mode."""

    gpu_instance_id: int
    profile: str
    index: str
    uuid: str
    memory_total_bytes: int
    compute_slices: int
    utilization_supported: bool
    unsupported: frozenset[str]


@dataclass(frozen=True, slots=True)
class RemappedRows:
    """Rows a GPU's row remapper had remapped before the scenario starts (a lifetime count,
    kept in its InfoROM), for correctable and for uncorrectable errors."""

    correctable: int = 0
    uncorrectable: int = 0


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One physical GPU. Power in watts, temperatures in celsius, clocks in hertz, memory in
    bytes, ratios 0..1. ``temperature_*``, ``sm_clock_*`` and ``fan_*`` give the value at
    utilization 0 (idle) and 1 (busy). ``gpm``: the GPU (and its MIG slices) reports GPM
    activity. ``throttle``: (reason, seconds of throttling per second as a pattern of
    scenario time) for the reasons that are not 0. ``remapped_rows``: the GPU's row remapper
    (``None``: it has none, as before Ampere; ``row_remap`` faults change what it reports).
    ``mps_client_utilization``: under CUDA MPS, whether per-process utilization is reported
    for each MPS client (True) or only for the MPS server, carrying every client's work
    (False: what an H200 with driver 580.159.04 does)."""

    index: int
    uuid: str
    model: str
    architecture: str | None
    pci_bus_id: str
    memory_total_bytes: int
    memory_reserved_bytes: int
    power_limit_watts: float
    power_idle_watts: float
    temperature_idle_celsius: float
    temperature_busy_celsius: float
    sm_clock_idle_hertz: float
    sm_clock_busy_hertz: float
    memory_clock_hertz: float
    fan_idle_ratio: float | None
    fan_busy_ratio: float | None
    memory_utilization_factor: float
    base_utilization: float
    ecc_corrected_errors: int
    ecc_uncorrected_errors: int
    unsupported: frozenset[str]
    mig: tuple[MigSliceSpec, ...] = ()
    gpm: bool = False
    throttle: tuple[tuple[str, UtilizationPattern], ...] = ()
    mps_client_utilization: bool = False
    remapped_rows: RemappedRows | None = None

    @property
    def mig_enabled(self) -> bool:
        """True when the GPU is in MIG mode (its work runs on its slices)."""
        return bool(self.mig)

    def slice(self, gpu_instance_id: int) -> MigSliceSpec | None:
        """The MIG slice with this GPU-instance id, if any."""
        for s in self.mig:
            if s.gpu_instance_id == gpu_instance_id:
                return s
        return None


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """A process on a GPU or MIG slice: host ``pid``, device memory (bytes, constant while it
    runs), a utilization pattern, a lifetime, optionally the container it runs in, and its
    part in CUDA MPS (``mps``: the ``server`` or a ``client``; GPUs only, not MIG slices)."""

    pid: int
    device: DeviceRef
    kinds: tuple[ProcessKind, ...]
    memory_bytes: int
    utilization: UtilizationPattern
    lifetime: Lifetime
    pod: ContainerRef | None = None
    activity: ActivitySpec = field(default_factory=lambda: ActivitySpec())
    mps: MpsRole | None = None


@dataclass(frozen=True, slots=True)
class ActivitySpec:
    """What a process's utilization is made of, per unit of it (its pattern's value): the GPM
    activities it causes (ratios: ``sm``, ``tensor``, ``dram``, ``graphics``, ``occupancy``),
    its PCIe and NVLink traffic (bytes per second at utilization 1) and its share of the busy
    power draw (``power``: a kernel spinning in a collective keeps the GPU "utilized" while
    drawing little)."""

    sm: float = 1.0
    tensor: float = 0.0
    dram: float = 0.0
    graphics: float = 1.0
    occupancy: float = 0.0
    pcie_rx: float = 0.0
    pcie_tx: float = 0.0
    nvlink_rx: float = 0.0
    nvlink_tx: float = 0.0
    power: float = 1.0


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """A container and the devices the kubelet allocated to it (``nvidia.com/gpu``,
    ``nvidia.com/mig-*`` or time-slicing replicas)."""

    name: str
    id: str
    devices: tuple[DeviceRef, ...]


@dataclass(frozen=True, slots=True)
class PodSpec:
    """A pod on the node. ``workload`` is ``<Kind>/<name>`` of its top owner, or empty."""

    namespace: str
    name: str
    uid: str
    workload: str
    qos: QosClass
    containers: tuple[ContainerSpec, ...]


@dataclass(frozen=True, slots=True)
class LostFault:
    """GPU ``gpu`` (and its MIG slices) is lost during ``window``: ``up`` False and every
    measurement None."""

    gpu: int
    window: Window


@dataclass(frozen=True, slots=True)
class XidFault:
    """GPU ``gpu`` raises XID ``code`` at ``at`` and then every ``every`` seconds, ``count``
    events at most (None: unlimited)."""

    gpu: int
    code: int
    at: float
    every: float | None
    count: int | None

    def count_at(self, t: float) -> int:
        """Events raised up to and including scenario time ``t``."""
        return events_at(self.at, self.every, self.count, t)

    def last_at(self, t: float) -> float | None:
        """Scenario time of the last event raised up to and including ``t`` (None: none)."""
        n = self.count_at(t)
        if n == 0:
            return None
        return self.at + (n - 1) * (self.every or 0.0)


def events_at(at: float, every: float | None, count: int | None, t: float) -> int:
    """Events of a series that starts at ``at`` and repeats every ``every`` seconds (None:
    once), ``count`` at most (None: unlimited), up to and including scenario time ``t``."""
    if t < at:
        return 0
    n = 1 if every is None else int((t - at) // every) + 1
    return n if count is None else min(n, count)


@dataclass(frozen=True, slots=True)
class EccFault:
    """GPU ``gpu`` has ECC errors at ``at`` and then every ``every`` seconds, ``count`` events
    at most (None: unlimited); each event adds ``corrected`` corrected and ``uncorrected``
    uncorrected errors to the GPU's (volatile) ECC counts."""

    gpu: int
    at: float
    every: float | None
    count: int | None
    corrected: int
    uncorrected: int

    def count_at(self, t: float) -> int:
        """Events up to and including scenario time ``t``."""
        return events_at(self.at, self.every, self.count, t)


@dataclass(frozen=True, slots=True)
class RowRemapFault:
    """During ``window`` GPU ``gpu``'s row remapper reports ``correctable`` and
    ``uncorrectable`` more rows remapped, a remap pending (``pending``: it waits for a GPU
    reset) and a remap failed (``failed``) where set. Overlapping faults add their rows; a
    flag is set while any of them sets it."""

    gpu: int
    window: Window
    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failed: bool = False


@dataclass(frozen=True, slots=True)
class NvmlDownFault:
    """NVML is unavailable during ``window``: ``source_up`` False and no devices."""

    window: Window


@dataclass(frozen=True, slots=True)
class NotSupportedFault:
    """During ``window`` the device answers NOT_SUPPORTED for ``fields`` (they become None)."""

    device: DeviceRef
    fields: frozenset[str]
    window: Window


Fault = LostFault | XidFault | EccFault | RowRemapFault | NvmlDownFault | NotSupportedFault


@dataclass(frozen=True, slots=True)
class Scenario:
    """A validated scenario. ``source`` names where it came from (a path, or the built-in)."""

    node: NodeSpec
    gpus: tuple[GpuSpec, ...]
    processes: tuple[ProcessSpec, ...] = ()
    pods: tuple[PodSpec, ...] = ()
    faults: tuple[Fault, ...] = ()
    description: str = ""
    source: str = "<scenario>"

    def gpu(self, index: int) -> GpuSpec:
        """The GPU with this index (``IndexError`` when there is none)."""
        return self.gpus[index]

    def device_uuid(self, ref: DeviceRef) -> str:
        """The UUID NVML (GPU, MIG slice) or the kubelet (``<uuid>::<n>`` for a time-slicing
        replica) uses for ``ref``."""
        gpu = self.gpus[ref.gpu]
        if ref.gpu_instance_id is not None:
            sl = gpu.slice(ref.gpu_instance_id)
            if sl is None:
                raise KeyError(str(ref))
            return sl.uuid
        if ref.replica is not None:
            return f"{gpu.uuid}::{ref.replica}"
        return gpu.uuid

    def pod(self, namespace: str, name: str) -> PodSpec | None:
        """The pod ``namespace/name``, if the scenario has one."""
        for p in self.pods:
            if p.namespace == namespace and p.name == name:
                return p
        return None
