"""The embedded store's per-step reductions of its stored samples, as PromQL computes them
in a range query: ``*_over_time`` over a step (:func:`bucket`), a counter's ``rate()`` and
``increase()`` (:func:`rate_bucket`, :func:`increase_bucket`; a drop is a reset), ``or``
(:func:`either`), several series as one (:func:`merged`); the work signals and a
straggler's evidence from them; a container's raw-sample statistics; the steps a GPU in MIG
mode has no slice (:func:`uncarved`)."""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from gpuscope.dashboard.series import (
    ContainerRef,
    Evidence,
    GpuRef,
    Holding,
    HoldingKey,
    PodInfo,
    PodKey,
    Series,
    UtilStats,
    Window,
    WorkSignals,
)


def bucket(
    times: Sequence[float], values: Sequence[float], evals: Sequence[float], rng: float,
    how: Callable[[Sequence[float]], float],
) -> Series:
    """Per evaluation time ``e``, ``how`` of the values in ``(e - rng, e]`` (like
    ``*_over_time(x[rng])`` in a range query); times without samples are left out."""
    out_t: list[float] = []
    out_v: list[float] = []
    for e in evals:
        lo = bisect.bisect_right(times, e - rng)
        hi = bisect.bisect_right(times, e)
        if hi > lo:
            out_t.append(e)
            out_v.append(how(values[lo:hi]))
    return Series(tuple(out_t), tuple(out_v))


def increase(values: Sequence[float]) -> float:
    """How much a counter grew over ``values`` (a drop is a reset: counting starts again
    from 0, as Prometheus' ``rate()`` does)."""
    total = 0.0
    for a, b in itertools.pairwise(values):
        total += b - a if b >= a else b
    return total


def rate_bucket(
    times: Sequence[float], values: Sequence[float], evals: Sequence[float], rng: float
) -> Series:
    """Per evaluation time ``e``, the counter's increase over its samples in
    ``(e - rng, e]`` divided by the time between the first and the last of them (the mean
    rate, like ``rate(x[rng])``); times with fewer than two samples are left out."""
    out_t: list[float] = []
    out_v: list[float] = []
    for e in evals:
        lo = bisect.bisect_right(times, e - rng)
        hi = bisect.bisect_right(times, e)
        if hi - lo >= 2 and times[hi - 1] > times[lo]:
            out_t.append(e)
            out_v.append(increase(values[lo:hi]) / (times[hi - 1] - times[lo]))
    return Series(tuple(out_t), tuple(out_v))


def increase_bucket(
    times: Sequence[float], values: Sequence[float], evals: Sequence[float], rng: float
) -> Series:
    """Per evaluation time ``e``, the counter's increase over its samples in ``(e - rng, e]``
    (:func:`increase`: a drop is a reset), like ``increase(x[rng])`` without Prometheus'
    extrapolation to the range's edges; times with fewer than two samples are left out, as
    Prometheus leaves them."""
    out_t: list[float] = []
    out_v: list[float] = []
    for e in evals:
        lo = bisect.bisect_right(times, e - rng)
        hi = bisect.bisect_right(times, e)
        if hi - lo >= 2:
            out_t.append(e)
            out_v.append(increase(values[lo:hi]))
    return Series(tuple(out_t), tuple(out_v))


def either(first: Series, second: Series | None) -> Series:
    """``first or second`` per time, as PromQL's ``or``: ``second`` where ``first`` has no
    point."""
    if second is None:
        return first
    points = {**second.at(), **first.at()}
    times = sorted(points)
    return Series(tuple(times), tuple(points[t] for t in times))



def gref(lab: Mapping[str, str]) -> GpuRef:
    return GpuRef(lab["node"], lab.get("uuid", ""))


def cref(lab: Mapping[str, str]) -> ContainerRef:
    return ContainerRef(lab["node"], lab.get("namespace", ""), lab.get("pod", ""),
                        lab.get("container", ""), lab.get("uuid", ""))


Selected = Mapping[str, list[tuple[dict[str, str], list[float], list[float]]]]


def merged(
    parts: Iterable[tuple[GpuRef, list[float], list[float]]], evals: Sequence[float],
    rng: float, how: Callable[[Sequence[float]], float],
) -> dict[GpuRef, Series]:
    """Several series per device bucketed as one (``how`` over all of their samples)."""
    points: dict[GpuRef, tuple[list[float], list[float]]] = {}
    for ref, times, values in parts:
        merged = points.setdefault(ref, ([], []))
        merged[0].extend(times)
        merged[1].extend(values)
    out = {}
    for ref, (times, values) in points.items():
        order = sorted(range(len(times)), key=times.__getitem__)
        out[ref] = bucket([times[i] for i in order], [values[i] for i in order], evals, rng,
                           how)
    return out


def work_signals(sel: Selected, window: Window, evals: Sequence[float], rng: float,
                  rate_rng: float, throttle_rates: bool = True) -> WorkSignals:
    """The work signals per step from the stored counters (see :class:`WorkSignals`); gauges
    over ``rng``, counters' rates over ``rate_rng``; the throttle rates where
    ``throttle_rates`` (the node view: the fleet page's throttled verdict asks its own step
    queries)."""
    def rates(name: str) -> dict[GpuRef, Series]:
        return {gref(lab): rate_bucket(t, v, evals, rate_rng)
                for lab, t, v in sel.get(name, [])}

    def means(name: str) -> dict[GpuRef, Series]:
        return {gref(lab): bucket(t, v, evals, rng, mean_of) for lab, t, v in sel.get(name, [])}

    busy, gauge = rates("gpu_busy_seconds_total"), means("gpu_utilization_ratio")
    energy, watts = rates("gpu_energy_joules_total"), means("gpu_power_watts")
    utilization = {ref: either(busy.get(ref, Series((), ())), gauge.get(ref))
                   for ref in set(busy) | set(gauge)}
    power = {ref: either(energy.get(ref, Series((), ())), watts.get(ref))
             for ref in set(energy) | set(watts)}
    sm = rates("gpu_sm_active_seconds_total")
    throttle: dict[GpuRef, dict[str, Series]] = {}
    for lab, t, v in sel.get("gpu_throttle_seconds_total", []) if throttle_rates else ():
        throttle.setdefault(gref(lab), {})[lab.get("reason", "")] = rate_bucket(
            t, v, evals, rate_rng)
    limits = {gref(lab): v[-1] for lab, t, v in sel.get("gpu_power_limit_watts", [])
              if t[-1] > window.start}
    limit_steps = {gref(lab): bucket(t, v, evals, rng, max)
                   for lab, t, v in sel.get("gpu_power_limit_watts", [])}
    return WorkSignals(
        utilization={ref: s for ref, s in utilization.items() if s.times},
        sm={ref: s for ref, s in sm.items() if s.times},
        tensor={ref: s for ref, s in rates("gpu_tensor_active_seconds_total").items()
                if s.times},
        dram={ref: s for ref, s in rates("gpu_dram_active_seconds_total").items() if s.times},
        power={ref: s for ref, s in power.items() if s.times},
        power_limit=limits,
        gpm=frozenset(ref for ref, s in sm.items() if s.times),
        throttle=throttle,
        power_limits={ref: s for ref, s in limit_steps.items() if s.times and ref in limits},
    )


def evidence(sel: Selected, window: Window, seconds: float) -> dict[GpuRef, Evidence]:
    """Per device, over the last ``seconds`` of the window: throttle seconds per second by
    reason (those above 0), mean SM clock and temperature."""
    since = window.end - seconds
    parts: dict[GpuRef, dict[str, Any]] = {}

    def recent(t: list[float], v: list[float]) -> tuple[list[float], list[float]]:
        lo = bisect.bisect_right(t, since)
        return t[lo:], v[lo:]

    for lab, t, v in sel.get("gpu_throttle_seconds_total", []):
        t, v = recent(t, v)
        if len(t) >= 2 and t[-1] > t[0]:
            rate = increase(v) / (t[-1] - t[0])
            if rate > 0:
                parts.setdefault(gref(lab), {}).setdefault("throttle", {})[
                    lab.get("reason", "")] = rate
    for name, key in (("gpu_sm_clock_hertz", "sm_clock"),
                      ("gpu_temperature_celsius", "temperature")):
        for lab, t, v in sel.get(name, []):
            t, v = recent(t, v)
            if v:
                parts.setdefault(gref(lab), {})[key] = mean_of(v)
    return {ref: Evidence(p.get("throttle", {}), p.get("sm_clock"), p.get("temperature"))
            for ref, p in parts.items()}


def slice_holder_lines(held: Mapping[tuple[str, str], Series], sm: Mapping[str, Series]
                       ) -> dict[str, Series]:
    """The node drill-down's lines of MIG slices' holders: NVML gives no per-container
    utilization on a MIG slice, so each holder (``held``: by (``namespace/pod/container``,
    the slice's index), the steps at which it held the slice) is drawn by its slice's SM
    activity (``sm``, by index; GPM) at those steps, its slice's use while it held it. A
    slice without GPM has no measure of its use: its holders get no line (never 0)."""
    out: dict[str, Series] = {}
    for (name, gpu), steps in sorted(held.items()):
        activity = sm.get(gpu)
        if activity is None:
            continue
        at = dict(zip(activity.times, activity.values, strict=True))
        times = [t for t in steps.times if t in at]
        if times:
            out[f"{name} (GPU {gpu}, its slice's SM activity)"] = Series(
                tuple(times), tuple(at[t] for t in times))
    return out


def mean_of(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def util_stats(values: Sequence[float], memory: float) -> UtilStats:
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return UtilStats(mean, math.sqrt(var), n, memory)



def holdings(held: Mapping[ContainerRef, Series], used: Mapping[ContainerRef, Series],
             pods: Mapping[PodKey, PodInfo], slices: Collection[GpuRef], window: Window
             ) -> dict[HoldingKey, Holding]:
    """Who held what over ``window`` (:class:`~gpuscope.dashboard.series.Holding`), as the
    Prometheus plan's query computes it: per step after the window's start, each container
    whose ``held`` value is above 0 holds ``1/n`` of its device (``n`` holders then) and used
    its ``used`` value (its mean utilization in the step) of it; summed per node, namespace,
    workload (its pod's, from ``pods``) and, for a MIG slice (``slices``), the slice."""
    start = window.start + 1e-9
    holders: dict[GpuRef, dict[float, int]] = {}
    for ref, series in held.items():
        at = holders.setdefault(ref.gpu, {})
        for t, v in zip(series.times, series.values, strict=True):
            if v > 0 and t > start:
                at[t] = at.get(t, 0) + 1
    out: dict[HoldingKey, list[float]] = {}
    for ref, series in held.items():
        counts = holders[ref.gpu]
        own = used.get(ref)
        use = own.at() if own is not None else {}
        info = pods.get(ref.pod_key)
        key = HoldingKey(ref.node, ref.namespace, info.workload if info is not None else "",
                         ref.uuid if ref.gpu in slices else "")
        sums = out.setdefault(key, [0.0, 0.0])
        for t, v in zip(series.times, series.values, strict=True):
            if v > 0 and t > start:
                sums[0] += 1.0 / counts[t]
                sums[1] += use.get(t, 0.0)
    return {k: Holding(h * window.step, u * window.step) for k, (h, u) in out.items()}


def uncarved(
    modes: Iterable[tuple[dict[str, str], list[float], list[float]]],
    utilization: Mapping[GpuRef, Sequence[float]],
    reported: Mapping[GpuRef, Sequence[float]],
    infos: Iterable[Mapping[str, str]],
    evals: Sequence[float],
    rng: float,
) -> dict[GpuRef, Series]:
    """Each whole GPU in MIG mode with no MIG slice (``uncarved_promql`` of
    :mod:`~gpuscope.dashboard.verdicts.idle`, as the stores judge it): 0 at each step at
    which its ``gpu_sharing_info`` says ``mig``, no slice of it (``infos``: ``gpu_info``
    over the window) reported (``reported``: each device's steps with a sample) and it had
    no utilization of its own (``utilization``: each device's steps with one)."""
    slices: dict[GpuRef, list[GpuRef]] = {}
    for lab in infos:
        if lab.get("parent_uuid"):
            slices.setdefault(GpuRef(lab["node"], lab["parent_uuid"]), []).append(gref(lab))
    # (Not a slice itself: a slice's mode is its GPU's.)
    every_slice = {s for refs in slices.values() for s in refs}
    out: dict[GpuRef, Series] = {}
    for lab, times, values in modes:
        ref = gref(lab)
        if lab.get("sharing") != "mig" or ref in every_slice:
            continue
        carved = {t for s in slices.get(ref, ()) for t in reported.get(s, ())}
        carved.update(utilization.get(ref, ()))
        steps = tuple(t for t in bucket(times, values, evals, rng, max).times
                      if t not in carved)
        if steps:
            out[ref] = Series(steps, tuple(0.0 for _ in steps))
    return out
