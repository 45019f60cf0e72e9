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


@dataclass(frozen=True, slots=True)
class ProcessSample:
    """One process running on one device (a GPU or a MIG slice) during a sampling round.

    ``pid`` is the *host* PID as NVML reports it. ``sm_utilization_ratio`` is the mean SM
    utilization (0..1) of this process over the samples NVML recorded since the previous
    round; ``0.0`` when the device reports per-process utilization but had no sample for this
    process, ``None`` when the device cannot report it at all (MIG slices, old GPUs).
    """

    pid: int
    kinds: tuple[ProcessKind, ...]
    memory_used_bytes: int | None
    sm_utilization_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class XidCount:
    """How many XID events of one code a device has raised since the exporter started."""

    xid: int
    count: int


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
    xid_errors: tuple[XidCount, ...] = ()
    processes: tuple[ProcessSample, ...] = ()

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None


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
