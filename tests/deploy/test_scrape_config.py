"""deploy/prometheus/scrape-config.yaml: promtool accepts it, it targets the rendered exporter,
and a real Prometheus applying its relabeling (and the ServiceMonitor's) stores the exporter's
series with the labels the metric contract promises.

Debian's Prometheus 2.42 (the promtool this suite installs) is built without Kubernetes service
discovery: it rejects `kubernetes_sd_configs` as an unknown field. So promtool checks the job
with that one block swapped for file-based discovery (everything else, relabeling included,
is checked as written), and the `kubernetes_sd_configs` block itself is checked against the
Prometheus configuration reference below. If a promtool with Kubernetes discovery is on PATH,
the file is checked unchanged.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.conftest import ExporterProcess, free_port, wait_for
from tests.deploy.render import DEPLOY, exporter, exporter_container, one, render

SCRAPE_CONFIG = DEPLOY / "prometheus" / "scrape-config.yaml"


def _job() -> dict[str, Any]:
    doc = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert set(doc) == {"scrape_configs"}
    (job,) = doc["scrape_configs"]
    return dict(job)


def _full_config(jobs: list[dict[str, Any]]) -> str:
    """The minimal complete prometheus.yml around scrape jobs."""
    return yaml.safe_dump({
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "scrape_configs": jobs,
    }, sort_keys=False)


def _promtool_check(promtool: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, "check", "config", str(path)],
                          capture_output=True, text=True, timeout=30, check=False)


def test_scrape_config_passes_promtool(promtool: str, tmp_path: Path) -> None:
    job = _job()
    config = tmp_path / "prometheus.yml"
    config.write_text(_full_config([job]))
    result = _promtool_check(promtool, config)
    if result.returncode != 0 and "field kubernetes_sd_configs not found" in result.stderr:
        # This promtool has no Kubernetes discovery (Debian's build): check the rest as written.
        targets = tmp_path / "targets.json"
        targets.write_text("[]")
        swapped = {k: v for k, v in job.items() if k != "kubernetes_sd_configs"}
        swapped["file_sd_configs"] = [{"files": [str(targets)]}]
        config.write_text(_full_config([swapped]))
        result = _promtool_check(promtool, config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# https://prometheus.io/docs/prometheus/latest/configuration/configuration/#kubernetes_sd_config
_K8S_SD_FIELDS = {
    "api_server", "role", "kubeconfig_file", "namespaces", "selectors", "attach_metadata",
    "basic_auth", "authorization", "oauth2", "tls_config", "proxy_url", "follow_redirects",
    "enable_http2", "bearer_token", "bearer_token_file",
}
_ROLES = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}


def test_kubernetes_sd_block_targets_the_rendered_exporter() -> None:
    job = _job()
    (sd,) = job["kubernetes_sd_configs"]
    assert set(sd) <= _K8S_SD_FIELDS
    assert sd["role"] == "pod"
    assert set(sd["namespaces"]) <= {"names", "own_namespace"}
    for selector in sd["selectors"]:
        assert set(selector) <= {"role", "label", "field"} and selector["role"] in _ROLES
        assert selector["role"] == sd["role"], "a selector for another role is an error"

    objs = render("eks")
    ds = exporter(objs)
    assert sd["namespaces"]["names"] == [ds["metadata"]["namespace"]]
    (label_selector,) = [s["label"] for s in sd["selectors"]]
    key, _, value = label_selector.partition("=")
    assert ds["spec"]["template"]["metadata"]["labels"][key] == value
    (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
    assert keep["source_labels"] == ["__meta_kubernetes_pod_container_port_name"]
    assert [p["name"] for p in exporter_container(objs)["ports"]] == [keep["regex"]]
    assert job["honor_labels"] is False
    assert job["job_name"] == one(objs, "Service", "gpuscope-exporter")["metadata"]["labels"][
        "app.kubernetes.io/name"], "same job name as the ServiceMonitor's jobLabel gives"


# ---- a real Prometheus applying the relabeling -------------------------------------------------

SCENARIO = """
version: 1
node: {name: sim-node, instance_type: g5.12xlarge, seed: 3}
gpus:
  - {model: NVIDIA A10G, memory_total: 24GiB, count: 2}
processes:
  - {pid: 1001, gpu: 0, memory: 4GiB, utilization: 0.5, pod: ml/train-a/main}
  - {pid: 2001, gpu: 1, memory: 1GiB, utilization: 0.2}
pods:
  - {namespace: ml, name: train-a, workload: PyTorchJob/a, containers: [{name: main, gpus: ["0"]}]}
"""

# The __meta labels Kubernetes discovery gives an exporter pod (role pod / role endpoints).
POD_META = {
    "__meta_kubernetes_namespace": "gpuscope",
    "__meta_kubernetes_pod_name": "gpuscope-exporter-x7k2p",
    "__meta_kubernetes_pod_node_name": "gpu-node-1",
    "__meta_kubernetes_pod_container_name": "exporter",
    "__meta_kubernetes_pod_container_port_name": "metrics",
    "__meta_kubernetes_pod_phase": "Running",
    "__meta_kubernetes_pod_label_app_kubernetes_io_name": "gpuscope-exporter",
    "__meta_kubernetes_service_name": "gpuscope-exporter",
    "__meta_kubernetes_service_label_app_kubernetes_io_name": "gpuscope-exporter",
}


def _snake(relabel: dict[str, Any]) -> dict[str, Any]:
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): v for k, v in relabel.items()}


def _operator_job(job_name: str, relabelings: list[dict[str, Any]], honor: bool) -> dict[str, Any]:
    """What the Prometheus Operator generates for a ServiceMonitor endpoint: target labels for
    the scraped pod's namespace, service, pod, container, job and endpoint, then the
    ServiceMonitor's own relabelings."""
    generated = [
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_name"],
         "target_label": "job"},
        {"target_label": "endpoint", "replacement": "metrics"},
    ]
    # Last, a job label of the emulation's own, so that the jobs' series stay apart.
    own_job = [{"target_label": "job", "replacement": job_name}]
    return {"job_name": job_name, "honor_labels": honor,
            "relabel_configs": generated + [_snake(r) for r in relabelings] + own_job}


@pytest.fixture
def prometheus(
    prometheus_bin: str, tmp_path: Path
) -> Iterator[Callable[[list[dict[str, Any]]], str]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(jobs: list[dict[str, Any]]) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": jobs}))
        log = (tmp_path / "prometheus.log").open("wb")
        procs.append(subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT,
        ))
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(15)


def _series(url: str, selector: str) -> list[dict[str, str]]:
    response = requests.get(f"{url}/api/v1/series", params={"match[]": selector}, timeout=5)
    response.raise_for_status()
    return list(response.json()["data"])


def test_relabeling_keeps_the_metric_contract(
    start_exporter: Callable[..., ExporterProcess],
    prometheus: Callable[[list[dict[str, Any]]], str],
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    exp = start_exporter("--source", "simulated", "--scenario", str(scenario))
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"targets": [exp.url.removeprefix("http://")],
                                    "labels": POD_META}]))
    file_sd = [{"files": [str(targets)], "refresh_interval": "1s"}]

    plain = copy.deepcopy(_job())
    plain.pop("kubernetes_sd_configs")
    plain |= {"file_sd_configs": file_sd, "scrape_interval": "1s", "scrape_timeout": "1s"}
    (endpoint,) = one(render("eks"), "ServiceMonitor", "gpuscope-exporter")["spec"]["endpoints"]
    servicemonitor = _operator_job("servicemonitor", endpoint["relabelings"],
                                   endpoint["honorLabels"]) | {"file_sd_configs": file_sd}
    # Control: the operator's defaults alone, without gpuscope's labeldrop.
    control = _operator_job("control", [r for r in endpoint["relabelings"]
                                        if r["action"] != "labeldrop"], False)
    control["file_sd_configs"] = file_sd
    # Control: honorLabels: true instead of the labeldrop.
    honor = _operator_job("honor", [r for r in endpoint["relabelings"]
                                    if r["action"] != "labeldrop"], True)
    honor["file_sd_configs"] = file_sd

    url = prometheus([plain, servicemonitor, control, honor])
    # A scrape stores all its families at once: a job with one has them all.
    wait_for(lambda: _ready(url, "container_gpu_allocated", 4), 60, "four scraped jobs")

    for job in (plain["job_name"], "servicemonitor"):
        allocated = _series(url, f'container_gpu_allocated{{job="{job}"}}')
        assert len(allocated) == 1, allocated
        labels = allocated[0]
        assert labels["node"] == "gpu-node-1"
        # The workload's names, exactly as the exporter exposed them.
        workload = (labels["namespace"], labels["pod"], labels["container"])
        assert workload == ("ml", "train-a", "main")
        assert not [k for k in labels if k.startswith("exported_")], labels
        assert not {"service", "endpoint"} & set(labels), labels
        # Device series carry no pod identity at all (not the exporter pod's).
        for device in _series(url, f'gpu_utilization_ratio{{job="{job}"}}'):
            assert set(device) == {"__name__", "job", "instance", "node", "gpu", "uuid"}, device
        # The host process on GPU 1 is not stamped with the exporter pod's name.
        for series in _series(url, f'container_gpu_memory_used_bytes{{job="{job}"}}'):
            assert series.get("namespace") in (None, "ml"), series
            assert "gpuscope" not in series.get("pod", ""), series

    # Without the labeldrop the operator's defaults rename the workload's labels away
    # (exported_namespace) and put the exporter pod's names in their place.
    (broken,) = _series(url, 'container_gpu_allocated{job="control"}')
    assert broken["namespace"] == "gpuscope" and broken["exported_namespace"] == "ml"
    assert re.fullmatch(r"gpuscope-exporter-\w+", broken["pod"])
    # honorLabels: true alone keeps the workload's labels but stamps the device series, which
    # have none, with the exporter pod's.
    (honored,) = _series(url, 'container_gpu_allocated{job="honor"}')
    assert (honored["namespace"], honored["pod"]) == ("ml", "train-a")
    for device in _series(url, 'gpu_utilization_ratio{job="honor"}'):
        assert device["namespace"] == "gpuscope" and device["container"] == "exporter", device


def _ready(url: str, metric: str, jobs: int) -> bool:
    try:
        return len({s["job"] for s in _series(url, metric)}) >= jobs
    except requests.RequestException:
        return False
