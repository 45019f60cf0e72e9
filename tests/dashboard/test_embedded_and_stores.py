"""The embedded store and the Prometheus path give the same findings on the same data (issue
29, item 4). The 200-node fleet of ``test_backends.py`` (same plan, same one-minute scrape
step, same window and end) is loaded into a real Prometheus (promtool blocks) and a real
VictoriaMetrics (its import API), and the same samples are fed scrape by scrape, in time
order, into an :class:`EmbeddedData` through ``ingest()``, labelled as the exporters serve
them (``bench.fleet.scrapes``: no ``node``, ``job`` nor ``instance``; the node passed to
``ingest``).

What agrees: every flag of the page (idle nodes, spinning and throttled GPUs, allocated-idle
and starved containers, stragglers, idle MIG slices), the counts and $/hour of the
headline, and the planted verdicts. Where the numbers differ, and why:

- the grid: the stores' window ends on the last whole step (37 s before the data's end),
  the embedded store's at its clock;
- the step ranges: at a one-minute scrape the embedded store reads gauges over two scrape
  intervals (120 s) and rates over three (180 s), Prometheus over ``max(step, lookback)``
  (60 s) and two lookbacks (120 s): the values at a step (a container's share of its GPU,
  the GPU's % busy, the heatmap's cells) differ a little, not the flags;
- nothing else: the history begins at the window's start on all three (the data began five
  minutes before it), so a finding held through the window is held 60 minutes of 60 on each,
  and the $ wasted in the window agree to the cent (``test_the_history_begins_alike``:
  ``PrometheusData`` looks for data a rate range before the window's first step).

With the stores' grid, their ranges and their history start, every number of the page
agrees with Prometheus' (``test_on_the_stores_grid_every_number_agrees``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import astuple, dataclass, replace
from typing import Any

import pytest

from bench import fleet as F
from gpuscope.dashboard.data import EmbeddedData
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.views import FleetView, build_fleet_view, page_view
from tests.dashboard.test_backends import NODES, STEP, WINDOW, _close, _diff, expected, verdicts
from tests.stores import fleet_in_both

#: Prometheus' default ``lookback`` (PrometheusData): gauges over one, rates over two.
LOOKBACK = 60.0


@dataclass
class Loaded:
    end: float
    expected: F.Expected
    ours: FleetView                  # the embedded store's page
    theirs: dict[str, FleetView]     # each store's page, by kind
    aligned: EmbeddedData            # the same samples, read on the stores' grid and ranges


# The module's fixture builds the 200-node fleet in the embedded store and both real stores; the
# first test's setup is charged with it. On a loaded 2-core machine that passed the suite's 120 s
# per test (a slow machine, not a hang): the module's tests have 360 s each.
pytestmark = pytest.mark.timeout(360)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    # As test_backends.py: the data ends on a minute less 23 s, 5 minutes before now.
    end = (time.time() // 60 - 5) * 60 - 23.0
    fleet = F.Fleet(F.Shape(NODES, STEP, WINDOW, end))
    # One scrape a step (interval = the step), the page's window in WINDOW / STEP steps as
    # PrometheusData makes it (max_points 60: one-minute steps).
    embedded = EmbeddedData([], interval=STEP, max_points=int(WINDOW // STEP),
                            max_series=1 << 20, clock=lambda: end,
                            extra_metrics=registry.step_metrics())
    # The same samples read as Prometheus reads them: its window ends on the last whole
    # step, and an interval of half its lookback makes the embedded store's gauge range
    # (two intervals) and rate range (three) hold the samples that Prometheus' (one
    # lookback, two lookbacks, each 1 ms short) hold on this grid: one, and two.
    aligned = EmbeddedData([], interval=LOOKBACK / 2, max_points=int(WINDOW // STEP),
                           max_series=1 << 20, clock=lambda: (end // STEP) * STEP,
                           extra_metrics=registry.step_metrics())
    last = -1.0
    for t, node, samples in F.scrapes(fleet):
        assert t >= last  # in time order
        last = t
        embedded.ingest(node, samples, t)
        aligned.ingest(node, samples, t)
    assert last == end
    assert embedded.dropped_series == aligned.dropped_series == 0
    ours = page_view(embedded, WINDOW, bundled_prices())
    embedded.close()
    theirs = {}
    with fleet_in_both(fleet, tmp_path_factory.mktemp("embedded")) as stores:
        for store in stores:
            prom = PrometheusData(store.url, clock=lambda: end, timeout=120)
            try:
                theirs[store.kind] = page_view(prom, WINDOW, bundled_prices())
            finally:
                prom.close()
    yield Loaded(end, F.expected(fleet.plan), ours, theirs, aligned)
    aligned.close()


def headline(view: FleetView) -> dict[str, Any]:
    """The KPIs that count or price findings: counts exactly, $/hour to the cent."""
    k = view.kpis
    return {
        "gpus": k.gpus, "busy": k.busy, "idle": k.idle, "no_data": k.no_data,
        "spinning": k.spinning, "throttled": k.throttled, "idle_nodes": k.idle_nodes,
        "allocated_idle": k.allocated_idle, "idle_slices": k.idle_slices,
        "spot_nodes": k.spot_nodes, "unpriced_idle_nodes": k.unpriced_idle_nodes,
        "unpriced_nodes": k.unpriced_nodes,
        "burning_per_hour": round(k.burning_per_hour, 2),
        "allocated_idle_per_hour": round(k.allocated_idle_per_hour, 2),
        "fleet_per_hour": round(k.fleet_per_hour, 2),
    }


def test_embedded_and_stores_give_the_same_verdicts(loaded: Loaded) -> None:
    ours = loaded.ours
    want = expected(loaded.expected)
    assert verdicts(ours) == want, f"embedded:\n{_diff(verdicts(ours), want)}"
    # The same step on every store (the grids a whole number of steps plus 37 s apart).
    assert ours.window.end == loaded.end
    for kind, theirs in loaded.theirs.items():
        assert theirs.window.step == ours.window.step == STEP
        assert theirs.window.end == (loaded.end // STEP) * STEP
        assert verdicts(theirs) == verdicts(ours), (
            f"{kind} vs embedded:\n{_diff(verdicts(theirs), verdicts(ours))}")
        assert headline(theirs) == headline(ours), kind
        # The heatmap draws the same nodes and marks the same GPUs idle or spinning.
        cells = [{n: (i, s) for n, i, s in zip(h.nodes, h.idle, h.spinning, strict=True)}
                 for h in (ours.heatmap, theirs.heatmap)]
        assert cells[0] == cells[1], kind
        assert ours.heatmap.total_nodes == theirs.heatmap.total_nodes == NODES


ROWS = ("idle_rows", "spinning_rows", "allocated_idle_rows", "slice_rows",
        "straggler_rows", "starved_rows", "share_rows", "owners")


def numbers(view: FleetView) -> dict[str, Any]:
    """Every row of the page's tables and its headline, as values."""
    rows: dict[str, Any] = {name: [astuple(r) for r in getattr(view, name)] for name in ROWS}
    # The registry's own verdicts' findings (throttled GPUs, GPU health, MPS).
    rows.update({f"findings:{name}": [astuple(f) for f in found]
                 for name, found in view.findings.items()})
    # A spinning row judged by GPM shows SM, tensor and DRAM activity, not the power the
    # embedded store reads for every device (Prometheus asks it only of GPUs without GPM).
    rows["spinning_rows"] = [astuple(replace(r, power_ratio=None) if r.signal == "gpm" else r)
                             for r in view.spinning_rows]
    # A starved row's text rounds its mean: 0.365 is 0.36499999999999994 summed in one order
    # and 0.3650000000000001 in another, "36%" and "37%" (the number is compared).
    rows["starved_rows"] = [astuple(replace(r, detail="")) for r in view.starved_rows]
    h = view.heatmap
    rows["heatmap"] = {n: row for n, *row in zip(h.nodes, h.z, h.idle, h.spinning, h.mig,
                                                strict=True)}
    rows["groups"] = [astuple(g) for g in h.groups]
    rows["kpis"] = astuple(view.kpis)
    rows["window"] = (view.window, view.history_start, view.workloads_checked)
    return rows


def test_on_the_stores_grid_every_number_agrees(loaded: Loaded) -> None:
    """The embedded store on Prometheus' grid and ranges, from where Prometheus begins its
    history (the one difference left: see the module's docstring), shows every number of the
    page as Prometheus does: each row's values and the headline."""
    theirs = loaded.theirs["prometheus"]
    data = loaded.aligned.fleet(WINDOW)
    assert data.window == theirs.window
    ours = build_fleet_view(replace(data, history_start=theirs.history_start), bundled_prices(),
                            steps=loaded.aligned.step_series(registry.step_queries(), WINDOW))
    a, b = numbers(ours), numbers(theirs)
    for part in b:
        assert _close(a[part], b[part]), part
    # Who uses each device: the embedded store reads every container, Prometheus those its
    # findings need (the registry's verdicts name a device's pods from it).
    assert ours.context is not None and theirs.context is not None
    assert {k: ours.context.pods[k] for k in theirs.context.pods} == theirs.context.pods


# The data began five minutes before the window: on every store the history begins at the
# window's start, and a node idle through the window is idle for its 3,600 s (a history begun
# a step late would show 3,540 s and 1/60 less $ wasted).
def test_the_history_begins_alike(loaded: Loaded) -> None:
    ours = loaded.ours
    assert ours.history_seconds == WINDOW
    for kind, theirs in loaded.theirs.items():
        assert theirs.history_seconds == ours.history_seconds, kind
        assert round(theirs.kpis.wasted, 2) == round(ours.kpis.wasted, 2), kind
        assert ([(r.node, r.idle_seconds) for r in theirs.idle_rows]
                == [(r.node, r.idle_seconds) for r in ours.idle_rows]), kind
