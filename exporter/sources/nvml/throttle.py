"""``gpu_throttle_seconds_total{reason}``: how long each reason held a GPU's clocks down.

NVML keeps a cumulative nanosecond counter per perf policy since the driver loaded. They are
read as field values (``nvmlDeviceGetFieldValues``, ``NVML_FI_DEV_PERF_POLICY_*``, ids 74-81,
plus the clocks-event-reason durations 269-271 where the driver has them), each field with
its own return code; a policy whose field the driver lacks is read with the deprecated
``nvmlDeviceGetViolationStatus`` instead. A reason neither answers is absent.

The exporter's counter is the throttle time since it first read the GPU: it starts at 0 and
adds the driver counter's increase at every read, or the driver's whole value after a drop
(the driver's counters start again from 0 when it reloads or the GPU is reset), so it never
goes backwards while the exporter runs, and it starts again from 0 when the exporter
restarts, which Prometheus reads as a counter reset. Why not from the driver's value: after a
GPU reset the two differ, and a restarted exporter would then begin below its predecessor's
last value at the driver's whole count since the reset, which ``rate()`` counts as a reset
and so as all of it in one scrape interval (far more than 100 % of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

from gpuscope.exporter.model import THROTTLE_REASONS, ThrottleTime
from gpuscope.exporter.sources.nvml import calls
from gpuscope.exporter.sources.nvml.calls import read

# reason -> (field id, perf policy for nvmlDeviceGetViolationStatus or None)
_SOURCES: dict[str, tuple[int, int | None]] = {
    "power": (pynvml.NVML_FI_DEV_PERF_POLICY_POWER, pynvml.NVML_PERF_POLICY_POWER),
    "thermal": (pynvml.NVML_FI_DEV_PERF_POLICY_THERMAL, pynvml.NVML_PERF_POLICY_THERMAL),
    "sync_boost": (
        pynvml.NVML_FI_DEV_PERF_POLICY_SYNC_BOOST, pynvml.NVML_PERF_POLICY_SYNC_BOOST,
    ),
    "board_limit": (
        pynvml.NVML_FI_DEV_PERF_POLICY_BOARD_LIMIT, pynvml.NVML_PERF_POLICY_BOARD_LIMIT,
    ),
    "low_utilization": (
        pynvml.NVML_FI_DEV_PERF_POLICY_LOW_UTILIZATION, pynvml.NVML_PERF_POLICY_LOW_UTILIZATION,
    ),
    "reliability": (
        pynvml.NVML_FI_DEV_PERF_POLICY_RELIABILITY, pynvml.NVML_PERF_POLICY_RELIABILITY,
    ),
    "app_clocks": (
        pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_APP_CLOCKS, pynvml.NVML_PERF_POLICY_TOTAL_APP_CLOCKS,
    ),
    "base_clocks": (
        pynvml.NVML_FI_DEV_PERF_POLICY_TOTAL_BASE_CLOCKS,
        pynvml.NVML_PERF_POLICY_TOTAL_BASE_CLOCKS,
    ),
    "sw_thermal": (pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, None),
    "hw_thermal": (pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN, None),
    "hw_power_brake": (pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN, None),
}
assert tuple(_SOURCES) == THROTTLE_REASONS
FIELD_IDS: tuple[int, ...] = tuple(field_id for field_id, _ in _SOURCES.values())


@dataclass(slots=True)
class ThrottlePlan:
    """Which NVML calls answer on one GPU, learnt on the first read of an NVML session:
    the field values (``fields`` False once the call itself is unsupported) and the
    violation-status policies that are not."""

    fields: bool = True
    violation_unsupported: set[str] = field(default_factory=set)

    def read(self, handle: object) -> dict[str, int]:
        """Every reason's driver counter (ns) that this GPU gives. Raises
        :class:`~.calls.NvmlFault` like every read."""
        raw: dict[str, int] = {}
        if self.fields:
            values = read(calls.field_values, handle, FIELD_IDS)
            if values is None:
                self.fields = False
            else:
                for reason, value in zip(_SOURCES, values, strict=True):
                    if value is not None:
                        raw[reason] = int(value)
        for reason, (_, policy) in _SOURCES.items():
            if reason in raw or policy is None or reason in self.violation_unsupported:
                continue
            ns = read(calls.violation_time, handle, policy)
            if ns is None:
                self.violation_unsupported.add(reason)
            else:
                raw[reason] = ns
        return raw


@dataclass(slots=True)
class ThrottleTotals:
    """One GPU's throttle counters in seconds, kept across NVML sessions: 0 at the first
    read of a reason (that read's driver value is the base), then the driver's increases
    (module docstring)."""

    seconds: dict[str, float] = field(default_factory=dict)
    last_ns: dict[str, int] = field(default_factory=dict)

    def update(self, raw: dict[str, int]) -> tuple[ThrottleTime, ...]:
        for reason, ns in raw.items():
            last = self.last_ns.get(reason)
            if last is None:  # the first read: counting starts here
                added = 0
            elif ns >= last:
                added = ns - last
            else:  # the driver's counter started again (driver reload, GPU reset)
                added = ns
            self.seconds[reason] = self.seconds.get(reason, 0.0) + added / 1e9
            self.last_ns[reason] = ns
        return tuple(
            ThrottleTime(reason, self.seconds[reason]) for reason in THROTTLE_REASONS
            if reason in raw
        )
