"""Utilization patterns of simulated processes. Each is a pure function of tau, the seconds
since the process's current incarnation started; every value is a ratio in 0..1."""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class ConstantPattern:
    """Always ``value`` (ratio 0..1)."""

    value: float

    def value_at(self, tau: float) -> float:
        """Utilization ratio at ``tau`` seconds into the process's incarnation."""
        return self.value


@dataclass(frozen=True, slots=True)
class SteppedPattern:
    """Piecewise constant: ``steps`` is ``((t_seconds, ratio), ...)`` with strictly increasing
    times; a value holds from its time until the next step's time. Before the first step the
    value is 0. With ``repeat`` (seconds, greater than the last step time) the schedule
    restarts every ``repeat`` seconds."""

    steps: tuple[tuple[float, float], ...]
    repeat: float | None = None
    _times: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _values: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_times", tuple(s[0] for s in self.steps))
        object.__setattr__(self, "_values", tuple(s[1] for s in self.steps))

    def value_at(self, tau: float) -> float:
        """Utilization ratio at ``tau`` seconds into the process's incarnation."""
        if self.repeat is not None:
            tau %= self.repeat
        i = bisect.bisect_right(self._times, tau) - 1
        return self._values[i] if i >= 0 else 0.0


@dataclass(frozen=True, slots=True)
class BurstyPattern:
    """A square wave: ``high`` for the first ``duty`` fraction of every ``period`` seconds,
    ``low`` for the rest. ``phase`` (seconds) is how far into its cycle the wave is at
    tau = 0."""

    low: float
    high: float
    period: float
    duty: float
    phase: float = 0.0

    def value_at(self, tau: float) -> float:
        """Utilization ratio at ``tau`` seconds into the process's incarnation."""
        pos = (tau + self.phase) % self.period
        return self.high if pos < self.duty * self.period else self.low


@lru_cache(maxsize=16384)
def _bucket_unit(seed: int, bucket: int) -> float:
    """A uniform number in [0, 1) that depends only on ``seed`` and the time bucket."""
    return random.Random((seed << 32) ^ (bucket & 0xFFFFFFFF)).random()


@dataclass(frozen=True, slots=True)
class RandomPattern:
    """Seeded noise: scenario time is cut into buckets of ``interval`` seconds and each bucket
    gets a value drawn uniformly from [``low``, ``high``] by ``random.Random`` seeded from
    (``seed``, bucket number). ``smooth`` interpolates linearly from one bucket's value to the
    next (a wandering line) instead of holding it (a staircase). The value at a given time
    never depends on when or how often it was asked for."""

    low: float
    high: float
    interval: float
    seed: int
    smooth: bool = False

    def value_at(self, tau: float) -> float:
        """Utilization ratio at ``tau`` seconds into the process's incarnation."""
        pos = tau / self.interval
        bucket = math.floor(pos)
        span = self.high - self.low
        v0 = self.low + span * _bucket_unit(self.seed, bucket)
        if not self.smooth:
            return v0
        v1 = self.low + span * _bucket_unit(self.seed, bucket + 1)
        return v0 + (v1 - v0) * (pos - bucket)


@dataclass(frozen=True, slots=True)
class SinePattern:
    """A sine wave between ``low`` and ``high`` with ``period`` seconds (diurnal inference
    load); ``phase`` seconds shifts it (at tau = -phase the wave is at its midpoint, rising).
    """

    low: float
    high: float
    period: float
    phase: float = 0.0

    def value_at(self, tau: float) -> float:
        """Utilization ratio at ``tau`` seconds into the process's incarnation."""
        s = math.sin(2.0 * math.pi * (tau + self.phase) / self.period)
        return self.low + (self.high - self.low) * 0.5 * (1.0 + s)


UtilizationPattern = ConstantPattern | SteppedPattern | BurstyPattern | RandomPattern | SinePattern
