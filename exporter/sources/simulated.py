"""The simulated GPU source: turns a :class:`~gpuscope.exporter.sources.scenario.Scenario` into
snapshots.

Scenario time is ``clock() - start`` seconds (``start`` defaults to the clock at
construction). Every value in a snapshot is a pure function of the scenario and the scenario
time, so asking for time ``t`` always gives the same answer whatever was asked before; the
state kept (the energy integral, numerical work integrals, random patterns' sums) is cached in
a way that gives bit-identical results (see :meth:`SimulatedSource._energies`).

How device values follow from processes (all documented in ``docs/scenarios.md``):

- utilization ratio ``u = clamp(base_utilization + sum of running processes' values, 0, 1)``
- memory used (bytes) = ``memory_reserved`` + memory of running processes
- memory utilization ratio = ``clamp(memory_utilization_factor * u, 0, 1)``
- power load ``w = clamp(base_utilization + sum of values x each process's activity.power)``
  (``w == u`` unless a process draws less than its utilization says)
- power (W) = ``power_idle + (power_limit - power_idle) * w``
- temperature (C) and fan speed (ratio) move linearly from their idle to busy value with ``w``
- SM clock (Hz) is the idle clock when ``u == 0``, the busy clock otherwise
- energy (J) = integral of power from scenario time 0: a left Riemann sum over 1-second steps
  plus the partial step, so it is monotonic and independent of how often it is sampled.
- work signals are exact integrals of scenario time (closed forms of the patterns), so that a
  rate over any window is the mean over it: busy seconds = integral of ``u``; with ``gpm``,
  each GPM activity ``clamp(sum of values x the process's activity factor)`` (SM and graphics
  with ``base_utilization`` added) integrated, traffic likewise (bytes), SM occupancy its
  current value; throttle seconds per reason the integral of the GPU's throttle pattern.
  Where the processes of a device can add up to more than 1 (the clamp bites), the integral
  is numerical instead (midpoints of 0.25 s steps).
- health: ECC counts are the scenario's plus what its ``ecc`` faults' events added so far;
  the row remapper (a GPU's ``remapped_rows``) adds the rows of the ``row_remap`` faults whose
  window holds ``t`` and is pending / failed while one of them says so; ``lost`` and ``xid``
  faults as before.

A GPU in MIG mode reports no utilization (NVML answers NOT_SUPPORTED); its power,
temperature and clock follow its *activity*, ``clamp(base + sum over slices of
compute_slices / max(7, total compute slices) * slice load)``. Slices report memory and
processes; utilization (and busy time) only when the slice sets ``utilization_supported``;
GPM per slice from its own processes (the parent: the slices' activities weighted the same
way, their traffic summed).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from gpuscope.exporter.model import (
    THROTTLE_REASONS,
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
from gpuscope.exporter.sources.scenario import (
    ActivitySpec,
    EccFault,
    GpuSpec,
    Lifetime,
    LostFault,
    MigSliceSpec,
    NotSupportedFault,
    NvmlDownFault,
    ProcessSpec,
    RowRemapFault,
    Scenario,
    UtilizationPattern,
    Window,
    XidFault,
)

__all__ = ["ENERGY_STEP_SECONDS", "NUMERIC_SUBSTEPS", "SimulatedSource"]

#: Width of one step of the energy integral, in seconds of scenario time.
ENERGY_STEP_SECONDS = 1.0
#: Midpoints per second of a work integral that cannot be taken in closed form (processes
#: that add up to more than 1, so that the clamp bites).
NUMERIC_SUBSTEPS = 4
# Keep the running energy sums every this many steps, so going back in time (a test asking
# for an earlier time) restarts from the nearest checkpoint instead of from 0.
_CHECKPOINT_STEPS = 3600

_NO_FIELDS: frozenset[str] = frozenset()


def _clamp(value: float) -> float:
    return 0.0 if value < 0.0 else 1.0 if value > 1.0 else value


class _Term(Protocol):
    """Something with a value at scenario time ``t``, its integral from 0 and a bound."""

    @property
    def maximum(self) -> float: ...

    def value(self, t: float) -> float: ...

    def integral(self, t: float) -> float: ...


class _Proc:
    """A process with everything sample() needs precomputed."""

    __slots__ = (
        "activity", "always", "fn", "kinds", "lifetime", "maximum", "memory", "mps", "pattern",
        "pid",
    )

    def __init__(self, spec: ProcessSpec) -> None:
        self.pid: int = spec.pid
        self.mps: MpsRole | None = spec.mps
        self.kinds: tuple[ProcessKind, ...] = spec.kinds
        self.memory: int = spec.memory_bytes
        self.pattern: UtilizationPattern = spec.utilization
        self.fn: Callable[[float], float] = spec.utilization.value_at
        self.lifetime: Lifetime = spec.lifetime
        self.always: bool = spec.lifetime.always
        self.activity: ActivitySpec = spec.activity
        self.maximum: float = spec.utilization.maximum

    def value(self, t: float) -> float:
        """The process's utilization at scenario time ``t`` (0 while it does not run)."""
        if self.always:
            return self.fn(t)
        since = self.lifetime.incarnation_start(t)
        return 0.0 if since is None else self.fn(t - since)

    def integral(self, t: float) -> float:
        """The integral of :meth:`value` from scenario time 0 to ``t``, in closed form."""
        lt = self.lifetime
        end = t if lt.stop is None else min(t, lt.stop)
        if end <= lt.start:
            return 0.0
        run = end - lt.start
        once = self.pattern.integral
        if lt.period is None or lt.on is None:
            return once(run)
        cycles = math.floor(run / lt.period)
        rest = run - cycles * lt.period
        return cycles * once(lt.on) + once(min(rest, lt.on))


class _Numeric:
    """The integral of ``fn`` from 0 by the midpoint rule on NUMERIC_SUBSTEPS steps a second,
    whole seconds summed in order from 0 (or from an hourly checkpoint), so the result is
    bit-identical whatever times were asked before."""

    __slots__ = ("checkpoints", "fn", "seconds", "total")

    def __init__(self, fn: Callable[[float], float]) -> None:
        self.fn = fn
        self.seconds = 0
        self.total = 0.0
        self.checkpoints: dict[int, float] = {0: 0.0}

    def _second(self, k: int) -> float:
        h = 1.0 / NUMERIC_SUBSTEPS
        return sum(self.fn(k + (j + 0.5) * h) for j in range(NUMERIC_SUBSTEPS)) * h

    def integral(self, t: float) -> float:
        whole = math.floor(t)
        if whole < self.seconds:
            start = (whole // _CHECKPOINT_STEPS) * _CHECKPOINT_STEPS
            self.seconds, self.total = start, self.checkpoints[start]
        k, total = self.seconds, self.total
        while k < whole:
            total += self._second(k)
            k += 1
            if k % _CHECKPOINT_STEPS == 0:
                self.checkpoints[k] = total
        self.seconds, self.total = k, total
        h = 1.0 / NUMERIC_SUBSTEPS
        rest = t - whole
        j = 0
        while j * h < rest:
            a, b = j * h, min(rest, (j + 1) * h)
            total += self.fn(whole + (a + b) / 2) * (b - a)
            j += 1
        return total


class _Sum:
    """``base + sum of coefficient x term``, clamped to 1 for a ratio. Its integral is the same
    sum of the terms' exact integrals, unless the terms can add up to more than 1 and the
    clamp bites: then it is numerical."""

    __slots__ = ("_numeric", "_procs", "base", "clamp", "maximum", "terms")

    def __init__(
        self, base: float, terms: tuple[tuple[float, _Term], ...], clamp: bool = True
    ) -> None:
        self.base = base
        self.terms = tuple((c, term) for c, term in terms if c > 0.0)
        self.clamp = clamp
        bound = base + sum(c * term.maximum for c, term in self.terms)
        self.maximum = min(1.0, bound) if clamp else bound
        # Plain processes summed as they are (a utilization): the fast path of value().
        procs = tuple(term for c, term in self.terms if c == 1.0 and isinstance(term, _Proc))
        self._procs = procs if len(procs) == len(self.terms) else None
        self._numeric = _Numeric(self.value) if clamp and bound > 1.0 else None

    def value(self, t: float) -> float:
        if self._procs is not None:
            total = self.base + _running_sum(self._procs, t)
            return _clamp(total) if self.clamp else total
        total = self.base
        for c, term in self.terms:
            total += c * term.value(t)
        return _clamp(total) if self.clamp else total

    def integral(self, t: float) -> float:
        if self._numeric is not None:
            return self._numeric.integral(t)
        total = self.base * t
        for c, term in self.terms:
            total += c * term.integral(t)
        return total


#: (DeviceSample field, ActivitySpec factor, whether base_utilization adds to it, clamped)
_GPM_COUNTERS: tuple[tuple[str, str, bool, bool], ...] = (
    ("sm_active_seconds", "sm", True, True),
    ("tensor_active_seconds", "tensor", False, True),
    ("dram_active_seconds", "dram", False, True),
    ("graphics_active_seconds", "graphics", True, True),
    ("pcie_receive_bytes", "pcie_rx", False, False),
    ("pcie_transmit_bytes", "pcie_tx", False, False),
    ("nvlink_receive_bytes", "nvlink_rx", False, False),
    ("nvlink_transmit_bytes", "nvlink_tx", False, False),
)


class _Gpm:
    """The GPM integrands of one device: counters (integrated) and SM occupancy (a value)."""

    __slots__ = ("counters", "occupancy")

    def __init__(self, counters: tuple[tuple[str, _Sum], ...], occupancy: _Sum) -> None:
        self.counters = counters
        self.occupancy = occupancy

    @classmethod
    def of_processes(cls, base: float, procs: tuple[_Proc, ...]) -> _Gpm:
        counters = tuple(
            (name, _Sum(base if with_base else 0.0,
                        tuple((getattr(p.activity, factor), p) for p in procs), clamp))
            for name, factor, with_base, clamp in _GPM_COUNTERS
        )
        occupancy = _Sum(0.0, tuple((p.activity.occupancy, p) for p in procs))
        return cls(counters, occupancy)

    @classmethod
    def of_slices(cls, base: float, slices: tuple[_Slice, ...]) -> _Gpm:
        """A MIG parent: its slices' activities weighted by their share of the GPU's compute,
        their traffic summed."""
        counters = []
        for i, (name, _, with_base, clamp) in enumerate(_GPM_COUNTERS):
            terms = tuple(
                (s.weight if clamp else 1.0, s.gpm.counters[i][1])
                for s in slices if s.gpm is not None
            )
            counters.append((name, _Sum(base if with_base else 0.0, terms, clamp)))
        occupancy = _Sum(0.0, tuple(
            (s.weight, s.gpm.occupancy) for s in slices if s.gpm is not None
        ))
        return cls(tuple(counters), occupancy)

    def fields(self, t: float, uns: frozenset[str]) -> dict[str, float]:
        result = {name: s.integral(t) for name, s in self.counters if name not in uns}
        if "sm_occupancy_ratio" not in uns:
            result["sm_occupancy_ratio"] = self.occupancy.value(t)
        return result


def _running_sum(procs: tuple[_Proc, ...], t: float) -> float:
    """Sum of the utilization of the processes running at ``t``."""
    total = 0.0
    for p in procs:
        if p.always:
            total += p.fn(t)
        else:
            since = p.lifetime.incarnation_start(t)
            if since is not None:
                total += p.fn(t - since)
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


def _power_load(util: _Sum, base: float, procs: tuple[_Proc, ...]) -> _Sum:
    """The load power follows: the utilization itself unless a process draws less."""
    if all(p.activity.power == 1.0 for p in procs):
        return util
    return _Sum(base, tuple((p.activity.power, p) for p in procs))


class _Slice:
    __slots__ = (
        "faults", "gpm", "index", "model", "power", "procs", "spec", "unsupported", "util",
        "uuid", "weight",
    )

    def __init__(
        self,
        spec: MigSliceSpec,
        model: str,
        procs: tuple[_Proc, ...],
        weight: float,
        unsupported: frozenset[str],
        faults: tuple[tuple[Window, frozenset[str]], ...],
        gpm: bool,
    ) -> None:
        self.spec = spec
        self.index = spec.index
        self.uuid = spec.uuid
        self.model = f"{model} MIG {spec.profile}"
        self.procs = procs
        self.weight = weight
        self.unsupported = unsupported
        self.faults = faults
        self.util = _Sum(0.0, tuple((1.0, p) for p in procs))
        self.power = _power_load(self.util, 0.0, procs)
        self.gpm = _Gpm.of_processes(0.0, procs) if gpm else None


class _Gpu:
    """A GPU with its processes, slices and faults, precomputed for sample()."""

    __slots__ = (
        "eccs", "faults", "gpm", "index", "load", "lost", "mps", "power_span", "procs", "remap",
        "remaps", "slices", "spec", "temp_span", "throttle", "unsupported", "util", "xids",
    )

    def __init__(
        self,
        spec: GpuSpec,
        procs: tuple[_Proc, ...],
        slices: tuple[_Slice, ...],
        lost: tuple[Window, ...],
        xids: tuple[XidFault, ...],
        faults: tuple[tuple[Window, frozenset[str]], ...],
        eccs: tuple[EccFault, ...] = (),
        remaps: tuple[RowRemapFault, ...] = (),
    ) -> None:
        self.spec = spec
        self.index = str(spec.index)
        self.procs = procs
        self.mps = any(p.mps is not None for p in procs)  # CUDA MPS runs on it
        self.slices = slices
        self.lost = lost
        self.xids = xids
        self.faults = faults
        self.eccs = eccs
        self.remaps = remaps
        rows = spec.remapped_rows
        # What the row remapper reports outside every row_remap fault.
        self.remap: RowRemapping | None = None if rows is None else RowRemapping(
            rows.correctable, rows.uncorrectable, pending=False, failed=False
        )
        self.unsupported = spec.unsupported
        self.power_span = spec.power_limit_watts - spec.power_idle_watts
        self.temp_span = spec.temperature_busy_celsius - spec.temperature_idle_celsius
        base = spec.base_utilization
        self.gpm: _Gpm | None = None
        if slices:
            self.util: _Sum | None = None  # NVML: NOT_SUPPORTED on a MIG parent
            # The parent's activity: its slices' power loads weighted by their compute share.
            self.load = _Sum(base, tuple((s.weight, s.power) for s in slices))
            if spec.gpm:
                self.gpm = _Gpm.of_slices(base, slices)
        else:
            self.util = _Sum(base, tuple((1.0, p) for p in procs))
            self.load = _power_load(self.util, base, procs)
            if spec.gpm:
                self.gpm = _Gpm.of_processes(base, procs)
        patterns = dict(spec.throttle)
        self.throttle: tuple[tuple[str, UtilizationPattern | None], ...] = tuple(
            (reason, patterns.get(reason)) for reason in THROTTLE_REASONS
        )

    def power(self, t: float) -> float:
        """Power draw in watts at scenario time ``t``."""
        return self.spec.power_idle_watts + self.power_span * self.load.value(t)

    def throttle_at(self, t: float) -> tuple[ThrottleTime, ...]:
        return tuple(
            ThrottleTime(reason, 0.0 if pattern is None else pattern.integral(t))
            for reason, pattern in self.throttle
        )

    def ecc_at(self, t: float) -> tuple[int, int]:
        """(corrected, uncorrected) ECC errors at ``t``: the scenario's counts plus those of
        the ``ecc`` faults' events so far."""
        corrected, uncorrected = self.spec.ecc_corrected_errors, self.spec.ecc_uncorrected_errors
        for f in self.eccs:
            n = f.count_at(t)
            corrected += n * f.corrected
            uncorrected += n * f.uncorrected
        return corrected, uncorrected

    def row_remapping_at(self, t: float) -> RowRemapping | None:
        """The row remapper at ``t``: the GPU's rows plus those of the ``row_remap`` faults
        whose window holds ``t``, pending or failed while one of them says so."""
        base = self.remap
        if base is None or not self.remaps:
            return base
        corr, unc = base.correctable_rows, base.uncorrectable_rows
        pending = failed = False
        for f in self.remaps:
            if f.window.contains(t):
                corr += f.correctable
                unc += f.uncorrectable
                pending = pending or f.pending
                failed = failed or f.failed
        return RowRemapping(corr, unc, pending, failed)

    def xid_counts(self, t: float, start: float) -> tuple[XidCount, ...]:
        """The XID counts at scenario time ``t``, each with its last event's wall-clock time
        (``start`` + its scenario time)."""
        if not self.xids:
            return ()
        counts: dict[int, int] = {}
        last: dict[int, float] = {}
        for x in self.xids:
            n = x.count_at(t)
            if n:
                counts[x.code] = counts.get(x.code, 0) + n
                at = x.last_at(t)
                if at is not None:
                    last[x.code] = max(last.get(x.code, at), at)
        return tuple(XidCount(code, counts[code], start + last[code]) for code in sorted(counts))


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
        eccs: dict[int, list[EccFault]] = {}
        remaps: dict[int, list[RowRemapFault]] = {}
        ns: dict[str, list[tuple[Window, frozenset[str]]]] = {}
        down: list[Window] = []
        for f in scenario.faults:
            if isinstance(f, LostFault):
                lost.setdefault(f.gpu, []).append(f.window)
            elif isinstance(f, XidFault):
                xids.setdefault(f.gpu, []).append(f)
            elif isinstance(f, EccFault):
                eccs.setdefault(f.gpu, []).append(f)
            elif isinstance(f, RowRemapFault):
                remaps.setdefault(f.gpu, []).append(f)
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
                    g.gpm,
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
                tuple(eccs.get(g.index, ())),
                tuple(remaps.get(g.index, ())),
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
        xid = gpu.xid_counts(t, self.start)
        for window in gpu.lost:
            if window.contains(t):
                out.append(DeviceSample(
                    index=gpu.index, uuid=spec.uuid, model=spec.model, up=False,
                    pci_bus_id=spec.pci_bus_id, architecture=spec.architecture, xid_errors=xid,
                    mig_mode=spec.mig_enabled,
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
        busy: float | None = None
        processes: tuple[ProcessSample, ...] = ()
        mps_reported: bool | None = None
        slice_samples: list[DeviceSample] = []
        if gpu.slices:
            util = mem_util = None  # NVML: NOT_SUPPORTED on a MIG parent
            mem_used = spec.memory_reserved_bytes
            for s in gpu.slices:
                sample, slice_mem = self._sample_slice(s, gpu, t)
                mem_used += slice_mem
                slice_samples.append(sample)
            load = gpu.load.value(t)
            clocked = load > 0.0
        else:
            procs, total, mem_used = _sample_procs(
                gpu.procs, t, "process_utilization" in uns, "process_memory" in uns
            )
            processes = procs
            if gpu.mps:
                processes, mps_reported = _mps_view(procs, spec.mps_client_utilization)
            mem_used += spec.memory_reserved_bytes
            util = _clamp(spec.base_utilization + total)
            load = util if gpu.load is gpu.util else gpu.load.value(t)
            clocked = util > 0.0
            mem_util = _clamp(spec.memory_utilization_factor * util)
            if gpu.util is not None and "busy_seconds" not in uns:
                busy = gpu.util.integral(t)
        work = gpu.gpm.fields(t, uns) if gpu.gpm is not None else {}
        throttle = () if "throttle_seconds" in uns else gpu.throttle_at(t)
        ecc_corrected, ecc_uncorrected = gpu.ecc_at(t)
        fan: float | None = None
        if spec.fan_idle_ratio is not None and spec.fan_busy_ratio is not None:
            fan = spec.fan_idle_ratio + (spec.fan_busy_ratio - spec.fan_idle_ratio) * load
        out.append(DeviceSample(
            index=gpu.index,
            uuid=spec.uuid,
            model=spec.model,
            pci_bus_id=spec.pci_bus_id,
            architecture=spec.architecture,
            mig_mode=spec.mig_enabled,
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
                else spec.sm_clock_busy_hertz if clocked else spec.sm_clock_idle_hertz
            ),
            memory_clock_hertz=None if "memory_clock_hertz" in uns else spec.memory_clock_hertz,
            fan_speed_ratio=None if "fan_speed_ratio" in uns else fan,
            ecc_corrected_errors=None if "ecc_corrected_errors" in uns else ecc_corrected,
            ecc_uncorrected_errors=(
                None if "ecc_uncorrected_errors" in uns else ecc_uncorrected
            ),
            row_remapping=None if "row_remapping" in uns else gpu.row_remapping_at(t),
            busy_seconds=busy,
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
            xid_errors=xid,
            processes=processes,
            mps_client_utilization_reported=mps_reported,
        ))
        out.extend(slice_samples)

    def _sample_slice(
        self, s: _Slice, gpu: _Gpu, t: float
    ) -> tuple[DeviceSample, int]:
        """A MIG slice's sample and its memory in use (bytes) at ``t``."""
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
        busy = s.util.integral(t) if supported and "busy_seconds" not in uns else None
        work = s.gpm.fields(t, uns) if s.gpm is not None else {}
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
            busy_seconds=busy,
            sm_active_seconds=work.get("sm_active_seconds"),
            tensor_active_seconds=work.get("tensor_active_seconds"),
            dram_active_seconds=work.get("dram_active_seconds"),
            graphics_active_seconds=work.get("graphics_active_seconds"),
            sm_occupancy_ratio=work.get("sm_occupancy_ratio"),
            pcie_receive_bytes=work.get("pcie_receive_bytes"),
            pcie_transmit_bytes=work.get("pcie_transmit_bytes"),
            nvlink_receive_bytes=work.get("nvlink_receive_bytes"),
            nvlink_transmit_bytes=work.get("nvlink_transmit_bytes"),
            processes=procs,
        )
        return sample, mem_used


def _sample_procs(
    procs: tuple[_Proc, ...], t: float, no_util: bool, no_memory: bool
) -> tuple[tuple[ProcessSample, ...], float, int]:
    """The running processes' samples, their summed utilization and memory (bytes)."""
    samples: list[ProcessSample] = []
    total = 0.0
    memory = 0
    for p in procs:
        if p.always:
            v = p.fn(t)
        else:
            since = p.lifetime.incarnation_start(t)
            if since is None:
                continue
            v = p.fn(t - since)
        total += v
        memory += p.memory
        samples.append(ProcessSample(
            p.pid, p.kinds, None if no_memory else p.memory, None if no_util else v, p.mps
        ))
    return tuple(samples), total, memory


def _mps_view(
    samples: tuple[ProcessSample, ...], clients_reported: bool
) -> tuple[tuple[ProcessSample, ...], bool | None]:
    """What NVML reports of a GPU's running processes under CUDA MPS, and whether clients'
    utilization is reported (``None``: no MPS process runs, or no utilization at all). With
    ``clients_reported`` off (as an H200 with driver 580.159.04 answers) the clients have no
    utilization and the server's carries theirs (at most 1)."""
    if not any(s.mps is not None for s in samples):
        return samples, None
    if any(s.sm_utilization_ratio is None for s in samples):
        return samples, None  # process_utilization not supported: nothing to tell
    if clients_reported:
        return samples, True
    clients = sum(s.sm_utilization_ratio or 0.0 for s in samples if s.mps == "client")
    return tuple(
        replace(s, sm_utilization_ratio=None) if s.mps == "client"
        else replace(s, sm_utilization_ratio=min(1.0, (s.sm_utilization_ratio or 0.0) + clients))
        if s.mps == "server" else s
        for s in samples
    ), False
