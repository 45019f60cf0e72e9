"""Stragglers: within one workload (the pods of one job, ``gpu_pod_info``'s ``workload``),
a GPU whose utilization is below ``factor`` (0.5) x the workload's median for >= ``duration``
(10 min, shortened to the window and the history collected).

A "GPU" here is one device as the workload uses it: the summed utilization of the
workload's containers on that device. The median is taken over the workload's devices at
each step (the straggler included); a workload needs >= 2 devices to be compared.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from gpuscope.dashboard.analysis.common import holds, is_fresh, required_seconds, trailing_run
from gpuscope.dashboard.series import ContainerRef, GpuRef, PodInfo, PodKey, Series, Window

STRAGGLER_FACTOR = 0.5
STRAGGLER_DURATION = 10 * 60.0


@dataclass(frozen=True, slots=True)
class Straggler:
    """``utilization`` and ``median`` are means over the straggling run."""

    namespace: str
    workload: str
    gpu: GpuRef
    pods: tuple[str, ...]
    utilization: float
    median: float
    since: float
    seconds: float
    required_seconds: float
    devices: int

    @property
    def ratio(self) -> float:
        return self.utilization / self.median if self.median > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StragglerReport:
    stragglers: tuple[Straggler, ...]
    workloads_checked: int


def stragglers(
    containers: Mapping[ContainerRef, Series],
    pods: Mapping[PodKey, PodInfo],
    window: Window,
    history_start: float,
    *,
    factor: float = STRAGGLER_FACTOR,
    duration: float = STRAGGLER_DURATION,
) -> StragglerReport:
    required = required_seconds(duration, window, history_start)
    # (namespace, workload) -> device -> {time: summed utilization}, and the pods per device.
    workloads: dict[tuple[str, str], dict[GpuRef, dict[float, float]]] = {}
    pod_names: dict[tuple[str, str, GpuRef], set[str]] = {}
    for ref, series in containers.items():
        info = pods.get(ref.pod_key)
        if info is None or not info.workload:
            continue
        key = (ref.namespace, info.workload)
        per_time = workloads.setdefault(key, {}).setdefault(ref.gpu, {})
        for t, v in zip(series.times, series.values, strict=True):
            per_time[t] = per_time.get(t, 0.0) + v
        pod_names.setdefault((*key, ref.gpu), set()).add(ref.pod)

    found: list[Straggler] = []
    checked = 0
    for (namespace, workload), devices in workloads.items():
        if len(devices) < 2:
            continue
        checked += 1
        times = sorted({t for values in devices.values() for t in values})
        medians: dict[float, float] = {}
        for t in times:
            present = [values[t] for values in devices.values() if t in values]
            if len(present) >= 2:
                medians[t] = statistics.median(present)
        for gpu, values in devices.items():
            own = sorted(values)
            if not is_fresh(own, window):
                continue
            flags = [t in medians and values[t] < factor * medians[t] for t in own]
            run = trailing_run(own, flags, window.step, history_start)
            if not holds(run, required) or run is None:
                continue
            run_times = own[run.first_index:]
            found.append(Straggler(
                namespace=namespace,
                workload=workload,
                gpu=gpu,
                pods=tuple(sorted(pod_names[(namespace, workload, gpu)])),
                utilization=sum(values[t] for t in run_times) / len(run_times),
                median=sum(medians[t] for t in run_times) / len(run_times),
                since=run.start,
                seconds=run.seconds,
                required_seconds=required,
                devices=len(devices),
            ))
    found.sort(key=lambda s: (s.namespace, s.workload, s.gpu))
    return StragglerReport(tuple(found), checked)
