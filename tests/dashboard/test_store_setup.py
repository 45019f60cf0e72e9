"""A store set up as a first setup often has it, and what the page says of it. Two real
simulated exporters, one scraped with the ``node`` label and one without, by a real
Prometheus and a real VictoriaMetrics:

- a scrape config that leaves out the ``node`` label (a user's own job, without the
  relabeling the shipped ServiceMonitor, PodMonitor and ``deploy/prometheus/
  scrape-config.yaml`` do): the page cannot place those GPUs on a node, and says why instead
  of "No GPUs reported yet";
- the dashboard's clock ahead of the store's newest sample (clock skew, or data that reaches
  the store late): the page ends where the store has data, as many steps earlier as that
  takes, and says so, instead of losing every verdict that needs a point at its last step."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator

import pytest

from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.verdicts import Thresholds
from gpuscope.dashboard.views import FleetView, page_view
from tests.conftest import ExporterProcess, stop_all, wait_for
from tests.stores import Store, start_prometheus, start_victoriametrics

LABELLED, BARE = "gpu-labelled", "gpu-bare"


@pytest.fixture(scope="module")
def exporters() -> Iterator[dict[str, ExporterProcess]]:
    started = {node: ExporterProcess(["--source", "simulated", "--interval", "0.5",
                                      "--node-name", node]) for node in (LABELLED, BARE)}
    try:
        for e in started.values():
            e.wait_ready(60)
        yield started
    finally:
        stop_all(started.values())


@pytest.fixture(scope="module")
def stores(prometheus_bin: str, exporters: dict[str, ExporterProcess]
           ) -> Iterator[dict[str, Store]]:
    labelled, bare = exporters[LABELLED], exporters[BARE]
    scrape = (
        f"  - job_name: labelled\n    scrape_interval: 1s\n    static_configs: "
        f"[{{targets: ['127.0.0.1:{labelled.port}'], labels: {{node: {LABELLED}}}}}]\n"
        # The exporter states its node in gpu_node_info alone; the job adds no label.
        f"  - job_name: bare\n    scrape_interval: 1s\n    static_configs: "
        f"[{{targets: ['127.0.0.1:{bare.port}']}}]")
    with start_prometheus(scrape_config=scrape) as prom, start_victoriametrics(
            scrape_config=scrape, scrape_interval="1s",
            extra_args=["-search.latencyOffset=1s"]) as vm:
        wait_for(lambda: all(s.scalar('count(gpu_info{node=""})')
                             and s.scalar(f'count(gpu_info{{node="{LABELLED}"}})')
                             for s in (prom, vm)),
                 60, "both exporters' gpu_info in both stores")
        yield {"prometheus": prom, "victoriametrics": vm}


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_the_page_says_how_many_gpus_lack_the_node_label(
        stores: dict[str, Store], store: str) -> None:
    s = stores[store]
    count = s.scalar('count(gpu_info{node="", parent_uuid=""})')  # whole GPUs
    assert count is not None
    bare_gpus = round(count)
    prom = PrometheusData(s.url, timeout=30)
    views: list[FleetView] = []

    def drawn() -> bool:  # (a store seconds old: until the page's history has begun)
        views.append(page_view(prom, 300.0, bundled_prices()))
        return bool(views[-1].heatmap.nodes)
    try:
        wait_for(drawn, 60, "the labelled exporter's GPUs on the page")
    finally:
        prom.close()
    view = views[-1]
    assert view.heatmap.nodes == (LABELLED,)  # the bare exporter's GPUs have no node
    labelled_gpus = s.scalar(f'count(gpu_info{{node="{LABELLED}", parent_uuid=""}})')
    assert view.kpis.gpus == labelled_gpus
    notes = [n for n in view.notes if "no node label" in n]
    assert notes == [
        f"{bare_gpus:,} GPUs in the store have no node label (gpu_info without `node`) and are "
        "not on this page: add the label in the scrape config from the pod's node name, as "
        "the shipped ServiceMonitor, PodMonitor and deploy/prometheus/scrape-config.yaml do "
        "(docs/dashboard.md)."], view.notes
    assert bare_gpus >= 2


@pytest.mark.parametrize("store", ["prometheus", "victoriametrics"])
def test_a_store_behind_the_dashboards_clock_serves_the_page_where_it_has_data(
        stores: dict[str, Store], store: str) -> None:
    s = stores[store]

    def newest() -> float:
        value = s.scalar("max(timestamp(gpu_node_info))")
        assert value is not None
        return value

    # A 2-minute page on 2 s steps whose queries look back 5 s, its idle verdicts held for
    # 20 s (the store is a minute old: a page of the defaults, a minute's lookback and
    # 30-minute verdicts, would end before its first sample), its dashboard's clock
    # ``ahead`` of the store's newest sample.
    def page(ahead: float, at: float) -> FleetView:
        prom = PrometheusData(s.url, clock=lambda: at + ahead, timeout=30, min_step=2,
                              lookback=5, thresholds=Thresholds(idle_duration=20,
                                                                allocated_idle_duration=20))
        try:
            return page_view(prom, 120.0, bundled_prices())
        finally:
            prom.close()

    def lag_notes(view: FleetView) -> list[str]:
        return [n for n in view.notes if "newest exporter sample" in n]
    at_newest: list[FleetView] = []

    def drawn() -> bool:  # (until the page's history is 30 s long)
        at_newest.append(page(0.0, newest()))
        view = at_newest[-1]
        return bool(view.kpis.gpus) and view.window.end - view.history_start >= 30
    wait_for(drawn, 60, "a page with 30 s of history at the store's newest sample")
    last = newest()
    # Within what a step's queries look back: the page ends at the dashboard's clock.
    assert not lag_notes(page(3.0, last))
    # 20 s ahead (the note says 15-20 s: samples newer than the one read came in since):
    # before, every GPU had no point at the page's last step.
    behind = page(20.0, last)
    # Ended where the store has data (its last read reaches the newest sample), every GPU
    # judged there, as on the page at the newest sample.
    kpis, then = behind.kpis, at_newest[-1].kpis
    assert kpis.gpus == then.gpus > 0 and kpis.no_data == 0
    # (Before: 0 idle GPUs, slices and allocated-idle containers, against 2 each.)
    assert (kpis.idle, kpis.idle_slices, kpis.allocated_idle) == (
        then.idle, then.idle_slices, then.allocated_idle)
    assert then.idle > 0 and then.allocated_idle > 0
    assert last - 5 < behind.window.end < last + 5
    assert behind.heatmap.nodes == (LABELLED,)
    notes = lag_notes(behind)
    assert len(notes) == 1 and re.fullmatch(
        r"The store's newest exporter sample is (1[5-9]|20)s older than the dashboard's clock "
        r"\(\d\d:\d\d:\d\d UTC\): this page ends at \d\d:\d\d:\d\d UTC, where the store has "
        r"data\. Is the store's clock behind, or does data reach it late \(remote write, a "
        r"managed store's ingestion\)\?", notes[0]), notes
    # 400 s ahead: beyond the store's own lookback (5 minutes), so the first round's read at
    # the clock finds no sample (before: an empty page and no note). The page is served at
    # the newest sample found further back, as above.
    far = page(400.0, last)
    assert (far.kpis.gpus, far.kpis.idle, far.kpis.allocated_idle) == (
        then.gpus, then.idle, then.allocated_idle)
    assert last - 5 < far.window.end < last + 5
    notes = lag_notes(far)
    assert len(notes) == 1 and re.fullmatch(
        r"The store's newest exporter sample is 6m (3[2-9]|40)s older than the dashboard's "
        r"clock \(\d\d:\d\d:\d\d UTC\): this page ends at \d\d:\d\d:\d\d UTC, where "
        r"the store has data\. .*", notes[0]), notes


def test_a_failed_scrape_costs_a_node_no_step_of_its_time_there(
        stores: dict[str, Store], exporters: dict[str, ExporterProcess]) -> None:
    # (Last in the module: it stops an exporter.) The labelled exporter frozen for 4 s:
    # its scrapes time out and each store writes staleness markers for its series. Without
    # the rules a node's presence per step was read at the step's instant, so a step that
    # fell in the gap lost the node (charged a step less than the other, ``present``).
    pid = exporters[LABELLED].proc.pid
    # (A scrape that began in the last second waits and succeeds, stamped when it began:
    # the gap in each store is about 3 s, more than a 2-s step, less than the 5-s lookback.)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(4.0)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: all(s.scalar('min_over_time(up{job="labelled"}[30s])') == 0
                         for s in stores.values()), 30, "a failed scrape in both stores")
    time.sleep(4.0)  # (samples after the gap, within the page's last step)
    for name, s in stores.items():
        prom = PrometheusData(s.url, timeout=30, min_step=2, lookback=5)
        try:
            data = prom.fleet(40.0)
        finally:
            prom.close()
        # (Both nodes are counted: the bare one's exporter states its node in gpu_node_info.)
        assert LABELLED in data.nodes and data.present == {}, (name, data.present)
