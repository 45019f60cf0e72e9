"""The simulated GPU source: turns a :class:`~gpuscope.exporter.sources.scenario.Scenario` into
snapshots.

Scenario time is ``clock() - start`` seconds (``start`` defaults to the clock at
construction). Every value in a snapshot is a pure function of the scenario and the scenario
time, so asking for time ``t`` always gives the same answer whatever was asked before; the
one piece of state, the energy integral, is cached in a way that gives bit-identical results
(see :meth:`SimulatedSource._energies`).

How device values follow from processes (all documented in ``docs/scenarios.md``):

- utilization ratio ``u = clamp(base_utilization + sum of running processes' values, 0, 1)``
- memory used (bytes) = ``memory_reserved`` + memory of running processes
- memory utilization ratio = ``clamp(memory_utilization_factor * u, 0, 1)``
- power (W) = ``power_idle + (power_limit - power_idle) * u``
- temperature (C) and fan speed (ratio) move linearly from their idle to busy value with ``u``
- SM clock (Hz) is the idle clock when ``u == 0``, the busy clock otherwise
- energy (J) = integral of power from scenario time 0: a left Riemann sum over 1-second steps
  plus the partial step, so it is monotonic and independent of how often it is sampled.

A GPU in MIG mode reports no utilization (NVML answers NOT_SUPPORTED); its power,
temperature and clock follow its *activity*, ``clamp(base + sum over slices of
compute_slices / max(7, total compute slices) * slice load)``. Slices report memory and
processes; utilization only when the slice sets ``utilization_supported`` (GPM).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from gpuscope.exporter.model import (
    DeviceSample,
    PartResult,
    ProcessKind,
    ProcessSample,
    Snapshot,
    XidCount,
)
from gpuscope.exporter.sources.scenario import (
    GpuSpec,
    Lifetime,
    LostFault,
    MigSliceSpec,
    NotSupportedFault,
    NvmlDownFault,
    ProcessSpec,
    Scenario,
    Window,
    XidFault,
)

__all__ = ["ENERGY_STEP_SECONDS", "SimulatedSource"]

#: Width of one step of the energy integral, in seconds of scenario time.
ENERGY_STEP_SECONDS = 1.0
# Keep the running energy sums every this many steps, so going back in time (a test asking
# for an earlier time) restarts from the nearest checkpoint instead of from 0.
_CHECKPOINT_STEPS = 3600

_NO_FIELDS: frozenset[str] = frozenset()


def _clamp(value: float) -> float:
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


class _Proc:
    """A process with everything sample() needs precomputed."""

    __slots__ = ("always", "kinds", "lifetime", "memory", "pid", "value")

    def __init__(self, spec: ProcessSpec) -> None:
        self.pid: int = spec.pid
        self.kinds: tuple[ProcessKind, ...] = spec.kinds
        self.memory: int = spec.memory_bytes
        self.value: Callable[[float], float] = spec.utilization.value_at
        self.lifetime: Lifetime = spec.lifetime
        self.always: bool = spec.lifetime.always


def _running_sum(procs: tuple[_Proc, ...], t: float) -> float:
    """Sum of the utilization of the processes running at ``t``."""
    total = 0.0
    for p in procs:
        if p.always:
            total += p.value(t)
        else:
            since = p.lifetime.incarnation_start(t)
            if since is not None:
                total += p.value(t - since)
    return total


def _fields_at(
    static: frozenset[str], faults: tuple[tuple[Window, frozenset[str]], ...], t: float
) -> frozenset[str]:
    if not faults:
        return static
    result = static
    for window, fields in faults:
        if window.contains(t):
            result = result | fields
    return result


class _Slice:
    __slots__ = ("faults", "index", "model", "procs", "spec", "unsupported", "uuid", "weight")

    def __init__(
        self,
        spec: MigSliceSpec,
        model: str,
        procs: tuple[_Proc, ...],
        weight: float,
        unsupported: frozenset[str],
        faults: tuple[tuple[Window, frozenset[str]], ...],
    ) -> None:
        self.spec = spec
        self.index = spec.index
        self.uuid = spec.uuid
        self.model = f"{model} MIG {spec.profile}"
        self.procs = procs
        self.weight = weight
        self.unsupported = unsupported
        self.faults = faults


class _Gpu:
    """A GPU with its processes, slices and faults, precomputed for sample()."""

    __slots__ = (
        "faults", "index", "lost", "power_span", "procs", "slices", "spec", "temp_span",
        "unsupported", "xids",
    )

    def __init__(
        self,
        spec: GpuSpec,
        procs: tuple[_Proc, ...],
        slices: tuple[_Slice, ...],
        lost: tuple[Window, ...],
        xids: tuple[XidFault, ...],
        faults: tuple[tuple[Window, frozenset[str]], ...],
    ) -> None:
        self.spec = spec
        self.index = str(spec.index)
        self.procs = procs
        self.slices = slices
        self.lost = lost
        self.xids = xids
        self.faults = faults
        self.unsupported = spec.unsupported
        self.power_span = spec.power_limit_watts - spec.power_idle_watts
        self.temp_span = spec.temperature_busy_celsius - spec.temperature_idle_celsius

    def load(self, t: float) -> float:
        """Utilization (plain GPU) or activity (MIG parent) at scenario time ``t``, 0..1."""
        if not self.slices:
            return _clamp(self.spec.base_utilization + _running_sum(self.procs, t))
        total = self.spec.base_utilization
        for s in self.slices:
            total += s.weight * _clamp(_running_sum(s.procs, t))
        return _clamp(total)

    def power(self, t: float) -> float:
        """Power draw in watts at scenario time ``t``."""
        return self.spec.power_idle_watts + self.power_span * self.load(t)

    def xid_counts(self, t: float) -> tuple[XidCount, ...]:
        if not self.xids:
            return ()
        counts: dict[int, int] = {}
        for x in self.xids:
            n = x.count_at(t)
            if n:
                counts[x.code] = counts.get(x.code, 0) + n
        return tuple(XidCount(code, counts[code]) for code in sorted(counts))


class SimulatedSource:
    """A :class:`~gpuscope.exporter.model.Source` that plays a scenario.

    ``clock`` gives wall-clock seconds (snapshot timestamps); scenario time is
    ``clock() - start`` seconds, clamped at 0, with ``start`` defaulting to the clock at
    construction. Deterministic: the snapshot for a scenario time depends on nothing else.
    """

    name = "simulated"

    def __init__(
        self,
        scenario: Scenario,
        clock: Callable[[], float] = time.time,
        start: float | None = None,
    ) -> None:
        self.scenario = scenario
        self._clock = clock
        self.start: float = clock() if start is None else start
        self._driver_version = scenario.node.driver_version

        procs_by_device: dict[str, list[_Proc]] = {}
        for p in scenario.processes:
            procs_by_device.setdefault(p.device.device_index, []).append(_Proc(p))
        lost: dict[int, list[Window]] = {}
        xids: dict[int, list[XidFault]] = {}
        ns: dict[str, list[tuple[Window, frozenset[str]]]] = {}
        down: list[Window] = []
        for f in scenario.faults:
            if isinstance(f, LostFault):
                lost.setdefault(f.gpu, []).append(f.window)
            elif isinstance(f, XidFault):
                xids.setdefault(f.gpu, []).append(f)
            elif isinstance(f, NvmlDownFault):
                down.append(f.window)
            elif isinstance(f, NotSupportedFault):
                ns.setdefault(f.device.device_index, []).append((f.window, f.fields))
        self._down: tuple[Window, ...] = tuple(down)

        gpus: list[_Gpu] = []
        for g in scenario.gpus:
            total_slices = max(7, sum(s.compute_slices for s in g.mig))
            slices = tuple(
                _Slice(
                    s,
                    g.model,
                    tuple(procs_by_device.get(s.index, ())),
                    s.compute_slices / total_slices,
                    s.unsupported,
                    tuple(ns.get(s.index, ())),
                )
                for s in g.mig
            )
            gpus.append(_Gpu(
                g,
                tuple(procs_by_device.get(str(g.index), ())),
                slices,
                tuple(lost.get(g.index, ())),
                tuple(xids.get(g.index, ())),
                tuple(ns.get(str(g.index), ())),
            ))
        self._gpus: tuple[_Gpu, ...] = tuple(gpus)

        # Energy integral state: sums[g] = sum of power(k * STEP) * STEP for k < steps_done.
        self._steps_done = 0
        self._sums: list[float] = [0.0] * len(gpus)
        self._checkpoints: dict[int, tuple[float, ...]] = {0: tuple(self._sums)}
        self._last_step: tuple[int, tuple[float, ...]] | None = None

    # -- Source protocol -----------------------------------------------------------------
    def sample(self) -> Snapshot:
        """One snapshot at the current scenario time."""
        began = time.perf_counter()
        now = self._clock()
        snap = self.sample_at(now - self.start, timestamp=now)
        duration = time.perf_counter() - began
        return Snapshot(
            timestamp=snap.timestamp,
            source_up=snap.source_up,
            driver_version=snap.driver_version,
            devices=snap.devices,
            parts=(PartResult("simulated", snap.source_up, duration),),
        )

    def close(self) -> None:
        """Nothing to release."""

    # -- the simulation ------------------------------------------------------------------
    def sample_at(self, t: float, timestamp: float | None = None) -> Snapshot:
        """The snapshot at scenario time ``t`` seconds (negative times count as 0).

        ``timestamp`` (wall-clock seconds) defaults to ``start + t``. ``parts`` is empty;
        :meth:`sample` adds the timing.
        """
        t = max(0.0, t)
        ts = self.start + t if timestamp is None else timestamp
        for window in self._down:
            if window.contains(t):
                return Snapshot(timestamp=ts, source_up=False)
        energies = self._energies(t)
        devices: list[DeviceSample] = []
        for gpu, energy in zip(self._gpus, energies, strict=True):
            self._sample_gpu(gpu, t, energy, devices)
        return Snapshot(
            timestamp=ts,
            source_up=True,
            driver_version=self._driver_version,
            devices=tuple(devices),
        )

    def _energies(self, t: float) -> list[float]:
        """Energy in joules of every GPU since scenario time 0, at time ``t``.

        Sum of ``power(k * STEP) * STEP`` over whole steps before ``t``, plus
        ``power(K * STEP) * (t - K * STEP)`` for the partial step K. The whole-step sums are
        always accumulated in the same order from 0 (or from a checkpoint that was), so the
        result is bit-identical whatever times were asked before.
        """
        step = ENERGY_STEP_SECONDS
        k_target = math.floor(t / step)
        if k_target < self._steps_done:
            base = (k_target // _CHECKPOINT_STEPS) * _CHECKPOINT_STEPS
            self._steps_done = base
            self._sums = list(self._checkpoints[base])
        sums = self._sums
        k = self._steps_done
        while k < k_target:
            powers = self._powers_at_step(k)
            for i, p in enumerate(powers):
                sums[i] += p * step
            k += 1
            if k % _CHECKPOINT_STEPS == 0:
                self._checkpoints[k] = tuple(sums)
        self._steps_done = k
        partial = t - k_target * step
        if partial == 0.0:
            return list(sums)
        powers = self._powers_at_step(k_target)
        return [s + p * partial for s, p in zip(sums, powers, strict=True)]

    def _powers_at_step(self, k: int) -> tuple[float, ...]:
        """Every GPU's power (W) at the start of integration step ``k``. The last one asked
        for is kept: the partial step of one sample is the first whole step of the next."""
        if self._last_step is not None and self._last_step[0] == k:
            return self._last_step[1]
        tk = k * ENERGY_STEP_SECONDS
        powers = tuple(gpu.power(tk) for gpu in self._gpus)
        self._last_step = (k, powers)
        return powers

    def _sample_gpu(self, gpu: _Gpu, t: float, energy: float, out: list[DeviceSample]) -> None:
        spec = gpu.spec
        xid = gpu.xid_counts(t)
        for window in gpu.lost:
            if window.contains(t):
                out.append(DeviceSample(
                    index=gpu.index, uuid=spec.uuid, model=spec.model, up=False,
                    pci_bus_id=spec.pci_bus_id, architecture=spec.architecture, xid_errors=xid,
                ))
                for s in gpu.slices:
                    out.append(DeviceSample(
                        index=s.index, uuid=s.uuid, model=s.model, up=False,
                        pci_bus_id=spec.pci_bus_id, parent_uuid=spec.uuid,
                        mig_profile=s.spec.profile, architecture=spec.architecture,
                    ))
                return
        uns = _fields_at(gpu.unsupported, gpu.faults, t)
        util: float | None
        mem_util: float | None
        processes: tuple[ProcessSample, ...] = ()
        slice_samples: list[DeviceSample] = []
        if gpu.slices:
            util = mem_util = None  # NVML: NOT_SUPPORTED on a MIG parent
            activity = spec.base_utilization
            mem_used = spec.memory_reserved_bytes
            for s in gpu.slices:
                sample, slice_load, slice_mem = self._sample_slice(s, gpu, t)
                activity += s.weight * slice_load
                mem_used += slice_mem
                slice_samples.append(sample)
            load = _clamp(activity)
        else:
            procs, total, mem_used = _sample_procs(
                gpu.procs, t, "process_utilization" in uns, "process_memory" in uns
            )
            processes = procs
            mem_used += spec.memory_reserved_bytes
            load = util = _clamp(spec.base_utilization + total)
            mem_util = _clamp(spec.memory_utilization_factor * util)
        fan: float | None = None
        if spec.fan_idle_ratio is not None and spec.fan_busy_ratio is not None:
            fan = spec.fan_idle_ratio + (spec.fan_busy_ratio - spec.fan_idle_ratio) * load
        out.append(DeviceSample(
            index=gpu.index,
            uuid=spec.uuid,
            model=spec.model,
            pci_bus_id=spec.pci_bus_id,
            architecture=spec.architecture,
            utilization_ratio=None if "utilization_ratio" in uns else util,
            memory_utilization_ratio=None if "memory_utilization_ratio" in uns else mem_util,
            memory_used_bytes=None if "memory_used_bytes" in uns else mem_used,
            memory_total_bytes=None if "memory_total_bytes" in uns else spec.memory_total_bytes,
            temperature_celsius=(
                None if "temperature_celsius" in uns
                else spec.temperature_idle_celsius + gpu.temp_span * load
            ),
            power_watts=(
                None if "power_watts" in uns
                else spec.power_idle_watts + gpu.power_span * load
            ),
            power_limit_watts=None if "power_limit_watts" in uns else spec.power_limit_watts,
            energy_joules=None if "energy_joules" in uns else energy,
            sm_clock_hertz=(
                None if "sm_clock_hertz" in uns
                else spec.sm_clock_busy_hertz if load > 0.0 else spec.sm_clock_idle_hertz
            ),
            memory_clock_hertz=None if "memory_clock_hertz" in uns else spec.memory_clock_hertz,
            fan_speed_ratio=None if "fan_speed_ratio" in uns else fan,
            ecc_corrected_errors=(
                None if "ecc_corrected_errors" in uns else spec.ecc_corrected_errors
            ),
            ecc_uncorrected_errors=(
                None if "ecc_uncorrected_errors" in uns else spec.ecc_uncorrected_errors
            ),
            xid_errors=xid,
            processes=processes,
        ))
        out.extend(slice_samples)

    def _sample_slice(
        self, s: _Slice, gpu: _Gpu, t: float
    ) -> tuple[DeviceSample, float, int]:
        """A MIG slice's sample, its load (0..1) and its memory in use (bytes) at ``t``."""
        spec = gpu.spec
        uns = _fields_at(s.unsupported, s.faults, t)
        supported = s.spec.utilization_supported
        procs, total, mem_used = _sample_procs(
            s.procs, t, not supported or "process_utilization" in uns, "process_memory" in uns
        )
        load = _clamp(total)
        util = load if supported and "utilization_ratio" not in uns else None
        mem_util: float | None = None
        if supported and "memory_utilization_ratio" not in uns:
            mem_util = _clamp(spec.memory_utilization_factor * load)
        sample = DeviceSample(
            index=s.index,
            uuid=s.uuid,
            model=s.model,
            pci_bus_id=spec.pci_bus_id,
            parent_uuid=spec.uuid,
            mig_profile=s.spec.profile,
            architecture=spec.architecture,
            utilization_ratio=util,
            memory_utilization_ratio=mem_util,
            memory_used_bytes=None if "memory_used_bytes" in uns else mem_used,
            memory_total_bytes=(
                None if "memory_total_bytes" in uns else s.spec.memory_total_bytes
            ),
            processes=procs,
        )
        return sample, load, mem_used


def _sample_procs(
    procs: tuple[_Proc, ...], t: float, no_util: bool, no_memory: bool
) -> tuple[tuple[ProcessSample, ...], float, int]:
    """The running processes' samples, their summed utilization and memory (bytes)."""
    samples: list[ProcessSample] = []
    total = 0.0
    memory = 0
    for p in procs:
        if p.always:
            v = p.value(t)
        else:
            since = p.lifetime.incarnation_start(t)
            if since is None:
                continue
            v = p.value(t - since)
        total += v
        memory += p.memory
        samples.append(ProcessSample(
            p.pid, p.kinds, None if no_memory else p.memory, None if no_util else v
        ))
    return tuple(samples), total, memory
