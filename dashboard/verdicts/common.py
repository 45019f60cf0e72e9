"""Shared rule for every "condition holds for >= D" verdict.

A verdict rests on the *trailing run*: the most recent stretch of consecutive steps in which
the condition held. It is true when that run is at least ``min(D, window, history)`` long,
where history is how much data has been collected so far (an embedded dashboard starts with
none). Each step stands for the ``step`` seconds that end at its timestamp; a missing step
(no data) breaks a run, so a gap never counts as evidence.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import sub

from gpuscope.dashboard.series import Window

# Slack when comparing a run with the required duration: timestamps are milliseconds.
EPSILON = 1e-3


@dataclass(frozen=True, slots=True)
class Run:
    """The trailing run of a condition: ``start`` (seconds since the epoch) to ``end``."""

    start: float
    end: float
    first_index: int  # index of the run's first point in the series after ``start``

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def required_seconds(duration: float, window: Window, history_start: float) -> float:
    """``min(D, window, history collected)``: how long a condition must have held."""
    history = max(0.0, window.end - history_start)
    return min(duration, window.seconds, history)


def trailing_run(
    times: Sequence[float],
    flags: Sequence[bool],
    step: float,
    history_start: float,
) -> Run | None:
    """The trailing run of true ``flags``, or None when the last point is false (or there is
    no point). A run that begins at the series' first point starts no earlier than
    ``history_start`` (nothing is known before it)."""
    n = len(times)
    if not n or not flags[-1]:
        return None
    # The flags alone hold back to just after the last false one before the end (found by
    # ``index``, not a step at a time: 10^4 runs of 59 steps on a large fleet); a gap of
    # more than a step and a half ends the run earlier.
    try:
        lo = n - 1 - flags[-2::-1].index(False)
    except ValueError:
        lo = 0
    i = n - 1
    gap = 1.5 * step
    if lo < i and max(map(sub, times[lo + 1:], times[lo:-1])) <= gap:
        i = lo  # no gap in the run (the usual case: its steps measured at once, in C)
    else:
        while i > lo and times[i] - times[i - 1] <= gap:
            i -= 1
    start = max(times[i] - step, history_start)
    if i == 0 and start - history_start <= 2 * step:
        # The run goes back to this device's first point, which lies within two steps of
        # where the fleet's history begins: targets are scraped at different offsets, so a
        # device's first sample can trail the fleet's first by up to a scrape interval. It
        # has held for all the history there is (at most two steps are given the benefit).
        start = history_start
    # Points at or before where the history begins are not evidence (a rate there covers
    # time before the data): the run's points, for the means taken over it, come after.
    while i < len(times) - 1 and times[i] <= start:
        i += 1
    return Run(start=start, end=times[-1], first_index=i)


def holds(run: Run | None, required: float) -> bool:
    return run is not None and run.seconds >= required - EPSILON


def is_fresh(times: Sequence[float], window: Window) -> bool:
    """The series has a point in its last step or so: it describes the present."""
    return bool(times) and times[-1] >= window.end - 1.5 * window.step


def whole_run(steps: Sequence[float], window: Window, history_start: float,
              first: int = 0) -> Run | None:
    """The run of a condition the store found held at every one of ``steps`` (the
    history's steps, :class:`~gpuscope.dashboard.series.Runs`) from the one at index
    ``first`` on, and at none before it: the trailing run of those steps alone (as the
    steps the store sends of such a condition give it), or None where they do not describe
    the present."""
    held = steps[first:]
    if not is_fresh(held, window):
        return None
    return trailing_run(held, [True] * len(held), window.step, history_start)


def runs_from(steps: Sequence[float], window: Window, history_start: float
              ) -> Callable[[int], Run | None]:
    """:func:`whole_run` of ``steps`` from each first index asked, each made once: the
    store's runs (10^3 to 10^4 devices on a large fleet) share a few first steps."""
    @functools.cache
    def run(first: int) -> Run | None:
        return whole_run(steps, window, history_start, first)
    return run


def tails_from(steps: Sequence[float]) -> Callable[[int], frozenset[float]]:
    """The set of ``steps`` from each first index asked, each made once (as
    :func:`runs_from`)."""
    @functools.cache
    def tail(first: int) -> frozenset[float]:
        return frozenset(steps[first:])
    return tail
