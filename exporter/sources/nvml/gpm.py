"""GPM (GPU Performance Monitoring, Hopper and newer): SM, tensor, DRAM and graphics activity,
SM occupancy and PCIe/NVLink traffic, per GPU and per MIG GPU instance.

GPM gives means between two samples of the GPU's counters: ``nvmlGpmSampleGet`` (or
``nvmlGpmMigSampleGet`` for one MIG GPU instance) fills a sample buffer, and
``nvmlGpmMetricsGet`` computes every asked metric between the previous and the current
sample, each metric with its own return code. Each target (a GPU, or a GPU instance) has two
buffers, allocated once per NVML session and used in turn (the current one becomes the
previous one), freed when the session ends.

The means become counters, so that ``rate()`` over any window is the exact mean: activity
ratio x elapsed seconds (``*_active_seconds``), MiB/s x 1048576 x elapsed (bytes). SM
occupancy stays a gauge (the last interval's mean).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml

from gpuscope.exporter.sources.nvml import calls
from gpuscope.exporter.sources.nvml.calls import Fault, NvmlFault, quietly, read

log = logging.getLogger(__name__)

MIB = 1048576
# (metric id, DeviceSample field, scale): a counter adds value x scale x elapsed seconds.
COUNTERS: tuple[tuple[int, str, float], ...] = (
    (pynvml.NVML_GPM_METRIC_SM_UTIL, "sm_active_seconds", 0.01),
    (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "tensor_active_seconds", 0.01),
    (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, "dram_active_seconds", 0.01),
    (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, "graphics_active_seconds", 0.01),
    (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, "pcie_receive_bytes", MIB),
    (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "pcie_transmit_bytes", MIB),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "nvlink_receive_bytes", MIB),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "nvlink_transmit_bytes", MIB),
)
OCCUPANCY = (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, "sm_occupancy_ratio")
METRIC_IDS: tuple[int, ...] = (*(m for m, _, _ in COUNTERS), OCCUPANCY[0])
# NVML: samples closer than this are refreshed internally and give no valid metrics.
MIN_INTERVAL_SECONDS = 0.1


@dataclass(slots=True)
class GpmTotals:
    """One device's GPM counters (and the occupancy gauge), kept across NVML sessions.
    ``present`` holds the fields whose metric answered in the last GPM interval: the others
    are absent until theirs answers again (their count is kept)."""

    values: dict[str, float] = field(default_factory=dict)
    present: frozenset[str] = frozenset()

    def add(self, means: dict[int, float], elapsed: float) -> None:
        present: set[str] = set()
        for metric_id, name, scale in COUNTERS:
            mean = means.get(metric_id)
            # A NaN, infinite or negative mean is a bad answer, that interval's value
            # unknown: added, NaN would hold the counter NaN and a negative mean take it back
            # (a reset to Prometheus), for the life of the process.
            if mean is not None and math.isfinite(mean) and mean >= 0:
                self.values[name] = self.values.get(name, 0.0) + mean * scale * elapsed
                present.add(name)
        occupancy = means.get(OCCUPANCY[0])
        if occupancy is not None and math.isfinite(occupancy) and occupancy >= 0:
            self.values[OCCUPANCY[1]] = calls.ratio(occupancy)
            present.add(OCCUPANCY[1])
        self.present = frozenset(present)

    def reported(self) -> dict[str, float]:
        """The DeviceSample fields to set: only those present."""
        return {name: self.values[name] for name in self.present}


@dataclass(slots=True)
class _Target:
    buffers: tuple[object, object]
    current: int = 0  # the buffer the next sample goes into
    previous_at: float | None = None  # monotonic time of the previous sample, if any


class GpmSampler:
    """The GPM state of one NVML session: sample buffers per target and the one metrics
    request all targets share (it is only used from the sampler thread)."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._request: Any = calls.gpm_metrics_request(METRIC_IDS)
        self._targets: dict[object, _Target | None] = {}  # None: no buffers (unsupported)
        self._failing = False

    def sample(
        self, key: object, take: Callable[[object], bool]
    ) -> tuple[dict[int, float], float] | None:
        """Take a sample for the target ``key`` with ``take(buffer)`` (a read of
        ``nvmlGpmSampleGet`` or ``nvmlGpmMigSampleGet``) and return the means since its previous
        sample with the seconds between the two; ``None`` for the first sample, an
        unsupported target or too short an interval. Device faults of ``take`` raise
        :class:`~.calls.NvmlFault`."""
        target = self._target(key)
        if target is None:
            return None
        now = self._monotonic()
        if target.previous_at is not None and now - target.previous_at < MIN_INTERVAL_SECONDS:
            return None
        current = target.buffers[target.current]
        if read(take, current) is None:
            self._targets[key] = None  # NOT_SUPPORTED: this target has no GPM
            self._free(target)
            return None
        taken_at = self._monotonic()
        previous_at = target.previous_at
        previous = target.buffers[1 - target.current]
        target.current = 1 - target.current
        target.previous_at = taken_at
        if previous_at is None:
            return None
        try:
            means = read(calls.gpm_metrics_get, self._request, previous, current)
        except NvmlFault as fault:
            if fault.fault is Fault.DRIVER:
                raise
            if not self._failing:
                log.warning("nvmlGpmMetricsGet failed: %s", fault.error)
            self._failing = True
            return None
        self._failing = False
        if means is None:
            return None
        return means, taken_at - previous_at

    def restart(self, key: object) -> None:
        """The target's device stopped answering: its next sample starts a new interval."""
        target = self._targets.get(key)
        if target is not None:
            target.previous_at = None

    def forget(self, key: object) -> None:
        """The target is gone (a destroyed MIG GPU instance): free its buffers. A target
        created later under the same key starts afresh."""
        target = self._targets.pop(key, None)
        if target is not None:
            self._free(target)

    def close(self) -> None:
        """Free every sample buffer (NVML errors ignored: the driver may be gone)."""
        for target in self._targets.values():
            if target is not None:
                self._free(target)
        self._targets.clear()

    def _target(self, key: object) -> _Target | None:
        if key in self._targets:
            return self._targets[key]
        first = read(calls.gpm_sample_alloc)
        second = read(calls.gpm_sample_alloc) if first is not None else None
        if first is None or second is None:
            if first is not None:
                quietly(calls.gpm_sample_free, first)
            self._targets[key] = None
            return None
        target = _Target((first, second))
        self._targets[key] = target
        return target

    @staticmethod
    def _free(target: _Target) -> None:
        for buffer in target.buffers:
            quietly(calls.gpm_sample_free, buffer)
