"""``gpu_busy_seconds_total``: the time a kernel ran, integrated from the driver's own
utilization samples.

The driver records a GPU-utilization sample every 1/6 s to 1 s (depending on the GPU) in a
buffer that ``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES, lastSeenTimeStamp)`` reads
past a timestamp. Each sample's value is the busy share of the period since the previous
sample, so ``value / 100 x (timeStamp - previous timeStamp)`` summed over the samples is the
exact busy time. A per-device cursor (the newest timestamp read) makes every sample count
exactly once across rounds, like the per-process utilization cursor.

Where the driver keeps no samples (NOT_SUPPORTED, or an NVML without the call), the sampled
utilization (``nvmlDeviceGetUtilizationRates``) is integrated over the sampling interval
instead: exact for a steady load, an estimate for a bursty one.

The driver stamps its samples with the wall clock. When the wall clock steps back (NTP
correcting a clock that was ahead), every new sample is older than the cursor, and reading past
the cursor would find none until the clock caught up again: a cursor later than the wall clock
(by more than :data:`CLOCK_SLACK_US`) starts again as at the first read, and samples stamped
that far after the wall clock (taken before the step) are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuscope.exporter.sources.nvml import calls
from gpuscope.exporter.sources.nvml.calls import read

# A gap between two samples longer than this is not integrated: samples were lost (the
# exporter stalled past the driver's buffer, or the GPU was lost and reset), and spreading
# one sample's value over minutes would invent busy time. Drivers sample every <= 1 s.
MAX_SAMPLE_GAP_US = 10_000_000
# A sample or cursor later than the wall clock by more than this was stamped before the wall
# clock stepped back.
CLOCK_SLACK_US = 10_000_000

Mode = Literal["samples", "rates"]


@dataclass(slots=True)
class BusyTime:
    """One device's busy-time counter; kept across NVML sessions so that it never goes back.

    ``cursor_us`` is the newest sample timestamp read (``None`` before the first read),
    ``mode`` how the device is read this session (``None``: not known yet)."""

    seconds: float = 0.0
    cursor_us: int | None = None
    mode: Mode | None = None
    last_rates_at: float | None = None

    def new_session(self) -> None:
        """A new NVML session: ask the driver again what it supports."""
        self.mode = None
        self.last_rates_at = None

    def interrupted(self) -> None:
        """The device stopped answering: the time until it answers again is not integrated."""
        self.last_rates_at = None

    def update(
        self, handle: object, utilization_percent: int | None, start_us: int, now: float,
        wall_us: int | None = None,
    ) -> float | None:
        """Read the samples newer than the cursor (the first time: newer than ``start_us``) and
        add them; or, on a device without samples, add ``utilization_percent`` x the seconds
        since the last call (``now``, monotonic). ``wall_us``: the wall clock now (µs), where
        known: a cursor later than it (the clock stepped back) starts again from ``start_us``
        (module docstring). Returns the counter, ``None`` when the device gives neither.
        Raises :class:`~.calls.NvmlFault` like every read."""
        if self.mode != "rates":
            until = None if wall_us is None else wall_us + CLOCK_SLACK_US
            if until is not None and self.cursor_us is not None and self.cursor_us > until:
                self.cursor_us = None  # the wall clock stepped back
            samples = read(calls.utilization_samples, handle, self.cursor_us or start_us)
            if samples is not None:
                self.mode = "samples"
                self._add_samples(samples, until)
                return self.seconds
            self.mode = "rates"
        if utilization_percent is None:
            self.last_rates_at = None
            return None
        if self.last_rates_at is not None:
            self.seconds += calls.ratio(utilization_percent) * max(0.0, now - self.last_rates_at)
        self.last_rates_at = now
        return self.seconds

    def _add_samples(self, samples: list[tuple[int, float]], until: int | None) -> None:
        previous = self.cursor_us
        for timestamp_us, percent in samples:
            if until is not None and timestamp_us > until:
                break  # stamped before the wall clock stepped back (samples come oldest first)
            if previous is not None and timestamp_us <= previous:
                continue  # at or before the cursor: already counted
            if previous is not None and timestamp_us - previous <= MAX_SAMPLE_GAP_US:
                self.seconds += calls.ratio(percent) * (timestamp_us - previous) / 1e6
            previous = timestamp_us
        self.cursor_us = previous
