"""Throttled GPUs: clocks held down for a reason the SRE can act on.

A GPU is throttled for a reason when ``rate(gpu_throttle_seconds_total{reason})`` (seconds
of throttling per second) is >= ``ratio`` (0.2) at every step for >= ``duration`` (10 min,
shortened to the window and the history collected). Only the reasons that point at the
machine count (``power``, ``thermal``, ``reliability``, ``board_limit``): ``low_utilization``
(idle clocks), ``sync_boost``, ``app_clocks`` and ``base_clocks`` are settings, not faults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuscope.dashboard import ids
from gpuscope.dashboard.series import GpuRef, Series, Window
from gpuscope.dashboard.verdicts.common import holds, is_fresh, required_seconds, trailing_run
from gpuscope.dashboard.verdicts.page import Column, Section, Table

THROTTLE_REASONS: tuple[str, ...] = ("power", "thermal", "reliability", "board_limit")
THROTTLE_RATIO = 0.2
THROTTLE_DURATION = 10 * 60.0


@dataclass(frozen=True, slots=True)
class Throttled:
    """``ratio``: mean throttle seconds per second over the run."""

    ref: GpuRef
    reason: str
    ratio: float
    since: float
    seconds: float
    required_seconds: float


def throttled_gpus(
    throttle: Mapping[GpuRef, Mapping[str, Series]],
    window: Window,
    history_start: float,
    *,
    reasons: tuple[str, ...] = THROTTLE_REASONS,
    ratio: float = THROTTLE_RATIO,
    duration: float = THROTTLE_DURATION,
) -> list[Throttled]:
    """One entry per (device, reason) throttled for long enough, worst first per device."""
    required = required_seconds(duration, window, history_start)
    out: list[Throttled] = []
    for ref, by_reason in throttle.items():
        for reason, series in by_reason.items():
            if reason not in reasons or not is_fresh(series.times, window):
                continue
            flags = [v >= ratio for v in series.values]
            run = trailing_run(series.times, flags, window.step, history_start)
            if run is None or not holds(run, required):
                continue
            values = series.values[run.first_index:]
            out.append(Throttled(ref, reason, sum(values) / len(values), run.start,
                                 run.seconds, required))
    out.sort(key=lambda t: (t.ref, -t.ratio, t.reason))
    return out


# -- on the page -----------------------------------------------------------------------------

THROTTLED_COLUMNS = (
    Column("node", "Node", "link"),
    Column("gpu", "GPU"),
    Column("pods", "Pod", "link"),
    Column("reason", "Reason"),
    Column("ratio", "Throttled", "percent"),
    Column("for", "For"),
)
SECTION = Section(
    id=ids.SECTION_THROTTLED, title="Throttled GPUs",
    intro="GPUs whose clocks have been held down by power, heat, reliability or a board limit "
          "for a good part of the time: they run slower than their peers.",
    tables=(Table(ids.THROTTLED_GPUS_TABLE, ids.THROTTLED_NOTE, THROTTLED_COLUMNS),),
)
