"""The spinning verdicts read lined-up signals by position (``_aligned``, the fast path a
5,000-node page takes for its summarised devices) and any other series through
``{time: value}`` dicts: both ways must give the same steps and the same verdicts, NaN,
missing signals, values on the thresholds and short runs included."""

from __future__ import annotations

from unittest import mock

from hypothesis import example, given
from hypothesis import strategies as st

from gpuscope.dashboard.series import GpuRef, Series, WorkSignals
from gpuscope.dashboard.verdicts import spinning
from gpuscope.dashboard.verdicts.spinning import SpinRule, spinning_gpus, spinning_steps
from tests.dashboard.conftest import T0, make_window
from tests.fuzz._profile import fuzz

RULE = SpinRule()
REF = GpuRef("node-a", "GPU-0")
# Values around each of the rule's thresholds (and none at all: NaN).
VALUE = st.one_of(
    st.sampled_from([0.0, 0.01, 0.02, 0.03, 0.25, 0.29, 0.3, 0.31, 0.49, 0.5, 0.51, 1.0,
                     float("nan")]),
    st.floats(0.0, 1.0),
)


@st.composite
def signals(draw: st.DrawFn) -> WorkSignals:
    n = draw(st.integers(0, 40))
    times = tuple(T0 - (n - 1 - i) * 60.0 for i in range(n))
    # Runs of equal steps, as summaries and real devices have them, more often than noise.
    def series() -> Series:
        values = []
        while len(values) < n:
            values += [draw(VALUE)] * draw(st.integers(1, max(1, n)))
        # An equal tuple of times, not the same object: the fast path compares them.
        return Series(tuple(list(times)), tuple(values[:n]))

    has = {name: draw(st.booleans()) for name in ("sm", "tensor", "dram", "power")}
    gpm = draw(st.booleans())
    limit = draw(st.sampled_from([None, 0.0, 300.0, 700.0]))
    # Each step's limit (a cap changed within the window), or none: the latest judges.
    steps = draw(st.booleans())
    limits = Series(tuple(list(times)), tuple(draw(st.sampled_from([0.0, 300.0, 700.0]))
                                              for _ in times))

    def one(name: str) -> dict[GpuRef, Series]:
        return {REF: series()} if has[name] else {}

    return WorkSignals(
        utilization={REF: series()}, sm=one("sm"), tensor=one("tensor"), dram=one("dram"),
        power={REF: Series(times, tuple(draw(VALUE) * 700.0 for _ in times))}
        if has["power"] else {},
        power_limit={} if limit is None else {REF: limit},
        gpm=frozenset({REF}) if gpm else frozenset(),
        power_limits={REF: limits} if steps and limit is not None else {},
    )


def _nan_step() -> WorkSignals:
    """Without GPM, a step whose utilization is NaN is judged by its power alone (the rule's
    test is "not below busy"), as the dicts' path does."""
    times = tuple(T0 - (9 - i) * 60.0 for i in range(10))
    return WorkSignals(utilization={REF: Series(times, (1.0,) * 5 + (float("nan"),) * 5)},
                       power={REF: Series(tuple(list(times)), (10.0,) * 10)},
                       power_limit={REF: 400.0})


@fuzz(300)
@given(signals(), st.sampled_from([600.0, 1800.0, 3600.0]))
@example(_nan_step(), 600.0)
def test_lined_up_signals_give_what_the_dicts_give(sig: WorkSignals, seconds: float) -> None:
    window = make_window(3600.0)
    history_start = T0 - seconds
    fast_steps = spinning_steps(sig, RULE)
    fast = spinning_gpus(sig, window, history_start, rule=RULE, duration=1800.0)
    with mock.patch.object(spinning, "_aligned", return_value=None):
        slow_steps = spinning_steps(sig, RULE)
        slow = spinning_gpus(sig, window, history_start, rule=RULE, duration=1800.0)
    assert fast_steps == slow_steps
    # repr: NaN means compare equal as text.
    assert repr(fast) == repr(slow)


def test_the_fast_path_is_taken_for_lined_up_signals() -> None:
    times = tuple(T0 - (3 - i) * 60.0 for i in range(4))
    sig = WorkSignals(utilization={REF: Series(times, (1.0,) * 4)},
                      power={REF: Series(tuple(times), (10.0,) * 4)},
                      power_limit={REF: 400.0})
    assert spinning._aligned(REF, sig.utilization[REF], sig) is not None
    shifted = WorkSignals(utilization=sig.utilization,
                          power={REF: Series(tuple(t + 60.0 for t in times), (10.0,) * 4)},
                          power_limit={REF: 400.0})
    assert spinning._aligned(REF, sig.utilization[REF], shifted) is None
