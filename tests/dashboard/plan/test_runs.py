"""The run summaries read into findings (``dashboard/plan/runs.py``), on hand-built rows
shaped as :meth:`~gpuscope.dashboard.plan.queries.PlanQueries.run_queries` labels them:
which runs are taken whole, which from a later step, and which are left to the steps."""

from __future__ import annotations

from gpuscope.dashboard.plan.runs import _FullRuns
from gpuscope.dashboard.series import ContainerRef, GpuRef, Window


def _gpu(uuid: str, stat: str, **more: str) -> dict[str, str]:
    return {"node": "n", "gpu": "0", "uuid": uuid, "stat": stat, **more}


def _held(uuid: str, stat: str) -> dict[str, str]:
    return {"node": "n", "namespace": "ml", "pod": "p", "container": "c", "uuid": uuid,
            "stat": stat, "signal": "utilization"}


ROWS = [
    # idle: the whole history (60 minutes), the last 40, a count the steps cannot be
    (_gpu("i60", "idle", signal="sm"), 60.0),
    (_gpu("i40", "idle", signal="utilization"), 40.0),
    (_gpu("i61", "idle"), 61.0),  # a minute twice
    # spinning: whole, the last 40, the last 59 (a run from the second step), no count
    (_gpu("s60", "spin", signal="utilization"), 0.97), (_gpu("s60", "spin_n"), 60.0),
    (_gpu("s40", "spin", signal="utilization"), 0.98), (_gpu("s40", "spin_n"), 40.0),
    (_gpu("s40", "spin", signal="sm"), 0.01),
    (_gpu("s59", "spin", signal="utilization"), 0.99), (_gpu("s59", "spin_n"), 59.0),
    (_gpu("s00", "spin", signal="utilization"), 0.99),
    # allocated-idle: the last 35 minutes, and one with a mean but no count
    (_held("h35", "held_idle"), 0.01), (_held("h35", "held_idle_n"), 35.0),
    (_held("h00", "held_idle"), 0.02),
]


def test_runs_up_to_the_end_are_taken_from_their_first_step_on_one_minute_steps() -> None:
    window = Window(start=0.0, end=3600.0, step=60.0)
    runs = _FullRuns.parse(ROWS, window, 60, 60, trailing=True)
    assert runs.grid[0] == 60.0 and runs.grid[-1] == 3600.0 and len(runs.grid) == 60
    assert runs.idle == {GpuRef("n", "i60"): "sm", GpuRef("n", "i40"): "utilization"}
    assert runs.idle_from == {GpuRef("n", "i40"): 20}
    # A spinning run from the second step is left to the steps; one with no count too.
    assert set(runs.spin) == {GpuRef("n", "s60"), GpuRef("n", "s40")}
    assert runs.spin[GpuRef("n", "s40")] == {"utilization": 0.98, "sm": 0.01}
    assert runs.spin_from == {GpuRef("n", "s40"): 20}
    h35 = ContainerRef("n", "ml", "p", "c", "h35")
    assert runs.held_idle == {h35: ("utilization", 0.01)} and runs.held_idle_from == {h35: 25}
    summary = runs.summary({})
    assert summary.idle_from == runs.idle_from and summary.spinning_from == runs.spin_from
    assert summary.held_idle_from == runs.held_idle_from
    # What is not summarised goes to the steps: the idle device counted 61 times.
    again = runs.fallback({GpuRef("n", "i60"), GpuRef("n", "i61")}, set(), {h35})
    assert set(again.idle) == {"n"} and not again.held


def test_on_steps_of_several_minutes_a_run_begins_at_its_first_whole_step() -> None:
    # Three-minute steps over the same hour (steps at 180, 360, ... 3600 s): a step meets a
    # sparse rule where each of its three minutes does.
    window = Window(start=0.0, end=3600.0, step=180.0)
    runs = _FullRuns.parse(ROWS, window, 20, 60, trailing=True)
    # 40 minutes: from minute 1260 s; the step at 1260 holds minutes 1140-1260 (not all of
    # them), the one at 1440 (index 7) minutes 1320-1440.
    assert set(runs.idle) == {GpuRef("n", "i60"), GpuRef("n", "i40")}
    assert runs.idle_from == {GpuRef("n", "i40"): 7}
    # 35 minutes: from 1560 s; the step at 1800 (index 9) is the first whole one.
    h35 = ContainerRef("n", "ml", "p", "c", "h35")
    assert runs.held_idle_from == {h35: 9}
    # A spinning run that began within the history is left to the steps (a step spins by
    # its signals' means, which the minutes' flags do not give).
    assert set(runs.spin) == {GpuRef("n", "s60")} and not runs.spin_from


def test_the_whole_history_forms_answer_are_runs_from_the_first_step() -> None:
    """The first runs query's forms return the whole history's runs alone (no lengths):
    each is a run from the first step; the runs up to the end (asked after) are merged in."""
    window = Window(start=0.0, end=3600.0, step=60.0)
    whole = [(_gpu("i60", "idle", signal="sm"), 60.0),
             (_gpu("s60", "spin", signal="utilization"), 0.97),
             (_gpu("s60", "spin", signal="sm"), 0.02),
             (_held("h60", "held_idle"), 0.01), (_gpu("i60", "held"), 60.0)]
    runs = _FullRuns.parse(whole, window, 60, 60)
    h60 = ContainerRef("n", "ml", "p", "c", "h60")
    assert runs.idle == {GpuRef("n", "i60"): "sm"} and set(runs.spin) == {GpuRef("n", "s60")}
    assert runs.held_idle == {h60: ("utilization", 0.01)} and runs.held_steps
    assert not runs.idle_from and not runs.spin_from and not runs.held_idle_from
    both = runs.merged(_FullRuns.parse(ROWS, window, 60, 60, trailing=True))
    assert set(both.idle) == {GpuRef("n", "i60"), GpuRef("n", "i40")}
    assert both.idle_from == {GpuRef("n", "i40"): 20} and both.held_steps == runs.held_steps
    # A whole run keeps the means it came with (the later query's have fewer).
    assert both.spin[GpuRef("n", "s60")] == {"utilization": 0.97, "sm": 0.02}
    assert set(both.held_idle) == {h60, ContainerRef("n", "ml", "p", "c", "h35")}
