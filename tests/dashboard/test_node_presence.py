"""A node charged for the time it was there (a node Karpenter started, or removed, within the
window): the fleet's cost in the window (``Kpis.spent``) and its cluster's showback
(``(unallocated)`` and its holders) count each node's $/hour over the steps its exporter's
series were there, not over the whole history; a node there throughout costs what it did.
On hand-made numbers, in the embedded store, and in Prometheus and VictoriaMetrics, raw and
with the recording rules, on a fleet of two clusters: ``a``'s node there for the whole
window, ``b``'s from a third of it on."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import bench.fleet as F
from gpuscope.dashboard.data import EmbeddedData
from gpuscope.dashboard.data.promql import node_key
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.series import Holding, HoldingKey, presence
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.owners import UNALLOCATED, rollup, showback
from gpuscope.dashboard.verdicts.waste import waste
from gpuscope.dashboard.views import FleetView, page_view
from tests.dashboard.test_showback import add_up
from tests.stores import (
    Store,
    backfill_rules,
    fleet_in_both,
    replay_rules,
    start_prometheus,
)

HOUR = 3600.0
WINDOW = 3600.0
STEP = 60.0
WHOLE, LATE = "gpu-node-00000", "gpu-node-00001"
CLUSTER = {WHOLE: "a", LATE: "b"}
#: The late node's first sample: a third into the window (so there for 40 of its 60 minutes).
LATE_BY = WINDOW / 3

pytestmark = pytest.mark.timeout(600)


def test_presence_is_the_history_less_the_steps_a_node_missed() -> None:
    # 60 one-minute steps over an hour: a node seen at all of them is left out (the whole
    # history, to the second); one seen at 20 of them was there 20 minutes; a step at the
    # window's edge that the store counts for every node changes nothing.
    assert presence({"a": 60, "b": 20}, 60.0, HOUR) == {"b": 1200.0}
    assert presence({"a": 61, "b": 21}, 60.0, HOUR) == {"b": 1200.0}
    assert presence({"a": 60.0, "b": 60.0}, 60.0, HOUR) == {}
    assert presence({}, 60.0, HOUR) == {}


def test_a_node_that_came_up_within_the_window_costs_its_time_there() -> None:
    # A 24-hour window: an 8-GPU node at $10/hour there for all of it, and one that
    # Karpenter started an hour in ($20/hour, 23 hours there; Job/a held 2 of its GPUs for
    # those 23 hours). It was charged 24 hours, $20 more in its cluster's unallocated row.
    day = 24 * HOUR
    holdings = {HoldingKey("b/late", "ml", "Job/a"): Holding(2 * 23 * HOUR, 23 * HOUR)}
    rows = showback(holdings, {"a/whole": 10.0, "b/late": 20.0}, lambda n: 8, {}, day,
                    waste({}, {}), present={"b/late": 23 * HOUR})
    by_cluster = {r.cluster: r for r in rollup(rows, by_namespace=False)}
    assert by_cluster["a"].spent == 10.0 * 24
    assert by_cluster["b"].spent == pytest.approx(20.0 * 23)
    job = next(r for r in rows if r.workload == "Job/a")
    rest = next(r for r in rows if r.cluster == "b" and r.namespace == UNALLOCATED)
    assert job.spent == pytest.approx(20.0 * 23 * 2 / 8)
    assert rest.spent == pytest.approx(20.0 * 23 * 6 / 8)
    assert job.gpu_hours == pytest.approx(2 * 23)


class _LateNode(F.Fleet):
    """Two nodes in clusters ``a`` and ``b``; ``b``'s (:data:`LATE`) has no sample before
    :data:`LATE_BY` into the window: its exporter started then."""

    def series_of(self, family: str | None = None):  # type: ignore[no-untyped-def]
        first = self.shape.end - WINDOW + LATE_BY
        stamps = self.shape.stamps()
        for name, lab, values, ks in super().series_of(family):
            if lab["node"] == LATE:
                ks = [k for k in ks if stamps[k] >= first]
                values = [v if stamps[k] >= first else math.nan for k, v in enumerate(values)]
                if not ks:
                    continue
            yield name, lab, values, ks


def late_fleet(end: float) -> F.Fleet:
    busy, late = F.layout({"near-miss": 2})
    nodes = [replace(busy, cluster="a"), replace(late, cluster="b")]
    assert [n.name for n in nodes] == [WHOLE, LATE]
    return _LateNode(F.Shape(2, STEP, WINDOW, end), nodes)


def charged_for_their_time(view: FleetView, what: str) -> None:
    """``a``'s node costs its price over the history, ``b``'s over its 40 minutes (to a
    step), in the fleet's cost and in its cluster's showback, and the owners add up."""
    # Both g6.xlarge (one GPU), on demand.
    p_whole = p_late = bundled_prices().node_price("g6.xlarge", "on-demand").per_hour
    assert p_whole is not None and p_late is not None
    history = view.history_seconds
    assert history == pytest.approx(WINDOW, abs=STEP), what
    there = WINDOW - LATE_BY
    a, b = node_key("a", WHOLE), node_key("b", LATE)
    assert set(view.nodes) == {a, b}, what
    by_cluster = {o.cluster: o for o in rollup(view.owners, by_namespace=False)}
    # A node there throughout: what it cost before, exactly.
    assert by_cluster["a"].spent == pytest.approx(p_whole * history / HOUR, rel=1e-12), what
    # The late node: its 40 minutes (to a step), not the history's hour.
    assert by_cluster["b"].spent == pytest.approx(p_late * there / HOUR,
                                                  abs=p_late * STEP / HOUR * 1.01), what
    assert view.kpis.spent == pytest.approx(by_cluster["a"].spent + by_cluster["b"].spent,
                                            rel=1e-12), what
    # Its holders' GPU-hours are its time too (from the holdings), and what they did not
    # hold is its cluster's unallocated row, of its time alone.
    b_gpus = 1  # a g6.xlarge
    assert by_cluster["b"].gpu_hours <= b_gpus * (there + STEP) / HOUR, what
    rest = [o for o in view.owners if o.cluster == "b" and o.namespace == UNALLOCATED]
    assert sum(o.spent for o in rest) <= p_late * (there + STEP) / HOUR, what
    add_up(view)


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[F.Fleet, Path, float, dict[str, Store]]]:
    end = (time.time() // 60 - 5) * 60 - 23.0
    fleet = late_fleet(end)
    work = tmp_path_factory.mktemp("presence")
    with fleet_in_both(fleet, work) as stores:
        yield fleet, work / "tsdb", end, {s.kind: s for s in stores}


def test_in_the_embedded_store() -> None:
    end = (time.time() // 60 - 5) * 60 - 23.0
    fleet = late_fleet(end)
    store = EmbeddedData([], interval=STEP, max_points=int(WINDOW // STEP),
                         max_series=1 << 20, clock=lambda: end,
                         extra_metrics=registry.step_metrics())
    try:
        for t, node, samples in F.scrapes(fleet):
            store.ingest(node_key(CLUSTER[node], node), samples, t)
        view = page_view(store, WINDOW, bundled_prices())
    finally:
        store.close()
    charged_for_their_time(view, "embedded")


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics"])
def test_in_prometheus_and_victoriametrics(
        stored: tuple[F.Fleet, Path, float, dict[str, Store]], kind: str) -> None:
    _, _, end, urls = stored
    charged_for_their_time(store_page(urls[kind].url, end, rules=False), kind)


def test_with_the_recording_rules_in_prometheus(
        stored: tuple[F.Fleet, Path, float, dict[str, Store]], tmp_path: Path) -> None:
    fleet, tsdb, end, _ = stored
    blocks = tmp_path / "tsdb"
    shutil.copytree(tsdb, blocks, copy_function=lambda s, d: Path(d).hardlink_to(s))
    backfill_rules(blocks, fleet.shape.start, end, tmp_path)
    with start_prometheus(blocks, copy=False) as store:
        view = page_with_the_rules(store.url, end)
    charged_for_their_time(view, "prometheus, rules")


def test_with_the_recording_rules_in_victoriametrics(
        stored: tuple[F.Fleet, Path, float, dict[str, Store]], tmp_path: Path) -> None:
    fleet, _, end, stores = stored
    vm = stores["victoriametrics"]
    replay_rules(vm, fleet.shape.start, end, tmp_path)
    charged_for_their_time(page_with_the_rules(vm.url, end), "victoriametrics, rules")


def store_page(url: str, end: float, rules: bool) -> FleetView:
    """The page of the store at ``url`` at ``end``, read from its recording rules or (where
    it has none) from the raw series."""
    prom = PrometheusData(url, clock=lambda: end, timeout=60)
    try:
        view = page_view(prom, WINDOW, bundled_prices())
        assert prom.rules_loaded(view.window) is rules
    finally:
        prom.close()
    return view


def page_with_the_rules(url: str, end: float) -> FleetView:
    """The page of the store at ``url`` at ``end``, read from its recording rules."""
    return store_page(url, end, rules=True)
