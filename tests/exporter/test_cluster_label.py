"""``--cluster-name`` states the cluster on ``gpu_node_info`` only, and what a real Prometheus
(Debian's 2.42) then stores: a scrape without a ``cluster`` target label keeps it; one with
such a target label keeps the target's and renames the exporter's ``exported_cluster`` unless
``honor_labels: true``; the scraping Prometheus' own queries see no external label; remote
write keeps the series' own ``cluster`` over an external label of the same name
(docs/metrics.md, "The cluster label")."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ExporterProcess, free_port, wait_for

CLUSTER = "prod-east"


def labelled(text: str, label: str) -> set[str]:
    """The families of an exposition with a series carrying ``label``."""
    return {family.name for family in text_string_to_metric_families(text)
            for sample in family.samples if label in sample.labels}


def test_only_gpu_node_info_states_the_cluster(
    start_exporter: Callable[..., ExporterProcess]
) -> None:
    with_name = start_exporter("--source", "simulated", "--interval", "0.2",
                               "--cluster-name", CLUSTER)
    text = with_name.metrics()
    assert labelled(text, "cluster") == {"gpu_node_info"}
    (info,) = [s for f in text_string_to_metric_families(text) if f.name == "gpu_node_info"
               for s in f.samples]
    assert info.labels["cluster"] == CLUSTER and info.labels["node_name"]
    # The same as a GPUSCOPE_* variable (the DaemonSet's way); without either, no label.
    from_env = start_exporter("--source", "simulated", "--interval", "0.2",
                              env={"GPUSCOPE_CLUSTER_NAME": CLUSTER})
    assert labelled(from_env.metrics(), "cluster") == {"gpu_node_info"}
    without = start_exporter("--source", "simulated", "--interval", "0.2")
    assert labelled(without.metrics(), "cluster") == set()


class Prometheus:
    def __init__(self, binary: str, workdir: Path, config: dict[str, Any],
                 *flags: str) -> None:
        workdir.mkdir()
        self.url = f"http://127.0.0.1:{free_port()}"
        path = workdir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log = workdir / "prometheus.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={path}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}", *flags],
                stdout=log, stderr=subprocess.STDOUT)

    def series(self, selector: str) -> list[dict[str, str]]:
        response = requests.get(f"{self.url}/api/v1/series", params={"match[]": selector},
                                timeout=5)
        response.raise_for_status()
        return list(response.json()["data"])

    def has(self, selector: str, count: int) -> bool:
        assert self.proc.poll() is None, self.log.read_text()
        try:
            return len(self.series(selector)) >= count
        except requests.RequestException:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def prometheus(prometheus_bin: str, tmp_path: Path
               ) -> Iterator[Callable[..., Prometheus]]:
    started: list[Prometheus] = []

    def start(name: str, config: dict[str, Any], *flags: str) -> Prometheus:
        started.append(Prometheus(prometheus_bin, tmp_path / name, config, *flags))
        return started[-1]

    yield start
    for server in reversed(started):  # a remote-writing scraper before its store
        server.stop()


def test_what_prometheus_stores_of_the_cluster_label(
    start_exporter: Callable[..., ExporterProcess], prometheus: Callable[..., Prometheus]
) -> None:
    exp = start_exporter("--source", "simulated", "--interval", "0.2",
                         "--cluster-name", CLUSTER)
    target = exp.url.removeprefix("http://")
    # The store: remote write into a second Prometheus, as into Mimir, AMP or Thanos Receive.
    store = prometheus("store", {"global": {"scrape_interval": "1h"}},
                       "--web.enable-remote-write-receiver")

    def job(name: str, honor: bool, target_cluster: str | None) -> dict[str, Any]:
        labels = {"cluster": target_cluster} if target_cluster else {}
        return {"job_name": name, "honor_labels": honor, "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [target], "labels": labels}]}

    scraper = prometheus("scraper", {
        "global": {"scrape_interval": "1s", "external_labels": {"cluster": "store-label"}},
        "scrape_configs": [job("plain", False, None), job("relabelled", False, "target-label"),
                           job("honored", True, "target-label")],
        "remote_write": [{"url": f"{store.url}/api/v1/write",
                          "queue_config": {"batch_send_deadline": "1s"}}],
    })
    wait_for(lambda: scraper.has("gpu_node_info", 3), 60, "three scraped jobs")

    def node_info(server: Prometheus, job_name: str) -> dict[str, str]:
        (series,) = server.series(f'gpu_node_info{{job="{job_name}"}}')
        return series

    def info_clusters(server: Prometheus, job_name: str) -> set[str | None]:
        return {s.get("cluster") for s in server.series(f'gpu_info{{job="{job_name}"}}')}

    # No cluster target label: the exporter's cluster as it is; other series have none, the
    # external label notwithstanding (a Prometheus' own queries and rules never see it).
    assert node_info(scraper, "plain")["cluster"] == CLUSTER
    assert info_clusters(scraper, "plain") == {None}
    # A target label cluster (relabelling, a ServiceMonitor's targetLabels) with
    # honor_labels: false wins on every series; the exporter's is kept as exported_cluster.
    relabelled = node_info(scraper, "relabelled")
    assert (relabelled["cluster"], relabelled["exported_cluster"]) == ("target-label", CLUSTER)
    assert info_clusters(scraper, "relabelled") == {"target-label"}
    # honor_labels: true: the exporter's cluster wins on gpu_node_info, the target's on the
    # rest: one node, two cluster names.
    honored = node_info(scraper, "honored")
    assert honored["cluster"] == CLUSTER and "exported_cluster" not in honored
    assert info_clusters(scraper, "honored") == {"target-label"}
    # Remote write adds the external label only where a series has no cluster of its own:
    # gpu_node_info keeps the exporter's; every other series gets the external label.
    wait_for(lambda: store.has("gpu_node_info", 3) and store.has('gpu_info{job="plain"}', 1),
             60, "remote write into the store")
    assert node_info(store, "plain")["cluster"] == CLUSTER
    assert info_clusters(store, "plain") == {"store-label"}
    assert node_info(store, "relabelled")["cluster"] == "target-label"
