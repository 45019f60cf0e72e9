"""Pure analysis functions on time series (no I/O): idle GPUs and nodes, waste in dollars,
time-slicing and input starvation, stragglers. Thresholds are DESIGN.md's, as defaults
that every function takes as keyword arguments and :class:`Thresholds` carries as one."""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.dashboard.analysis.idle import IDLE_DURATION, IDLE_THRESHOLD
from gpuscope.dashboard.analysis.starvation import (
    BUSY_THRESHOLD,
    INPUT_HIGH,
    INPUT_LOW,
    INPUT_MIN_CV,
    INPUT_MIN_SAMPLES,
    SHARE_FACTOR,
    STARVATION_DURATION,
)
from gpuscope.dashboard.analysis.stragglers import STRAGGLER_DURATION, STRAGGLER_FACTOR


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


__all__ = ["Thresholds"]
