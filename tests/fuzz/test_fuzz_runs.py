"""``trailing_run`` finds where a run's steps stop lining up (a gap of more than a step and a
half) by measuring all of its steps at once; a step-by-step walk back from the end, as the
rule reads, must give the same run on any times: gaps anywhere, off-grid times, one point."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from gpuscope.dashboard.verdicts.common import Run, trailing_run
from tests.fuzz._profile import fuzz


def walk(times: list[float], flags: list[bool], step: float, history_start: float
         ) -> Run | None:
    """The rule, one step at a time."""
    n = len(times)
    if not n or not flags[-1]:
        return None
    i = n - 1
    while i > 0 and flags[i - 1] and times[i] - times[i - 1] <= 1.5 * step:
        i -= 1
    start = max(times[i] - step, history_start)
    if i == 0 and start - history_start <= 2 * step:
        start = history_start
    while i < n - 1 and times[i] <= start:
        i += 1
    return Run(start=start, end=times[-1], first_index=i)


@st.composite
def series(draw: st.DrawFn) -> tuple[list[float], list[bool], float, float]:
    step = draw(st.sampled_from([15.0, 60.0, 300.0]))
    # Increasing times: mostly a step apart, sometimes more (a gap), sometimes less.
    gaps = draw(st.lists(st.sampled_from([1.0, 1.0, 1.0, 1.5, 1.5000001, 2.0, 0.5, 3.7]),
                         min_size=0, max_size=70))
    t = 1_700_000_000.0
    times = [t]
    for g in gaps:
        t += g * step
        times.append(t)
    flags = draw(st.lists(st.booleans(), min_size=len(times), max_size=len(times))
                 | st.just([True] * len(times)))
    history_start = times[0] - draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 10.0])) * step
    return times, flags, step, history_start


@fuzz(500)
@given(series())
@example(([0.0, 60.0, 150.0, 210.0], [True] * 4, 60.0, 0.0))
@example(([0.0, 60.0, 150.000001, 210.0], [True] * 4, 60.0, 0.0))
def test_a_run_is_where_the_walk_back_stops(case: tuple[list[float], list[bool], float, float]
                                            ) -> None:
    times, flags, step, history_start = case
    assert trailing_run(times, flags, step, history_start) == walk(
        times, flags, step, history_start)
    assert trailing_run(tuple(times), tuple(flags), step, history_start) == walk(
        times, flags, step, history_start)
