"""The NVML source: every GPU, MIG slice and GPU process on this node, read through pynvml.

NVML is initialised once and device handles are cached (each GPU's MIG mode and slices are
read again every ``mig_layout_interval_seconds``: MIG is reconfigured without a driver
reload); each :meth:`NvmlSource.sample` reads the current values and converts them to base
units (``calls.ratio``, ``calls.watts``, ... are the only place units change).
Faults never escape ``sample()``:

* a value the device does not report (``NOT_SUPPORTED``, ``NO_PERMISSION``, a symbol the
  driver lacks) is ``None``, and its series is absent;
* a device that fails (``GPU_IS_LOST``, ``UNKNOWN``, any other NVML error) is ``up=False``
  with every measurement ``None``, while the other devices keep reporting; it is asked again
  every round and comes back by itself;
* a missing library or driver (at start, or unloaded mid-run) makes the whole source
  ``source_up=False``; NVML is shut down and initialised again with exponential backoff.

XID critical errors arrive as NVML events, waited for in a daemon thread of their own and
counted per (device, XID code) for as long as the source lives.

Work signals (what tells work from waiting) are counters kept per device UUID across NVML
sessions, so that they never go backwards, through GPU loss and driver reloads included
(a UUID no device has had for ``departed_retention_seconds``, a destroyed MIG slice, is
forgotten):
busy time from the driver's utilization samples (:mod:`.busy`), throttle time per reason
(:mod:`.throttle`) every round, and GPM activity per GPU and MIG GPU instance (:mod:`.gpm`)
at a cadence of its own (``gpm_interval_seconds``, stretched so that GPM never takes more
than ``gpm_cpu_budget`` of the time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import pynvml

from gpuscope.exporter.model import (
    DeviceSample,
    MpsRole,
    PartResult,
    ProcessKind,
    ProcessSample,
    RowRemapping,
    Snapshot,
    ThrottleTime,
    XidCount,
)
from gpuscope.exporter.repeats import Repeats
from gpuscope.exporter.sources.nvml import calls
from gpuscope.exporter.sources.nvml.busy import CLOCK_SLACK_US, BusyTime
from gpuscope.exporter.sources.nvml.calls import (
    Fault,
    NvmlFault,
    describe,
    handle_key,
    hertz,
    joules,
    quietly,
    ratio,
    read,
    watts,
)
from gpuscope.exporter.sources.nvml.gpm import GpmSampler, GpmTotals
from gpuscope.exporter.sources.nvml.mps import (
    MpsBehaviour,
    ProcessNames,
    mps_compute_processes,
    mps_compute_processes_v2,
)
from gpuscope.exporter.sources.nvml.throttle import ThrottlePlan, ThrottleTotals
from gpuscope.exporter.sources.nvml.xid import XidCounts, XidWatcher

log = logging.getLogger(__name__)


#: GPM cadence: at most every 10 s, and GPM takes at most 0.5 % of one core (docs/metrics.md).
DEFAULT_GPM_INTERVAL_SECONDS = 10.0
DEFAULT_GPM_CPU_BUDGET = 0.005

#: How often each GPU's MIG mode and slices are read again: they change without a driver
#: reload (``nvidia-smi mig``, the GPU operator's MIG manager), and a slice found at nvmlInit
#: may be gone, another one created in its place (docs/metrics.md).
DEFAULT_MIG_LAYOUT_INTERVAL_SECONDS = 10.0

#: How long what the source keeps per device UUID (work-signal counters, the utilization
#: cursor, XID counts, what MPS and optional reads did there) outlives the device: a UUID
#: back within this time (a transient answer) continues its counters; one gone longer (a
#: destroyed MIG slice: every new slice has a new UUID) is forgotten, so a node re-carved
#: every few minutes does not keep every slice it ever had (docs/metrics.md).
DEFAULT_DEPARTED_RETENTION_SECONDS = 3600.0

# How far back the per-process utilization cursor starts: the driver keeps a buffer of older
# samples, which belong to before the exporter started and must not be counted.
_UTIL_LOOKBACK_SECONDS = 1.0

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


# "GPU UUID: \t GPU-8c2b5d1e-..." in the driver's per-GPU information file; older drivers
# print "GPU-????????-????-..." when they cannot read it, which this does not match.
PROCFS_UUID = re.compile(
    r"^GPU UUID:\s*(GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\s*$",
    re.MULTILINE,
)
_PROCFS_EXCLUDED = re.compile(r"^GPU Excluded:\s*Yes\s*$", re.MULTILINE)


def procfs_uuids(proc_root: str) -> list[str] | None:
    """The UUIDs of the GPUs the driver lists under ``<proc_root>/driver/nvidia/gpus``
    (excluded ones left out: NVML does not enumerate them); ``None`` where the directory
    cannot be read or a listed GPU shows no UUID."""
    gpus = os.path.join(proc_root, "driver", "nvidia", "gpus")
    uuids: list[str] = []
    try:
        for bus in sorted(os.listdir(gpus)):
            with open(os.path.join(gpus, bus, "information"), encoding="utf-8",
                      errors="replace") as f:
                text = f.read()
            if _PROCFS_EXCLUDED.search(text):
                continue
            match = PROCFS_UUID.search(text)
            if match is None:
                return None
            uuids.append(match.group(1))
    except OSError:
        return None
    return uuids


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
    minor_number: int | None = None  # /dev/nvidia<N>; a slice has its GPU's
    parent: _Device | None = None
    mig_profile: str | None = None
    gpu_instance_id: int | None = None
    mig_enabled: bool = False
    slices: list[_Device] = field(default_factory=list)
    identified: bool = False
    up: bool = True
    process_utilization_supported: bool = True
    mps_supported: bool = True  # nvmlDeviceGetMPSComputeRunningProcesses answers
    util_cursor_us: int = 0
    gpm_supported: bool = False
    throttle: ThrottlePlan = field(default_factory=ThrottlePlan)
    #: Its reads' unexpected errors (a bug, a broken binding), logged without a traceback
    #: every round (made at the first one).
    errors: Repeats | None = None

    @property
    def gpm_key(self) -> tuple[object, ...]:
        """The GPM target: a GPU, or (for a MIG slice) its parent's GPU instance."""
        if self.parent is not None:
            return ("gi", self.parent.key, self.gpu_instance_id)
        return ("gpu", self.key)


@dataclass(frozen=True, slots=True)
class _Identity:
    """What a GPU index was last identified as (its static facts)."""

    uuid: str
    model: str
    pci_bus_id: str
    architecture: str | None
    minor_number: int | None


@dataclass(slots=True)
class _Counters:
    """One device's work-signal counters, kept by UUID across NVML sessions."""

    busy: BusyTime = field(default_factory=BusyTime)
    gpm: GpmTotals = field(default_factory=GpmTotals)
    throttle: ThrottleTotals = field(default_factory=ThrottleTotals)


@dataclass(eq=False, slots=True)
class _Session:
    """Everything valid between one nvmlInit and its nvmlShutdown."""

    driver_version: str | None
    devices: list[_Device]
    xid: XidWatcher | None = None
    gpm: GpmSampler | None = None


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
    ``gpm`` turns GPM on (where the GPU supports it); it is sampled every
    ``gpm_interval_seconds`` at most (0: every round), less often when a GPM round takes more
    than ``gpm_cpu_budget`` (a fraction of one core) of the time between two (GPM reads
    counters over PCIe: about 1.4 ms per GPU or GPU instance on an H100).
    ``departed_retention_seconds``: how long the per-UUID state of a device no longer on
    the node is kept (a UUID back within it continues its counters), counted from the first
    MIG layout read without it.
    ``proc_root`` (the host's ``/proc``, ``--proc-root``) is where the MPS server is
    recognised by its name (:mod:`.mps`), and where a GPU NVML cannot open at init (lost)
    finds its UUID (``driver/nvidia/gpus``, :meth:`_name_from_procfs`); ``None`` reads
    nothing there, and the server is recognised by its place in NVML's process lists alone.

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
        gpm: bool = True,
        gpm_interval_seconds: float = DEFAULT_GPM_INTERVAL_SECONDS,
        gpm_cpu_budget: float = DEFAULT_GPM_CPU_BUDGET,
        proc_root: str | None = None,
        mig_layout_interval_seconds: float = DEFAULT_MIG_LAYOUT_INTERVAL_SECONDS,
        departed_retention_seconds: float = DEFAULT_DEPARTED_RETENTION_SECONDS,
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
        self._xid_counts = XidCounts(clock)
        # Utilization cursors by device UUID, kept across re-inits so that no sample already
        # counted is counted again after a driver reload.
        self._util_cursors: dict[str, int] = {}
        self._gpm = gpm
        self._gpm_interval = gpm_interval_seconds
        self._gpm_budget = gpm_cpu_budget
        self._next_gpm_at = 0.0
        self._mig_layout_interval = mig_layout_interval_seconds
        self._next_layout_at = 0.0
        self._gpm_due = False
        self._gpm_seconds = 0.0  # time spent in GPM calls this round
        # GPM means by target this round: the MIG devices of one GPU instance share them.
        self._gpm_results: dict[tuple[object, ...], tuple[dict[int, float], float] | None] = {}
        # (device, signal) pairs whose optional read failed, so each is logged once.
        self._optional_failures: set[tuple[str, str]] = set()
        # Work-signal counters by device UUID, kept across re-inits: they never go back.
        self._counters: dict[str, _Counters] = {}
        # The process-list calls to use; switched to _v2 for good when the driver lacks _v3.
        self._process_calls: dict[ProcessKind, Callable[[object], calls.Processes]] = {}
        # The MPS list call, likewise (_v3, else _v2); MPS per device below.
        self._mps_call: Callable[[object], calls.Processes] = mps_compute_processes
        self._names = ProcessNames(proc_root)
        self._proc_root = proc_root
        # Per device UUID, kept across re-inits: which utilization behaviour MPS has there.
        self._mps_behaviour: dict[str, MpsBehaviour] = {}
        # Devices whose MPS list failed once (logged once each).
        self._mps_failures: set[str] = set()
        # (device UUID, query) of the process queries failing now: logged when the failure
        # starts and when it ends, not every round (_process_query).
        self._process_failures: set[tuple[str, str]] = set()
        # What each GPU index was last identified as, and the GPU count then: a GPU that NVML
        # cannot open after a re-init (lost: GPU_IS_LOST from nvmlDeviceGetHandleByIndex) is
        # still the GPU at its index, with the same count (NVML enumerates in PCI order).
        self._identities: dict[int, _Identity] = {}
        self._identities_count: int | None = None
        self._departed_retention = departed_retention_seconds
        # UUIDs with state kept above that no device of the session has now: since when
        # (monotonic), read at each MIG layout read (_forget_departed).
        self._departed: dict[str, float] = {}
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
                "NVML unavailable (%s); retrying in %.0f s", describe(exc), self._retry_delay
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
            calls.install_library(self._library)
        calls.init()  # NVMLError_LibraryNotFound / _DriverNotLoaded when absent
        try:
            driver_version = read(calls.driver_version)
            self._process_calls = {
                "compute": calls.compute_processes,
                "graphics": calls.graphics_processes,
            }
            self._mps_call = mps_compute_processes
            count = read(calls.device_count) or 0
            devices = [_Device(index=str(i), nvml_index=i) for i in range(count)]
            for dev in devices:
                self._identify(dev)
            self._carry_identities(devices, count)
            self._name_from_procfs(devices)
            self._next_layout_at = self._monotonic() + self._mig_layout_interval
            session = _Session(driver_version=driver_version, devices=devices)
            if self._gpm:
                session.gpm = GpmSampler(self._monotonic)
            for counters in self._counters.values():
                counters.busy.new_session()
            if self._xid_events:
                session.xid = self._watch_xid(devices)
        except BaseException:
            quietly(calls.shutdown)
            raise
        return session

    def _identify(self, dev: _Device) -> None:
        """Read a GPU's handle, static facts and MIG slices (once; again next round when the GPU
        is lost meanwhile). Device faults leave ``identified`` False; driver faults propagate."""
        try:
            if dev.handle is None:
                dev.handle = read(calls.device_handle, dev.nvml_index)
                if dev.handle is None:
                    return
                dev.key = handle_key(dev.handle)
            dev.uuid = read(calls.uuid, dev.handle) or ""
            dev.model = read(calls.name, dev.handle) or ""
            dev.pci_bus_id = read(calls.pci_bus_id, dev.handle) or ""
            dev.minor_number = self._minor_number(dev)
            arch = read(calls.architecture, dev.handle)
            dev.architecture = None if arch is None else _ARCHITECTURES.get(arch)
            dev.mig_enabled = bool(read(calls.mig_enabled, dev.handle))
            dev.gpm_supported = self._gpm and self._gpm_supported(dev)
            dev.slices = self._mig_slices(dev) if dev.mig_enabled else []
        except NvmlFault as fault:
            if fault.fault is Fault.DRIVER:
                raise
            self._mark(dev, up=False, why=fault.error)
            return
        dev.identified = True
        if dev.uuid:
            self._identities[dev.nvml_index] = _Identity(
                dev.uuid, dev.model, dev.pci_bus_id, dev.architecture, dev.minor_number
            )
        self._start_cursor(dev)

    def _carry_identities(self, devices: list[_Device], count: int) -> None:
        """Name each GPU NVML could not open at this init (lost, failing) as its index was
        known in an earlier session of this process, where the GPU count is the same (after
        a driver reload with another count the indices may have moved: left unnamed). A GPU
        never identified by this process keeps an empty UUID: none is invented."""
        if count != self._identities_count:
            # (Identified at this init: the entries _identify just wrote. The rest are stale.)
            self._identities = {
                d.nvml_index: self._identities[d.nvml_index]
                for d in devices if d.identified and d.nvml_index in self._identities
            }
            self._identities_count = count
            return
        for dev in devices:
            known = self._identities.get(dev.nvml_index)
            if dev.identified or dev.uuid or known is None:
                continue
            dev.uuid, dev.model, dev.pci_bus_id = known.uuid, known.model, known.pci_bus_id
            dev.architecture, dev.minor_number = known.architecture, known.minor_number
            log.info("GPU %d does not answer; still reported as %s", dev.nvml_index, dev.uuid)

    def _name_from_procfs(self, devices: list[_Device]) -> None:
        """Name the one GPU NVML could not open and no earlier session named, by the UUID
        the driver lists in ``<proc_root>/driver/nvidia/gpus/<bus>/information`` (printed
        from the UUID the kernel module cached at probe, without asking the GPU) that no GPU
        NVML opened holds. Only where that is unambiguous: one such GPU, the driver's
        non-excluded GPUs as many as NVML's, each with a UUID; else it stays unnamed."""
        unnamed = [d for d in devices if not d.identified and not d.uuid]
        if self._proc_root is None or len(unnamed) != 1:
            return
        listed = procfs_uuids(self._proc_root)
        if listed is None or len(listed) != len(devices):
            return
        left = set(listed) - {d.uuid for d in devices if d.uuid}
        if len(left) == 1:
            unnamed[0].uuid = left.pop()
            log.info("GPU %d does not answer NVML; the driver lists it as %s",
                     unnamed[0].nvml_index, unnamed[0].uuid)

    @staticmethod
    def _minor_number(dev: _Device) -> int | None:
        """The GPU's ``/dev/nvidia<N>``, None where it does not answer: it only names the
        GPU for GKE's device ids (the index stands in), so a failure of it is no fault of
        the GPU's."""
        try:
            return read(calls.minor_number, dev.handle)
        except NvmlFault as fault:
            if fault.fault is Fault.DRIVER:
                raise
            return None

    def _mig_slices(self, gpu: _Device) -> list[_Device]:
        slices: list[_Device] = []
        for slot in range(read(calls.max_mig_devices, gpu.handle) or 0):
            handle = read(calls.mig_handle, gpu.handle, slot)
            if handle is None:
                continue
            name = read(calls.name, handle) or ""
            match = _MIG_PROFILE.search(name)
            gi = read(calls.gpu_instance_id, handle)
            mig = _Device(
                index=f"{gpu.index}/{gi if gi is not None else slot}",
                nvml_index=gpu.nvml_index,
                handle=handle,
                key=handle_key(handle),
                uuid=read(calls.uuid, handle) or "",
                # The slice is of the parent's model; its size is in mig_profile.
                model=gpu.model,
                pci_bus_id=gpu.pci_bus_id,
                architecture=gpu.architecture,
                minor_number=gpu.minor_number,
                parent=gpu,
                mig_profile=match.group(1) if match else None,
                gpu_instance_id=gi,
                identified=True,
                gpm_supported=gpu.gpm_supported and gi is not None,
            )
            self._start_cursor(mig)
            slices.append(mig)
        return slices

    def _follow_mig_layout(self, gpu: _Device, session: _Session) -> None:
        """Read the GPU's MIG mode and slices again and take the new layout when it changed:
        a slice still there is the same object (its cursor, what it supports, its counters),
        new ones are added, destroyed ones dropped with the GPM buffers no kept slice shares.
        A device fault, or a mode or slot count the GPU does not answer, leaves the layout
        as it was (the round's reads mark the GPU down); driver faults propagate. Counters of
        a slice that is gone are kept for ``departed_retention_seconds``: its UUID coming
        back within that time (a transient answer) continues them, never from 0."""
        try:
            mode = read(calls.mig_enabled, gpu.handle)
            if mode is None or (mode and read(calls.max_mig_devices, gpu.handle) is None):
                return  # unknown: not a change
            enabled = bool(mode)
            slices = self._mig_slices(gpu) if enabled else []
        except NvmlFault as fault:
            if fault.fault is Fault.DRIVER:
                raise
            return

        def same(m: _Device) -> tuple[object, ...]:
            # A slice is its UUID (a new one at each creation), index and profile; not the
            # address of its handle, an opaque pointer nothing promises to keep.
            return m.index, m.uuid, m.mig_profile

        known = {same(m): m for m in gpu.slices}
        layout: list[_Device] = []
        still: set[tuple[object, ...]] = set()  # the GPM targets of the slices kept
        for fresh in slices:
            kept = known.pop(same(fresh), None)
            if kept is None:
                layout.append(fresh)
            else:  # the same slice, under the handle NVML gives now
                kept.handle, kept.key = fresh.handle, fresh.key
                layout.append(kept)
                still.add(kept.gpm_key)
        if enabled == gpu.mig_enabled and not known and len(layout) == len(gpu.slices):
            return
        if session.gpm is not None:
            # A GPU instance's compute instances share its GPM target: freed unless a kept
            # slice still reads it (a new instance under the same id starts afresh).
            for gone in known.values():
                if gone.gpm_key not in still:
                    session.gpm.forget(gone.gpm_key)
        if enabled != gpu.mig_enabled:
            self._interrupt(gpu)  # the mode changed with a GPU reset: not integrated over
        gpu.mig_enabled = enabled
        gpu.slices = layout
        if session.xid is not None:
            session.xid.set_mig_slices(gpu.key, {
                m.gpu_instance_id: m.uuid for m in layout if m.gpu_instance_id is not None
            })
        log.info(
            "MIG layout of GPU %s changed: %s", gpu.uuid,
            ", ".join(f"{m.index} {m.mig_profile}" for m in layout) or "MIG mode off",
        )

    def _forget_departed(self, session: _Session, now: float) -> None:
        """Drop the per-UUID state of devices the session has not had for
        ``departed_retention_seconds`` (destroyed MIG slices, GPUs gone after a reload); a
        UUID seen again before that keeps its state."""
        present = {d.uuid for gpu in session.devices for d in (gpu, *gpu.slices) if d.uuid}
        known = (self._counters.keys() | self._util_cursors.keys()
                 | self._mps_behaviour.keys() | self._mps_failures
                 | {uuid for uuid, _ in self._optional_failures}
                 | {uuid for uuid, _ in self._process_failures}
                 | self._xid_counts.uuids()) - {""}
        for uuid in self._departed.keys() - known:
            del self._departed[uuid]
        gone: set[str] = set()
        for uuid in known:
            if uuid in present:
                self._departed.pop(uuid, None)
            elif now - self._departed.setdefault(uuid, now) >= self._departed_retention:
                gone.add(uuid)
        if not gone:
            return
        for uuid in gone:
            del self._departed[uuid]
            self._counters.pop(uuid, None)
            self._util_cursors.pop(uuid, None)
            self._mps_behaviour.pop(uuid, None)
        self._mps_failures -= gone
        self._optional_failures = {f for f in self._optional_failures if f[0] not in gone}
        self._process_failures = {f for f in self._process_failures if f[0] not in gone}
        self._xid_counts.forget(gone)

    def _gpm_supported(self, dev: _Device) -> bool:
        """Whether NVML says the GPU has GPM; a GPU that fails the question has none."""
        try:
            return bool(read(calls.gpm_supported, dev.handle))
        except NvmlFault as fault:
            if fault.fault is not Fault.FAILED:
                raise
            log.info("GPM support query failed on %s: %s", dev.uuid, fault.error)
            return False

    def _start_cursor(self, dev: _Device) -> None:
        start = int((self._clock() - _UTIL_LOOKBACK_SECONDS) * 1_000_000)
        dev.util_cursor_us = max(self._util_cursors.get(dev.uuid, 0), start)

    def _watch_xid(self, devices: list[_Device]) -> XidWatcher | None:
        """Register every GPU for XID events on one event set and start the waiting thread.
        A GPU that cannot register (NOT_SUPPORTED, lost, ...) is skipped; an event set that
        cannot be made (NVML answers UNKNOWN on some nodes) leaves XID events unwatched (the
        ``xid`` part fails), never the GPUs unread. Driver faults propagate."""
        try:
            event_set = read(calls.event_set_create)
        except NvmlFault as fault:
            if fault.fault is Fault.DRIVER:
                raise
            log.warning("XID events not watched: nvmlEventSetCreate failed: %s", describe(fault))
            return None
        if event_set is None:
            log.warning("XID events not supported on this node")
            return None
        gpus: dict[int, tuple[object, str]] = {}
        mig_slices: dict[tuple[int, int], str] = {}
        for dev in devices:
            if not dev.identified:
                continue
            try:
                registered = read(calls.register_xid_events, dev.handle, event_set)
            except NvmlFault as fault:
                if fault.fault is Fault.DRIVER:
                    raise
                registered = False
            if not registered:
                log.warning("GPU %s cannot report XID events; not watching it", dev.uuid)
                continue
            gpus[dev.key] = (dev.handle, dev.uuid)
            for mig in dev.slices:
                if mig.gpu_instance_id is not None:
                    mig_slices[(dev.key, mig.gpu_instance_id)] = mig.uuid
        if not gpus:
            log.warning("no GPU on this node can report XID events")
            quietly(calls.event_set_free, event_set)
            return None
        watcher = XidWatcher(
            event_set, gpus, mig_slices, self._xid_counts, self._xid_wait_timeout_ms,
            self._monotonic,
        )
        watcher.start()
        return watcher

    def _watch_late(self, gpu: _Device, session: _Session) -> None:
        """Watch a GPU for XID events that was identified after nvmlInit (it did not answer
        then: lost, failing): the event set was made without it. With no event thread (no
        GPU could register at start) one is started now."""
        if not self._xid_events:
            return
        if session.xid is None:
            try:
                session.xid = self._watch_xid(session.devices)
            except NvmlFault as fault:
                if fault.fault is Fault.DRIVER:
                    raise
                log.warning("XID events not watched: %s", describe(fault))
            return
        session.xid.add_gpu(gpu.handle, gpu.uuid, {
            m.gpu_instance_id: m.uuid for m in gpu.slices if m.gpu_instance_id is not None
        })

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
                quietly(calls.event_set_free, session.xid.event_set)
            else:
                # Still inside nvmlEventSetWait: freeing the set under it is not safe.
                log.warning("XID event thread did not stop; leaving its event set")
        if session.gpm is not None:
            session.gpm.close()
        quietly(calls.shutdown)

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
            except NvmlFault as fault:
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
        round_started = self._monotonic()
        self._gpm_due = session.gpm is not None and round_started >= self._next_gpm_at
        self._gpm_seconds = 0.0
        self._gpm_results = {}
        if round_started >= self._next_layout_at:
            self._next_layout_at = round_started + self._mig_layout_interval
            for gpu in session.devices:
                if gpu.identified:
                    self._follow_mig_layout(gpu, session)
            self._forget_departed(session, round_started)
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
                if gpu.identified:
                    self._watch_late(gpu, session)
            for dev in (gpu, *gpu.slices):
                started = self._monotonic()
                sample = self._measure(dev, xids)
                measured = self._monotonic()
                if sample.up and not (dev is gpu and gpu.mig_enabled):
                    # A MIG-enabled GPU lists its slices' processes: they are reported once,
                    # on the slices, where attribution (MIG UUIDs) needs them.
                    try:
                        processes, listed, mps_reported = self._processes(dev)
                        processes_ok = processes_ok and listed
                    except NvmlFault as fault:
                        if fault.fault is Fault.DRIVER:
                            raise
                        self._mark(dev, up=False, why=fault.error)
                        sample = self._down_sample(dev, xids)
                        processes, mps_reported = (), None
                    if processes:
                        sample = replace(sample, processes=processes,
                                         mps_client_utilization_reported=mps_reported)
                process_seconds += self._monotonic() - measured
                device_seconds += measured - started
                devices_ok = devices_ok and sample.up
                devices.append(sample)
        self._names.retain(p.pid for d in devices for p in d.processes)
        if self._gpm_due:
            # The next GPM round: after the interval, later when GPM took more than its
            # budget (it reads counters over PCIe: ~1.4 ms per GPU or GPU instance).
            spacing = self._gpm_interval
            if self._gpm_budget > 0:
                spacing = max(spacing, self._gpm_seconds / self._gpm_budget)
            self._next_gpm_at = round_started + spacing
        parts = [
            PartResult("nvml_devices", devices_ok, device_seconds),
            PartResult("nvml_processes", processes_ok, process_seconds),
        ]
        if self._xid_events:
            # Success means events are being watched: the thread runs and its waits do not
            # fail. No GPU able to register for events (or a thread that died with the
            # driver) is a failure.
            alive = session.xid is not None and session.xid.watching()
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
            util = read(calls.utilization, h)
            memory = read(calls.memory, h)
            if dev.parent is None:
                temperature = read(calls.temperature, h)
                power = read(calls.power, h)
                power_limit = read(calls.power_limit, h)
                energy = read(calls.energy, h)
                sm_clock = read(calls.clock, h, pynvml.NVML_CLOCK_SM)
                mem_clock = read(calls.clock, h, pynvml.NVML_CLOCK_MEM)
                fan = read(calls.fan_speed, h)
                ecc_corrected = read(calls.ecc_errors, h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED)
                ecc_uncorrected = read(
                    calls.ecc_errors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
                )
                # Read every round like ECC, not at a slower cadence of its own like GPM: one
                # nvmlDeviceGetRemappedRows costs what one ECC read costs (1.1 µs against
                # 1.2 µs a call, measured on an H200 with driver 580.159; a GPM sample is
                # ~1.1 ms), so a remap that turns pending shows at the next round for free.
                # NOT_SUPPORTED before Ampere or with ECC off: absent.
                remap = read(calls.remapped_rows, h)
            else:
                # Board-level readings belong to the parent GPU; NVML does not answer them on
                # MIG handles (and some drivers fail them with INVALID_ARGUMENT, not
                # NOT_SUPPORTED, which would wrongly mark the slice down).
                temperature = power = power_limit = energy = sm_clock = mem_clock = None
                fan = ecc_corrected = ecc_uncorrected = remap = None
            work, throttle = self._work_signals(dev, h, None if util is None else util[0])
        except NvmlFault as fault:
            if fault.fault is Fault.DRIVER:
                raise
            self._mark(dev, up=False, why=fault.error)
            return self._down_sample(dev, xids)
        except Exception as exc:  # a bug or a broken binding: fail this device, not the round
            if dev.errors is None:
                dev.errors = Repeats(log, f"reading device {dev.uuid or dev.index}",
                                     clock=self._monotonic)
            dev.errors.failed()
            self._mark(dev, up=False, why=exc)
            return self._down_sample(dev, xids)
        if dev.errors is not None:
            dev.errors.succeeded()
        self._mark(dev, up=True)
        return DeviceSample(
            index=dev.index,
            uuid=dev.uuid,
            model=dev.model,
            up=True,
            pci_bus_id=dev.pci_bus_id,
            parent_uuid=dev.parent.uuid if dev.parent else None,
            mig_profile=dev.mig_profile,
            mig_mode=dev.mig_enabled,
            architecture=dev.architecture,
            minor_number=dev.minor_number,
            utilization_ratio=None if util is None else ratio(util[0]),
            memory_utilization_ratio=None if util is None else ratio(util[1]),
            memory_used_bytes=None if memory is None else memory[0],
            memory_total_bytes=None if memory is None else memory[1],
            temperature_celsius=None if temperature is None else float(temperature),
            power_watts=None if power is None else watts(power),
            power_limit_watts=None if power_limit is None else watts(power_limit),
            energy_joules=None if energy is None else joules(energy),
            sm_clock_hertz=None if sm_clock is None else hertz(sm_clock),
            memory_clock_hertz=None if mem_clock is None else hertz(mem_clock),
            fan_speed_ratio=None if fan is None else ratio(fan),
            ecc_corrected_errors=ecc_corrected,
            ecc_uncorrected_errors=ecc_uncorrected,
            row_remapping=None if remap is None else RowRemapping(*remap),
            busy_seconds=work.get("busy_seconds"),
            sm_active_seconds=work.get("sm_active_seconds"),
            tensor_active_seconds=work.get("tensor_active_seconds"),
            dram_active_seconds=work.get("dram_active_seconds"),
            graphics_active_seconds=work.get("graphics_active_seconds"),
            sm_occupancy_ratio=work.get("sm_occupancy_ratio"),
            pcie_receive_bytes=work.get("pcie_receive_bytes"),
            pcie_transmit_bytes=work.get("pcie_transmit_bytes"),
            nvlink_receive_bytes=work.get("nvlink_receive_bytes"),
            nvlink_transmit_bytes=work.get("nvlink_transmit_bytes"),
            throttle_seconds=throttle,
            xid_errors=xids.get(dev.uuid, ()),
        )

    def _work_signals(
        self, dev: _Device, handle: object, utilization_percent: int | None
    ) -> tuple[dict[str, float], tuple[ThrottleTime, ...]]:
        """The device's work-signal counters after this round's reads: busy time, GPM (when
        due: else the totals of the last GPM round) and, on a GPU, throttle time. A lost
        device or a dead driver raises NvmlFault; any other error of these optional reads
        leaves that signal out of this round (logged once), not the device down."""
        counters = self._counters.get(dev.uuid)
        if counters is None:
            counters = self._counters[dev.uuid] = _Counters()
        work: dict[str, float] = {}
        wall_us = int(self._clock() * 1_000_000)
        start_us = wall_us - int(_UTIL_LOOKBACK_SECONDS * 1_000_000)
        with self._optional(dev, "busy time"):
            busy = counters.busy.update(handle, utilization_percent, start_us, self._monotonic(),
                                        wall_us)
            if busy is not None:
                work["busy_seconds"] = busy
        gpm = self._session.gpm if self._session is not None else None
        if dev.gpm_supported and gpm is not None:
            if self._gpm_due:
                with self._optional(dev, "GPM"):
                    key = dev.gpm_key
                    if key not in self._gpm_results:  # once per GPU instance per round
                        started = self._monotonic()
                        self._gpm_results[key] = gpm.sample(key, self._gpm_take(dev))
                        self._gpm_seconds += self._monotonic() - started
                    means = self._gpm_results[key]
                    if means is not None:
                        counters.gpm.add(*means)
            work.update(counters.gpm.reported())
        throttle: tuple[ThrottleTime, ...] = ()
        if dev.parent is None:
            with self._optional(dev, "throttle time"):
                throttle = counters.throttle.update(dev.throttle.read(handle))
        return work, throttle

    @contextlib.contextmanager
    def _optional(self, dev: _Device, what: str) -> Iterator[None]:
        """Run one optional read: a failing (not lost) device leaves it out this round."""
        try:
            yield
        except NvmlFault as fault:
            if fault.fault is not Fault.FAILED:
                raise
            if (dev.uuid, what) not in self._optional_failures:
                self._optional_failures.add((dev.uuid, what))
                log.warning("%s of %s not read: %s", what, dev.uuid, describe(fault))

    def _gpm_take(self, dev: _Device) -> Callable[[object], bool]:
        """How to fill a GPM sample buffer for ``dev``: its GPU, or its MIG GPU instance."""
        parent, gi = dev.parent, dev.gpu_instance_id
        if parent is None:
            return lambda buffer: calls.gpm_sample_get(dev.handle, buffer)
        assert gi is not None
        return lambda buffer: calls.gpm_mig_sample_get(parent.handle, gi, buffer)

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
            mig_mode=dev.mig_enabled,
            architecture=dev.architecture,
            minor_number=dev.minor_number,
            xid_errors=xids.get(dev.uuid, ()),
        )

    def _mark(self, dev: _Device, *, up: bool, why: BaseException | None = None) -> None:
        """Record a device's up/down state, logging only the transitions."""
        if not up:
            self._interrupt(dev)
        if dev.up == up:
            return
        dev.up = up
        label = dev.uuid or f"index {dev.index}"
        if up:
            log.info("device %s answers again", label)
        else:
            log.warning("device %s is down: %s", label, describe(why))

    def _interrupt(self, dev: _Device) -> None:
        """A device stopped answering: the time until it answers again is not integrated
        (busy time from rates, GPM intervals)."""
        counters = self._counters.get(dev.uuid)
        if counters is not None:
            counters.busy.interrupted()
        if self._session is not None and self._session.gpm is not None:
            self._session.gpm.restart(dev.gpm_key)

    # --- processes

    def _processes(
        self, dev: _Device
    ) -> tuple[tuple[ProcessSample, ...], bool, bool | None]:
        """Compute, graphics and MPS processes of one device, merged by PID, with their mean
        SM utilization since the previous round; whether every query succeeded; and, under
        MPS, whether NVML reports the MPS clients' utilization (``None``: not known, or no
        MPS). A lost device or a dead driver raises NvmlFault; other errors give
        ``((), False, None)`` (listing failed) or utilization ``None`` for this round
        (per-process utilization failed). A failing MPS list leaves the clients unlisted this
        round: where the server is known by its name, the other compute processes' utilization
        is unknown (``None``) unless NVML is known to report clients'."""
        try:
            compute = self._list_processes(dev, "compute")
            graphics = self._list_processes(dev, "graphics")
        except NvmlFault as fault:
            if fault.fault is not Fault.FAILED:
                raise
            self._process_query(dev, "listing processes", fault)
            return (), False, None
        if self._process_failures:
            self._process_query(dev, "listing processes", None)
        clients, ok = self._list_mps(dev)
        mps_listed = ok
        if not compute and not graphics and not clients:
            # No need to read utilization: samples exist only for running processes, so a
            # process that starts later finds only its own samples past the cursor.
            return (), ok, None
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
        roles = self._mps_roles(kinds_by_pid, memory_by_pid, clients)
        try:
            utilization = self._utilization_by_pid(dev)
        except NvmlFault as fault:
            if fault.fault is not Fault.FAILED:
                raise
            # The cursor stays where it was: these samples are read next round instead.
            self._process_query(dev, "process utilization", fault)
            utilization, ok = None, False
        else:
            if self._process_failures:
                self._process_query(dev, "process utilization", None)
        reported: bool | None = None
        if roles:
            behaviour = self._mps_behaviour.get(dev.uuid)
            if behaviour is None:
                behaviour = self._mps_behaviour[dev.uuid] = MpsBehaviour()
            client_pids = [pid for pid, role in roles.items() if role == "client"]
            reported = behaviour.reported if utilization is None else behaviour.learn(
                client_pids, utilization)

        if not roles:  # no MPS here (the common case, kept to one pass)
            return tuple(
                ProcessSample(
                    pid, tuple(kinds), memory_by_pid[pid],
                    None if utilization is None else utilization.get(pid, 0.0),
                )
                for pid, kinds in sorted(kinds_by_pid.items())
            ), ok, None

        # The MPS list failed this round but the server runs (known by its name): the other
        # compute processes are the clients NVML could not list, their work in the server's
        # samples where the driver reports those only. Unknown, as listed clients are; read
        # as 0 they would make busy clients look idle for as long as the list fails.
        unlisted = not mps_listed and "server" in roles.values()

        def sm(pid: int) -> float | None:
            if utilization is None:
                return None
            role = roles.get(pid)
            if not reported and (role == "client" or (
                    role is None and unlisted and "compute" in kinds_by_pid[pid])):
                # The driver reports the MPS server's samples only (or has not shown yet
                # which way it reports): this client's share of them is unknown, not 0.
                return None
            return utilization.get(pid, 0.0)

        samples = tuple(
            ProcessSample(
                pid=pid,
                kinds=tuple(kinds),
                memory_used_bytes=memory_by_pid[pid],
                sm_utilization_ratio=sm(pid),
                mps=roles.get(pid),
            )
            for pid, kinds in sorted(kinds_by_pid.items())
        )
        return samples, ok, reported

    def _process_query(self, dev: _Device, what: str, fault: NvmlFault | None) -> None:
        """Log a process query of ``dev`` that failed (``fault``) or answered (``None``):
        the first failure as a warning, the answer after failures as info, the failures in
        between at debug level (the ``nvml_processes`` part counts every round)."""
        key = (dev.uuid, what)
        if fault is None:
            if key in self._process_failures:
                self._process_failures.discard(key)
                log.info("%s on %s works again", what, dev.uuid)
        elif key in self._process_failures:
            log.debug("%s on %s failed again: %s", what, dev.uuid, fault.error)
        else:
            self._process_failures.add(key)
            log.warning("%s on %s failed: %s (logged again when it answers)", what, dev.uuid,
                        fault.error)

    def _list_mps(self, dev: _Device) -> tuple[calls.Processes, bool]:
        """The device's MPS clients (nvmlDeviceGetMPSComputeRunningProcesses) and whether the
        query succeeded. A device that answers NOT_SUPPORTED (before Volta) is not asked
        again; a failure leaves MPS out this round (logged once per device)."""
        if not dev.mps_supported:
            return [], True
        try:
            try:
                listed = read(self._mps_call, dev.handle)
            except pynvml.NVMLLibraryMismatchError:
                log.info("driver lacks the _v3 MPS process call; using _v2")
                self._mps_call = mps_compute_processes_v2
                listed = read(self._mps_call, dev.handle)
        except NvmlFault as fault:
            if fault.fault is not Fault.FAILED:
                raise
            if dev.uuid not in self._mps_failures:
                self._mps_failures.add(dev.uuid)
                log.warning("listing MPS processes on %s failed: %s", dev.uuid, fault.error)
            return [], False
        if listed is None:
            dev.mps_supported = False
            return [], True
        return listed, True

    def _mps_roles(
        self,
        kinds_by_pid: dict[int, list[ProcessKind]],
        memory_by_pid: dict[int, int | None],
        clients: calls.Processes,
    ) -> dict[int, MpsRole]:
        """Merge the MPS list into the compute and graphics ones (a client is one process:
        its memory, the same in both lists, counted once) and name each process's MPS role:
        ``client`` for the listed ones, ``server`` for ``nvidia-cuda-mps-server`` (by name,
        else by being the compute process beside the clients that the MPS list leaves
        out)."""
        roles: dict[int, MpsRole] = {}
        client_memory: dict[int, int | None] = {}
        for pid, used in clients:
            if pid in client_memory:  # one entry per compute instance: memory adds up
                known = client_memory[pid]
                client_memory[pid] = None if known is None or used is None else known + used
            else:
                client_memory[pid] = used
        for pid, used in client_memory.items():
            roles[pid] = "client"
            kinds = kinds_by_pid.setdefault(pid, [])
            if not kinds:
                kinds.append("compute")  # listed as an MPS process only
            known = memory_by_pid.get(pid)
            memory_by_pid[pid] = used if known is None else max(known, used or 0)
        if not client_memory and not self._names.enabled:
            return roles  # no client, no names: nothing says MPS runs here
        for pid, kinds in kinds_by_pid.items():
            if pid in roles or "compute" not in kinds:
                continue
            server = self._names.is_mps_server(pid)
            if server is None:  # the name cannot be read: its place in the lists tells
                server = bool(client_memory)
            if server:
                roles[pid] = "server"
        return roles

    def _list_processes(self, dev: _Device, kind: ProcessKind) -> calls.Processes:
        call = self._process_calls[kind]
        try:
            return read(call, dev.handle) or []
        except pynvml.NVMLLibraryMismatchError:
            # The driver predates the _v3 process calls (raised as pynvml raises this plain
            # Exception for the unversioned call). Use _v2 from now on instead of failing
            # every round.
            v2 = {
                "compute": calls.compute_processes_v2, "graphics": calls.graphics_processes_v2,
            }[kind]
            log.info("driver lacks the _v3 %s process call; using _v2", kind)
            self._process_calls[kind] = v2
            return read(v2, dev.handle) or []

    def _utilization_by_pid(self, dev: _Device) -> dict[int, float] | None:
        """Mean SM utilization ratio per PID over the samples NVML recorded since the device's
        cursor; advances the cursor to the newest sample returned, so each sample is counted
        exactly once. ``None`` when the device cannot report it (then never asked again)."""
        if not self._process_utilization or not dev.process_utilization_supported:
            return None
        # The driver stamps its samples with the wall clock: a cursor later than the wall
        # clock (it stepped back: NTP correcting a clock that was ahead) would find no sample
        # until the clock caught up, and every process would read 0 (idle) meanwhile. It
        # starts again as at the first read; samples stamped that far ahead of the wall
        # clock (taken before the step) are not counted (as busy time does: busy.py).
        until = int(self._clock() * 1_000_000) + CLOCK_SLACK_US
        if dev.util_cursor_us > until:
            dev.util_cursor_us = until - CLOCK_SLACK_US - int(_UTIL_LOOKBACK_SECONDS * 1e6)
        samples = read(calls.process_utilization, dev.handle, dev.util_cursor_us)
        if samples is None:
            dev.process_utilization_supported = False
            return None
        totals: dict[int, tuple[int, int]] = {}
        newest = dev.util_cursor_us
        for pid, timestamp_us, sm_percent in samples:
            if timestamp_us > until:
                continue
            total, n = totals.get(pid, (0, 0))
            totals[pid] = (total + sm_percent, n + 1)
            newest = max(newest, timestamp_us)
        dev.util_cursor_us = newest
        return {pid: ratio(total / n) for pid, (total, n) in totals.items()}
