"""The verdicts, one module each (:mod:`.registry` lists them): idle GPUs, MIG slices and
nodes, waste in dollars, time-slicing and input starvation, stragglers (stalled and slow),
spinning and throttled GPUs, allocated-idle containers, GPU health, MPS. Thresholds are
DESIGN.md's, as defaults that every function takes as keyword arguments and
:class:`Thresholds` carries as one; each verdict module declares its own as data
(``THRESHOLDS``), which the dashboard's flags are made from."""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass

from gpuscope.dashboard.verdicts.allocated import (
    ALLOCATED_IDLE_DURATION,
    ALLOCATED_IDLE_THRESHOLD,
)
from gpuscope.dashboard.verdicts.idle import IDLE_DURATION, IDLE_THRESHOLD
from gpuscope.dashboard.verdicts.spinning import (
    SPIN_BUSY,
    SPIN_DRAM,
    SPIN_DURATION,
    SPIN_POWER,
    SPIN_SM,
    SPIN_TENSOR,
    SpinRule,
)
from gpuscope.dashboard.verdicts.starvation import (
    BUSY_THRESHOLD,
    INPUT_HIGH,
    INPUT_LOW,
    INPUT_MIN_CV,
    INPUT_MIN_SAMPLES,
    SHARE_FACTOR,
    STARVATION_DURATION,
)
from gpuscope.dashboard.verdicts.stragglers import (
    SLOW_BUSY,
    SLOW_FACTOR,
    STRAGGLER_DURATION,
    STRAGGLER_FACTOR,
)
from gpuscope.dashboard.verdicts.throttle import (
    THROTTLE_DURATION,
    THROTTLE_RATIO,
    THROTTLE_REASONS,
)


@dataclass(frozen=True, slots=True)
class Thresholds:
    idle_utilization: float = IDLE_THRESHOLD
    idle_duration: float = IDLE_DURATION
    busy_utilization: float = BUSY_THRESHOLD
    share_factor: float = SHARE_FACTOR
    starvation_duration: float = STARVATION_DURATION
    input_low: float = INPUT_LOW
    input_high: float = INPUT_HIGH
    input_min_cv: float = INPUT_MIN_CV
    input_min_samples: int = INPUT_MIN_SAMPLES
    straggler_factor: float = STRAGGLER_FACTOR
    straggler_duration: float = STRAGGLER_DURATION
    slow_factor: float = SLOW_FACTOR
    slow_busy: float = SLOW_BUSY
    spin_busy: float = SPIN_BUSY
    spin_sm: float = SPIN_SM
    spin_tensor: float = SPIN_TENSOR
    spin_dram: float = SPIN_DRAM
    spin_power: float = SPIN_POWER
    spin_duration: float = SPIN_DURATION
    throttle_ratio: float = THROTTLE_RATIO
    throttle_duration: float = THROTTLE_DURATION
    throttle_reasons: tuple[str, ...] = THROTTLE_REASONS
    allocated_idle_utilization: float = ALLOCATED_IDLE_THRESHOLD
    allocated_idle_duration: float = ALLOCATED_IDLE_DURATION

    @property
    def key(self) -> str:
        """A short digest of every value: the recording rules made for these thresholds
        carry it (``gpuscope:dashboard_rules:version{thresholds}``), and the page reads them
        only where it is its own."""
        values = tuple(float(v) if isinstance(v, int | float) else tuple(v)
                       for v in astuple(self))
        return hashlib.sha256(repr(values).encode()).hexdigest()[:12]

    @property
    def spin_rule(self) -> SpinRule:
        return SpinRule(busy=self.spin_busy, sm=self.spin_sm, tensor=self.spin_tensor,
                        dram=self.spin_dram, power=self.spin_power)


__all__ = ["Thresholds"]
