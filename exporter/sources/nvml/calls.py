"""The one way NVML is called: typed wrappers over pynvml and what their errors mean.

Every NVML call of the source goes through :func:`read`, which turns an NVML error into an
outcome: ``None`` for a value the device does not give (NOT_SUPPORTED, NO_PERMISSION, a symbol
the driver lacks), or :class:`NvmlFault` classified as a lost device, a failing device or a dead
driver. The thin accessors below name the NVML C function each one calls and return values in
NVML's units; :func:`ratio`, :func:`watts`, :func:`joules` and :func:`hertz` are the only place
those units become base units. pynvml has no type hints, so ``Any`` stays in this module.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from enum import Enum
from typing import Any, ParamSpec, TypeVar

import pynvml

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")

# ---------------------------------------------------------------------------------------------
# Unit conversion: the one place NVML units become base units.


def ratio(percent: float) -> float:
    """Percent (NVML utilization, fan speed) -> ratio 0..1."""
    return percent / 100


def watts(milliwatts: int) -> float:
    return milliwatts / 1000


def joules(millijoules: int) -> float:
    return millijoules / 1000


def hertz(megahertz: int) -> float:
    return megahertz * 1_000_000.0


# ---------------------------------------------------------------------------------------------
# Error classification: every NVML call goes through read, which decides what an error means.


class Fault(Enum):
    LOST = "lost"  # the device is gone (GPU_IS_LOST): it is down until it answers again
    FAILED = "failed"  # any other error on a device: treat the device as failing
    DRIVER = "driver"  # NVML itself is gone: shut down and initialise again


class NvmlFault(Exception):
    """An NVML error that is not just "this value is not available"."""

    def __init__(self, fault: Fault, error: BaseException) -> None:
        super().__init__(f"{fault.value}: {error!r}")
        self.fault = fault
        self.error = error


# Errors that only mean the value is not available here: the series is absent.
_ABSENT_ERRORS: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_NoPermission,
    pynvml.NVMLError_FunctionNotFound,  # an older driver without this entry point
)
# Errors that mean the library or driver is unusable (not initialised, unloaded, or replaced
# by a different version under us); nothing on any device can work until NVML is re-initialised.
_DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_Uninitialized,
    pynvml.NVMLError_DriverNotLoaded,
    pynvml.NVMLError_LibraryNotFound,
    pynvml.NVMLError_LibRmVersionMismatch,
)
_LOST_ERRORS: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_GpuIsLost,
    pynvml.NVMLError_ResetRequired,
)


def read(fn: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs) -> _R | None:
    """Call one NVML accessor. Returns ``None`` when the value is not available on this device
    (NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND) and raises :class:`NvmlFault` for
    every other NVML error, classified as a lost device, a failing device or a dead driver."""
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as exc:
        if isinstance(exc, _ABSENT_ERRORS):
            return None
        if isinstance(exc, _DRIVER_ERRORS):
            raise NvmlFault(Fault.DRIVER, exc) from exc
        if isinstance(exc, _LOST_ERRORS):
            raise NvmlFault(Fault.LOST, exc) from exc
        raise NvmlFault(Fault.FAILED, exc) from exc


# ---------------------------------------------------------------------------------------------
# Typed accessors: thin wrappers over pynvml (which has no type hints), so Any stays here.
# Values are in NVML's units; the NVML C function each one calls is named in its docstring.


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def handle_key(handle: object) -> int:
    """The pointer value of an opaque NVML handle. pynvml builds a new ctypes object for every
    handle it returns (event data included), so handles are compared by address."""
    value: Any = handle
    return ctypes.cast(value, ctypes.c_void_p).value or 0


def driver_version() -> str:
    """nvmlSystemGetDriverVersion, e.g. ``"550.54.15"``."""
    return _text(pynvml.nvmlSystemGetDriverVersion())


def device_count() -> int:
    """nvmlDeviceGetCount_v2: physical GPUs (MIG slices are not counted)."""
    return int(pynvml.nvmlDeviceGetCount())


def device_handle(index: int) -> object:
    """nvmlDeviceGetHandleByIndex_v2."""
    handle: object = pynvml.nvmlDeviceGetHandleByIndex(index)
    return handle


def uuid(handle: object) -> str:
    """nvmlDeviceGetUUID: ``GPU-…`` for a GPU, ``MIG-…`` for a MIG slice."""
    return _text(pynvml.nvmlDeviceGetUUID(handle))


def name(handle: object) -> str:
    """nvmlDeviceGetName, e.g. ``"NVIDIA A100-SXM4-80GB"`` (``"… MIG 1g.10gb"`` for a slice)."""
    return _text(pynvml.nvmlDeviceGetName(handle))


def pci_bus_id(handle: object) -> str:
    """nvmlDeviceGetPciInfo_v3().busId, e.g. ``"00000000:10:00.0"``."""
    return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)


def minor_number(handle: object) -> int:
    """nvmlDeviceGetMinorNumber: the ``N`` of the GPU's ``/dev/nvidia<N>``."""
    return int(pynvml.nvmlDeviceGetMinorNumber(handle))


def architecture(handle: object) -> int:
    """nvmlDeviceGetArchitecture: an ``NVML_DEVICE_ARCH_*`` value."""
    return int(pynvml.nvmlDeviceGetArchitecture(handle))


def mig_enabled(handle: object) -> bool:
    """nvmlDeviceGetMigMode: whether MIG mode is currently on (the pending mode is ignored)."""
    current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def max_mig_devices(handle: object) -> int:
    """nvmlDeviceGetMaxMigDeviceCount: number of MIG slots (some may be empty)."""
    return int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))


def mig_handle(handle: object, slot: int) -> object | None:
    """nvmlDeviceGetMigDeviceHandleByIndex; ``None`` for an empty slot (NOT_FOUND)."""
    try:
        mig: object = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
    except pynvml.NVMLError_NotFound:
        return None
    return mig


def gpu_instance_id(handle: object) -> int:
    """nvmlDeviceGetGpuInstanceId of a MIG device handle."""
    return int(pynvml.nvmlDeviceGetGpuInstanceId(handle))


def utilization(handle: object) -> tuple[int, int]:
    """nvmlDeviceGetUtilizationRates: (gpu, memory) in percent of the last sample period."""
    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
    return int(rates.gpu), int(rates.memory)


# nvmlDeviceGetMemoryInfo_v2, else v1: which one a device answers, learnt once.

# v2 errors that only mean "ask v1 instead": a driver older than R510 lacks the symbol
# (FUNCTION_NOT_FOUND), or knows another version of the struct (ARGUMENT_VERSION_MISMATCH),
# both for all its devices; a device that does not answer v2 says NOT_SUPPORTED.
_MEMORY_V2_ABSENT: tuple[type[BaseException], ...] = (
    pynvml.NVMLError_FunctionNotFound,
    pynvml.NVMLError_ArgumentVersionMismatch,
)
_MEMORY_V2_UNSUPPORTED: tuple[type[BaseException], ...] = (pynvml.NVMLError_NotSupported,)


_memory_versions_unset = object()


class _MemoryVersions:
    """What :func:`memory` has learnt about ``nvmlDeviceGetMemoryInfo_v2`` in the library
    pynvml uses now (``pynvml.nvmlLib``): the struct version to ask for (``None`` where the
    pynvml binding has no ``nvmlMemory_v2``, or the library lacks v2: then every device is
    read with v1), and the devices (handle keys) that answer v2 NOT_SUPPORTED. Forgotten when
    another library is installed, so that a new driver is asked again; kept across
    nvmlShutdown/nvmlInit of the same library (its symbols, and the handles, stay the same)."""

    def __init__(self) -> None:
        self.library: object = _memory_versions_unset  # nothing learnt yet
        self.version: int | None = None
        self.v1_devices: set[int] = set()

    def v2_version(self, handle: object) -> int | None:
        """The ``nvmlMemory_v2`` version to ask ``handle`` for, or ``None``: ask v1."""
        library = pynvml.nvmlLib
        if library is not self.library:
            self.library = library
            version = getattr(pynvml, "nvmlMemory_v2", None)
            self.version = None if version is None else int(version)
            self.v1_devices = set()
            if version is None:
                log.info(
                    "this pynvml has no nvmlMemory_v2: reading memory with "
                    "nvmlDeviceGetMemoryInfo (v1), whose used counts the driver's reserved memory"
                )
        if self.version is None or handle_key(handle) in self.v1_devices:
            return None
        return self.version

    def without_v2(self, handle: object, error: BaseException) -> None:
        """Remember that v2 failed with ``error`` (one of the fallback errors), for good."""
        if isinstance(error, _MEMORY_V2_ABSENT):
            self.version = None
            where = "this NVML library"
        else:
            self.v1_devices.add(handle_key(handle))
            where = "one device"
        log.info(
            "nvmlDeviceGetMemoryInfo_v2 unavailable on %s (%s): reading its memory with "
            "nvmlDeviceGetMemoryInfo (v1), whose used counts the driver's reserved memory",
            where, describe(error),
        )


_memory_versions = _MemoryVersions()


def memory(handle: object) -> tuple[int, int]:
    """nvmlDeviceGetMemoryInfo_v2 (``nvmlMemory_v2_t``): (used, total) in bytes; falls back
    to nvmlDeviceGetMemoryInfo (v1) where v2 is not there.

    v2's ``used`` is what nvidia-smi shows as memory.used (it calls v2 since R510): memory
    allocated by processes and contexts, without ``reserved``, what the driver sets aside for
    itself at load (615 MiB on an H200 with driver 580.159), which nothing a user runs can
    use or free. v1's ``used`` is ``total - free``, reserved memory included: an idle H200
    showed 615 MiB used where nvidia-smi said 0. ``total`` is the same in both.

    A library without v2 (FUNCTION_NOT_FOUND: drivers before R510; ARGUMENT_VERSION_MISMATCH;
    a pynvml without ``nvmlMemory_v2``) is read with v1 from then on; so is a device that
    answers v2 NOT_SUPPORTED: v2 is asked once, not every round. A device that answers v1
    NOT_SUPPORTED too has no memory readings (``None`` through :func:`read`)."""
    version = _memory_versions.v2_version(handle)
    if version is not None:
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except (*_MEMORY_V2_ABSENT, *_MEMORY_V2_UNSUPPORTED) as exc:
            _memory_versions.without_v2(handle, exc)
        else:
            return int(info.used), int(info.total)
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.used), int(info.total)


def temperature(handle: object) -> int:
    """nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU): °C."""
    return int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))


def power(handle: object) -> int:
    """nvmlDeviceGetPowerUsage: milliwatts."""
    return int(pynvml.nvmlDeviceGetPowerUsage(handle))


def power_limit(handle: object) -> int:
    """nvmlDeviceGetEnforcedPowerLimit: milliwatts."""
    return int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))


def energy(handle: object) -> int:
    """nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver was loaded."""
    return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))


def clock(handle: object, clock_type: int) -> int:
    """nvmlDeviceGetClockInfo: current clock in MHz."""
    return int(pynvml.nvmlDeviceGetClockInfo(handle, clock_type))


def fan_speed(handle: object) -> int:
    """nvmlDeviceGetFanSpeed: percent of the maximum."""
    return int(pynvml.nvmlDeviceGetFanSpeed(handle))


def ecc_errors(handle: object, error_type: int) -> int:
    """nvmlDeviceGetTotalEccErrors(type, NVML_VOLATILE_ECC): errors since the driver loaded."""
    return int(pynvml.nvmlDeviceGetTotalEccErrors(handle, error_type, pynvml.NVML_VOLATILE_ECC))


def remapped_rows(handle: object) -> tuple[int, int, bool, bool]:
    """nvmlDeviceGetRemappedRows: (rows remapped for correctable errors, rows remapped for
    uncorrectable errors, a remap pending until the GPU is reset, a remap failed); the
    counts are kept by the GPU (InfoROM) for its whole life."""
    corr, unc, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
    return int(corr), int(unc), bool(pending), bool(failed)


class _ProcessInfo(ctypes.Structure):
    """``nvmlProcessInfo_t`` of nvml.h, the element of the ``_v3`` and ``_v2`` process lists
    (the two versions share this layout; pynvml's own class for it is named differently
    across nvidia-ml-py releases)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


_NOT_AVAILABLE_ULL = ctypes.c_ulonglong(-1).value  # NVML_VALUE_NOT_AVAILABLE as unsigned
Processes = list[tuple[int, int | None]]  # (host PID, used bytes or None)


def _running_processes(function: str, handle: object) -> Processes:
    """nvmlDeviceGet{Compute,Graphics}RunningProcesses_v{3,2}: (host PID, used bytes), the
    bytes ``None`` where NVML cannot tell (NVML_VALUE_NOT_AVAILABLE).

    The calls pynvml's functions make, in the same order (a size query, then the list with
    room for twice as many plus 5; errors raised as pynvml's ``NVMLError`` subclasses), but
    reading the two fields straight from the C structs: pynvml turns every entry into a
    "friendly object" through per-field Python hooks, 1.5 ms per round at 512 processes
    against 0.2 ms. Only these two process-list calls bypass pynvml's wrappers.
    """
    fn = pynvml._nvmlGetFunctionPointer(function)
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == pynvml.NVML_SUCCESS:
        return []  # no processes
    if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        raise pynvml.NVMLError(ret)
    count.value = count.value * 2 + 5  # room for processes started in between
    infos = (_ProcessInfo * count.value)()
    pynvml._nvmlCheckReturn(fn(handle, ctypes.byref(count), infos))
    return [
        (p.pid, None if p.usedGpuMemory == _NOT_AVAILABLE_ULL else p.usedGpuMemory)
        for p in infos[: count.value]
    ]


def _running_processes_v3(function: str, handle: object) -> Processes:
    """:func:`_running_processes` for a ``_v3`` call, which a driver older than the pynvml
    binding lacks: raised as ``NVMLLibraryMismatchError``, like pynvml's unversioned
    ``nvmlDeviceGet*RunningProcesses`` (which call ``_v3``) do."""
    try:
        return _running_processes(function, handle)
    except pynvml.NVMLError_FunctionNotFound as exc:
        raise pynvml.NVMLLibraryMismatchError(f"{function} not found in the NVML library") from exc


def compute_processes(handle: object) -> Processes:
    """nvmlDeviceGetComputeRunningProcesses_v3."""
    return _running_processes_v3("nvmlDeviceGetComputeRunningProcesses_v3", handle)


def graphics_processes(handle: object) -> Processes:
    """nvmlDeviceGetGraphicsRunningProcesses_v3."""
    return _running_processes_v3("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)


def compute_processes_v2(handle: object) -> Processes:
    """nvmlDeviceGetComputeRunningProcesses_v2."""
    return _running_processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)


def graphics_processes_v2(handle: object) -> Processes:
    """nvmlDeviceGetGraphicsRunningProcesses_v2."""
    return _running_processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle)


# pynvml's structs hook every attribute read in Python (to decode bytes fields); these fields
# are integers, so they are read with the plain ctypes lookup: 0.15 ms instead of 0.55 ms per
# round at 512 samples.
field = object.__getattribute__


def process_utilization(handle: object, last_seen_us: int) -> list[tuple[int, int, int]]:
    """nvmlDeviceGetProcessUtilization: (pid, timeStamp µs, smUtil %) for every sample newer
    than ``last_seen_us``; empty when there is none (NVML answers NOT_FOUND)."""
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us)
    except pynvml.NVMLError_NotFound:
        return []
    return [
        (int(field(s, "pid")), int(field(s, "timeStamp")), int(field(s, "smUtil")))
        for s in samples
    ]


# --- work signals: utilization samples, throttle time, GPM


def _union_value(value_type: int, value: Any) -> float:
    """The member of an ``nvmlValue_t`` union that ``value_type`` (``NVML_VALUE_TYPE_*``) names."""
    member = _VALUE_MEMBERS.get(value_type, "ullVal")
    return float(field(value, member))


_VALUE_MEMBERS: dict[int, str] = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def utilization_samples(handle: object, last_seen_us: int) -> list[tuple[int, float]]:
    """nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES): (timeStamp µs, GPU utilization %)
    of every sample newer than ``last_seen_us``, oldest first; empty when there is none (NVML
    answers NOT_FOUND)."""
    try:
        value_type, samples = pynvml.nvmlDeviceGetSamples(
            handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, last_seen_us
        )
    except pynvml.NVMLError_NotFound:
        return []
    kind = int(value_type)
    result = [
        (int(field(s, "timeStamp")), _union_value(kind, field(s, "sampleValue")))
        for s in samples
    ]
    result.sort(key=lambda sample: sample[0])
    return result


def field_values(handle: object, field_ids: tuple[int, ...]) -> list[float | None]:
    """nvmlDeviceGetFieldValues: each field's value, in the order asked, or ``None`` where
    that field's own ``nvmlReturn`` is not SUCCESS (a field this driver or GPU lacks)."""
    values = pynvml.nvmlDeviceGetFieldValues(handle, list(field_ids))
    result: list[float | None] = []
    for v in values:
        if int(field(v, "nvmlReturn")) != pynvml.NVML_SUCCESS:
            result.append(None)
        else:
            result.append(_union_value(int(field(v, "valueType")), field(v, "value")))
    return result


def violation_time(handle: object, policy: int) -> int:
    """nvmlDeviceGetViolationStatus(NVML_PERF_POLICY_*).violationTime: nanoseconds the policy
    held the clocks down since the driver loaded (deprecated in favour of the field values)."""
    return int(field(pynvml.nvmlDeviceGetViolationStatus(handle, policy), "violationTime"))


def gpm_supported(handle: object) -> bool:
    """nvmlGpmQueryDeviceSupport (``nvmlGpmSupport_t`` version 1).isSupportedDevice."""
    return bool(field(pynvml.nvmlGpmQueryDeviceSupport(handle), "isSupportedDevice"))


def gpm_sample_alloc() -> object:
    """nvmlGpmSampleAlloc: an opaque GPM sample buffer (free it with :func:`gpm_sample_free`)."""
    sample: object = pynvml.nvmlGpmSampleAlloc()
    return sample


def gpm_sample_free(sample: object) -> None:
    """nvmlGpmSampleFree."""
    pynvml.nvmlGpmSampleFree(sample)


def gpm_sample_get(handle: object, sample: object) -> bool:
    """nvmlGpmSampleGet: read the GPU's GPM counters into ``sample``; True once done."""
    pynvml.nvmlGpmSampleGet(handle, sample)
    return True


def gpm_mig_sample_get(handle: object, gpu_instance_id: int, sample: object) -> bool:
    """nvmlGpmMigSampleGet: read one MIG GPU instance's GPM counters into ``sample``
    (``handle`` is the parent GPU's); True once done."""
    pynvml.nvmlGpmMigSampleGet(handle, gpu_instance_id, sample)
    return True


def gpm_metrics_request(metric_ids: tuple[int, ...]) -> Any:
    """A ``nvmlGpmMetricsGet_t`` (pynvml's ``c_nvmlGpmMetricsGet_t``, version
    ``NVML_GPM_METRICS_GET_VERSION``) asking for ``metric_ids``; reused for every call."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(metric_ids)
    for i, metric_id in enumerate(metric_ids):
        request.metrics[i].metricId = metric_id
    return request


def gpm_metrics_get(request: Any, sample1: object, sample2: object) -> dict[int, float]:
    """nvmlGpmMetricsGet between two samples: each metric's mean over the interval, by metric
    id, for the metrics whose own ``nvmlReturn`` is SUCCESS (the others are left out)."""
    request.sample1 = sample1
    request.sample2 = sample2
    pynvml.nvmlGpmMetricsGet(request)
    result: dict[int, float] = {}
    metrics = field(request, "metrics")
    for i in range(int(field(request, "numMetrics"))):
        m = metrics[i]
        if int(field(m, "nvmlReturn")) == pynvml.NVML_SUCCESS:
            result[int(field(m, "metricId"))] = float(field(m, "value"))
    return result


def event_set_create() -> object:
    """nvmlEventSetCreate."""
    event_set: object = pynvml.nvmlEventSetCreate()
    return event_set


def register_xid_events(handle: object, event_set: object) -> bool:
    """nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError); True once registered."""
    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    return True


def wait_xid(event_set: object, timeout_ms: int) -> tuple[object, int, int] | None:
    """nvmlEventSetWait_v2: (device handle, XID code, GPU instance id) of the next XID event,
    or ``None`` when none arrived within the timeout (or the event is of another type)."""
    try:
        data = pynvml.nvmlEventSetWait_v2(event_set, timeout_ms)
    except pynvml.NVMLError_Timeout:
        return None
    if int(data.eventType) != pynvml.nvmlEventTypeXidCriticalError:
        return None
    device: object = data.device
    return device, int(data.eventData), int(data.gpuInstanceId)


def event_set_free(event_set: object) -> None:
    """nvmlEventSetFree."""
    pynvml.nvmlEventSetFree(event_set)


def init() -> None:
    """nvmlInit (nvmlInitWithFlags(0)); loads libnvidia-ml.so.1 unless already loaded."""
    pynvml.nvmlInit()


def shutdown() -> None:
    """nvmlShutdown."""
    pynvml.nvmlShutdown()


def install_library(library: object) -> None:
    """Make pynvml use ``library`` as libnvidia-ml (pynvml has no setting for its path)."""
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is not library:
            pynvml.nvmlLib = library
            # Function pointers looked up in another library object must not be reused.
            pynvml._nvmlGetFunctionPointer_cache.clear()



def quietly(fn: Callable[_P, object], /, *args: _P.args, **kwargs: _P.kwargs) -> None:
    """Call an NVML cleanup function, ignoring NVML errors (the driver may already be gone)."""
    try:
        fn(*args, **kwargs)
    except pynvml.NVMLError as exc:
        log.debug("%s failed during cleanup: %s", getattr(fn, "__name__", fn), exc)


def describe(exc: BaseException | None) -> str:
    if isinstance(exc, NvmlFault):
        exc = exc.error
    if exc is None:
        return "unknown error"
    return f"{type(exc).__name__}: {exc}"
