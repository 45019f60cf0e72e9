"""The data model every part of the exporter shares.

A :class:`Source` (NVML or simulated) produces one :class:`Snapshot` per sampling round.
Snapshots are frozen and typed, and every quantity is already in base units (bytes,
seconds, degrees celsius, watts, joules, hertz, ratios in 0..1). Unit conversion happens
exactly once, inside the source, where data leaves NVML or the scenario.

A value the device does not support (NVML answered ``NOT_SUPPORTED``) is ``None``, never 0:
downstream code leaves the series out instead of reporting a made-up zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

ProcessKind = Literal["compute", "graphics"]
#: A process's part in CUDA MPS (Multi-Process Service): ``"client"``, an application whose
#: work runs through the MPS server (NVML lists it with
#: ``nvmlDeviceGetMPSComputeRunningProcesses_v3``), or ``"server"``, the
#: ``nvidia-cuda-mps-server`` that owns the GPU context the clients share: infrastructure,
#: never a workload or a host process using the GPU.
MpsRole = Literal["client", "server"]


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process running on one device (a GPU or a MIG slice) during a sampling round.

    ``pid`` is the *host* PID as NVML reports it. ``sm_utilization_ratio`` is the mean SM
    utilization (0..1) of this process over the samples NVML recorded since the previous
    round; ``0.0`` when the device reports per-process utilization but had no sample for this
    process, ``None`` when the device cannot report it at all (MIG slices, old GPUs), or
    when the process is an MPS client on a GPU whose driver reports the MPS server's samples
    only (the clients' work is in the server's samples: each client's share is unknown).

    ``mps`` is the process's part in CUDA MPS (:data:`MpsRole`), ``None`` outside MPS. An
    MPS client is listed by NVML both as a compute process and as an MPS process, with the
    same memory: it is one process, its memory counted once.
    """

    pid: int
    kinds: tuple[ProcessKind, ...]
    memory_used_bytes: int | None
    sm_utilization_ratio: float | None = None
    mps: MpsRole | None = None


@dataclass(frozen=True, slots=True)
class XidCount:
    """How many XID events of one code a device has raised since the exporter started, and
    when the last of them was seen (wall-clock seconds, as the exporter's clock read it when
    the event arrived; None where the source cannot tell). ``last_seen`` is left out of
    equality: two readings of one count are the same reading, whatever clock a test ran on
    (tests of the time read it by name)."""

    xid: int
    count: int
    last_seen: float | None = field(default=None, compare=False)


#: The reasons of ``gpu_throttle_seconds_total``: the eight perf policies of NVML
#: (``NVML_FI_DEV_PERF_POLICY_*`` / ``nvmlDeviceGetViolationStatus``), then the three
#: clocks-event-reason durations newer drivers give (``NVML_FI_DEV_CLOCKS_EVENT_REASON_*``).
THROTTLE_REASONS: tuple[str, ...] = (
    "power",
    "thermal",
    "sync_boost",
    "board_limit",
    "low_utilization",
    "reliability",
    "app_clocks",
    "base_clocks",
    "sw_thermal",
    "hw_thermal",
    "hw_power_brake",
)


@dataclass(frozen=True, slots=True)
class ThrottleTime:
    """Seconds a GPU's clocks were held down for one reason (one of :data:`THROTTLE_REASONS`),
    a counter that never goes backwards while the exporter runs."""

    reason: str
    seconds: float


@dataclass(frozen=True, slots=True)
class RowRemapping:
    """A GPU's row remapper (``nvmlDeviceGetRemappedRows``, Ampere and newer): the memory rows
    it has remapped to spare rows because of correctable and of uncorrectable errors, counts
    the GPU keeps in its InfoROM (for its whole life, not since the exporter or the driver
    started), whether a remap waits for a GPU reset (``pending``), and whether a remap failed
    (``failed``: no spare row was left; the GPU should be replaced)."""

    correctable_rows: int
    uncorrectable_rows: int
    pending: bool
    failed: bool


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One GPU, or one MIG slice (a device of its own), as seen in one sampling round.

    Identity fields are always present. ``up`` is False when the device is lost or failing
    (NVML ``GPU_IS_LOST`` or an unexpected error); then every measurement is ``None``, but
    ``xid_errors`` is kept: XID 79 ("fell off the bus") arrives exactly when a GPU is lost.

    With MIG on, the parent GPU carries no processes: NVML reports them on the slices, and
    attribution relies on each process appearing on exactly one device.

    ``index`` is the value of the ``gpu`` label: ``"0"`` for a GPU, ``"<parent>/<gi>"`` for a
    MIG slice (parent GPU index and GPU-instance id, as nvidia-smi shows them).
    ``minor_number`` is the ``N`` of the GPU's ``/dev/nvidia<N>`` (a slice carries its
    GPU's), which device plugins that name GPUs by their device file use (GKE's
    ``nvidia<N>``); it need not equal the index. ``None`` where not known.

    Work signals (what tells work from waiting) are counters that never go backwards while
    the exporter runs, through GPU loss and driver reloads included, so that a rate over any
    window is the exact mean: ``busy_seconds`` (time a kernel ran), the GPM activities
    ``*_active_seconds`` (each activity ratio integrated over time) and interconnect bytes,
    and ``throttle_seconds`` per reason. ``sm_occupancy_ratio`` is the mean over the last GPM
    interval. A MIG slice carries its GPU instance's GPM values; throttling is board-level
    (the parent GPU only). ``None`` (or no ``throttle_seconds``) where the device or driver
    does not give them.

    ``mig_mode`` is True for a GPU whose current MIG mode is on, with or without slices (a
    GPU in MIG mode with none runs nothing and has no utilization); False for a slice.

    ``row_remapping`` is board-level too (the parent GPU only, never a MIG slice), ``None``
    where the GPU has no row remapper (before Ampere, ECC off).

    ``mps_client_utilization_reported`` says, for a device running CUDA MPS (a process with
    an ``mps`` role), which of the two behaviours of per-process utilization the source saw:
    True when NVML gave samples for MPS clients (they carry their own utilization), False
    when it gave samples only for other processes, the MPS server's PID carrying every
    client's work (the clients' utilization is then ``None``: unknown, never 0); ``None``
    when not known yet (no sample since MPS appeared) or not an MPS device.
    """

    index: str
    uuid: str
    model: str
    up: bool = True
    pci_bus_id: str = ""
    parent_uuid: str | None = None
    mig_profile: str | None = None
    architecture: str | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    sm_clock_hertz: float | None = None
    memory_clock_hertz: float | None = None
    fan_speed_ratio: float | None = None
    ecc_corrected_errors: int | None = None
    ecc_uncorrected_errors: int | None = None
    row_remapping: RowRemapping | None = None
    busy_seconds: float | None = None
    sm_active_seconds: float | None = None
    tensor_active_seconds: float | None = None
    dram_active_seconds: float | None = None
    graphics_active_seconds: float | None = None
    sm_occupancy_ratio: float | None = None
    pcie_receive_bytes: float | None = None
    pcie_transmit_bytes: float | None = None
    nvlink_receive_bytes: float | None = None
    nvlink_transmit_bytes: float | None = None
    throttle_seconds: tuple[ThrottleTime, ...] = ()
    xid_errors: tuple[XidCount, ...] = ()
    processes: tuple[ProcessSample, ...] = ()
    mps_client_utilization_reported: bool | None = None
    minor_number: int | None = None
    mig_mode: bool = False

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None

    @property
    def runs_mps(self) -> bool:
        """Whether an MPS server or MPS clients run on this device."""
        return any(p.mps is not None for p in self.processes)


#: The work-signal fields of :class:`DeviceSample` with one value each (``throttle_seconds``,
#: one value per reason, is apart); the GPM ones are :data:`GPM_SIGNALS`.
GPM_SIGNALS: tuple[str, ...] = (
    "sm_active_seconds",
    "tensor_active_seconds",
    "dram_active_seconds",
    "graphics_active_seconds",
    "sm_occupancy_ratio",
    "pcie_receive_bytes",
    "pcie_transmit_bytes",
    "nvlink_receive_bytes",
    "nvlink_transmit_bytes",
)
WORK_SIGNALS: tuple[str, ...] = ("busy_seconds", *GPM_SIGNALS)

#: The measurement fields of :class:`DeviceSample` (all None when the device is down).
MEASUREMENTS: tuple[str, ...] = (
    "utilization_ratio",
    "memory_utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "power_limit_watts",
    "energy_joules",
    "sm_clock_hertz",
    "memory_clock_hertz",
    "fan_speed_ratio",
    "ecc_corrected_errors",
    "ecc_uncorrected_errors",
    "row_remapping",
    *WORK_SIGNALS,
)


@dataclass(frozen=True, slots=True)
class PartResult:
    """Success and duration of one part of the work (node_exporter's per-collector
    ``success``/``duration`` pair), e.g. ``nvml_devices``, ``nvml_processes``, ``xid``,
    ``kubelet``. ``errors_total`` counts the part's failures since start, where it keeps
    such a count (background workers do)."""

    name: str
    success: bool
    duration_seconds: float
    errors_total: int = 0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one sampling round saw on this node.

    ``timestamp`` is wall-clock seconds since the epoch when the round finished.
    ``source_up`` is False when the GPU source itself is unavailable (NVML library or driver
    missing); ``devices`` is then empty.
    """

    timestamp: float
    source_up: bool
    driver_version: str | None = None
    devices: tuple[DeviceSample, ...] = ()
    parts: tuple[PartResult, ...] = field(default=())


class Source(Protocol):
    """Something that can be sampled: NVML on a real node, or a simulated scenario.

    ``sample()`` is called from the sampler thread only, once per interval; it must not
    raise for device or driver faults (those become ``up=False`` / ``source_up=False``).
    """

    name: str

    def sample(self) -> Snapshot: ...

    def close(self) -> None: ...
