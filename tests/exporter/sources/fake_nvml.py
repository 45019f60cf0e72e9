"""A test double for the NVML C library (``libnvidia-ml.so.1``), driven through real pynvml.

Tests install it in place of the shared library and let pynvml do everything else::

    fake = FakeNvml()
    gpu = fake.add_gpu(util_gpu=87, power_mw=312_500)
    pynvml.nvmlLib = fake                       # or NvmlSource(library_loader=lambda: fake)
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlInit()

pynvml looks every C entry point up with ``getattr(nvmlLib, "nvml...")`` and calls it with
ctypes objects, so the fake's entry points receive exactly what the real library would:
``byref(...)`` arguments (written through ``arg._obj``), string buffers, arrays of structs, and
opaque handles (``c_nvmlDevice_t`` pointers, compared by address). Each returns an NVML return
code (an int), and pynvml turns it into its real error classes. A name listed in
``missing_functions`` is absent (``AttributeError``), which pynvml reports as
``NVMLError_FunctionNotFound``, or as ``NVMLLibraryMismatchError`` for the unversioned process
calls whose ``_v3`` symbol is missing.

Memory as the driver answers it: ``memory_used`` is what processes and contexts use and
``memory_reserved`` what the driver keeps for itself (615 MiB by default on a GPU, as on an
idle H200; 0 on a MIG slice). ``nvmlDeviceGetMemoryInfo_v2`` (version ``nvmlMemory_v2``, else
ARGUMENT_VERSION_MISMATCH) answers them apart, its ``used`` being nvidia-smi's memory.used;
v1 ``nvmlDeviceGetMemoryInfo`` answers ``used = total - free``, reserved included.
``FakeNvml(memory_v2=False)`` (or ``fake.memory_v2 = False`` before pynvml first looks the
symbol up) plays a driver before R510, without the ``_v2`` symbol.

State is plain mutable data (:class:`FakeGpu`, :class:`FakeMigSlice`, :class:`FakeProcess`) that
a test may change between sampling rounds. Units are NVML's own: percent, bytes, °C, milliwatts,
millijoules, MHz, microseconds, nanoseconds (throttle time), MiB/s. A measurement set to
``None`` answers ``NVML_ERROR_NOT_SUPPORTED``; ``device.errors[entry_point] = code`` makes one
entry point return any code on one device; ``fake.errors[entry_point] = code`` does it on all
of them.

GPU health: ``gpu.lost = True`` makes every call on the GPU (and its MIG slices) answer
GPU_IS_LOST; ``fake.inject_xid(gpu, 79)`` queues an XID event; ``ecc_uncorrected`` is the
volatile uncorrected ECC count; ``remapped_rows`` (a :class:`FakeRemappedRows`: rows
remapped for correctable and uncorrectable errors, ``pending``, ``failed``) is what
``nvmlDeviceGetRemappedRows`` answers, ``None`` for NOT_SUPPORTED (before Ampere).

Work signals: the driver's GPU-utilization samples (``add_busy_sample``, read by
``nvmlDeviceGetSamples``), the perf-policy violation counters (``violation_ns``, read as field
values 74-81 or with ``nvmlDeviceGetViolationStatus``) and the clocks-event-reason durations
(``clocks_event_ns``, fields 269-271), and GPM (``gpm_supported``; ``gpm`` holds the means
``nvmlGpmMetricsGet`` answers for the interval that ends at the next ``nvmlGpmSampleGet`` or
``nvmlGpmMigSampleGet``, ``gpm_unsupported`` the metric ids that answer NOT_SUPPORTED). GPM
sample buffers are real allocations, checked like the driver does: a metrics request needs two
filled buffers of one target, the older first, and a freed buffer is invalid.

CUDA MPS, as an H200 with driver 580.159.04 showed it: a process with ``mps="server"`` is the
``nvidia-cuda-mps-server`` (a compute process like any other to NVML), ``mps="client"`` an MPS
client, listed by ``nvmlDeviceGetMPSComputeRunningProcesses_v3`` (and ``_v2``) and, with the
same memory, by the compute list too (``device.mps_clients_in_compute_list = False`` lists
them in the MPS list only). Per-process utilization has two behaviours:
``device.mps_client_utilization = False`` (the default, as measured) makes
:meth:`FakeNvml.record_process_samples` record a sample for the server only, its smUtil the
clients' added up (at most 100), and none for the clients; ``True`` records each client's own.
``device.mps_supported = False`` answers the MPS list NOT_SUPPORTED (before Volta).

Entry points are cheap (a dict lookup per handle, no copies of the process lists), so the fake
also serves the benchmark (8 GPUs x 64 processes).
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import functools
import threading
import time
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import pynvml

SUCCESS: int = pynvml.NVML_SUCCESS
UNINITIALIZED: int = pynvml.NVML_ERROR_UNINITIALIZED
INVALID_ARGUMENT: int = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED: int = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION: int = pynvml.NVML_ERROR_NO_PERMISSION
NOT_FOUND: int = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE: int = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
DRIVER_NOT_LOADED: int = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
TIMEOUT: int = pynvml.NVML_ERROR_TIMEOUT
ARGUMENT_VERSION_MISMATCH: int = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
GPU_IS_LOST: int = pynvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN: int = pynvml.NVML_ERROR_UNKNOWN

MIB = 1024 * 1024
GIB = 1024 * MIB

# The perf policies NVML keeps a violation counter for, and their field ids (74-81).
PERF_POLICIES: tuple[int, ...] = (
    pynvml.NVML_PERF_POLICY_POWER,
    pynvml.NVML_PERF_POLICY_THERMAL,
    pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    pynvml.NVML_PERF_POLICY_RELIABILITY,
    pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
)
PERF_POLICY_FIELDS: dict[int, int] = {
    pynvml.NVML_FI_DEV_PERF_POLICY_POWER: pynvml.NVML_PERF_POLICY_POWER,
    pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL: pynvml.NVML_PERF_POLICY_THERMAL,
    pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST: pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT: pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION: pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY: pynvml.NVML_PERF_POLICY_RELIABILITY,
    pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS: pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS: pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
}

# usedGpuMemory value NVML writes when it cannot tell (pynvml turns it into None).
_NOT_AVAILABLE_ULL: int = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
# gpuInstanceId / computeInstanceId of a process or event outside any MIG instance.
_NO_INSTANCE = 0xFFFFFFFF

_PROCESS_V3_ENTRY_POINTS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v3",
)


class _Return(Exception):
    """Raised inside an entry point to make it return an NVML error code."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


# ---------------------------------------------------------------------------------------------
# Test-controllable state


@dataclass(eq=False)
class FakeProcess:
    """One process on a device. ``used_memory`` in bytes (``None``: NVML cannot tell);
    ``kinds`` picks the lists it appears in (compute and/or graphics); ``sm_util`` and
    ``mem_util`` (percent) are what :meth:`FakeNvml.record_process_samples` records for it.
    ``mps``: ``"server"`` (the MPS server), ``"client"`` (an MPS client: in the MPS list
    too) or ``None``."""

    pid: int
    used_memory: int | None = 512 * MIB
    kinds: tuple[str, ...] = ("compute",)
    sm_util: int = 0
    mem_util: int = 0
    compute_instance_id: int = 0
    mps: str | None = None


@dataclass(eq=False)
class FakeRemappedRows:
    """A GPU's row remapper, as ``nvmlDeviceGetRemappedRows`` answers it: rows remapped for
    correctable and for uncorrectable errors, a remap waiting for a GPU reset (``pending``),
    a remap that failed (``failed``)."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failed: bool = False


@dataclass(eq=False)
class _FakeDevice:
    """What a GPU and a MIG slice have in common: identity, memory, processes and the
    per-process utilization buffer NVML keeps (``(timeStamp µs, pid, smUtil, memUtil)``,
    sorted by time, oldest dropped beyond ``max_util_samples``)."""

    uuid: str = ""
    name: str = ""
    memory_total: int = 80 * GIB
    # What processes and contexts use: v2's used, nvidia-smi's memory.used.
    memory_used: int = 1 * GIB
    # What the driver sets aside for itself (v2's reserved); v1's used counts it too.
    memory_reserved: int = 0
    util_gpu: int | None = None  # percent; None answers NOT_SUPPORTED
    util_memory: int | None = None  # percent
    processes: list[FakeProcess] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    process_utilization_supported: bool = True
    util_samples: list[tuple[int, int, int, int]] = field(default_factory=list)
    max_util_samples: int = 4096
    # The driver's GPU-utilization samples (timeStamp µs, percent), oldest first.
    busy_samples: list[tuple[int, int]] = field(default_factory=list)
    max_busy_samples: int = 120
    busy_samples_supported: bool = True
    # GPM means (metric id -> % or MiB/s) for the interval ending at the next sample.
    gpm: dict[int, float] = field(default_factory=dict)
    gpm_unsupported: set[int] = field(default_factory=set)
    # MPS: the MPS list answers (else NOT_SUPPORTED, before Volta); clients are in the
    # compute list too; the driver records samples per client (True) or for the server only,
    # carrying the clients' work (False: as an H200 with driver 580.159.04 does).
    mps_supported: bool = True
    mps_clients_in_compute_list: bool = True
    mps_client_utilization: bool = False
    address: int = 0  # the opaque handle's value, assigned by FakeNvml
    _token: Any = field(default=None, repr=False)

    @property
    def is_lost(self) -> bool:
        raise NotImplementedError

    def add_process(self, pid: int, **kwargs: Any) -> FakeProcess:
        proc = FakeProcess(pid, **kwargs)
        self.processes.append(proc)
        return proc

    def remove_process(self, pid: int) -> None:
        self.processes[:] = [p for p in self.processes if p.pid != pid]

    def add_util_sample(self, pid: int, timestamp_us: int, sm_util: int, mem_util: int = 0) -> None:
        """Record one per-process utilization sample, as the driver does every ~1/6 s."""
        bisect.insort(self.util_samples, (timestamp_us, pid, sm_util, mem_util))
        excess = len(self.util_samples) - self.max_util_samples
        if excess > 0:
            del self.util_samples[:excess]

    def add_busy_sample(self, timestamp_us: int, percent: int) -> None:
        """Record one GPU-utilization sample, as the driver does every 1/6 s to 1 s."""
        bisect.insort(self.busy_samples, (timestamp_us, percent))
        excess = len(self.busy_samples) - self.max_busy_samples
        if excess > 0:
            del self.busy_samples[:excess]

    def not_supported(self, *entry_points: str) -> None:
        """Make these entry points answer NVML_ERROR_NOT_SUPPORTED on this device."""
        for name in entry_points:
            self.errors[name] = NOT_SUPPORTED


@dataclass(eq=False)
class FakeGpu(_FakeDevice):
    """A physical GPU. Measurements in NVML units; ``None`` answers NOT_SUPPORTED."""

    index: int = 0
    pci_bus_id: str = ""
    minor: int | None = None  # /dev/nvidia<minor>; None: the index
    architecture: int | None = pynvml.NVML_DEVICE_ARCH_AMPERE
    util_gpu: int | None = 50  # percent
    util_memory: int | None = 20  # percent
    # The driver's own memory, as an idle H200 with driver 580.159 showed (615 MiB): not
    # zero, so that a reading of v1's used (used + reserved) shows against v2's.
    memory_reserved: int = 615 * MIB
    temperature_c: int | None = 45
    power_mw: int | None = 250_000
    power_limit_mw: int | None = 400_000
    energy_mj: int | None = 1_000_000_000
    sm_clock_mhz: int | None = 1410
    mem_clock_mhz: int | None = 1593
    fan_percent: int | None = 30
    ecc_corrected: int | None = 0
    ecc_uncorrected: int | None = 0
    # nvmlDeviceGetRemappedRows; None answers NOT_SUPPORTED (before Ampere, ECC off).
    remapped_rows: FakeRemappedRows | None = field(default_factory=FakeRemappedRows)
    lost: bool = False
    # None: the GPU cannot do MIG (nvmlDeviceGetMigMode answers NOT_SUPPORTED).
    mig_enabled: bool | None = None
    mig_slices: list[FakeMigSlice] = field(default_factory=list)
    max_mig_devices: int = 7
    events_supported: bool = True
    gpm_supported: bool = False  # Hopper and newer
    # NVML_PERF_POLICY_* -> violation time (ns since the driver loaded); a policy left out
    # answers NOT_SUPPORTED (field value or nvmlDeviceGetViolationStatus).
    violation_ns: dict[int, int] = field(default_factory=lambda: dict.fromkeys(PERF_POLICIES, 0))
    # Whether the perf-policy field ids (74-81) answer; False: an older driver without them.
    perf_policy_fields: bool = True
    # NVML_FI_DEV_CLOCKS_EVENT_REASON_*_SLOWDOWN field id (269-271) -> ns; newer drivers only.
    clocks_event_ns: dict[int, int] = field(default_factory=dict)

    @property
    def is_lost(self) -> bool:
        return self.lost


@dataclass(eq=False)
class FakeMigSlice(_FakeDevice):
    """A MIG device (GPU instance). Memory and processes work; utilization answers
    NOT_SUPPORTED unless ``util_gpu`` is set (GPM-capable drivers)."""

    parent: FakeGpu | None = None
    gpu_instance_id: int = 0
    profile: str = "1g.10gb"
    process_utilization_supported: bool = False
    busy_samples_supported: bool = False

    @property
    def is_lost(self) -> bool:
        return self.parent is not None and self.parent.lost


@dataclass(eq=False)
class _EventSet:
    devices: set[int] = field(default_factory=set)  # addresses of registered GPUs
    _token: Any = field(default=None, repr=False)


# ---------------------------------------------------------------------------------------------
# C entry points: module functions registered by name. Each gets the FakeNvml first, then the
# C arguments as pynvml passes them; the decorators do the bookkeeping every NVML call shares.

_EntryPoint = Callable[..., int]
_ENTRY_POINTS: dict[str, _EntryPoint] = {}


def _entry(fn: Callable[..., int | None]) -> Callable[..., int | None]:
    """A library-level entry point: counts the call, checks init/driver, maps _Return."""
    name = fn.__name__

    @functools.wraps(fn)
    def entry(lib: FakeNvml, *args: Any) -> int:
        lib.calls[name] += 1
        try:
            lib._check(name)
            rc = fn(lib, *args)
        except _Return as ret:
            return ret.code
        return SUCCESS if rc is None else rc

    _ENTRY_POINTS[name] = entry
    return fn


def _device_entry(fn: Callable[..., int | None]) -> Callable[..., int | None]:
    """Like :func:`_entry`, for calls whose first C argument is a device handle: the function
    gets the device itself, after the lost-GPU and per-device error checks."""
    name = fn.__name__

    @functools.wraps(fn)
    def entry(lib: FakeNvml, handle: Any, *args: Any) -> int:
        lib.calls[name] += 1
        try:
            lib._check(name)
            rc = fn(lib, lib._device(handle, name), *args)
        except _Return as ret:
            return ret.code
        return SUCCESS if rc is None else rc

    _ENTRY_POINTS[name] = entry
    return fn


def _write(ref: Any, value: int | None) -> None:
    """Store a scalar through a ``byref(c_uint())``-style argument; None is NOT_SUPPORTED."""
    if value is None:
        raise _Return(NOT_SUPPORTED)
    ref._obj.value = value


def _write_handle(ref: Any, address: int) -> None:
    """Store an opaque handle (a pointer value) through ``byref(c_nvmlDevice_t())``."""
    ctypes.c_void_p.from_buffer(ref._obj).value = address


def _write_string(buf: Any, length: Any, text: str) -> None:
    data = text.encode()
    if len(data) + 1 > length.value:
        raise _Return(INSUFFICIENT_SIZE)
    buf.value = data


def _board(dev: _FakeDevice) -> FakeGpu:
    """The physical GPU a handle belongs to (a MIG slice's parent)."""
    if isinstance(dev, FakeMigSlice) and dev.parent is not None:
        return dev.parent
    assert isinstance(dev, FakeGpu)
    return dev


def _gpu_only(dev: _FakeDevice) -> FakeGpu:
    # Board-level readings (power, clocks, temperature, ...) are not answered on MIG handles.
    if not isinstance(dev, FakeGpu):
        raise _Return(NOT_SUPPORTED)
    return dev


@_entry
def nvmlInitWithFlags(lib: FakeNvml, flags: int) -> int | None:
    lib.init_count += 1
    return None


@_entry
def nvmlShutdown(lib: FakeNvml) -> int | None:
    lib.init_count = max(0, lib.init_count - 1)
    return None


@_entry
def nvmlSystemGetDriverVersion(lib: FakeNvml, buf: Any, length: Any) -> int | None:
    _write_string(buf, length, lib.driver_version)
    return None


@_entry
def nvmlDeviceGetCount_v2(lib: FakeNvml, count: Any) -> int | None:
    count._obj.value = len(lib.gpus)
    return None


@_entry
def nvmlDeviceGetHandleByIndex_v2(lib: FakeNvml, index: Any, out: Any) -> int | None:
    if not 0 <= index.value < len(lib.gpus):
        raise _Return(INVALID_ARGUMENT)
    gpu = lib.gpus[index.value]
    if gpu.lost:
        raise _Return(GPU_IS_LOST)
    if code := gpu.errors.get("nvmlDeviceGetHandleByIndex_v2"):
        raise _Return(code)
    _write_handle(out, gpu.address)
    return None


@_device_entry
def nvmlDeviceGetName(lib: FakeNvml, dev: _FakeDevice, buf: Any, length: Any) -> int | None:
    _write_string(buf, length, dev.name)
    return None


@_device_entry
def nvmlDeviceGetUUID(lib: FakeNvml, dev: _FakeDevice, buf: Any, length: Any) -> int | None:
    _write_string(buf, length, dev.uuid)
    return None


@_device_entry
def nvmlDeviceGetIndex(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    _write(out, _gpu_only(dev).index)
    return None


@_device_entry
def nvmlDeviceGetPciInfo_v3(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    gpu = _board(dev)
    out._obj.busId = gpu.pci_bus_id.encode()
    out._obj.busIdLegacy = gpu.pci_bus_id.encode()[:15]
    return None


@_device_entry
def nvmlDeviceGetMinorNumber(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    gpu = _gpu_only(dev)
    _write(out, gpu.index if gpu.minor is None else gpu.minor)
    return None


@_device_entry
def nvmlDeviceGetArchitecture(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    _write(out, _board(dev).architecture)
    return None


def _memory_free(dev: _FakeDevice) -> int:
    return max(0, dev.memory_total - dev.memory_reserved - dev.memory_used)


@_device_entry
def nvmlDeviceGetMemoryInfo(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    # nvmlMemory_t (v1): used is total - free, so it counts the driver's reserved memory.
    free = _memory_free(dev)
    out._obj.total = dev.memory_total
    out._obj.free = free
    out._obj.used = dev.memory_total - free
    return None


@_device_entry
def nvmlDeviceGetMemoryInfo_v2(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    # nvmlMemory_v2_t: used without reserved, as nvidia-smi's memory.used (R510 and newer).
    if out._obj.version != pynvml.nvmlMemory_v2:
        raise _Return(ARGUMENT_VERSION_MISMATCH)
    out._obj.total = dev.memory_total
    out._obj.reserved = dev.memory_reserved
    out._obj.used = dev.memory_used
    out._obj.free = _memory_free(dev)
    return None


@_device_entry
def nvmlDeviceGetUtilizationRates(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    # With MIG on, the parent GPU has no utilization of its own (NVML: NOT_SUPPORTED).
    if dev.util_gpu is None or dev.util_memory is None or (
        isinstance(dev, FakeGpu) and dev.mig_enabled
    ):
        raise _Return(NOT_SUPPORTED)
    out._obj.gpu = dev.util_gpu
    out._obj.memory = dev.util_memory
    return None


@_device_entry
def nvmlDeviceGetTemperature(lib: FakeNvml, dev: _FakeDevice, sensor: Any, out: Any) -> int | None:
    if sensor.value != pynvml.NVML_TEMPERATURE_GPU:
        raise _Return(INVALID_ARGUMENT)
    _write(out, _gpu_only(dev).temperature_c)
    return None


@_device_entry
def nvmlDeviceGetPowerUsage(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    _write(out, _gpu_only(dev).power_mw)
    return None


@_device_entry
def nvmlDeviceGetEnforcedPowerLimit(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    _write(out, _gpu_only(dev).power_limit_mw)
    return None


@_device_entry
def nvmlDeviceGetTotalEnergyConsumption(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    _write(out, _gpu_only(dev).energy_mj)
    return None


@_device_entry
def nvmlDeviceGetFanSpeed(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    _write(out, _gpu_only(dev).fan_percent)
    return None


@_device_entry
def nvmlDeviceGetClockInfo(lib: FakeNvml, dev: _FakeDevice, clock: Any, out: Any) -> int | None:
    gpu = _gpu_only(dev)
    by_type = {
        pynvml.NVML_CLOCK_GRAPHICS: gpu.sm_clock_mhz,
        pynvml.NVML_CLOCK_SM: gpu.sm_clock_mhz,
        pynvml.NVML_CLOCK_MEM: gpu.mem_clock_mhz,
    }
    if clock.value not in by_type:
        raise _Return(INVALID_ARGUMENT)
    _write(out, by_type[clock.value])
    return None


@_device_entry
def nvmlDeviceGetTotalEccErrors(
    lib: FakeNvml, dev: _FakeDevice, error_type: Any, counter_type: Any, out: Any
) -> int | None:
    gpu = _gpu_only(dev)
    if error_type.value == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
        _write(out, gpu.ecc_corrected)
    elif error_type.value == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
        _write(out, gpu.ecc_uncorrected)
    else:
        raise _Return(INVALID_ARGUMENT)
    return None


@_device_entry
def nvmlDeviceGetRemappedRows(
    lib: FakeNvml, dev: _FakeDevice, corr: Any, unc: Any, pending: Any, failure: Any
) -> int | None:
    rows = _gpu_only(dev).remapped_rows
    if rows is None:
        raise _Return(NOT_SUPPORTED)
    corr._obj.value = rows.correctable
    unc._obj.value = rows.uncorrectable
    pending._obj.value = int(rows.pending)
    failure._obj.value = int(rows.failed)
    return None


# --- MIG


@_device_entry
def nvmlDeviceGetMigMode(lib: FakeNvml, dev: _FakeDevice, current: Any, pending: Any) -> int | None:
    gpu = _gpu_only(dev)
    if gpu.mig_enabled is None:
        raise _Return(NOT_SUPPORTED)
    mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
    current._obj.value = mode
    pending._obj.value = mode
    return None


@_device_entry
def nvmlDeviceGetMaxMigDeviceCount(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    gpu = _gpu_only(dev)
    if gpu.mig_enabled is None:
        raise _Return(NOT_SUPPORTED)
    out._obj.value = gpu.max_mig_devices
    return None


@_device_entry
def nvmlDeviceGetMigDeviceHandleByIndex(
    lib: FakeNvml, dev: _FakeDevice, index: Any, out: Any
) -> int | None:
    gpu = _gpu_only(dev)
    if not gpu.mig_enabled:
        raise _Return(INVALID_ARGUMENT)
    if index.value >= gpu.max_mig_devices:
        raise _Return(INVALID_ARGUMENT)
    if index.value >= len(gpu.mig_slices):
        raise _Return(NOT_FOUND)  # an empty slot
    _write_handle(out, gpu.mig_slices[index.value].address)
    return None


@_device_entry
def nvmlDeviceIsMigDeviceHandle(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    out._obj.value = int(isinstance(dev, FakeMigSlice))
    return None


@_device_entry
def nvmlDeviceGetGpuInstanceId(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    if not isinstance(dev, FakeMigSlice):
        raise _Return(INVALID_ARGUMENT)
    out._obj.value = dev.gpu_instance_id
    return None


@_device_entry
def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    lib: FakeNvml, dev: _FakeDevice, out: Any
) -> int | None:
    if not isinstance(dev, FakeMigSlice) or dev.parent is None:
        raise _Return(INVALID_ARGUMENT)
    _write_handle(out, dev.parent.address)
    return None


# --- processes


def _running(dev: _FakeDevice, kind: str) -> Iterator[tuple[FakeProcess, int]]:
    """The processes of one kind on a device, with their GPU-instance id. A MIG-enabled
    parent lists the processes of all its slices, as NVML does."""
    if isinstance(dev, FakeGpu) and dev.mig_enabled:
        for mig in dev.mig_slices:
            for proc in mig.processes:
                if kind in proc.kinds:
                    yield proc, mig.gpu_instance_id
        return
    gi = dev.gpu_instance_id if isinstance(dev, FakeMigSlice) else _NO_INSTANCE
    for proc in dev.processes:
        if kind == "mps":
            if proc.mps == "client":
                yield proc, gi
        elif kind in proc.kinds and (
            proc.mps != "client" or kind != "compute" or dev.mps_clients_in_compute_list
        ):
            yield proc, gi


def _processes(dev: _FakeDevice, kind: str, count: Any, infos: Any) -> int | None:
    """nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses{,_v2,_v3}: the size query
    (infos is NULL) answers INSUFFICIENT_SIZE with the count, or SUCCESS when there are none;
    the MPS list is NOT_SUPPORTED on a device without MPS."""
    if kind == "mps" and not dev.mps_supported:
        raise _Return(NOT_SUPPORTED)
    running = list(_running(dev, kind))
    if infos is None or count._obj.value < len(running):
        count._obj.value = len(running)
        return SUCCESS if not running else INSUFFICIENT_SIZE
    for slot, (proc, gi) in zip(infos, running, strict=False):
        slot.pid = proc.pid
        slot.usedGpuMemory = _NOT_AVAILABLE_ULL if proc.used_memory is None else proc.used_memory
        slot.gpuInstanceId = gi
        slot.computeInstanceId = _NO_INSTANCE if gi == _NO_INSTANCE else proc.compute_instance_id
    count._obj.value = len(running)
    return None


@_device_entry
def nvmlDeviceGetComputeRunningProcesses_v3(
    lib: FakeNvml, dev: _FakeDevice, count: Any, infos: Any
) -> int | None:
    return _processes(dev, "compute", count, infos)


@_device_entry
def nvmlDeviceGetComputeRunningProcesses_v2(
    lib: FakeNvml, dev: _FakeDevice, count: Any, infos: Any
) -> int | None:
    return _processes(dev, "compute", count, infos)


@_device_entry
def nvmlDeviceGetGraphicsRunningProcesses_v3(
    lib: FakeNvml, dev: _FakeDevice, count: Any, infos: Any
) -> int | None:
    return _processes(dev, "graphics", count, infos)


@_device_entry
def nvmlDeviceGetGraphicsRunningProcesses_v2(
    lib: FakeNvml, dev: _FakeDevice, count: Any, infos: Any
) -> int | None:
    return _processes(dev, "graphics", count, infos)


@_device_entry
def nvmlDeviceGetMPSComputeRunningProcesses_v3(
    lib: FakeNvml, dev: _FakeDevice, count: Any, infos: Any
) -> int | None:
    return _processes(dev, "mps", count, infos)


@_device_entry
def nvmlDeviceGetMPSComputeRunningProcesses_v2(
    lib: FakeNvml, dev: _FakeDevice, count: Any, infos: Any
) -> int | None:
    return _processes(dev, "mps", count, infos)


@_device_entry
def nvmlDeviceGetProcessUtilization(
    lib: FakeNvml, dev: _FakeDevice, samples: Any, count: Any, last_seen: Any
) -> int | None:
    """Samples with ``timeStamp > lastSeenTimeStamp`` (µs), oldest first; NOT_FOUND when
    there are none. A buffer too small gets the oldest samples that fit."""
    if not dev.process_utilization_supported or (isinstance(dev, FakeGpu) and dev.mig_enabled):
        raise _Return(NOT_SUPPORTED)
    buffer = dev.util_samples
    start = bisect.bisect_right(buffer, last_seen.value, key=itemgetter(0))
    new = len(buffer) - start
    if new == 0:
        raise _Return(NOT_FOUND)
    if samples is None:
        count._obj.value = new
        return INSUFFICIENT_SIZE
    filled = min(new, count._obj.value, len(samples))
    for i in range(filled):
        ts, pid, sm, mem = buffer[start + i]
        slot = samples[i]
        slot.pid = pid
        slot.timeStamp = ts
        slot.smUtil = sm
        slot.memUtil = mem
    count._obj.value = filled
    return None


# --- work signals: utilization samples, throttle time, GPM


def _int(value: Any) -> int:
    """A C integer argument: pynvml passes some as ctypes objects, some as Python ints."""
    return int(getattr(value, "value", value))


@_device_entry
def nvmlDeviceGetSamples(
    lib: FakeNvml, dev: _FakeDevice, sampling_type: Any, last_seen: Any, value_type: Any,
    count: Any, samples: Any,
) -> int | None:
    """GPU-utilization samples with ``timeStamp > lastSeenTimeStamp``, oldest first; NOT_FOUND
    when there are none. ``samples`` NULL is the size query (SUCCESS with the count), as
    pynvml expects it."""
    if _int(sampling_type) != pynvml.NVML_GPU_UTILIZATION_SAMPLES:
        raise _Return(NOT_SUPPORTED)
    if not dev.busy_samples_supported or (isinstance(dev, FakeGpu) and dev.mig_enabled):
        raise _Return(NOT_SUPPORTED)
    buffer = dev.busy_samples
    start = bisect.bisect_right(buffer, _int(last_seen), key=itemgetter(0))
    new = len(buffer) - start
    if new == 0:
        raise _Return(NOT_FOUND)
    value_type._obj.value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    if samples is None:
        count._obj.value = new
        return None
    filled = min(new, count._obj.value, len(samples))
    for i in range(filled):
        ts, percent = buffer[start + i]
        samples[i].timeStamp = ts
        samples[i].sampleValue.uiVal = percent
    count._obj.value = filled
    return None


@_device_entry
def nvmlDeviceGetFieldValues(
    lib: FakeNvml, dev: _FakeDevice, count: Any, values: Any
) -> int | None:
    """Each field with its own return code: the perf-policy violation counters (74-81) and the
    clocks-event-reason durations (269-271) the GPU has, NOT_SUPPORTED for the rest."""
    gpu = _gpu_only(dev)
    for i in range(_int(count)):
        slot = values._obj[i]
        field_id = slot.fieldId
        value: int | None = None
        if field_id in PERF_POLICY_FIELDS and gpu.perf_policy_fields:
            value = gpu.violation_ns.get(PERF_POLICY_FIELDS[field_id])
        elif field_id in gpu.clocks_event_ns:
            value = gpu.clocks_event_ns[field_id]
        slot.timestamp = lib.now_us()
        slot.latencyUsec = 0
        if value is None:
            slot.nvmlReturn = NOT_SUPPORTED
            continue
        slot.nvmlReturn = SUCCESS
        slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        slot.value.ullVal = value
    return None


@_device_entry
def nvmlDeviceGetViolationStatus(
    lib: FakeNvml, dev: _FakeDevice, policy: Any, out: Any
) -> int | None:
    gpu = _gpu_only(dev)
    ns = gpu.violation_ns.get(_int(policy))
    if ns is None:
        raise _Return(NOT_SUPPORTED)
    out._obj.referenceTime = lib.now_us()
    out._obj.violationTime = ns
    return None


@dataclass(eq=False)
class _GpmSample:
    """One sample buffer: which target filled it (a GPU, or a GPU instance), in which order,
    and the means the next metrics request answers when it is ``sample2``."""

    _token: Any = field(default=None, repr=False)
    target: tuple[int, int] | None = None  # (GPU address, GPU instance id or -1)
    sequence: int = 0
    means: dict[int, float] = field(default_factory=dict)
    unsupported: frozenset[int] = frozenset()


@_device_entry
def nvmlGpmQueryDeviceSupport(lib: FakeNvml, dev: _FakeDevice, out: Any) -> int | None:
    if out._obj.version != pynvml.NVML_GPM_SUPPORT_VERSION:
        raise _Return(ARGUMENT_VERSION_MISMATCH)
    out._obj.isSupportedDevice = int(_board(dev).gpm_supported)
    return None


@_entry
def nvmlGpmSampleAlloc(lib: FakeNvml, out: Any) -> int | None:
    sample = _GpmSample(_token=ctypes.create_string_buffer(1))
    address = ctypes.addressof(sample._token)
    lib._gpm_samples[address] = sample
    _write_handle(out, address)
    return None


@_entry
def nvmlGpmSampleFree(lib: FakeNvml, sample: Any) -> int | None:
    if lib._gpm_samples.pop(_address(sample), None) is None:
        raise _Return(INVALID_ARGUMENT)
    return None


def _fill_gpm(lib: FakeNvml, sample: Any, target: tuple[int, int], dev: _FakeDevice) -> None:
    buffer = lib._gpm_samples.get(_address(sample))
    if buffer is None:
        raise _Return(INVALID_ARGUMENT)
    lib._gpm_sequence += 1
    buffer.target = target
    buffer.sequence = lib._gpm_sequence
    buffer.means = dict(dev.gpm)
    buffer.unsupported = frozenset(dev.gpm_unsupported)


@_device_entry
def nvmlGpmSampleGet(lib: FakeNvml, dev: _FakeDevice, sample: Any) -> int | None:
    gpu = _gpu_only(dev)
    if not gpu.gpm_supported:
        raise _Return(NOT_SUPPORTED)
    _fill_gpm(lib, sample, (gpu.address, -1), gpu)
    return None


@_device_entry
def nvmlGpmMigSampleGet(
    lib: FakeNvml, dev: _FakeDevice, gpu_instance_id: Any, sample: Any
) -> int | None:
    gpu = _gpu_only(dev)
    if not gpu.gpm_supported:
        raise _Return(NOT_SUPPORTED)
    gi = _int(gpu_instance_id)
    mig = next((m for m in gpu.mig_slices if m.gpu_instance_id == gi), None)
    if not gpu.mig_enabled or mig is None:
        raise _Return(INVALID_ARGUMENT)
    _fill_gpm(lib, sample, (gpu.address, gi), mig)
    return None


@_entry
def nvmlGpmMetricsGet(lib: FakeNvml, request: Any) -> int | None:
    """Each asked metric's mean between ``sample1`` and ``sample2`` (two filled buffers of one
    target, ``sample1`` the older), with its own return code."""
    get = request._obj
    if get.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
        raise _Return(ARGUMENT_VERSION_MISMATCH)
    first = lib._gpm_samples.get(_address(get.sample1))
    second = lib._gpm_samples.get(_address(get.sample2))
    if first is None or second is None or first is second:
        raise _Return(INVALID_ARGUMENT)
    if first.target is None or first.target != second.target:
        raise _Return(INVALID_ARGUMENT)
    if first.sequence >= second.sequence or get.numMetrics > len(get.metrics):
        raise _Return(INVALID_ARGUMENT)
    lib.gpm_requests.append((first.target, first.sequence, second.sequence))
    for i in range(get.numMetrics):
        metric = get.metrics[i]
        mean = second.means.get(metric.metricId)
        if mean is None or metric.metricId in second.unsupported:
            metric.nvmlReturn = NOT_SUPPORTED
            metric.value = 0.0
        else:
            metric.nvmlReturn = SUCCESS
            metric.value = mean
    return None


# --- events


@_entry
def nvmlEventSetCreate(lib: FakeNvml, out: Any) -> int | None:
    event_set = _EventSet(_token=ctypes.create_string_buffer(1))
    address = ctypes.addressof(event_set._token)
    lib._event_sets[address] = event_set
    _write_handle(out, address)
    return None


@_device_entry
def nvmlDeviceRegisterEvents(
    lib: FakeNvml, dev: _FakeDevice, event_types: Any, event_set: Any
) -> int | None:
    gpu = _gpu_only(dev)
    if not gpu.events_supported:
        raise _Return(NOT_SUPPORTED)
    registered = lib._event_sets.get(_address(event_set))
    if registered is None:
        raise _Return(INVALID_ARGUMENT)
    if event_types.value & pynvml.nvmlEventTypeXidCriticalError:
        registered.devices.add(gpu.address)
    return None


@_entry
def nvmlEventSetWait_v2(lib: FakeNvml, event_set: Any, data: Any, timeout_ms: Any) -> int | None:
    """Hands out the oldest queued XID event for a GPU registered in this set; when there is
    none, waits (at most ``max_event_wait_s``, so tests stay fast) and answers TIMEOUT.

    As a real driver after XID 79: while a GPU registered in the set is lost, the wait hands
    out that GPU's own queued events (its last XID), then answers GPU_IS_LOST at once, every
    time, and the other GPUs' events stay queued."""
    address = _address(event_set)
    with lib._events_changed:
        if address not in lib._event_sets:
            raise _Return(INVALID_ARGUMENT)
        lost = {a for a in lib._event_sets[address].devices
                if (dev := lib._by_address.get(a)) is not None and dev.is_lost}
        if lost:
            event = lib._pop_event(address, only=lost)
            if event is None:
                raise _Return(GPU_IS_LOST)
        else:
            event = lib._pop_event(address)
        if event is None:
            lib._events_changed.wait(min(timeout_ms.value / 1000, lib.max_event_wait_s))
            event = lib._pop_event(address)
    if event is None:
        raise _Return(TIMEOUT)
    gpu, xid, gpu_instance_id = event
    data._obj.device = ctypes.cast(ctypes.c_void_p(gpu.address), pynvml.c_nvmlDevice_t)
    data._obj.eventType = pynvml.nvmlEventTypeXidCriticalError
    data._obj.eventData = xid
    data._obj.gpuInstanceId = gpu_instance_id
    data._obj.computeInstanceId = _NO_INSTANCE if gpu_instance_id == _NO_INSTANCE else 0
    return None


@_entry
def nvmlEventSetFree(lib: FakeNvml, event_set: Any) -> int | None:
    with lib._events_changed:
        if lib._event_sets.pop(_address(event_set), None) is None:
            raise _Return(INVALID_ARGUMENT)
        lib._events_changed.notify_all()
    return None


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


# ---------------------------------------------------------------------------------------------


class FakeNvml:
    """The fake library: a node's GPUs plus the library-wide state (init refcount, driver
    loaded, XID queue). Build it with :meth:`add_gpu` / :meth:`add_mig_slice`; see the module
    docstring for how to install it.

    ``calls`` counts every entry point call by name and ``missing_lookups`` every lookup of a
    missing symbol, so tests can check what pynvml (and the code under test) asked for.
    """

    def __init__(
        self,
        gpus: int = 0,
        *,
        driver_version: str = "550.54.15",
        missing_functions: set[str] | None = None,
        max_event_wait_s: float = 0.02,
        memory_v2: bool = True,
    ) -> None:
        self.driver_version = driver_version
        self.gpus: list[FakeGpu] = []
        self.missing_functions: set[str] = set(missing_functions or ())
        self.memory_v2 = memory_v2
        self.errors: dict[str, int] = {}
        self.driver_loaded = True
        self.init_count = 0
        self.max_event_wait_s = max_event_wait_s
        self.calls: Counter[str] = Counter()
        self.missing_lookups: Counter[str] = Counter()
        self._by_address: dict[int, _FakeDevice] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._gpm_samples: dict[int, _GpmSample] = {}
        self._gpm_sequence = 0
        # (target, sample1 sequence, sample2 sequence) of every successful metrics request.
        self.gpm_requests: list[tuple[tuple[int, int], int, int]] = []
        # Wall clock (µs) of the timestamps the fake writes; tests may replace it.
        self.now_us: Callable[[], int] = lambda: int(time.time() * 1_000_000)
        self._events: list[tuple[FakeGpu, int, int]] = []
        self._events_changed = threading.Condition()
        # pynvml sets ``restype`` on this one, so it must be a plain function object.
        self.nvmlErrorString = _error_string
        for _ in range(gpus):
            self.add_gpu()

    def __getattr__(self, name: str) -> Any:
        # Only reached for names not found normally, i.e. the C entry points.
        entry = _ENTRY_POINTS.get(name)
        if entry is None or name in self.missing_functions or (
            name == "nvmlDeviceGetMemoryInfo_v2" and not self.memory_v2
        ):
            if name.startswith("nvml"):
                self.missing_lookups[name] += 1
            raise AttributeError(name)
        return functools.partial(entry, self)

    # --- building a node

    def add_gpu(self, **fields: Any) -> FakeGpu:
        """Add a GPU with realistic A100 defaults; ``fields`` override any FakeGpu field."""
        index = len(self.gpus)
        fields.setdefault("uuid", f"GPU-{uuidlib.UUID(int=0xA100_0000 + index)}")
        fields.setdefault("name", "NVIDIA A100-SXM4-80GB")
        fields.setdefault("pci_bus_id", f"00000000:{0x10 + index:02X}:00.0")
        gpu = FakeGpu(index=index, **fields)
        self._register(gpu)
        self.gpus.append(gpu)
        return gpu

    def add_mig_slice(
        self,
        gpu: FakeGpu | int,
        profile: str = "1g.10gb",
        *,
        gpu_instance_id: int | None = None,
        memory_total: int | None = None,
        **fields: Any,
    ) -> FakeMigSlice:
        """Add a MIG slice to a GPU (and turn MIG mode on for it). The slice's memory defaults
        to the size in its profile name; its name is ``"<gpu name> MIG <profile>"``."""
        parent = self.gpus[gpu] if isinstance(gpu, int) else gpu
        parent.mig_enabled = True
        gi = gpu_instance_id if gpu_instance_id is not None else len(parent.mig_slices) + 1
        if memory_total is None:
            memory_total = int(profile.split(".")[1].removesuffix("gb").split("+")[0]) * GIB
        fields.setdefault("uuid", f"MIG-{uuidlib.UUID(int=(0x316 << 64) + parent.index * 64 + gi)}")
        fields.setdefault("name", f"{parent.name} MIG {profile}")
        fields.setdefault("memory_used", 0)
        mig = FakeMigSlice(
            parent=parent, gpu_instance_id=gi, profile=profile, memory_total=memory_total,
            **fields,
        )
        self._register(mig)
        parent.mig_slices.append(mig)
        return mig

    def remove_mig_slice(self, mig: FakeMigSlice) -> None:
        """Destroy a MIG slice (its GPU instance), as ``nvidia-smi mig -dci -dgi`` or the GPU
        operator's MIG manager does without a driver reload: it leaves its GPU's slots and
        its handle answers INVALID_ARGUMENT. MIG mode stays on."""
        if mig.parent is not None:
            mig.parent.mig_slices.remove(mig)
        self._by_address.pop(mig.address, None)

    def _register(self, dev: _FakeDevice) -> None:
        # A real (tiny) allocation per handle: distinct, stable addresses that stay valid.
        dev._token = ctypes.create_string_buffer(1)
        dev.address = ctypes.addressof(dev._token)
        self._by_address[dev.address] = dev

    def device(self, uuid: str) -> _FakeDevice:
        return next(d for d in self._by_address.values() if d.uuid == uuid)

    # --- driving it

    def inject_xid(self, gpu: FakeGpu | int, xid: int, gpu_instance_id: int | None = None) -> None:
        """Queue an XID critical-error event, as the driver raises it for a GPU (and, under
        MIG, for one of its GPU instances)."""
        target = self.gpus[gpu] if isinstance(gpu, int) else gpu
        gi = _NO_INSTANCE if gpu_instance_id is None else gpu_instance_id
        with self._events_changed:
            self._events.append((target, xid, gi))
            self._events_changed.notify_all()

    def gpm_samples_allocated(self) -> int:
        """GPM sample buffers allocated and not freed."""
        return len(self._gpm_samples)

    def pending_events(self) -> int:
        with self._events_changed:
            return len(self._events)

    def record_process_samples(self, timestamp_us: int) -> None:
        """One driver sampling tick: a sample for every process on every device that keeps
        per-process utilization, with the process's current ``sm_util``/``mem_util``. Under
        MPS with ``mps_client_utilization`` off, the clients get none and the server one
        with their work added up (at most 100 %), as the H200 answered."""
        for dev in self._by_address.values():
            if not dev.process_utilization_supported:
                continue
            server = next((p for p in dev.processes if p.mps == "server"), None)
            pooled = server is not None and not dev.mps_client_utilization
            for proc in dev.processes:
                if pooled and proc.mps == "client":
                    continue
                sm, mem = proc.sm_util, proc.mem_util
                if pooled and proc is server:
                    clients = [p for p in dev.processes if p.mps == "client"]
                    sm = min(100, sm + sum(p.sm_util for p in clients))
                    mem = min(100, mem + sum(p.mem_util for p in clients))
                dev.add_util_sample(proc.pid, timestamp_us, sm, mem)

    # --- internals used by the entry points

    def _check(self, name: str) -> None:
        if name in ("nvmlShutdown",):
            return
        if not self.driver_loaded:
            raise _Return(DRIVER_NOT_LOADED)
        if name != "nvmlInitWithFlags" and self.init_count == 0:
            raise _Return(UNINITIALIZED)
        if code := self.errors.get(name):
            raise _Return(code)

    def _device(self, handle: Any, name: str) -> Any:
        dev = self._by_address.get(_address(handle))
        if dev is None:
            raise _Return(INVALID_ARGUMENT)
        if dev.is_lost:
            raise _Return(GPU_IS_LOST)
        if code := dev.errors.get(name):
            raise _Return(code)
        return dev

    def _pop_event(self, event_set: int, only: set[int] | None = None
                   ) -> tuple[FakeGpu, int, int] | None:
        registered = self._event_sets[event_set].devices if only is None else only
        for i, event in enumerate(self._events):
            if event[0].address in registered:
                return self._events.pop(i)
        return None


def _error_string(code: int) -> bytes:
    return f"NVML error {code}".encode()


@contextlib.contextmanager
def restored_pynvml() -> Iterator[None]:
    """Run with pynvml's module state (library, function-pointer cache, refcount) emptied, and
    put it back afterwards: NvmlSource installs the double as pynvml's library, and other
    tests must not see it."""
    saved_lib = pynvml.nvmlLib
    saved_cache = dict(pynvml._nvmlGetFunctionPointer_cache)
    saved_refcount = pynvml._nvmlLib_refcount
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield
    finally:
        pynvml.nvmlLib = saved_lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved_cache)
        pynvml._nvmlLib_refcount = saved_refcount
