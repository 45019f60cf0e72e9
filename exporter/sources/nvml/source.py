"""The NVML source: every GPU, MIG slice and GPU process on this node, read through pynvml.

NVML is initialised once and device handles are cached; each :meth:`NvmlSource.sample` reads
the current values and converts them to base units (see the ``_ratio``/``_watts``/... helpers,
the only place units change). Faults never escape ``sample()``:

* a value the device does not report (``NOT_SUPPORTED``, ``NO_PERMISSION``, a symbol the
  driver lacks) is ``None``, and its series is absent;
* a device that fails (``GPU_IS_LOST``, ``UNKNOWN``, any other NVML error) is ``up=False``
  with every measurement ``None``, while the other devices keep reporting; it is asked again
  every round and comes back by itself;
* a missing library or driver (at start, or unloaded mid-run) makes the whole source
  ``source_up=False``; NVML is shut down and initialised again with exponential backoff.

XID critical errors arrive as NVML events, waited for in a daemon thread of their own and
counted per (device, XID code) for as long as the source lives.
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, ParamSpec, TypeVar

import pynvml

from gpuscope.exporter.model import (
    DeviceSample,
    PartResult,
    ProcessKind,
    ProcessSample,
    Snapshot,
    XidCount,
)

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")

# How far back the per-process utilization cursor starts: the driver keeps a buffer of older
# samples, which belong to before the exporter started and must not be counted.
_UTIL_LOOKBACK_SECONDS = 1.0
# gpuInstanceId of an event that belongs to no MIG instance.
_NO_GPU_INSTANCE = 0xFFFFFFFF
# After an unexpected event-wait error, pause before waiting again so the thread never spins.
_XID_ERROR_PAUSE_SECONDS = 1.0
# XID events logged one by one per window; beyond that (an XID storm can be thousands a
# second) they are only counted, and one line per window sums up what was not logged.
_XID_LOG_BURST = 10
_XID_LOG_WINDOW_SECONDS = 60.0

# NVML architecture enum -> the name nvidia-smi prints (the CloudWatch ``arch`` dimension).
_ARCHITECTURES: dict[int, str] = {
    pynvml.NVML_DEVICE_ARCH_KEPLER: "Kepler",
    pynvml.NVML_DEVICE_ARCH_MAXWELL: "Maxwell",
    pynvml.NVML_DEVICE_ARCH_PASCAL: "Pascal",
    pynvml.NVML_DEVICE_ARCH_VOLTA: "Volta",
    pynvml.NVML_DEVICE_ARCH_TURING: "Turing",
    pynvml.NVML_DEVICE_ARCH_AMPERE: "Ampere",
    pynvml.NVML_DEVICE_ARCH_ADA: "Ada Lovelace",
    pynvml.NVML_DEVICE_ARCH_HOPPER: "Hopper",
    pynvml.NVML_DEVICE_ARCH_BLACKWELL: "Blackwell",
}

# "NVIDIA A100-SXM4-80GB MIG 1g.10gb" -> "1g.10gb" (also "1g.10gb+me", "1c.3g.40gb").
_MIG_PROFILE = re.compile(r"\bMIG\s+(\S+)\s*$")


# ---------------------------------------------------------------------------------------------
# Unit conversion: the one place NVML units become base units.


def _ratio(percent: float) -> float:
    """Percent (NVML utilization, fan speed) -> ratio 0..1."""
    return percent / 100


def _watts(milliwatts: int) -> float:
    return milliwatts / 1000


def _joules(millijoules: int) -> float:
    return millijoules / 1000


def _hertz(megahertz: int) -> float:
    return megahertz * 1_000_000.0


# ---------------------------------------------------------------------------------------------
# Error classification: every NVML call goes through _read, which decides what an error means.


class _Fault(Enum):
    LOST = "lost"  # the device is gone (GPU_IS_LOST): it is down until it answers again
    FAILED = "failed"  # any other error on a device: treat the device as failing
    DRIVER = "driver"  # NVML itself is gone: shut down and initialise again


class _NvmlFault(Exception):
    """An NVML error that is not just "this value is not available"."""

    def __init__(self, fault: _Fault, error: BaseException) -> None:
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


def _read(fn: Callable[_P, _R], /, *args: _P.args, **kwargs: _P.kwargs) -> _R | None:
    """Call one NVML accessor. Returns ``None`` when the value is not available on this device
    (NOT_SUPPORTED, NO_PERMISSION, FUNCTION_NOT_FOUND) and raises :class:`_NvmlFault` for
    every other NVML error, classified as a lost device, a failing device or a dead driver."""
    try:
        return fn(*args, **kwargs)
    except pynvml.NVMLError as exc:
        if isinstance(exc, _ABSENT_ERRORS):
            return None
        if isinstance(exc, _DRIVER_ERRORS):
            raise _NvmlFault(_Fault.DRIVER, exc) from exc
        if isinstance(exc, _LOST_ERRORS):
            raise _NvmlFault(_Fault.LOST, exc) from exc
        raise _NvmlFault(_Fault.FAILED, exc) from exc


# ---------------------------------------------------------------------------------------------
# Typed accessors: thin wrappers over pynvml (which has no type hints), so Any stays here.
# Values are in NVML's units; the NVML C function each one calls is named in its docstring.


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _handle_key(handle: object) -> int:
    """The pointer value of an opaque NVML handle. pynvml builds a new ctypes object for every
    handle it returns (event data included), so handles are compared by address."""
    value: Any = handle
    return ctypes.cast(value, ctypes.c_void_p).value or 0


def _driver_version() -> str:
    """nvmlSystemGetDriverVersion, e.g. ``"550.54.15"``."""
    return _text(pynvml.nvmlSystemGetDriverVersion())


def _device_count() -> int:
    """nvmlDeviceGetCount_v2: physical GPUs (MIG slices are not counted)."""
    return int(pynvml.nvmlDeviceGetCount())


def _device_handle(index: int) -> object:
    """nvmlDeviceGetHandleByIndex_v2."""
    handle: object = pynvml.nvmlDeviceGetHandleByIndex(index)
    return handle


def _uuid(handle: object) -> str:
    """nvmlDeviceGetUUID: ``GPU-…`` for a GPU, ``MIG-…`` for a MIG slice."""
    return _text(pynvml.nvmlDeviceGetUUID(handle))


def _name(handle: object) -> str:
    """nvmlDeviceGetName, e.g. ``"NVIDIA A100-SXM4-80GB"`` (``"… MIG 1g.10gb"`` for a slice)."""
    return _text(pynvml.nvmlDeviceGetName(handle))


def _pci_bus_id(handle: object) -> str:
    """nvmlDeviceGetPciInfo_v3().busId, e.g. ``"00000000:10:00.0"``."""
    return _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)


def _architecture(handle: object) -> int:
    """nvmlDeviceGetArchitecture: an ``NVML_DEVICE_ARCH_*`` value."""
    return int(pynvml.nvmlDeviceGetArchitecture(handle))


def _mig_enabled(handle: object) -> bool:
    """nvmlDeviceGetMigMode: whether MIG mode is currently on (the pending mode is ignored)."""
    current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _max_mig_devices(handle: object) -> int:
    """nvmlDeviceGetMaxMigDeviceCount: number of MIG slots (some may be empty)."""
    return int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))


def _mig_handle(handle: object, slot: int) -> object | None:
    """nvmlDeviceGetMigDeviceHandleByIndex; ``None`` for an empty slot (NOT_FOUND)."""
    try:
        mig: object = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
    except pynvml.NVMLError_NotFound:
        return None
    return mig


def _gpu_instance_id(handle: object) -> int:
    """nvmlDeviceGetGpuInstanceId of a MIG device handle."""
    return int(pynvml.nvmlDeviceGetGpuInstanceId(handle))


def _utilization(handle: object) -> tuple[int, int]:
    """nvmlDeviceGetUtilizationRates: (gpu, memory) in percent of the last sample period."""
    rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
    return int(rates.gpu), int(rates.memory)


def _memory(handle: object) -> tuple[int, int]:
    """nvmlDeviceGetMemoryInfo: (used, total) in bytes."""
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.used), int(info.total)


def _temperature(handle: object) -> int:
    """nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU): °C."""
    return int(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))


def _power(handle: object) -> int:
    """nvmlDeviceGetPowerUsage: milliwatts."""
    return int(pynvml.nvmlDeviceGetPowerUsage(handle))


def _power_limit(handle: object) -> int:
    """nvmlDeviceGetEnforcedPowerLimit: milliwatts."""
    return int(pynvml.nvmlDeviceGetEnforcedPowerLimit(handle))


def _energy(handle: object) -> int:
    """nvmlDeviceGetTotalEnergyConsumption: millijoules since the driver was loaded."""
    return int(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle))


def _clock(handle: object, clock_type: int) -> int:
    """nvmlDeviceGetClockInfo: current clock in MHz."""
    return int(pynvml.nvmlDeviceGetClockInfo(handle, clock_type))


def _fan_speed(handle: object) -> int:
    """nvmlDeviceGetFanSpeed: percent of the maximum."""
    return int(pynvml.nvmlDeviceGetFanSpeed(handle))


def _ecc_errors(handle: object, error_type: int) -> int:
    """nvmlDeviceGetTotalEccErrors(type, NVML_VOLATILE_ECC): errors since the driver loaded."""
    return int(pynvml.nvmlDeviceGetTotalEccErrors(handle, error_type, pynvml.NVML_VOLATILE_ECC))


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
_Processes = list[tuple[int, int | None]]  # (host PID, used bytes or None)


def _running_processes(function: str, handle: object) -> _Processes:
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


def _running_processes_v3(function: str, handle: object) -> _Processes:
    """:func:`_running_processes` for a ``_v3`` call, which a driver older than the pynvml
    binding lacks: raised as ``NVMLLibraryMismatchError``, like pynvml's unversioned
    ``nvmlDeviceGet*RunningProcesses`` (which call ``_v3``) do."""
    try:
        return _running_processes(function, handle)
    except pynvml.NVMLError_FunctionNotFound as exc:
        raise pynvml.NVMLLibraryMismatchError(f"{function} not found in the NVML library") from exc


def _compute_processes(handle: object) -> _Processes:
    """nvmlDeviceGetComputeRunningProcesses_v3."""
    return _running_processes_v3("nvmlDeviceGetComputeRunningProcesses_v3", handle)


def _graphics_processes(handle: object) -> _Processes:
    """nvmlDeviceGetGraphicsRunningProcesses_v3."""
    return _running_processes_v3("nvmlDeviceGetGraphicsRunningProcesses_v3", handle)


def _compute_processes_v2(handle: object) -> _Processes:
    """nvmlDeviceGetComputeRunningProcesses_v2."""
    return _running_processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)


def _graphics_processes_v2(handle: object) -> _Processes:
    """nvmlDeviceGetGraphicsRunningProcesses_v2."""
    return _running_processes("nvmlDeviceGetGraphicsRunningProcesses_v2", handle)


# pynvml's structs hook every attribute read in Python (to decode bytes fields); these fields
# are integers, so they are read with the plain ctypes lookup: 0.15 ms instead of 0.55 ms per
# round at 512 samples.
_field = object.__getattribute__


def _process_utilization(handle: object, last_seen_us: int) -> list[tuple[int, int, int]]:
    """nvmlDeviceGetProcessUtilization: (pid, timeStamp µs, smUtil %) for every sample newer
    than ``last_seen_us``; empty when there is none (NVML answers NOT_FOUND)."""
    try:
        samples = pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen_us)
    except pynvml.NVMLError_NotFound:
        return []
    return [
        (int(_field(s, "pid")), int(_field(s, "timeStamp")), int(_field(s, "smUtil")))
        for s in samples
    ]


def _event_set_create() -> object:
    """nvmlEventSetCreate."""
    event_set: object = pynvml.nvmlEventSetCreate()
    return event_set


def _register_xid_events(handle: object, event_set: object) -> bool:
    """nvmlDeviceRegisterEvents(nvmlEventTypeXidCriticalError); True once registered."""
    pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
    return True


def _wait_xid(event_set: object, timeout_ms: int) -> tuple[object, int, int] | None:
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


def _event_set_free(event_set: object) -> None:
    """nvmlEventSetFree."""
    pynvml.nvmlEventSetFree(event_set)


def _init() -> None:
    """nvmlInit (nvmlInitWithFlags(0)); loads libnvidia-ml.so.1 unless already loaded."""
    pynvml.nvmlInit()


def _shutdown() -> None:
    """nvmlShutdown."""
    pynvml.nvmlShutdown()


def _install_library(library: object) -> None:
    """Make pynvml use ``library`` as libnvidia-ml (pynvml has no setting for its path)."""
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is not library:
            pynvml.nvmlLib = library
            # Function pointers looked up in another library object must not be reused.
            pynvml._nvmlGetFunctionPointer_cache.clear()


# ---------------------------------------------------------------------------------------------
# Per-session state


@dataclass(eq=False, slots=True)
class _Device:
    """One GPU or MIG slice as found at init: handle and static facts, read once, plus the
    per-process utilization cursor (µs, NVML's ``lastSeenTimeStamp``)."""

    index: str
    nvml_index: int
    handle: object | None = None
    key: int = 0
    uuid: str = ""
    model: str = ""
    pci_bus_id: str = ""
    architecture: str | None = None
    parent: _Device | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    mig_enabled: bool = False
    slices: list[_Device] = field(default_factory=list)
    identified: bool = False
    up: bool = True
    process_utilization_supported: bool = True
    util_cursor_us: int = 0


class _XidCounts:
    """XID events per (device UUID, XID code) since the source was created. Written by the
    event thread, read by the sampler thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int], int] = {}

    def add(self, uuid: str, xid: int) -> None:
        with self._lock:
            self._counts[(uuid, xid)] = self._counts.get((uuid, xid), 0) + 1

    def by_device(self) -> dict[str, tuple[XidCount, ...]]:
        with self._lock:
            items = sorted(self._counts.items())
        grouped: dict[str, list[XidCount]] = {}
        for (uuid, xid), count in items:
            grouped.setdefault(uuid, []).append(XidCount(xid=xid, count=count))
        return {uuid: tuple(counts) for uuid, counts in grouped.items()}


class _XidWatcher:
    """Waits for XID critical-error events on one NVML event set in a daemon thread.

    An event names the physical GPU's handle and, under MIG, the GPU instance it hit; it is
    counted for that MIG slice when the instance is known, else for the GPU.
    """

    def __init__(
        self,
        event_set: object,
        gpus: dict[int, str],
        mig_slices: dict[tuple[int, int], str],
        counts: _XidCounts,
        wait_timeout_ms: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.event_set = event_set
        self._gpus = gpus
        self._mig_slices = mig_slices
        self._counts = counts
        self._wait_timeout_ms = wait_timeout_ms
        self._log = _XidLog(monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpuscope-nvml-xid", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float) -> bool:
        """Ask the thread to stop and wait for it; True when it has ended."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        failing = False  # log the first of a run of failures only
        while not self._stop.is_set():
            try:
                event = _read(_wait_xid, self.event_set, self._wait_timeout_ms)
            except _NvmlFault as fault:
                if fault.fault is _Fault.DRIVER:
                    # The sampler notices too, shuts NVML down and starts a new watcher.
                    log.warning("XID event thread stopping: %s", fault.error)
                    return
                if not failing:
                    log.warning("waiting for XID events failed: %s", fault.error)
                failing = True
                self._stop.wait(_XID_ERROR_PAUSE_SECONDS)
                continue
            except Exception:  # a bug must not end XID counting silently
                if not failing:
                    log.exception("XID event thread error")
                failing = True
                self._stop.wait(_XID_ERROR_PAUSE_SECONDS)
                continue
            failing = False
            if event is not None:
                self._count(*event)
            else:
                self._log.flush()  # a quiet moment: sum up a storm that has ended
        self._log.flush(force=True)

    def _count(self, handle: object, xid: int, gpu_instance_id: int) -> None:
        key = _handle_key(handle)
        uuid = self._mig_slices.get((key, gpu_instance_id)) or self._gpus.get(key)
        if uuid is None:
            # A handle we did not enumerate (should not happen): ask NVML who it is.
            try:
                uuid = _read(_uuid, handle)
            except _NvmlFault:
                uuid = None
        if uuid is None:
            self._log.event(xid, None)
            return
        self._counts.add(uuid, xid)
        self._log.event(xid, uuid)


class _XidLog:
    """Logs XID events one by one up to ``_XID_LOG_BURST`` per ``_XID_LOG_WINDOW_SECONDS``;
    the rest of a window are summed up in one line when it ends, so an XID storm (thousands
    of events a second) neither floods the log nor costs the event thread more than
    counting them does. The counts themselves (``gpu_xid_errors_total``) are never limited.
    Used by the event thread only."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._window_start: float | None = None
        self._logged = 0
        self._suppressed: dict[tuple[str, int], int] = {}  # (uuid or "", xid) -> events

    def event(self, xid: int, uuid: str | None) -> None:
        self.flush()
        if self._window_start is None:
            self._window_start = self._monotonic()
        if self._logged < _XID_LOG_BURST:
            self._logged += 1
            if uuid is None:
                log.warning("XID %d on an unknown device, not counted", xid)
            else:
                log.warning("XID %d on %s", xid, uuid)
            return
        key = (uuid or "", xid)
        self._suppressed[key] = self._suppressed.get(key, 0) + 1

    def flush(self, *, force: bool = False) -> None:
        """End the window once it is over (or now, with ``force``), logging the summary of
        the events it did not log one by one."""
        start = self._window_start
        if start is None:
            return
        elapsed = self._monotonic() - start
        if not force and elapsed < _XID_LOG_WINDOW_SECONDS:
            return
        if self._suppressed:
            detail = ", ".join(
                f"XID {xid} on {uuid or 'an unknown device'}: {n}"
                for (uuid, xid), n in sorted(self._suppressed.items())
            )
            log.warning(
                "%d more XID events in %.0f s, not logged one by one (%s)",
                sum(self._suppressed.values()), elapsed, detail,
            )
        self._window_start = None
        self._logged = 0
        self._suppressed = {}


@dataclass(eq=False, slots=True)
class _Session:
    """Everything valid between one nvmlInit and its nvmlShutdown."""

    driver_version: str | None
    devices: list[_Device]
    xid: _XidWatcher | None = None


# ---------------------------------------------------------------------------------------------


class NvmlSource:
    """Samples GPUs, MIG slices and their processes through NVML (pynvml).

    Outside inputs are parameters: ``library_loader`` returns the object to install as
    pynvml's ``nvmlLib`` (it raises ``OSError`` while the library is missing; ``None`` lets
    pynvml open ``libnvidia-ml.so.1`` itself), ``clock`` is wall time in seconds (snapshot
    timestamps, the per-process utilization cursor), ``monotonic`` measures durations and the
    init retry backoff (``retry_initial_seconds``, doubling up to ``retry_max_seconds``).
    ``process_utilization`` turns per-process SM utilization on, ``xid_events`` the XID event
    thread (which waits at most ``xid_wait_timeout_ms`` at a time, so ``close()`` is prompt).

    The constructor never raises for a missing library or driver: it tries to initialise, and
    ``sample()`` keeps trying (with backoff) until NVML answers.

    Each snapshot carries three parts: ``nvml_devices`` (False when any device is down),
    ``nvml_processes`` (False when a process query failed with an unexpected error) and, with
    ``xid_events``, ``xid`` (False unless the event thread is running).
    """

    name = "nvml"

    def __init__(
        self,
        *,
        library_loader: Callable[[], object] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        retry_initial_seconds: float = 1.0,
        retry_max_seconds: float = 60.0,
        process_utilization: bool = True,
        xid_events: bool = True,
        xid_wait_timeout_ms: int = 1000,
    ) -> None:
        self._library_loader = library_loader
        self._library: object | None = None
        self._clock = clock
        self._monotonic = monotonic
        self._retry_initial = retry_initial_seconds
        self._retry_max = retry_max_seconds
        self._retry_delay = retry_initial_seconds
        self._next_init_at = 0.0
        self._process_utilization = process_utilization
        self._xid_events = xid_events
        self._xid_wait_timeout_ms = xid_wait_timeout_ms
        self._xid_counts = _XidCounts()
        # Utilization cursors by device UUID, kept across re-inits so that no sample already
        # counted is counted again after a driver reload.
        self._util_cursors: dict[str, int] = {}
        # The process-list calls to use; switched to _v2 for good when the driver lacks _v3.
        self._process_calls: dict[ProcessKind, Callable[[object], _Processes]] = {}
        self._session: _Session | None = None
        self._closed = False
        self._lock = threading.Lock()
        self._start()

    # --- lifecycle

    def _start(self) -> None:
        """Initialise NVML and enumerate devices; on failure, schedule the next attempt."""
        try:
            self._session = self._open()
        except Exception as exc:  # never raise from here: the exporter must keep serving
            self._session = None
            log.warning(
                "NVML unavailable (%s); retrying in %.0f s", _describe(exc), self._retry_delay
            )
            self._next_init_at = self._monotonic() + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self._retry_max)
            return
        self._retry_delay = self._retry_initial
        log.info(
            "NVML initialised: driver %s, %d devices",
            self._session.driver_version,
            sum(1 + len(d.slices) for d in self._session.devices),
        )

    def _open(self) -> _Session:
        if self._library_loader is not None:
            if self._library is None:
                self._library = self._library_loader()  # OSError while the library is missing
            _install_library(self._library)
        _init()  # NVMLError_LibraryNotFound / _DriverNotLoaded when absent
        try:
            driver_version = _read(_driver_version)
            self._process_calls = {
                "compute": _compute_processes,
                "graphics": _graphics_processes,
            }
            count = _read(_device_count) or 0
            devices = [_Device(index=str(i), nvml_index=i) for i in range(count)]
            for dev in devices:
                self._identify(dev)
            session = _Session(driver_version=driver_version, devices=devices)
            if self._xid_events:
                session.xid = self._watch_xid(devices)
        except BaseException:
            _quietly(_shutdown)
            raise
        return session

    def _identify(self, dev: _Device) -> None:
        """Read a GPU's handle, static facts and MIG slices (once; again next round when the GPU
        is lost meanwhile). Device faults leave ``identified`` False; driver faults propagate."""
        try:
            if dev.handle is None:
                dev.handle = _read(_device_handle, dev.nvml_index)
                if dev.handle is None:
                    return
                dev.key = _handle_key(dev.handle)
            dev.uuid = _read(_uuid, dev.handle) or ""
            dev.model = _read(_name, dev.handle) or ""
            dev.pci_bus_id = _read(_pci_bus_id, dev.handle) or ""
            arch = _read(_architecture, dev.handle)
            dev.architecture = None if arch is None else _ARCHITECTURES.get(arch)
            dev.mig_enabled = bool(_read(_mig_enabled, dev.handle))
            dev.slices = self._mig_slices(dev) if dev.mig_enabled else []
        except _NvmlFault as fault:
            if fault.fault is _Fault.DRIVER:
                raise
            self._mark(dev, up=False, why=fault.error)
            return
        dev.identified = True
        self._start_cursor(dev)

    def _mig_slices(self, gpu: _Device) -> list[_Device]:
        slices: list[_Device] = []
        for slot in range(_read(_max_mig_devices, gpu.handle) or 0):
            handle = _read(_mig_handle, gpu.handle, slot)
            if handle is None:
                continue
            name = _read(_name, handle) or ""
            match = _MIG_PROFILE.search(name)
            gi = _read(_gpu_instance_id, handle)
            mig = _Device(
                index=f"{gpu.index}/{gi if gi is not None else slot}",
                nvml_index=gpu.nvml_index,
                handle=handle,
                key=_handle_key(handle),
                uuid=_read(_uuid, handle) or "",
                # The slice is of the parent's model; its size is in mig_profile.
                model=gpu.model,
                pci_bus_id=gpu.pci_bus_id,
                architecture=gpu.architecture,
                parent=gpu,
                mig_profile=match.group(1) if match else None,
                gpu_instance_id=gi,
                identified=True,
            )
            self._start_cursor(mig)
            slices.append(mig)
        return slices

    def _start_cursor(self, dev: _Device) -> None:
        start = int((self._clock() - _UTIL_LOOKBACK_SECONDS) * 1_000_000)
        dev.util_cursor_us = max(self._util_cursors.get(dev.uuid, 0), start)

    def _watch_xid(self, devices: list[_Device]) -> _XidWatcher | None:
        """Register every GPU for XID events on one event set and start the waiting thread.
        A GPU that cannot register (NOT_SUPPORTED, lost, ...) is skipped."""
        event_set = _read(_event_set_create)
        if event_set is None:
            log.warning("XID events not supported on this node")
            return None
        gpus: dict[int, str] = {}
        mig_slices: dict[tuple[int, int], str] = {}
        for dev in devices:
            if not dev.identified:
                continue
            try:
                registered = _read(_register_xid_events, dev.handle, event_set)
            except _NvmlFault as fault:
                if fault.fault is _Fault.DRIVER:
                    raise
                registered = False
            if not registered:
                log.warning("GPU %s cannot report XID events; not watching it", dev.uuid)
                continue
            gpus[dev.key] = dev.uuid
            for mig in dev.slices:
                if mig.gpu_instance_id is not None:
                    mig_slices[(dev.key, mig.gpu_instance_id)] = mig.uuid
        if not gpus:
            log.warning("no GPU on this node can report XID events")
            _quietly(_event_set_free, event_set)
            return None
        watcher = _XidWatcher(
            event_set, gpus, mig_slices, self._xid_counts, self._xid_wait_timeout_ms,
            self._monotonic,
        )
        watcher.start()
        return watcher

    def _teardown(self) -> None:
        """Stop the XID thread, free its event set and shut NVML down; errors are ignored
        (this also runs after the driver has gone)."""
        session, self._session = self._session, None
        if session is None:
            return
        for dev in session.devices:
            for d in (dev, *dev.slices):
                if d.uuid:
                    self._util_cursors[d.uuid] = d.util_cursor_us
        if session.xid is not None:
            if session.xid.stop(timeout=self._xid_wait_timeout_ms / 1000 + 1.0):
                _quietly(_event_set_free, session.xid.event_set)
            else:
                # Still inside nvmlEventSetWait: freeing the set under it is not safe.
                log.warning("XID event thread did not stop; leaving its event set")
        _quietly(_shutdown)

    def close(self) -> None:
        """Stop the XID thread and shut NVML down. Safe to call more than once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._teardown()

    # --- sampling

    def sample(self) -> Snapshot:
        """One round: every device's measurements, processes and XID counts, in base units.
        Never raises; NVML faults become ``up=False`` devices or ``source_up=False``."""
        with self._lock:
            if self._closed:
                return Snapshot(timestamp=self._clock(), source_up=False)
            if self._session is None and self._monotonic() >= self._next_init_at:
                self._start()
            session = self._session
            if session is None:
                return self._down_snapshot(0.0)
            started = self._monotonic()
            try:
                return self._sample_session(session)
            except _NvmlFault as fault:
                # Only driver faults reach here: NVML as a whole is gone.
                log.warning("NVML lost (%s); shutting down and re-initialising", fault.error)
            except Exception:
                log.exception("unexpected error while sampling NVML; re-initialising")
            self._teardown()
            self._next_init_at = self._monotonic() + self._retry_delay
            self._retry_delay = min(self._retry_delay * 2, self._retry_max)
            return self._down_snapshot(self._monotonic() - started)

    def _down_snapshot(self, duration: float) -> Snapshot:
        parts = [
            PartResult("nvml_devices", False, duration),
            PartResult("nvml_processes", False, 0.0),
        ]
        if self._xid_events:
            parts.append(PartResult("xid", False, 0.0))
        return Snapshot(timestamp=self._clock(), source_up=False, parts=tuple(parts))

    def _sample_session(self, session: _Session) -> Snapshot:
        xid_started = self._monotonic()
        xids = self._xid_counts.by_device()
        xid_seconds = self._monotonic() - xid_started
        devices: list[DeviceSample] = []
        device_seconds = 0.0
        process_seconds = 0.0
        devices_ok = True
        processes_ok = True
        for gpu in session.devices:
            if not gpu.identified:
                self._identify(gpu)
            for dev in (gpu, *gpu.slices):
                started = self._monotonic()
                sample = self._measure(dev, xids)
                measured = self._monotonic()
                if sample.up and not (dev is gpu and gpu.mig_enabled):
                    # A MIG-enabled GPU lists its slices' processes: they are reported once,
                    # on the slices, where attribution (MIG UUIDs) needs them.
                    try:
                        processes, listed = self._processes(dev)
                        processes_ok = processes_ok and listed
                    except _NvmlFault as fault:
                        if fault.fault is _Fault.DRIVER:
                            raise
                        self._mark(dev, up=False, why=fault.error)
                        sample = self._down_sample(dev, xids)
                        processes = ()
                    if processes:
                        sample = replace(sample, processes=processes)
                process_seconds += self._monotonic() - measured
                device_seconds += measured - started
                devices_ok = devices_ok and sample.up
                devices.append(sample)
        parts = [
            PartResult("nvml_devices", devices_ok, device_seconds),
            PartResult("nvml_processes", processes_ok, process_seconds),
        ]
        if self._xid_events:
            # Success means events are being watched: the thread runs. No GPU able to
            # register for events (or a thread that died with the driver) is a failure.
            alive = session.xid is not None and session.xid.alive()
            parts.append(PartResult("xid", alive, xid_seconds))
        return Snapshot(
            timestamp=self._clock(),
            source_up=True,
            driver_version=session.driver_version,
            devices=tuple(devices),
            parts=tuple(parts),
        )

    def _measure(self, dev: _Device, xids: dict[str, tuple[XidCount, ...]]) -> DeviceSample:
        """Read one device's measurements. A device fault gives a down sample; a driver fault
        propagates."""
        parent_down = dev.parent is not None and not dev.parent.up
        if dev.handle is None or not dev.identified or parent_down:
            return self._down_sample(dev, xids)
        h = dev.handle
        try:
            util = _read(_utilization, h)
            memory = _read(_memory, h)
            if dev.parent is None:
                temperature = _read(_temperature, h)
                power = _read(_power, h)
                power_limit = _read(_power_limit, h)
                energy = _read(_energy, h)
                sm_clock = _read(_clock, h, pynvml.NVML_CLOCK_SM)
                mem_clock = _read(_clock, h, pynvml.NVML_CLOCK_MEM)
                fan = _read(_fan_speed, h)
                ecc_corrected = _read(_ecc_errors, h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
                ecc_uncorrected = _read(
                    _ecc_errors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
                )
            else:
                # Board-level readings belong to the parent GPU; NVML does not answer them on
                # MIG handles (and some drivers fail them with INVALID_ARGUMENT, not
                # NOT_SUPPORTED, which would wrongly mark the slice down).
                temperature = power = power_limit = energy = sm_clock = mem_clock = None
                fan = ecc_corrected = ecc_uncorrected = None
        except _NvmlFault as fault:
            if fault.fault is _Fault.DRIVER:
                raise
            self._mark(dev, up=False, why=fault.error)
            return self._down_sample(dev, xids)
        except Exception as exc:  # a bug or a broken binding: fail this device, not the round
            log.exception("reading device %s failed", dev.uuid)
            self._mark(dev, up=False, why=exc)
            return self._down_sample(dev, xids)
        self._mark(dev, up=True)
        return DeviceSample(
            index=dev.index,
            uuid=dev.uuid,
            model=dev.model,
            up=True,
            pci_bus_id=dev.pci_bus_id,
            parent_uuid=dev.parent.uuid if dev.parent else None,
            mig_profile=dev.mig_profile,
            architecture=dev.architecture,
            utilization_ratio=None if util is None else _ratio(util[0]),
            memory_utilization_ratio=None if util is None else _ratio(util[1]),
            memory_used_bytes=None if memory is None else memory[0],
            memory_total_bytes=None if memory is None else memory[1],
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if power is None else _watts(power),
            power_limit_watts=None if power_limit is None else _watts(power_limit),
            energy_joules=None if energy is None else _joules(energy),
            sm_clock_hertz=None if sm_clock is None else _hertz(sm_clock),
            memory_clock_hertz=None if mem_clock is None else _hertz(mem_clock),
            fan_speed_ratio=None if fan is None else _ratio(fan),
            ecc_corrected_errors=ecc_corrected,
            ecc_uncorrected_errors=ecc_uncorrected,
            xid_errors=xids.get(dev.uuid, ()),
        )

    def _down_sample(self, dev: _Device, xids: dict[str, tuple[XidCount, ...]]) -> DeviceSample:
        # XID counts stay: the XID that took the GPU down (79, fallen off the bus) matters most.
        return DeviceSample(
            index=dev.index,
            uuid=dev.uuid,
            model=dev.model,
            up=False,
            pci_bus_id=dev.pci_bus_id,
            parent_uuid=dev.parent.uuid if dev.parent else None,
            mig_profile=dev.mig_profile,
            architecture=dev.architecture,
            xid_errors=xids.get(dev.uuid, ()),
        )

    def _mark(self, dev: _Device, *, up: bool, why: BaseException | None = None) -> None:
        """Record a device's up/down state, logging only the transitions."""
        if dev.up == up:
            return
        dev.up = up
        label = dev.uuid or f"index {dev.index}"
        if up:
            log.info("device %s answers again", label)
        else:
            log.warning("device %s is down: %s", label, _describe(why))

    # --- processes

    def _processes(self, dev: _Device) -> tuple[tuple[ProcessSample, ...], bool]:
        """Compute and graphics processes of one device, merged by PID, with their mean SM
        utilization since the previous round, and whether every query succeeded. A lost
        device or a dead driver raises _NvmlFault; other errors give ``((), False)`` (listing
        failed) or utilization ``None`` for this round (per-process utilization failed)."""
        try:
            compute = self._list_processes(dev, "compute")
            graphics = self._list_processes(dev, "graphics")
        except _NvmlFault as fault:
            if fault.fault is not _Fault.FAILED:
                raise
            log.warning("listing processes on %s failed: %s", dev.uuid, fault.error)
            return (), False
        if not compute and not graphics:
            # No need to read utilization: samples exist only for running processes, so a
            # process that starts later finds only its own samples past the cursor.
            return (), True
        listings: tuple[tuple[ProcessKind, list[tuple[int, int | None]]], ...] = (
            ("compute", compute),
            ("graphics", graphics),
        )
        kinds_by_pid: dict[int, list[ProcessKind]] = {}
        memory_by_pid: dict[int, int | None] = {}
        for kind, listing in listings:
            for pid, used in listing:
                kinds = kinds_by_pid.setdefault(pid, [])
                if pid not in memory_by_pid:
                    memory_by_pid[pid] = used
                elif kind in kinds:
                    # Listed twice in one list (one entry per compute instance): memory adds up.
                    known = memory_by_pid[pid]
                    memory_by_pid[pid] = None if known is None or used is None else known + used
                else:
                    # The compute and graphics entries of one process report the same memory.
                    known = memory_by_pid[pid]
                    memory_by_pid[pid] = used if known is None else max(known, used or 0)
                if kind not in kinds:
                    kinds.append(kind)
        ok = True
        try:
            utilization = self._utilization_by_pid(dev)
        except _NvmlFault as fault:
            if fault.fault is not _Fault.FAILED:
                raise
            # The cursor stays where it was: these samples are read next round instead.
            log.warning("process utilization on %s failed: %s", dev.uuid, fault.error)
            utilization, ok = None, False
        samples = tuple(
            ProcessSample(
                pid=pid,
                kinds=tuple(kinds),
                memory_used_bytes=memory_by_pid[pid],
                sm_utilization_ratio=None if utilization is None else utilization.get(pid, 0.0),
            )
            for pid, kinds in sorted(kinds_by_pid.items())
        )
        return samples, ok

    def _list_processes(self, dev: _Device, kind: ProcessKind) -> _Processes:
        call = self._process_calls[kind]
        try:
            return _read(call, dev.handle) or []
        except pynvml.NVMLLibraryMismatchError:
            # The driver predates the _v3 process calls (raised as pynvml raises this plain
            # Exception for the unversioned call). Use _v2 from now on instead of failing
            # every round.
            v2 = {"compute": _compute_processes_v2, "graphics": _graphics_processes_v2}[kind]
            log.info("driver lacks the _v3 %s process call; using _v2", kind)
            self._process_calls[kind] = v2
            return _read(v2, dev.handle) or []

    def _utilization_by_pid(self, dev: _Device) -> dict[int, float] | None:
        """Mean SM utilization ratio per PID over the samples NVML recorded since the device's
        cursor; advances the cursor to the newest sample returned, so each sample is counted
        exactly once. ``None`` when the device cannot report it (then never asked again)."""
        if not self._process_utilization or not dev.process_utilization_supported:
            return None
        samples = _read(_process_utilization, dev.handle, dev.util_cursor_us)
        if samples is None:
            dev.process_utilization_supported = False
            return None
        totals: dict[int, tuple[int, int]] = {}
        newest = dev.util_cursor_us
        for pid, timestamp_us, sm_percent in samples:
            total, n = totals.get(pid, (0, 0))
            totals[pid] = (total + sm_percent, n + 1)
            newest = max(newest, timestamp_us)
        dev.util_cursor_us = newest
        return {pid: _ratio(total / n) for pid, (total, n) in totals.items()}


def _quietly(fn: Callable[_P, object], /, *args: _P.args, **kwargs: _P.kwargs) -> None:
    """Call an NVML cleanup function, ignoring NVML errors (the driver may already be gone)."""
    try:
        fn(*args, **kwargs)
    except pynvml.NVMLError as exc:
        log.debug("%s failed during cleanup: %s", getattr(fn, "__name__", fn), exc)


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, _NvmlFault):
        exc = exc.error
    if exc is None:
        return "unknown error"
    return f"{type(exc).__name__}: {exc}"
