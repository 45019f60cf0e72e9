"""Patterns: utilization of simulated processes, throttling of simulated GPUs. Each is a pure
function of tau (the seconds since the process's current incarnation started, or scenario time
for throttling); every value is a ratio in 0..1.

Each pattern also gives ``integral(tau)``, the exact integral of its value from 0 to ``tau`` in
closed form (the simulated source's counters are these integrals, so that Prometheus' rate()
over a window is the pattern's mean over it), and ``maximum``, an upper bound of its value."""

from __future__ import annotations

import bisect
import math
import random
import threading
from dataclasses import dataclass, field
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class ConstantPattern:
    """Always ``value`` (ratio 0..1)."""

    value: float

    def value_at(self, tau: float) -> float:
        """Utilization ratio at ``tau`` seconds into the process's incarnation."""
        return self.value

    def integral(self, tau: float) -> float:
        """The integral of the value from 0 to ``tau`` (seconds)."""
        return self.value * tau

    @property
    def maximum(self) -> float:
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

    def _once(self, tau: float) -> float:
        """The integral from 0 to ``tau`` of the schedule played once (no repeat)."""
        total = 0.0
        for i, (start, value) in enumerate(self.steps):
            if tau <= start:
                break
            end = self._times[i + 1] if i + 1 < len(self._times) else tau
            total += value * (min(tau, end) - start)
        return total

    def integral(self, tau: float) -> float:
        """The integral of the value from 0 to ``tau`` (seconds)."""
        if self.repeat is None:
            return self._once(tau)
        cycles = math.floor(tau / self.repeat)
        rest = tau - cycles * self.repeat
        return cycles * self._once(self.repeat) + self._once(rest)

    @property
    def maximum(self) -> float:
        return max(self._values)

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

    def _from_cycle_start(self, x: float) -> float:
        """The integral of the square wave from the start of a cycle to ``x`` seconds on."""
        on = self.duty * self.period
        cycles = math.floor(x / self.period)
        rest = x - cycles * self.period
        per_cycle = self.high * on + self.low * (self.period - on)
        return (cycles * per_cycle + self.high * min(rest, on)
                + self.low * max(0.0, rest - on))

    def integral(self, tau: float) -> float:
        """The integral of the value from 0 to ``tau`` (seconds)."""
        return self._from_cycle_start(tau + self.phase) - self._from_cycle_start(self.phase)

    @property
    def maximum(self) -> float:
        return max(self.high, self.low)


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

    def _bucket_value(self, bucket: int) -> float:
        return self.low + (self.high - self.low) * _bucket_unit(self.seed, bucket)

    def integral(self, tau: float) -> float:
        """The integral of the value from 0 to ``tau`` (seconds)."""
        if tau <= 0.0:
            return 0.0
        pos = tau / self.interval
        bucket = math.floor(pos)
        whole = _random_sums(self, bucket)
        frac = pos - bucket
        v0 = self._bucket_value(bucket)
        if not self.smooth:
            return whole + v0 * frac * self.interval
        v1 = self._bucket_value(bucket + 1)
        # The line from v0 to v1 over the bucket, integrated over its first ``frac``.
        return whole + (v0 * frac + (v1 - v0) * frac * frac / 2) * self.interval

    @property
    def maximum(self) -> float:
        return self.high


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

    def integral(self, tau: float) -> float:
        """The integral of the value from 0 to ``tau`` (seconds)."""
        mid = (self.low + self.high) / 2
        amplitude = (self.high - self.low) / 2
        w = 2.0 * math.pi / self.period
        return mid * tau + amplitude / w * (
            math.cos(w * self.phase) - math.cos(w * (tau + self.phase))
        )

    @property
    def maximum(self) -> float:
        return self.high


UtilizationPattern = ConstantPattern | SteppedPattern | BurstyPattern | RandomPattern | SinePattern


# Per random pattern, the integral over its whole buckets (from 0 to the start of bucket k).
_RANDOM_CHECKPOINT = 4096


class _RandomSums:
    """Running sums of a random pattern's buckets, kept at one cursor (sampling moves forward)
    plus a checkpoint every 4096 buckets to go back to. Every sum is accumulated in the same
    order from 0, so it is bit-identical whatever was asked before."""

    __slots__ = ("bucket", "checkpoints", "lock", "pattern", "total")

    def __init__(self, pattern: RandomPattern) -> None:
        self.pattern = pattern
        self.bucket = 0
        self.total = 0.0
        self.checkpoints: dict[int, float] = {0: 0.0}
        # Shared by every source playing the pattern (the demo's live and past sources).
        self.lock = threading.Lock()

    def upto(self, bucket: int) -> float:
        with self.lock:
            return self._upto(bucket)

    def _upto(self, bucket: int) -> float:
        if bucket < self.bucket:
            start = (bucket // _RANDOM_CHECKPOINT) * _RANDOM_CHECKPOINT
            self.bucket, self.total = start, self.checkpoints[start]
        p = self.pattern
        k, total = self.bucket, self.total
        while k < bucket:
            v0 = p._bucket_value(k)
            if p.smooth:
                total += (v0 + p._bucket_value(k + 1)) / 2 * p.interval
            else:
                total += v0 * p.interval
            k += 1
            if k % _RANDOM_CHECKPOINT == 0:
                self.checkpoints[k] = total
        self.bucket, self.total = k, total
        return total


_RANDOM_SUMS: dict[RandomPattern, _RandomSums] = {}


def _random_sums(pattern: RandomPattern, bucket: int) -> float:
    sums = _RANDOM_SUMS.get(pattern)
    if sums is None:
        sums = _RANDOM_SUMS.setdefault(pattern, _RandomSums(pattern))
    return sums.upto(bucket)
