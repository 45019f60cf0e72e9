"""Per-series aggregates over one publishing interval, and the datums they become.

Every observation of a series in an interval is kept as a ``value -> count`` map (plus
minimum, maximum, sum and count), and published as **one** datum with ``Values``/``Counts``
(more than one only when the interval saw more than 150 distinct values: CloudWatch's limit
per datum). CloudWatch computes the same minimum, maximum, sum and sample count from that
datum as from the individual samples, so an alarm on ``Maximum`` still sees a one-second
spike inside a 60-second interval, and percentiles (``p90``…) keep working, which a
``StatisticValues`` set would lose.

Intervals are aligned on the wall clock (``floor(timestamp / interval) * interval``), so with
the default 60 s every datum falls into exactly one CloudWatch minute; the datum's timestamp
is the interval's start.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuscope.exporter.sinks.cloudwatch.series import UNITS, Dims, Observation, SeriesKey

#: A PutMetricData ``MetricData`` member, exactly as boto3 takes it.
Datum = dict[str, Any]

#: CloudWatch rejects a datum with more distinct values than this.
MAX_VALUES_PER_DATUM = 150
#: Smallest magnitude CloudWatch accepts (other than 0); smaller values are sent as 0.
_MIN_MAGNITUDE = 8.515920e-109


@dataclass(slots=True)
class SeriesAggregate:
    """Everything one series saw in one interval. ``counts`` maps value -> occurrences."""

    counts: dict[float, int] = field(default_factory=dict)
    minimum: float = math.inf
    maximum: float = -math.inf
    total: float = 0.0
    n: int = 0

    def add(self, value: float) -> None:
        self.counts[value] = self.counts.get(value, 0) + 1
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value
        self.total += value
        self.n += 1


@dataclass(frozen=True, slots=True)
class ClosedInterval:
    """One finished interval: its start (wall-clock seconds) and its series."""

    start: float
    series: Mapping[SeriesKey, SeriesAggregate]


def _clean(value: float) -> float | None:
    if not math.isfinite(value):
        return None
    if value != 0.0 and abs(value) < _MIN_MAGNITUDE:
        return 0.0
    return value


class Aggregator:
    """Interval buckets of series aggregates; thread-safe.

    :meth:`add` runs on the sampler thread for every snapshot (a few dict updates per
    value, under a lock held for microseconds); :meth:`take_closed` runs on the flush thread.
    An observation that arrives for an interval already taken opens that interval again; it
    is published with the same timestamp at the next flush, and CloudWatch merges the two.
    """

    def __init__(self, interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self.interval = interval
        self._buckets: dict[float, dict[SeriesKey, SeriesAggregate]] = {}
        self._lock = threading.Lock()

    def bucket_start(self, timestamp: float) -> float:
        """Start (wall-clock seconds) of the interval ``timestamp`` falls in."""
        return math.floor(timestamp / self.interval) * self.interval

    def add(self, timestamp: float, observations: Iterable[Observation]) -> int:
        """Adds one round's observations; returns how many were kept."""
        start = self.bucket_start(timestamp)
        kept = 0
        with self._lock:
            bucket = self._buckets.get(start)
            if bucket is None:
                bucket = self._buckets[start] = {}
            for key, raw in observations:
                value = _clean(raw)
                if value is None:
                    continue
                agg = bucket.get(key)
                if agg is None:
                    agg = bucket[key] = SeriesAggregate()
                agg.add(value)
                kept += 1
        return kept

    def open_starts(self) -> list[float]:
        with self._lock:
            return sorted(self._buckets)

    def take_closed(self, before: float) -> list[ClosedInterval]:
        """Removes and returns, oldest first, every interval that ended at or before
        ``before`` (wall-clock seconds)."""
        with self._lock:
            starts = sorted(s for s in self._buckets if s + self.interval <= before)
            return [ClosedInterval(s, self._buckets.pop(s)) for s in starts]

    def take_all(self) -> list[ClosedInterval]:
        """Removes and returns every interval, the open one included (shutdown)."""
        with self._lock:
            starts = sorted(self._buckets)
            return [ClosedInterval(s, self._buckets.pop(s)) for s in starts]


def dimension_list(dims: Dims) -> list[dict[str, str]]:
    """The ``Dimensions`` member of a series."""
    return [{"Name": k, "Value": v} for k, v in dims]


class SharedDimensions:
    """The ``Dimensions`` member of each series, one list shared by the series' datums of
    consecutive intervals (a buffer of 30 intervals would otherwise hold 30 copies; boto3
    never modifies it). It holds the lists of the last interval only (:meth:`next_interval`
    starts the next one), so the series that ended, the pods that came and went, are not
    kept for the life of the process. Used by one thread at a time."""

    def __init__(self) -> None:
        self._previous: dict[Dims, list[dict[str, str]]] = {}
        self._current: dict[Dims, list[dict[str, str]]] = {}

    def __call__(self, dims: Dims) -> list[dict[str, str]]:
        shared = self._current.get(dims)
        if shared is None:
            shared = self._previous.get(dims)
            if shared is None:
                shared = dimension_list(dims)
            self._current[dims] = shared
        return shared

    def next_interval(self) -> None:
        """The interval's datums are made: the next one shares its lists, no older ones."""
        self._previous, self._current = self._current, {}


def datums_for(interval: ClosedInterval, units: Mapping[str, str | None] = UNITS,
               dimensions: Callable[[Dims], list[dict[str, str]]] = dimension_list,
               ) -> list[Datum]:
    """The datums of one closed interval, in a stable order (metric name, dimensions).

    One datum per series, with ``Values`` in ascending order and their ``Counts``; a series
    with more than :data:`MAX_VALUES_PER_DATUM` distinct values is split into several datums
    with the same name, dimensions and timestamp, which CloudWatch aggregates together.
    """
    timestamp = datetime.fromtimestamp(interval.start, tz=UTC)
    out: list[Datum] = []
    for (name, dims), agg in sorted(interval.series.items(), key=lambda kv: kv[0]):
        if agg.n == 0:
            continue
        items = sorted(agg.counts.items())
        shared = dimensions(dims)
        unit = units.get(name)
        for i in range(0, len(items), MAX_VALUES_PER_DATUM):
            chunk = items[i:i + MAX_VALUES_PER_DATUM]
            datum: Datum = {
                "MetricName": name,
                "Dimensions": shared,
                "Timestamp": timestamp,
                "Values": [v for v, _ in chunk],
                # ints: CPython shares the small ones, and botocore sends them as numbers
                "Counts": [c for _, c in chunk],
            }
            if unit is not None:
                datum["Unit"] = unit
            out.append(datum)
    return out
