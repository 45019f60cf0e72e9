"""Idle GPUs, idle nodes and waste on hand-built series: each flag fires exactly where
DESIGN.md says (utilization < 0.05 for >= min(30 min, window, history)) and not on the
near misses."""

from __future__ import annotations

import pytest

from gpuscope.dashboard.series import GpuInfo, GpuRef
from gpuscope.dashboard.verdicts.idle import gpu_states, idle_gpus, idle_nodes
from gpuscope.dashboard.verdicts.waste import waste
from tests.dashboard.conftest import T0, make_series, make_window

A = GpuRef("node-a", "GPU-a0")
B = GpuRef("node-a", "GPU-a1")
HOUR = 3600.0


def verdict(values: list[float], *, window: float = 2 * HOUR, history: float | None = None,
            step: float = 60.0):
    w = make_window(window, step=step)
    hs = w.start if history is None else T0 - history
    return idle_gpus({A: make_series(values, step=step)}, w, hs)[A]


def test_utilization_just_below_threshold_for_30_minutes_is_idle() -> None:
    # 31 one-minute steps below 0.05 cover 31 minutes: >= 30.
    v = verdict([0.9] * 89 + [0.049] * 31)
    assert v.idle
    assert v.idle_seconds == pytest.approx(31 * 60)
    assert v.idle_since == pytest.approx(T0 - 31 * 60)
    assert v.required_seconds == 30 * 60


def test_exactly_30_minutes_is_idle_29_is_not() -> None:
    assert verdict([0.9] * 90 + [0.0] * 30).idle
    v = verdict([0.9] * 91 + [0.0] * 29)
    assert not v.idle
    assert v.idle_seconds == pytest.approx(29 * 60)


@pytest.mark.parametrize("value", [0.05, 0.06])
def test_at_or_above_threshold_is_not_idle(value: float) -> None:
    v = verdict([value] * 120)
    assert not v.idle
    assert v.idle_since is None


def test_one_busy_step_restarts_the_run() -> None:
    v = verdict([0.0] * 100 + [0.5] + [0.0] * 19)
    assert not v.idle
    assert v.idle_seconds == pytest.approx(19 * 60)


def test_a_gap_in_the_data_breaks_the_run() -> None:
    series = make_series([0.0] * 120)
    gapped = type(series)(series.times[:60] + series.times[70:], series.values[:60]
                          + series.values[70:])
    w = make_window(2 * HOUR)
    v = idle_gpus({A: gapped}, w, w.start)[A]
    assert v.idle_seconds == pytest.approx(50 * 60)
    assert v.idle  # 50 min >= 30 min


def test_window_shorter_than_duration_requires_the_whole_window() -> None:
    # 15-minute window: idle all of it is enough, 14 of 15 minutes is not.
    assert verdict([0.0] * 15, window=15 * 60).idle
    v = verdict([0.3] + [0.0] * 14, window=15 * 60)
    assert not v.idle
    assert v.required_seconds == 15 * 60


def test_short_history_requires_only_the_history_collected() -> None:
    # Embedded mode 5 minutes after start: 5 minutes idle is idle, on 5 minutes of history.
    v = verdict([0.0] * 5, history=5 * 60)
    assert v.idle
    assert v.required_seconds == pytest.approx(5 * 60)
    assert v.history_seconds == pytest.approx(5 * 60)
    assert v.idle_since == pytest.approx(T0 - 5 * 60)
    # ... but a GPU busy 1 minute ago is not, whatever the history.
    assert not verdict([0.5] + [0.0] * 4, history=5 * 60).idle


def test_a_new_gpu_must_be_idle_for_the_full_required_time() -> None:
    # History is 2 h, but the GPU appeared 10 minutes ago: 10 minutes < 30 minutes.
    v = verdict([0.0] * 10, history=2 * HOUR)
    assert not v.idle
    assert v.idle_seconds == pytest.approx(10 * 60)


def test_stale_series_is_not_idle() -> None:
    w = make_window(2 * HOUR)
    old = make_series([0.0] * 60, end=T0 - 3600)
    v = idle_gpus({A: old}, w, w.start)[A]
    assert not v.idle and not v.has_data


def test_allocated_time_in_the_idle_run() -> None:
    w = make_window(2 * HOUR)
    busy = make_series([0.9] * 60 + [0.0] * 60)
    held = make_series([1.0] * 30, end=T0)  # held during the last 30 idle minutes only
    v = idle_gpus({A: busy}, w, w.start, allocated={A: held})[A]
    assert v.idle_seconds == pytest.approx(3600)
    assert v.allocated_seconds == pytest.approx(1800)
    assert v.unallocated_seconds == pytest.approx(1800)


def infos(*refs: GpuRef, mig_parent_of: GpuRef | None = None) -> dict[GpuRef, GpuInfo]:
    out = {r: GpuInfo(r.node, str(i), r.uuid) for i, r in enumerate(refs)}
    if mig_parent_of is not None:
        s = GpuRef(mig_parent_of.node, "MIG-x")
        out[s] = GpuInfo(s.node, "0/1", s.uuid, parent_uuid=mig_parent_of.uuid)
    return out


def test_node_is_idle_only_when_every_gpu_is() -> None:
    w = make_window(2 * HOUR)
    idle, busy = make_series([0.0] * 120), make_series([0.0] * 119 + [0.3])
    v = idle_gpus({A: idle, B: idle}, w, w.start)
    assert set(idle_nodes(infos(A, B), v)) == {"node-a"}
    v = idle_gpus({A: idle, B: busy}, w, w.start)
    assert idle_nodes(infos(A, B), v) == {}
    # A GPU without utilization (lost, MIG without per-slice data) cannot be shown idle.
    v = idle_gpus({A: idle}, w, w.start)
    assert idle_nodes(infos(A, B), v) == {}


def test_mig_slices_do_not_count_as_gpus_of_the_node() -> None:
    # B is in MIG mode: it is judged by its one slice, and counts as one GPU of the node.
    w = make_window(2 * HOUR)
    mig = GpuRef("node-a", "MIG-x")
    v = idle_gpus({A: make_series([0.0] * 120), mig: make_series([0.0] * 120)}, w, w.start)
    node = idle_nodes(infos(A, B, mig_parent_of=B), v)["node-a"]
    assert node.gpus == 2 and node.mig_gpus == 1


def test_waste_is_idle_gpu_hours_times_price_per_gpu_split_by_allocation() -> None:
    w = make_window(2 * HOUR)
    busy_then_idle = make_series([0.9] * 60 + [0.0] * 60)   # idle 1 h
    idle_always = make_series([0.0] * 120)                   # idle 2 h
    held = make_series([1.0] * 120)
    v = idle_gpus({A: busy_then_idle, B: idle_always}, w, w.start, allocated={B: held})
    nodes = idle_nodes(infos(A, B), v)
    report = waste(nodes, {"node-a": 10.0})  # $10/h for 2 GPUs: $5 per GPU-hour
    assert report.burning_per_hour == 10.0
    assert report.wasted == pytest.approx(5.0 * 1 + 5.0 * 2)
    assert report.wasted_allocated == pytest.approx(10.0)    # B, 2 h
    assert report.wasted_unallocated == pytest.approx(5.0)   # A, 1 h
    row = report.nodes[0]
    assert row.idle.allocated_gpus == 1
    assert row.idle.idle_since == pytest.approx(T0 - 3600)   # when the last GPU went idle


def test_unknown_price_is_unknown_never_zero() -> None:
    w = make_window(2 * HOUR)
    v = idle_gpus({A: make_series([0.0] * 120)}, w, w.start)
    report = waste(idle_nodes(infos(A), v), {"node-a": None})
    assert report.unpriced_nodes == ("node-a",)
    assert report.nodes[0].price_per_hour is None
    assert report.nodes[0].wasted is None
    assert report.wasted == 0.0 and report.burning_per_hour == 0.0


def test_first_point_trailing_the_fleet_by_a_scrape_offset_still_covers_history() -> None:
    from gpuscope.dashboard.verdicts.common import trailing_run

    # The fleet's history starts at 100; this device's first sample came 1.5 steps later
    # (targets are scraped at different offsets): its idle run covers all the history.
    run = trailing_run([101.5, 102.5, 103.5], [True, True, True], 1.0, 100.0)
    assert run is not None and run.start == 100.0
    # Three steps later is not an offset but a device that was busy or absent: no benefit.
    run = trailing_run([104.0, 105.0], [True, True], 1.0, 100.0)
    assert run is not None and run.start == 103.0


def test_a_gpu_in_mig_mode_with_no_slice_is_idle_and_its_node_too() -> None:
    # Two H100s in MIG mode with nothing carved: the data layer gives each 0 (signal "mig")
    # at the steps it was so (``uncarved``); each is a whole GPU of idle time, held by
    # nobody, and the node is idle. One whose slices went away 20 minutes ago has been idle
    # 20 minutes: not yet.
    gpus = {r: GpuInfo(r.node, str(i), r.uuid, "NVIDIA H100 80GB HBM3")
            for i, r in enumerate((A, B))}
    w = make_window(HOUR)
    zeros = make_series([0.0] * 61)
    verdicts = idle_gpus({A: zeros, B: zeros}, w, w.start, signal={A: "mig", B: "mig"})
    assert all(v.idle and v.signal == "mig" and v.allocated_seconds == 0.0
               for v in verdicts.values())
    assert gpu_states(gpus, verdicts) == {A: "idle", B: "idle"}
    node = idle_nodes(gpus, verdicts)["node-a"]
    assert (node.gpus, node.allocated_gpus, node.spinning_gpus) == (2, 0, 0)
    assert node.idle_gpu_seconds == pytest.approx(2 * HOUR)
    assert node.unallocated_gpu_seconds == pytest.approx(2 * HOUR)
    late = idle_gpus({A: zeros, B: make_series([0.0] * 20)}, w, w.start,
                     signal={A: "mig", B: "mig"})
    assert not late[B].idle and late[B].idle_seconds == pytest.approx(20 * 60)
    assert gpu_states(gpus, late) == {A: "idle", B: "busy"}
    assert idle_nodes(gpus, late) == {}


def test_a_gpu_in_mig_mode_with_slices_is_judged_by_them() -> None:
    # The GPU's slices are in the inventory: its own verdict, had it one, does not count.
    parent = GpuInfo("node-a", "0", "GPU-a0", "NVIDIA H100 80GB HBM3")
    s = GpuInfo("node-a", "0/1", "MIG-a0-1", "NVIDIA H100 80GB HBM3", "GPU-a0", "3g.40gb")
    gpus = {parent.ref: parent, s.ref: s}
    w = make_window(HOUR)
    busy = idle_gpus({parent.ref: make_series([0.0] * 61), s.ref: make_series([0.9] * 61)},
                     w, w.start, signal={parent.ref: "mig"})
    assert gpu_states(gpus, busy) == {parent.ref: "busy"}
    assert idle_nodes(gpus, busy) == {}
