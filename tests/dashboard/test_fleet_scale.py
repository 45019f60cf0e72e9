"""A large fleet stays readable and light: the heatmap draws at most MAX_HEATMAP_NODES nodes,
idle and spinning ones first, and sums every node up by instance type; tables are sent at
their first TOP_ROWS rows with a note saying how many there are (all of them a click away,
and as CSV); the pod picker offers a
bounded list, the pods in a table first. On hand-built data for 1,000 nodes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuscope.dashboard import components, ids, sections
from gpuscope.dashboard.callbacks import MAX_POD_CHOICES, _pod_choices
from gpuscope.dashboard.data.source import DataError
from gpuscope.dashboard.figures import heatmap_figure, heatmap_summary
from gpuscope.dashboard.plan.runs import detail_nodes
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import (
    MAX_HEATMAP_NODES,
    ContainerRef,
    FleetData,
    GpuInfo,
    GpuRef,
    NodeInfo,
    NodeSummary,
    PodInfo,
)
from gpuscope.dashboard.views import build_fleet_view
from tests.dashboard.conftest import make_series, make_window

NODES = 1000
IDLE = range(0, NODES, 7)        # every 7th node idle: 143 of them
BUSY_MEAN = 0.8


def fleet(half_idle: range = range(0)) -> FleetData:
    """The 1,000 nodes; those of ``half_idle`` with their first four GPUs idle."""
    window = make_window(3600.0)
    gpus, nodes, busy_max, mean, containers, pods = {}, {}, {}, {}, {}, {}
    for n in range(NODES):
        node = f"node-{n:04d}"
        nodes[node] = NodeInfo(node, "p4d.24xlarge" if n % 2 else "g5.12xlarge")
        for g in range(8):
            ref = GpuRef(node, f"GPU-{n:04d}-{g}")
            gpus[ref] = GpuInfo(node, str(g), ref.uuid, "A100")
            idle = n in IDLE or (n in half_idle and g < 4)
            mean[ref] = 0.0 if idle else BUSY_MEAN - n / 10_000
            if idle:
                busy_max[ref] = make_series([0.0] * 61)
            c = ContainerRef(node, "ml", f"pod-{n:04d}-{g}", "main", ref.uuid)
            containers[c] = make_series([mean[ref]] * 61)
            pods[c.pod_key] = PodInfo(node, "ml", c.pod)
    return FleetData(window=window, history_start=window.start, gpus=gpus, nodes=nodes,
                     gpu_busy_max=busy_max, gpu_mean=mean, containers=containers,
                     pods=pods, silent=frozenset())


@pytest.fixture(scope="module")
def view():  # type: ignore[no-untyped-def]
    return build_fleet_view(fleet(), bundled_prices())


def test_the_heatmap_draws_idle_nodes_first_and_sums_up_every_node(view) -> None:  # type: ignore[no-untyped-def]
    h = view.heatmap
    assert view.kpis.idle_nodes == len(IDLE) == 143
    assert len(h.nodes) == MAX_HEATMAP_NODES and h.total_nodes == NODES
    assert h.hidden_nodes == NODES - MAX_HEATMAP_NODES
    # Idle nodes first (all of them fit), then the least busy of the rest.
    idle = {f"node-{n:04d}" for n in IDLE}
    assert set(h.nodes[:len(IDLE)]) == idle
    assert all(all(row) for row in h.idle[:len(IDLE)])
    rest = [int(n.split("-")[1]) for n in h.nodes[len(IDLE):]]
    assert rest == sorted(rest, reverse=True)  # the busy means fall with the node number
    # Every node counted by instance type, idle GPUs first.
    by_type = {g.name: g for g in h.groups}
    assert sum(g.nodes for g in h.groups) == NODES
    assert sum(g.idle for g in h.groups) == 8 * len(IDLE) == view.kpis.idle
    assert by_type["p4d.24xlarge"].nodes == by_type["g5.12xlarge"].nodes == NODES // 2
    lines = heatmap_summary(h)
    assert lines[0].startswith(f"Showing {MAX_HEATMAP_NODES} of 1,000 nodes")
    assert any(line.startswith("p4d.24xlarge: 500 nodes, 4,000 GPUs") for line in lines)
    fig = heatmap_figure(h)
    assert len(fig.data[0].y) == MAX_HEATMAP_NODES
    assert "Showing 200 of 1,000 nodes" in fig.layout.title.text


def summaries_of(full: FleetData) -> dict[str, NodeSummary]:
    """Each node of ``full`` as the recording rules send it: its 8 GPUs and their mean."""
    summaries = {}
    for node in full.nodes:
        means = [m for ref, m in full.gpu_mean.items() if ref.node == node]
        summaries[node] = NodeSummary(gpus=8, mean=sum(means) / len(means), known=8,
                                      model="A100")
    return summaries


def test_nodes_sent_as_numbers_give_the_same_page(view) -> None:  # type: ignore[no-untyped-def]
    """The Prometheus mode with the recording rules sends most nodes as a NodeSummary (whole
    GPUs, their mean, the model) and the devices of the nodes the data layer picks
    (``detail_nodes``: the named ones and the least busy, which the heatmap may draw): the
    same KPIs, heatmap, groups, prices and rows as with every device sent."""
    full = fleet()
    summaries = summaries_of(full)
    idle = {f"node-{n:04d}" for n in IDLE}
    rows = detail_nodes(idle, summaries)
    assert idle < rows and len(rows) == MAX_HEATMAP_NODES
    lean = replace(
        full, node_summaries=summaries,
        gpus={r: g for r, g in full.gpus.items() if r.node in rows},
        gpu_mean={r: m for r, m in full.gpu_mean.items() if r.node in rows})
    got = build_fleet_view(lean, bundled_prices())
    assert replace(got.kpis, mean_utilization=None) == replace(view.kpis, mean_utilization=None)
    assert got.kpis.mean_utilization == pytest.approx(view.kpis.mean_utilization, rel=1e-12)
    assert got.kpis.gpus == 8 * NODES and got.kpis.busy == 8 * (NODES - len(IDLE))
    assert replace(got.heatmap, groups=()) == replace(view.heatmap, groups=())
    assert [replace(g, mean_utilization=None) for g in got.heatmap.groups] == [
        replace(g, mean_utilization=None) for g in view.heatmap.groups]
    for a, b in zip(got.heatmap.groups, view.heatmap.groups, strict=True):
        assert a.mean_utilization == pytest.approx(b.mean_utilization, rel=1e-12)
    assert got.idle_rows == view.idle_rows and got.nodes == view.nodes
    # A summarised node never drawn without its devices, even where a summary's mean
    # is not what its devices' means give (a GPU that reported for part of the window).
    skewed = {n: replace(s, mean=0.0) if n == "node-0999" else s for n, s in summaries.items()}
    rows = detail_nodes(idle, skewed)
    assert "node-0999" in rows
    got = build_fleet_view(replace(
        lean, node_summaries=skewed,
        gpus={r: g for r, g in full.gpus.items() if r.node in rows},
        gpu_mean={r: m for r, m in full.gpu_mean.items() if r.node in rows}), bundled_prices())
    assert "node-0999" in got.heatmap.nodes
    assert all(any(z is not None for z in row) for row in got.heatmap.z)


def test_the_heatmaps_means_are_read_for_the_nodes_it_draws(view) -> None:  # type: ignore[no-untyped-def]
    """With the rules the store sends the named nodes' devices without their window means;
    the heatmap reads those of the nodes it draws, once, and draws what every mean sent
    gives. A failed read costs the heatmap's cells, not the page, and the page says so."""
    full = fleet()
    summaries = summaries_of(full)
    asked: list[list[str]] = []

    def means_of(nodes, inventory_of):  # type: ignore[no-untyped-def]
        asked.append(sorted(nodes))
        assert not inventory_of  # (no node sent with some of its devices)
        return {r: m for r, m in full.gpu_mean.items() if r.node in set(nodes)}, {}

    lean = replace(full, node_summaries=summaries, gpu_mean={}, read_devices=means_of)
    got = build_fleet_view(lean, bundled_prices())
    assert asked == [sorted(view.heatmap.nodes)]
    assert got.heatmap.z == view.heatmap.z and got.heatmap.nodes == view.heatmap.nodes
    assert got.idle_rows == view.idle_rows and not got.notes

    def broken(nodes, inventory_of):  # type: ignore[no-untyped-def]
        raise DataError("Prometheus http://prom:9090: timed out after 30 s")

    got = build_fleet_view(replace(lean, read_devices=broken), bundled_prices())
    assert got.heatmap.nodes == view.heatmap.nodes and got.idle_rows == view.idle_rows
    assert all(z is None for row in got.heatmap.z for z in row)
    assert got.notes == ("The heatmap's utilization could not be read (Prometheus "
                         "http://prom:9090: timed out after 30 s): its cells are blank.",)


def test_nodes_sent_with_their_idle_devices_alone_give_the_same_page() -> None:
    """With the rules, a node that only idle devices name is sent with those devices alone
    (``FleetData.partial_nodes``, its GPUs counted by its summary): the same KPIs, idle
    nodes, prices, showback and heatmap as with every device sent; the heatmap reads the
    inventory (and means) of the drawn nodes of those, and no other node's inventory."""
    half = range(3, NODES, 7)  # 143 nodes with four idle GPUs and four busy
    full = fleet(half)
    whole = build_fleet_view(full, bundled_prices())
    summaries = summaries_of(full)
    named = {r.node for r in full.gpu_busy_max}
    assert len(named) == 2 * 143
    partial = {n: 8 for n in named}
    asked: list[tuple[list[str], list[str]]] = []

    def read(nodes, inventory_of):  # type: ignore[no-untyped-def]
        asked.append((sorted(nodes), sorted(inventory_of)))
        return ({r: m for r, m in full.gpu_mean.items() if r.node in set(nodes)},
                {r: g for r, g in full.gpus.items() if r.node in set(inventory_of)})

    lean = replace(
        full, node_summaries=summaries, gpu_mean={}, read_devices=read, partial_nodes=partial,
        gpus={r: g for r, g in full.gpus.items() if r in full.gpu_busy_max})
    got = build_fleet_view(lean, bundled_prices())
    assert got.kpis.gpus == 8 * NODES and got.kpis.idle == 8 * 143 + 4 * 143
    assert replace(got.kpis, mean_utilization=None) == replace(whole.kpis,
                                                               mean_utilization=None)
    assert got.idle_rows == whole.idle_rows and len(got.idle_rows) == 143
    assert got.owners == whole.owners and not got.notes
    assert got.heatmap.nodes == whole.heatmap.nodes and got.heatmap.z == whole.heatmap.z
    assert got.heatmap.idle == whole.heatmap.idle
    drawn = set(whole.heatmap.nodes)
    assert asked == [(sorted(drawn), sorted(drawn & named))]
    # A node's GPUs not sent are busy: none of the partial nodes with four busy GPUs idle.
    assert not {r.node for r in got.idle_rows} & {f"node-{n:04d}" for n in half}


def test_tables_and_pickers_are_bounded(view) -> None:  # type: ignore[no-untyped-def]
    assert components.count_note(12, "row", "rows", "none") == "12 rows."
    # A table is sent its first TOP_ROWS rows, its note saying how many there are; "show
    # all rows" sends them all, and the CSV holds every one.
    rows, note, n = sections.table_rows(view, ids.IDLE_NODES_TABLE, {}, sections.TOP_ROWS)
    assert n == len(IDLE) == 143 and len(rows) == sections.TOP_ROWS == 50
    assert note.startswith("143 idle nodes.") and "first 50 of 143" in note
    filled = sections.fill(view, {})
    assert len(filled[(ids.IDLE_NODES_TABLE, "data")]) == 50
    assert len(sections.fill(view, {}, {ids.IDLE_NODES_TABLE: 1000})[
        (ids.IDLE_NODES_TABLE, "data")]) == 143
    lines = sections.csv_text(view, ids.IDLE_NODES_TABLE).splitlines()
    assert len(lines) == 1 + 143 and lines[0].startswith("Node,Instance type,GPUs,")
    assert lines[1].startswith("node-0") and "](" not in lines[1]  # links as their text
    assert len(view.pods) == 8 * NODES > MAX_POD_CHOICES
    choices = _pod_choices(view)
    assert len(choices) == MAX_POD_CHOICES and set(choices) <= set(view.pods)


def test_the_collector_is_held_off_while_a_page_is_computed_and_restored_after() -> None:
    """gc_paused: off inside (nested and from two threads at once), back on after the last
    holder leaves, and left off where it was off before; the page computations hold it."""
    import gc
    import threading

    from gpuscope.dashboard.series import gc_paused

    assert gc.isenabled()
    seen: list[bool] = []
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            leave.wait(10)
            seen.append(gc.isenabled())

    worker = threading.Thread(target=other)
    with gc_paused():
        worker.start()
        assert inside.wait(10)
        with gc_paused():
            seen.append(gc.isenabled())
        seen.append(gc.isenabled())
    seen.append(gc.isenabled())  # the other thread still holds it
    leave.set()
    worker.join(10)
    assert seen == [False, False, False, False]
    assert gc.isenabled()

    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()

    states: list[bool] = []
    import gpuscope.dashboard.views as views

    real = views._build_fleet_view

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        states.append(gc.isenabled())
        return real(*args, **kwargs)

    views._build_fleet_view = spy
    try:
        build_fleet_view(fleet(), bundled_prices())
    finally:
        views._build_fleet_view = real
    assert states == [False] and gc.isenabled()
