"""One series of the embedded store (:mod:`.embedded`): its times and values in two float
arrays, oldest first, at most a capacity of the newest points kept (trimmed in chunks)."""

from __future__ import annotations

import bisect
from array import array


class Ring:
    """Times and values of one series in two float arrays (16 bytes a point), oldest first."""

    __slots__ = ("times", "values")

    def __init__(self) -> None:
        self.times = array("d")
        self.values = array("d")

    def append(self, t: float, v: float, capacity: int) -> None:
        if self.times and t <= self.times[-1]:
            return  # out of order or repeated: keep the series monotonic
        self.times.append(t)
        self.values.append(v)
        excess = len(self.times) - capacity
        if excess > max(1, capacity // 8):  # trim in chunks: amortised O(1)
            del self.times[:excess]
            del self.values[:excess]

    def trim_before(self, t: float) -> None:
        i = bisect.bisect_left(self.times, t)
        if i:
            del self.times[:i]
            del self.values[:i]

    def points(self, after: float, until: float, capacity: int) -> tuple[list[float], list[float]]:
        """Points with ``after < t <= until`` among the newest ``capacity``."""
        lo = max(bisect.bisect_right(self.times, after), len(self.times) - capacity)
        hi = bisect.bisect_right(self.times, until)
        return list(self.times[lo:hi]), list(self.values[lo:hi])
