"""Findings the store summarised whole (``FleetData.runs``, :class:`Runs`): each verdict
takes them as its findings over the history's run, and they are what the same condition's
steps give (a run held at every step is its length and its means)."""

from __future__ import annotations

import pytest

from gpuscope.dashboard.scope import scoped_data
from gpuscope.dashboard.series import (
    ContainerRef,
    FleetData,
    GpuRef,
    GroupRun,
    Runs,
    Series,
    WorkSignals,
)
from gpuscope.dashboard.verdicts.allocated import allocated_idle
from gpuscope.dashboard.verdicts.idle import idle_gpus
from gpuscope.dashboard.verdicts.spinning import spin_begins, spinning_gpus, spinning_steps
from tests.dashboard.conftest import make_series, make_window

WINDOW = make_window(3600)
#: Data since 40 minutes before the end: the history is shorter than the window.
HS = WINDOW.end - 40 * 60.0
#: The history's steps, as the plan gives them: (history start, end], one a minute.
STEPS = tuple(WINDOW.end - (39 - i) * 60.0 for i in range(40))
GPU = GpuRef("gpu-node-1", "GPU-1")
OTHER = GpuRef("gpu-node-1", "GPU-2")


def steps(value: float) -> Series:
    return Series(STEPS, (value,) * len(STEPS))


def test_an_idle_device_summarised_whole_is_the_idle_verdict_of_its_steps() -> None:
    by_steps = idle_gpus({GPU: steps(0.0)}, WINDOW, HS, allocated={GPU: steps(1.0)},
                         signal={GPU: "sm"})
    runs = Runs(STEPS, idle={GPU: "sm"}, held=frozenset({GPU}))
    summarised = idle_gpus({}, WINDOW, HS, runs=runs)
    assert summarised == by_steps
    [v] = summarised.values()
    assert v.idle and v.signal == "sm" and v.idle_since == HS
    assert v.idle_seconds == v.allocated_seconds == 40 * 60.0
    # Not held at every step: no allocated time from the summary.
    assert idle_gpus({}, WINDOW, HS, runs=Runs(STEPS, idle={GPU: "sm"}))[GPU] \
        .allocated_seconds == 0.0


def test_a_device_with_steps_of_its_own_is_judged_by_them() -> None:
    """The steps the store sent win over a summary of the same device (the plan asks a
    node's every device again when one of them needs its steps)."""
    busy_now = make_series([0.0] * 39 + [0.9], end=WINDOW.end)
    found = idle_gpus({GPU: busy_now}, WINDOW, HS, runs=Runs(STEPS, idle={GPU: "utilization"}))
    assert not found[GPU].idle and found[GPU].idle_since is None


def test_a_spinning_device_summarised_whole_spins_and_counts_as_idle() -> None:
    util, sm = steps(0.97), steps(0.02)
    signals = WorkSignals(utilization={GPU: util}, sm={GPU: sm}, tensor={GPU: steps(0.0)},
                          dram={GPU: steps(0.01)}, gpm=frozenset({GPU}))
    by_steps = spinning_gpus(signals, WINDOW, HS)[GPU]
    runs = Runs(STEPS, spinning={GPU: {"utilization": 0.97, "sm": 0.02, "tensor": 0.0,
                                       "dram": 0.01}})
    summarised = spinning_gpus(WorkSignals(), WINDOW, HS, runs=runs)[GPU]
    assert (summarised.spinning, summarised.since, summarised.seconds, summarised.signal) == (
        by_steps.spinning, by_steps.since, by_steps.seconds, by_steps.signal) == (
        True, HS, 40 * 60.0, "gpm")
    for name in ("utilization", "sm", "tensor", "dram"):
        assert getattr(summarised, name) == pytest.approx(getattr(by_steps, name))
    assert summarised.power_ratio is None
    # Its steps spin, from the history's first: the idle verdict counts the whole run.
    spins = spinning_steps(WorkSignals(), runs=runs)
    assert spins == {GPU: frozenset(STEPS)}
    begins = spin_begins(WorkSignals(), spins, runs)
    assert begins == {GPU: STEPS[0]}
    idle = idle_gpus({}, WINDOW, HS, spinning=spins, known_from=begins, runs=runs)[GPU]
    assert idle.idle and idle.idle_seconds == idle.spinning_seconds == 40 * 60.0


def test_a_summarised_spinning_device_without_gpm_has_its_power_ratio() -> None:
    runs = Runs(STEPS, spinning={GPU: {"utilization": 1.0, "power_ratio": 0.2}})
    found = spinning_gpus(WorkSignals(), WINDOW, HS, runs=runs)[GPU]
    assert found.signal == "power" and found.power_ratio == pytest.approx(0.2)
    assert found.sm is None and found.tensor is None


def test_a_summary_wins_over_a_straggler_peers_few_steps_for_spinning() -> None:
    """A straggler group's peers bring some signals of a device (utilization and SM, no
    tensor or DRAM): the device the store found spinning whole stays spinning."""
    runs = Runs(STEPS, spinning={GPU: {"utilization": 0.97, "sm": 0.02, "tensor": 0.0,
                                       "dram": 0.0}})
    partial = WorkSignals(utilization={GPU: steps(0.97)}, sm={GPU: steps(0.02)},
                          gpm=frozenset({GPU}))
    assert spinning_gpus(partial, WINDOW, HS) == {}
    assert spinning_gpus(partial, WINDOW, HS, runs=runs)[GPU].spinning


def test_an_allocated_idle_container_summarised_whole() -> None:
    c = ContainerRef(GPU.node, "ml", "train-0", "main", GPU.uuid)
    by_steps = allocated_idle({c: steps(0.01)}, {c: "sm"}, WINDOW, HS)
    summarised = allocated_idle({}, {}, WINDOW, HS, runs=Runs(STEPS, held_idle={c: ("sm", 0.01)}))
    assert len(summarised) == len(by_steps) == 1
    assert summarised[0].ref == c and summarised[0].signal == "sm"
    assert (summarised[0].since, summarised[0].seconds) == (by_steps[0].since,
                                                            by_steps[0].seconds)
    assert summarised[0].usage == pytest.approx(by_steps[0].usage)
    # A summary whose steps do not reach the window's end describes no present: no
    # finding.
    stale = Runs(STEPS[:-3], held_idle={c: ("sm", 0.01)})
    assert allocated_idle({}, {}, WINDOW, HS, runs=stale) == []


def test_a_page_scoped_to_a_cluster_keeps_that_clusters_summaries() -> None:
    mine, theirs = GpuRef("east/gpu-node-1", "GPU-1"), GpuRef("west/gpu-node-1", "GPU-1")
    c = ContainerRef(mine.node, "ml", "train-0", "main", mine.uuid)
    runs = Runs(
        STEPS, idle={mine: "utilization", theirs: "utilization"}, held=frozenset({theirs}),
        spinning={theirs: {"utilization": 1.0}}, held_idle={c: ("utilization", 0.0)},
        stragglers={("east", "ml", "Job/a", "H100"): GroupRun("stalled", "utilization", 0.9,
                                                             {mine: 0.1}),
                    ("west", "ml", "Job/a", "H100"): GroupRun("stalled", "utilization", 0.9,
                                                             {theirs: 0.1})})
    data = FleetData(window=WINDOW, history_start=HS, runs=runs)
    east = scoped_data(data, "east").runs
    assert east is not None and east.steps == STEPS
    assert (dict(east.idle), east.held, dict(east.spinning), dict(east.held_idle)) == (
        {mine: "utilization"}, frozenset(), {}, {c: ("utilization", 0.0)})
    assert list(east.stragglers) == [("east", "ml", "Job/a", "H100")]
    assert scoped_data(FleetData(window=WINDOW, history_start=HS), "east").runs is None
