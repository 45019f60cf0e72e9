"""Showback (issue 30): cost and waste by cluster, namespace and workload
(:mod:`gpuscope.dashboard.verdicts.owners`). The owners' dollars are shares of the page's
own totals, so they add up to the fleet's cost and idle cost in the window to the cent:
checked here on hand-made holdings and on the demo fleet (the embedded store); on 200 nodes
in Prometheus and VictoriaMetrics in ``test_backends`` (raw and recording rules), and per
cluster in ``test_clusters``."""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Iterator

import pytest

from gpuscope.dashboard import components, fmt, ids, sections
from gpuscope.dashboard.data import EmbeddedData
from gpuscope.dashboard.demo import DEMO_SCRAPE_INTERVAL, DemoFleet
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import GpuRef, Holding, HoldingKey, Series
from gpuscope.dashboard.service import DashboardService
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.idle import NodeIdle
from gpuscope.dashboard.verdicts.owners import (
    UNALLOCATED,
    OwnerCost,
    owner_rows,
    rollup,
    run_totals,
    showback,
)
from gpuscope.dashboard.verdicts.page import Row
from gpuscope.dashboard.verdicts.waste import waste
from gpuscope.dashboard.views import FleetView, page_view

NODE = "c1/n1"
HOUR = 3600.0


def owner(rows: tuple[OwnerCost, ...], namespace: str, workload: str = "") -> OwnerCost:
    [row] = [r for r in rows if (r.namespace, r.workload) == (namespace, workload)]
    return row


def add_up(view: FleetView) -> None:
    """The owners' $ spent, idle and spinning are the page's totals, to the cent; each
    roll-up the same sums."""
    k = view.kpis
    for rows in (view.owners, rollup(view.owners, True), rollup(view.owners, False)):
        assert round(math.fsum(r.spent for r in rows), 2) == round(k.spent, 2)
        assert round(math.fsum(r.idle for r in rows), 2) == round(k.wasted, 2)
        assert round(math.fsum(r.spinning for r in rows), 2) == round(k.wasted_spinning, 2)


def test_a_node_is_shared_among_its_holders_and_the_rest_is_unallocated() -> None:
    # A 2-GPU node at $10/hour: Job/a held one GPU all hour, Job/b held a time-slice (half of
    # the other GPU's hour), nobody held the rest. All of it idle, one GPU spinning.
    holdings = {HoldingKey(NODE, "ml", "Job/a"): Holding(HOUR, 0.5 * HOUR),
                HoldingKey(NODE, "ml", "Job/b"): Holding(0.5 * HOUR, 0.0)}
    idle = NodeIdle(NODE, gpus=2, idle_since=0.0, idle_gpu_seconds=2 * HOUR,
                    allocated_gpu_seconds=HOUR, allocated_gpus=1, required_seconds=1800.0,
                    history_seconds=HOUR, spinning_gpu_seconds=HOUR, spinning_gpus=1)
    report = waste({NODE: idle}, {NODE: 10.0})
    rows = showback(holdings, {NODE: 10.0}, lambda n: 2, {}, HOUR, report)
    a, b, rest = owner(rows, "ml", "Job/a"), owner(rows, "ml", "Job/b"), owner(rows, UNALLOCATED)
    assert (a.cluster, a.gpu_hours, a.mean_use) == ("c1", 1.0, 0.5)
    assert (a.spent, b.spent, rest.spent) == (5.0, 2.5, 2.5)
    # The idle node's allocated-idle $5 by how much each held (2:1), its unallocated $5 to
    # the cluster's unallocated row; the spinning $5 like the allocated part.
    assert a.idle == pytest.approx(5.0 * 2 / 3) and b.idle == pytest.approx(5.0 / 3)
    assert rest.idle == 5.0 and a.spinning == pytest.approx(5.0 * 2 / 3)
    assert math.fsum(r.idle for r in rows) == pytest.approx(report.wasted)
    assert [r.namespace for r in rows] == ["(unallocated)", "ml", "ml"]  # waste first
    [cluster] = rollup(rows, by_namespace=False)
    assert (cluster.cluster, cluster.spent, cluster.idle) == ("c1", 10.0, 10.0)


def test_held_time_beyond_the_history_is_scaled_to_the_nodes_cost() -> None:
    # The store counted a step more than the page's history (a window's edge): the node's
    # cost stays its price over the history, all of it the holder's.
    rows = showback({HoldingKey("n", "ml", "Job/a"): Holding(HOUR + 60.0)}, {"n": 4.0},
                    lambda n: 1, {}, HOUR, waste({}, {}))
    assert owner(rows, "ml", "Job/a").spent == 4.0 and owner(rows, UNALLOCATED).spent == 0.0
    assert owner(rows, "ml", "Job/a").gpu_hours == 1.0  # (not 1.0167: one GPU, one hour)


def test_held_hours_fit_what_the_node_can_hold_over_the_history() -> None:
    # A 24-hour window's steps over a store of 48 minutes: the store counted an hour held on
    # both GPUs of a 2-GPU node. GPU-hours were 2.0 beside $ spent for 0.8 h (a cluster of
    # 66 GPUs "held" 66.5 GPU-hours in 48 minutes); both are the history's now, the mean
    # use unchanged.
    holdings = {HoldingKey(NODE, "ml", "Job/a"): Holding(HOUR, 0.5 * HOUR),
                HoldingKey(NODE, "ml", "Job/b"): Holding(HOUR, 0.25 * HOUR)}
    rows = showback(holdings, {NODE: 10.0}, lambda n: 2, {}, 0.8 * HOUR, waste({}, {}))
    a, b = owner(rows, "ml", "Job/a"), owner(rows, "ml", "Job/b")
    assert (a.gpu_hours, b.gpu_hours) == (pytest.approx(0.8), pytest.approx(0.8))
    assert (a.spent, b.spent) == (pytest.approx(4.0), pytest.approx(4.0))
    assert (a.mean_use, b.mean_use) == (pytest.approx(0.5), pytest.approx(0.25))
    assert math.fsum(r.gpu_hours for r in rows) <= 2 * 0.8 + 1e-9


def test_a_long_windows_coarse_step_keeps_the_unallocated_share() -> None:
    # A 7-day window's step (1h 24m) over a store of 62 minutes: the store counted one whole
    # step for each GPU held throughout. Job/a held 6 of the node's 8 GPUs the whole
    # history: 6/8 of the node's cost is its, and 2/8 unallocated. The over-count was capped
    # to the node's cost instead, so Job/a got all of it and the unallocated row $0 (below
    # the idle cost an idle unallocated GPU there adds to it).
    history, step = 3720.0, 5040.0
    rows = showback({HoldingKey(NODE, "ml", "Job/a"): Holding(6 * step, 3 * step)},
                    {NODE: 8.0}, lambda n: 8, {}, history, waste({}, {}), step_seconds=step)
    cost = 8.0 * history / HOUR
    a, rest = owner(rows, "ml", "Job/a"), owner(rows, UNALLOCATED)
    assert a.spent == pytest.approx(cost * 6 / 8) and rest.spent == pytest.approx(cost * 2 / 8)
    assert a.gpu_hours == pytest.approx(6 * history / HOUR)
    assert a.mean_use == pytest.approx(0.5)


def test_a_long_window_over_the_demos_hour_charges_no_owner_more_idle_than_spent(
        demo_store: EmbeddedData) -> None:
    # The demo has an hour of past; a 7-day window's steps (1h 24m) count more than that.
    # p5-mixed's holders were charged its unallocated capacity, and the (unallocated) row's
    # $ idle came out above its $ spent.
    week = page_view(demo_store, 7 * 24 * HOUR, bundled_prices())
    add_up(week)
    for rows in (week.owners, rollup(week.owners, True)):
        for r in rows:
            assert r.idle <= r.spent + 0.005, r
    hpc = owner(week.owners, "hpc", "Job/cfd-solver")  # 3 whole GPUs, all the history
    assert hpc.gpu_hours == pytest.approx(3 * week.kpis.spent / week.kpis.fleet_per_hour,
                                          rel=0.02)


def test_a_run_seen_in_one_long_step_was_seen_over_the_history() -> None:
    # A 7-day window's one step (1h 24m) over a store of 62 minutes: the run's series have
    # one point, at the window's end. The view said "seen 10:50:24 UTC to 10:50:24 UTC"
    # beside 9.72 GPU-hours; the point is the mean of its step, since the history began.
    end, step, began = 1_800_000_000.0, 5040.0, 1_800_000_000.0 - 3720.0
    rows = (OwnerCost("", "ml", "Job/a", gpu_hours=8 * 3720 / HOUR),)
    totals = run_totals(rows, "ml", "Job/a", 0, [Series((end,), (1.0,))], step, began)
    assert totals is not None and (totals.first_seen, totals.last_seen) == (began, end)
    # A run that began within the history: at the start of its first step.
    later = run_totals(rows, "ml", "Job/a", 0, [Series((end - 600, end), (1.0, 1.0))],
                       60.0, began)
    assert later is not None and later.first_seen == end - 660


def test_a_mig_slice_costs_its_share_of_its_gpu() -> None:
    # A 3g slice of a 7-slice GPU on a 1-GPU node at $7/hour, held for the hour.
    ref = GpuRef("n", "MIG-1")
    rows = showback({HoldingKey("n", "ml", "Job/a", "MIG-1"): Holding(HOUR)}, {"n": 7.0},
                    lambda n: 1, {ref: 3 / 7}, HOUR, waste({}, {}))
    a = owner(rows, "ml", "Job/a")
    assert a.gpu_hours == pytest.approx(3 / 7) and a.spent == pytest.approx(3.0)
    assert owner(rows, UNALLOCATED).spent == pytest.approx(4.0)


def test_a_mig_slices_use_is_not_measured_so_not_zero() -> None:
    # NVML gives no per-process utilization on a MIG slice: a holder of slices alone has no
    # mean use (n/a, not 0 %), and one holding a whole GPU as well is measured on it alone.
    slice_ref = GpuRef("n", "MIG-1")
    holdings = {HoldingKey("n", "ml", "Job/mig", "MIG-1"): Holding(HOUR, 0.0),
                HoldingKey("n", "ml", "Job/both", "MIG-1"): Holding(HOUR, 0.0),
                HoldingKey("n", "ml", "Job/both"): Holding(HOUR, 0.8 * HOUR)}
    rows = showback(holdings, {"n": 8.0}, lambda n: 2, {slice_ref: 3 / 7}, HOUR,
                    waste({}, {}))
    mig, both = owner(rows, "ml", "Job/mig"), owner(rows, "ml", "Job/both")
    assert mig.gpu_hours == pytest.approx(3 / 7) and mig.mean_use is None
    assert both.gpu_hours == pytest.approx(1 + 3 / 7) and both.mean_use == pytest.approx(0.8)
    [ns] = rollup([mig, both], by_namespace=True)
    assert ns.mean_use == pytest.approx(0.8)  # the slices' hours left out of the mean
    [row] = owner_rows([mig], 0.0, {})
    assert row["mean_use"] is None


def test_unknown_price_is_unknown_not_free() -> None:
    rows = showback({HoldingKey("dgx", "ml", "Job/a"): Holding(HOUR)}, {"dgx": None},
                    lambda n: 8, {}, HOUR, waste({}, {}))
    [a] = rows
    assert a.gpu_hours == 1.0 and a.unpriced_gpu_hours == 1.0 and a.spent == 0.0
    [row] = registry_rows(rows)
    assert row["spent"] is None and row["gpu_hours"] == 1.0


def registry_rows(rows: tuple[OwnerCost, ...]) -> list[Row]:
    return owner_rows(rows, 0.0, {})


@pytest.fixture(scope="module")
def demo_store() -> Iterator[EmbeddedData]:
    fleet = DemoFleet()
    began = time.time()  # the fleet's clock started before this
    store = EmbeddedData(fleet.start(), interval=5.0, extra_metrics=registry.step_metrics())
    fleet.backfill(store)
    store.scrape_once()
    # The past's first sample is one interval after the hour before the fleet began: a page
    # of the last hour asked sooner than that after the start (a fast machine backfills in
    # less) has a history a little short of an hour, and its owners' hours with it.
    time.sleep(max(0.0, began + DEMO_SCRAPE_INTERVAL - time.time()))
    yield store
    fleet.stop()
    store.close()


@pytest.fixture(scope="module")
def demo(demo_store: EmbeddedData) -> FleetView:
    return page_view(demo_store, HOUR, bundled_prices())


def test_on_the_demo_fleet_the_owners_add_up_to_the_page(demo: FleetView) -> None:
    add_up(demo)
    assert demo.kpis.spent == pytest.approx(demo.kpis.fleet_per_hour)  # an hour of history
    # p5-hung.yaml: gpt-sft holds all 8 GPUs of a p5.48xlarge, spinning all hour: its hour
    # is spent, idle and spinning alike, and the fleet's spinning waste is all its own.
    sft = owner(demo.owners, "ml-train", "PyTorchJob/gpt-sft")
    p5 = bundled_prices().node_price("p5.48xlarge", "on-demand").per_hour
    assert sft.gpu_hours == pytest.approx(8.0) and sft.spent == pytest.approx(p5)
    assert sft.idle == pytest.approx(p5) and sft.spinning == pytest.approx(p5)
    assert demo.owners[0] == sft  # the costliest waste first
    # onprem-dgx.yaml is of unknown price: its job's GPU-hours are there, its $ unknown.
    bert = owner(demo.owners, "ml-train", "PyTorchJob/bert-pretrain")
    assert bert.gpu_hours == pytest.approx(8.0) and bert.unpriced_gpu_hours == bert.gpu_hours


def test_the_tables_and_their_csv(demo: FleetView) -> None:
    rows, note, n = sections.table_rows(demo, ids.COST_BY_NAMESPACE_TABLE, {}, 50)
    assert n == len(rollup(demo.owners, True)) and rows[0]["namespace"] == "ml-train"
    assert "spent" in note
    text = sections.csv_text(demo, ids.COST_BY_WORKLOAD_TABLE)
    table = list(csv.DictReader(io.StringIO(text)))
    assert len(table) == len(demo.owners)
    first = table[0]
    assert first["Workload"] == "PyTorchJob/gpt-sft"  # the link's text
    assert float(first["$ idle"]) == pytest.approx(demo.owners[0].idle)
    # A workload row opens the workload view, keeping the page's cluster.
    [linked] = [r for r in sections.table_rows(demo, ids.COST_BY_WORKLOAD_TABLE,
                                               {"cluster": "c"}, 50)[0]
                if "gpt-sft" in str(r["workload"])]
    assert "workload=ml-train%2FPyTorchJob%2Fgpt-sft" in str(linked["workload"])
    assert "cluster=c" in str(linked["workload"])


def test_a_namespace_filter_keeps_its_own_owners(demo_store: EmbeddedData,
                                                 demo: FleetView) -> None:
    narrowed = page_view(demo_store, HOUR, bundled_prices(), namespace="serving")
    assert narrowed.owners and {o.namespace for o in narrowed.owners} == {"serving"}
    want = {(o.workload, round(o.gpu_hours, 6), round(o.spent, 6)) for o in demo.owners
            if o.namespace == "serving"}
    assert {(o.workload, round(o.gpu_hours, 6), round(o.spent, 6))
            for o in narrowed.owners} == want


def test_a_namespace_pages_footers_are_its_rows_sums(demo_store: EmbeddedData) -> None:
    # The page's idle KPI is the fleet's; the tables' footers add up their own rows.
    narrowed = page_view(demo_store, HOUR, bundled_prices(), namespace="serving")
    for table in (ids.COST_BY_CLUSTER_TABLE, ids.COST_BY_NAMESPACE_TABLE,
                  ids.COST_BY_WORKLOAD_TABLE):
        rows, note, _ = sections.table_rows(narrowed, table, {}, 50)
        spent = math.fsum(float(r["spent"] or 0.0) for r in rows)
        idle = math.fsum(float(r["idle"] or 0.0) for r in rows)
        assert (f"together {fmt.money(spent)} spent and {fmt.money(idle)} idle"
                in note), note
    assert math.fsum(o.idle for o in narrowed.owners) < narrowed.kpis.wasted


def test_on_the_demo_the_mig_service_is_not_shown_as_unused(demo: FleetView) -> None:
    # p5-mixed.yaml: Deployment/asr-api serves from two MIG slices, busy: its use is not
    # measured (n/a), not 0 %.
    asr = owner(demo.owners, "serving", "Deployment/asr-api")
    assert asr.gpu_hours > 0 and asr.mean_use is None


def test_the_workload_view_gains_the_runs_own_totals(demo_store: EmbeddedData) -> None:
    service = DashboardService(demo_store, bundled_prices())
    try:
        assert service.fleet("1h", None).view is not None
        detail, _, problem = service.workload("ml-train/PyTorchJob/gpt-sft", "1h")
        assert detail is not None and problem is None
        totals = service.run_totals(detail, "1h")
        p5 = bundled_prices().node_price("p5.48xlarge", "on-demand").per_hour
        assert totals is not None and totals.gpu_hours == pytest.approx(8.0)
        assert totals.spent == pytest.approx(p5) and totals.spinning == pytest.approx(p5)
        assert totals.first_seen is not None and totals.last_seen is not None
        assert totals.last_seen - totals.first_seen == pytest.approx(HOUR, abs=120)
        note = components.run_totals_note(totals)
        assert "8.00 GPU-hours" in note and f"{fmt.money(p5)} spent" in note
        # A slow-rank run: its straggler counted.
        slow, marks, _ = service.workload("ml-train/PyTorchJob/mixtral-pretrain", "1h")
        assert slow is not None and marks
        slow_totals = service.run_totals(slow, "1h")
        assert slow_totals is not None and slow_totals.stragglers == len(marks)
        # Nothing computed for a view the page has not shown.
        assert service.run_totals(detail, "6h") is None
    finally:
        service.close()


def test_the_fleet_cost_card_says_what_the_window_cost(demo: FleetView) -> None:
    text = str(components.kpi_cards(demo))
    assert f"{fmt.money(demo.kpis.spent)} over the window" in text
    # The demo's spot g6.xlarge: the bundled price file has no spot price, so it is priced
    # on demand, and the card says so.
    assert demo.kpis.spot_nodes == demo.kpis.spot_at_on_demand == 1
    assert "1 spot (1 priced on demand: no spot price in the price file)" in text


def test_an_idle_owner_on_a_node_of_unknown_price_is_not_shown_0_dollars_idle() -> None:
    # A job held the 8 GPUs of a node of unknown price, spinning all hour: its $ idle and
    # $ spinning are unknown as its $ spent is, not $0.00 beside its 8 GPU-hours (nor 0 %
    # of the waste); the table's note says which GPU-hours the dollars leave out.
    idle = NodeIdle("dgx", gpus=8, idle_since=0.0, idle_gpu_seconds=8 * HOUR,
                    allocated_gpu_seconds=8 * HOUR, allocated_gpus=8, required_seconds=1800.0,
                    history_seconds=HOUR, spinning_gpu_seconds=8 * HOUR, spinning_gpus=8)
    report = waste({"dgx": idle}, {"dgx": None})
    rows = showback({HoldingKey("dgx", "ml", "Job/a"): Holding(8 * HOUR)}, {"dgx": None},
                    lambda n: 8, {}, HOUR, report)
    for level in (rows, rollup(rows, True), rollup(rows, False)):
        [row] = owner_rows(level, 5.0, {})
        assert (row["spent"], row["idle"], row["spinning"], row["waste_share"]) == (
            None, None, None, None)
    note = components.run_totals_note(run_totals(rows, "ml", "Job/a", 0, []))
    assert "$0.00" not in note and "unknown" in note


def test_the_owner_tables_note_says_what_gpu_hours_the_dollars_leave_out(
        demo: FleetView) -> None:
    # onprem-dgx.yaml: bert-pretrain's 8 GPU-hours are of unknown price.
    unpriced = math.fsum(o.unpriced_gpu_hours for o in demo.owners)
    assert unpriced >= 8.0
    for table in (ids.COST_BY_CLUSTER_TABLE, ids.COST_BY_NAMESPACE_TABLE,
                  ids.COST_BY_WORKLOAD_TABLE):
        _, note, _ = sections.table_rows(demo, table, {}, 50)
        assert f"{unpriced:,.2f} GPU-hours on nodes of unknown price" in note, note
