"""A store set up as a first setup often has it, and what the page says of it. Two real
simulated exporters, one scraped with the ``node`` label and one without, by a real
Prometheus and a real VictoriaMetrics:

- a scrape config that leaves out the ``node`` label (a user's own job, without the
  relabeling the shipped ServiceMonitor, PodMonitor and ``deploy/prometheus/
  scrape-config.yaml`` do): the page cannot place those GPUs on a node, and says why instead
  of "No GPUs reported yet";
- the dashboard's clock ahead of the store's newest sample (clock skew, or data that reaches
  the store late): the verdicts that need a point at the last step are missing, and the page
  says why instead of losing them without a word."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from gpuscope.dashboard.plan import PrometheusData
from gpuscope.dashboard.prices import bundled_prices
from gpuscope.dashboard.views import FleetView, page_view
from tests.conftest import ExporterProcess, wait_for
from tests.stores import Store, start_prometheus, start_victoriametrics

LABELLED, BARE = "gpu-labelled", "gpu-bare"


@pytest.fixture(scope="module")
def stores(prometheus_bin: str) -> Iterator[dict[str, Store]]:
    exporters = {node: ExporterProcess(["--source", "simulated", "--interval", "0.5",
                                        "--node-name", node]) for node in (LABELLED, BARE)}
    try:
        for e in exporters.values():
            e.wait_ready(60)
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
    finally:
        for e in exporters.values():
            e.stop()


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
def test_the_page_says_when_the_stores_newest_sample_is_behind_its_clock(
        stores: dict[str, Store], store: str) -> None:
    s = stores[store]
    newest = s.scalar("max(timestamp(gpu_node_info))")
    assert newest is not None

    def page(ahead: float) -> FleetView:
        prom = PrometheusData(s.url, clock=lambda: newest + ahead, timeout=30)
        try:
            return page_view(prom, 900.0, bundled_prices())  # 15 s steps
        finally:
            prom.close()
    # Within what a step's queries look back (the step, at least a minute): no note.
    for ahead in (5.0, 45.0):
        assert not [n for n in page(ahead).notes if "newest exporter sample" in n]
    notes = [n for n in page(180.0).notes if "newest exporter sample" in n]
    # 165 to 180 s: the page's end is on its 15 s grid.
    assert len(notes) == 1 and re.match(
        r"The store's newest exporter sample is (2m [45]\ds|3m) older than this page's end ",
        notes[0]), notes
    assert notes[0].endswith("Is the store's clock behind, or does data reach it late "
                             "(remote write, a managed store's ingestion)?")
