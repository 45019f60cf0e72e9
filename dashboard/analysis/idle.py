"""Idle GPUs and idle nodes.

- idle GPU: utilization < ``threshold`` (0.05) for >= ``duration`` (30 min), the duration
  shortened to the window and to the history collected (see :mod:`.common`). Judged on the
  per-step *maximum*, so a single busy sample inside a step makes the step busy.
- idle node: every whole GPU on it is idle. A GPU that reports no utilization (lost, or in
  MIG mode without per-slice utilization) cannot be shown idle, so its node is not idle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuscope.dashboard.analysis.common import holds, is_fresh, required_seconds, trailing_run
from gpuscope.dashboard.series import GpuInfo, GpuRef, Series, Window

IDLE_THRESHOLD = 0.05
IDLE_DURATION = 30 * 60.0


@dataclass(frozen=True, slots=True)
class GpuIdle:
    """The idle verdict of one device.

    ``idle_since``/``idle_seconds``: the trailing run below the threshold (None/0 when the
    latest step is busy); ``allocated_seconds``: the part of that run in which a container
    held the device; ``required_seconds``: how long it had to be idle (min(D, window,
    history)); ``history_seconds``: the history the verdict rests on.
    """

    ref: GpuRef
    idle: bool
    idle_since: float | None
    idle_seconds: float
    allocated_seconds: float
    required_seconds: float
    history_seconds: float
    has_data: bool = True

    @property
    def unallocated_seconds(self) -> float:
        return max(0.0, self.idle_seconds - self.allocated_seconds)


def idle_gpus(
    busy_max: Mapping[GpuRef, Series],
    window: Window,
    history_start: float,
    *,
    allocated: Mapping[GpuRef, Series] | None = None,
    threshold: float = IDLE_THRESHOLD,
    duration: float = IDLE_DURATION,
) -> dict[GpuRef, GpuIdle]:
    """Verdict for every device with utilization data.

    ``allocated`` (per step, a value > 0 where a container held the device) splits each idle
    run into allocated-idle and unallocated time.
    """
    required = required_seconds(duration, window, history_start)
    history = max(0.0, window.end - history_start)
    out: dict[GpuRef, GpuIdle] = {}
    for ref, series in busy_max.items():
        if not is_fresh(series.times, window):
            out[ref] = GpuIdle(ref, False, None, 0.0, 0.0, required, history, has_data=False)
            continue
        flags = [v < threshold for v in series.values]
        run = trailing_run(series.times, flags, window.step, history_start)
        if run is None:
            out[ref] = GpuIdle(ref, False, None, 0.0, 0.0, required, history)
            continue
        held = allocated.get(ref) if allocated is not None else None
        allocated_s = 0.0
        if held is not None:
            holding = {t for t, v in zip(held.times, held.values, strict=True) if v > 0}
            run_times = series.times[run.first_index:]
            n_held = sum(1 for t in run_times if t in holding)
            allocated_s = run.seconds * n_held / len(run_times)
        out[ref] = GpuIdle(
            ref, holds(run, required), run.start, run.seconds, allocated_s, required, history
        )
    return out


@dataclass(frozen=True, slots=True)
class NodeIdle:
    """A node all of whose GPUs are idle. ``idle_since`` is when the last of them went idle;
    the GPU-seconds are summed over its GPUs' own idle runs."""

    node: str
    gpus: int
    idle_since: float
    idle_gpu_seconds: float
    allocated_gpu_seconds: float
    allocated_gpus: int
    required_seconds: float
    history_seconds: float

    @property
    def unallocated_gpu_seconds(self) -> float:
        return max(0.0, self.idle_gpu_seconds - self.allocated_gpu_seconds)


def physical_gpus(gpus: Mapping[GpuRef, GpuInfo]) -> dict[str, list[GpuInfo]]:
    """Whole GPUs (not MIG slices) per node."""
    by_node: dict[str, list[GpuInfo]] = {}
    for info in gpus.values():
        if info.is_physical:
            by_node.setdefault(info.node, []).append(info)
    return by_node


def idle_nodes(
    gpus: Mapping[GpuRef, GpuInfo], verdicts: Mapping[GpuRef, GpuIdle]
) -> dict[str, NodeIdle]:
    """Nodes whose every whole GPU is idle."""
    out: dict[str, NodeIdle] = {}
    for node, infos in physical_gpus(gpus).items():
        found = [verdicts.get(info.ref) for info in infos]
        if not found or any(v is None or not v.idle for v in found):
            continue
        idle = [v for v in found if v is not None]
        out[node] = NodeIdle(
            node=node,
            gpus=len(idle),
            idle_since=max(v.idle_since or 0.0 for v in idle),
            idle_gpu_seconds=sum(v.idle_seconds for v in idle),
            allocated_gpu_seconds=sum(v.allocated_seconds for v in idle),
            allocated_gpus=sum(1 for v in idle if v.allocated_seconds > 0),
            required_seconds=idle[0].required_seconds,
            history_seconds=idle[0].history_seconds,
        )
    return out
