"""HA pairs (issue 30): two Prometheus replicas scraping one cluster write every series twice
to one store, each copy with its replica label (``prometheus_replica``, as Cortex, Mimir and
Amazon Managed Prometheus' deduplication expects), where the store does not deduplicate.
The page must count every GPU and every dollar once: on a 50-node bench fleet, a real
Prometheus and a real VictoriaMetrics holding the data twice show the very page (KPIs, $,
every table's rows, the showback, the registry's findings) that they show holding it once;
so does VictoriaMetrics with the recording rules evaluated by vmalert over both copies (a
central ruler)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

import bench.fleet as F
from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.views import FleetView, page_view
from tests.dashboard.test_backends import STEP, WINDOW, _close
from tests.dashboard.test_embedded_and_stores import ROWS, headline, numbers
from tests.stores import fleet_in_both, replay_rules

REPLICAS = {"prometheus_replica": ("0", "1")}
#: Fewer nodes than the 200 of test_backends.py: what is checked is that two copies count
#: once, which the bench fleet's mix of verdicts shows at this size (each kind is planted).
NODES = 50

# The module's fixture builds the fleet in both stores twice (one copy, two replicas) and
# replays the rules with vmalert into each VictoriaMetrics: about 25 s on a quiet 2-core
# machine, which the first test's setup is charged with. The suite's 120 s per test caught a
# loaded machine's setup, not a hang.
pytestmark = pytest.mark.timeout(360)


def pages(fleet: F.Fleet, workdir: Any) -> dict[str, FleetView]:
    """Each store's page of ``fleet``, and VictoriaMetrics' with the recording rules
    evaluated over the data by vmalert (a central ruler over both replicas' copies)."""
    end = fleet.shape.end
    out = {}

    def page(url: str, rules: bool) -> FleetView:
        prom = PrometheusData(url, clock=lambda: end, timeout=120)
        if not rules:  # the raw series, whatever the store records
            prom._check_rules = lambda window: (False, 0)  # type: ignore[method-assign]
        try:
            view = page_view(prom, WINDOW, bundled_prices())
            assert prom.rules_loaded(view.window) is rules
            return view
        finally:
            prom.close()

    with fleet_in_both(fleet, workdir) as stores:
        vm = stores[1]
        # The rules recorded before any query: VictoriaMetrics may keep, for a while, the
        # answer "no such series" to a query of a recorded name made before it was written.
        replay_rules(vm, fleet.shape.start, end, workdir)
        for store in stores:
            out[store.kind] = page(store.url, False)
        out["victoriametrics with the rules"] = page(vm.url, True)
    return out


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, FleetView],
                                                                    dict[str, FleetView]]]:
    end = (time.time() // 60 - 5) * 60 - 23.0
    shape = F.Shape(NODES, STEP, WINDOW, end)
    once = pages(F.Fleet(shape), tmp_path_factory.mktemp("once"))
    doubled = F.Fleet(shape, replicas=REPLICAS)
    twice = pages(doubled, tmp_path_factory.mktemp("twice"))
    assert doubled.series == 2 * sum(1 for _ in F.Fleet(shape).series_of())
    yield once, twice


@pytest.mark.parametrize("kind", ["prometheus", "victoriametrics",
                                  "victoriametrics with the rules"])
def test_a_replicated_store_shows_the_page_of_one_copy(
        both: tuple[dict[str, FleetView], dict[str, FleetView]], kind: str) -> None:
    once, twice = both[0][kind], both[1][kind]
    assert headline(twice) == headline(once), kind
    a, b = numbers(twice), numbers(once)
    assert a.keys() == b.keys()
    for part in b:
        assert _close(a[part], b[part]), (kind, part)
    # Not a page with nothing on it: the fleet's idle nodes, their $, every table's rows and
    # the registry's findings.
    assert once.kpis.idle_nodes > 0 and once.kpis.burning_per_hour > 0
    assert all(getattr(once, name) for name in ROWS), kind
    assert once.findings["throttled"]
