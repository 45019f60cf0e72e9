"""A real Prometheus server scrapes a real exporter running the simulated source.

The scenario below defines exact values; Prometheus' query API must return them. This checks
the whole path: scenario → SimulatedSource → Sampler → collectors → HTTP → Prometheus.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import ExporterProcess, free_port, wait_for

GIB = 1024**3

SCENARIO = """
version: 1
node: {name: e2e-node, instance_type: g5.12xlarge, seed: 7}
gpus:
  - model: NVIDIA A10G
    memory_total: 24GiB
    power_limit: 300
    power_idle: 60
    temperature: {idle: 30, busy: 70}
    sm_clock: {idle: 300MHz, busy: 1710MHz}
    memory_clock: 6251MHz
    ecc: {corrected: 5, uncorrected: 1}
    count: 3
processes:
  - {pid: 1001, gpu: 0, memory: 6GiB, utilization: 0.5, pod: ml/train-a/main}
  - {pid: 1002, gpu: 0, memory: 2GiB, utilization: 0.25, pod: ml/train-b/main}
pods:
  - namespace: ml
    name: train-a
    workload: PyTorchJob/a
    containers: [{name: main, gpus: ["0::0"]}]
  - namespace: ml
    name: train-b
    workload: PyTorchJob/b
    containers: [{name: main, gpus: ["0::1"]}]
  - {namespace: ml, name: notebook, containers: [{name: lab, gpus: [1]}]}
faults:
  - {type: lost, gpu: 2}
  - {type: xid, gpu: 1, code: 79}
"""


@pytest.fixture
def prometheus(prometheus_bin: str, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """Returns a function that starts Prometheus scraping the given target every second."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(target: str) -> str:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: gpuscope\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n"
            "        labels: {node: e2e-node}\n"
        )
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


def query(base: str, promql: str) -> list[dict]:  # type: ignore[type-arg]
    r = requests.get(base + "/api/v1/query", params={"query": promql}, timeout=5)
    r.raise_for_status()
    body = r.json()
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def value(base: str, promql: str) -> float:
    result = query(base, promql)
    assert len(result) == 1, (promql, result)
    return float(result[0]["value"][1])


def test_prometheus_sees_the_scenario_values(
    start_exporter: Callable[..., ExporterProcess],
    prometheus: Callable[[str], str],
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    exp = start_exporter("--source", "simulated", "--scenario", str(scenario), "--interval", "0.5")
    prom = prometheus(f"127.0.0.1:{exp.port}")

    def scraped() -> bool:
        try:
            return bool(query(prom, 'gpu_utilization_ratio{gpu="0"}'))
        except requests.RequestException:
            return False

    wait_for(scraped, 60, "Prometheus to scrape the exporter")

    assert value(prom, 'up{job="gpuscope"}') == 1
    g0 = '{gpu="0", node="e2e-node"}'
    assert value(prom, f"gpu_utilization_ratio{g0}") == pytest.approx(0.75)
    assert value(prom, f"gpu_memory_utilization_ratio{g0}") == pytest.approx(0.375)  # 0.5 x u
    assert value(prom, f"gpu_memory_used_bytes{g0}") == 8 * GIB
    assert value(prom, f"gpu_memory_total_bytes{g0}") == 24 * GIB
    assert value(prom, f"gpu_power_watts{g0}") == pytest.approx(60 + 240 * 0.75)
    assert value(prom, f"gpu_power_limit_watts{g0}") == 300
    assert value(prom, f"gpu_temperature_celsius{g0}") == pytest.approx(30 + 40 * 0.75)
    assert value(prom, f"gpu_sm_clock_hertz{g0}") == 1.71e9
    assert value(prom, f"gpu_memory_clock_hertz{g0}") == 6.251e9
    assert value(prom, f"gpu_ecc_corrected_errors_total{g0}") == 5
    assert value(prom, f"gpu_ecc_uncorrected_errors_total{g0}") == 1

    # GPU 1 is idle: utilization 0 is a real measurement, reported as 0.
    assert value(prom, 'gpu_utilization_ratio{gpu="1"}') == 0
    assert value(prom, 'gpu_power_watts{gpu="1"}') == 60
    assert value(prom, 'gpu_xid_errors_total{gpu="1", xid="79"}') == 1

    # GPU 2 is lost: gpu_up 0 and no measurement series at all.
    assert value(prom, 'gpu_up{gpu="2"}') == 0
    assert query(prom, 'gpu_utilization_ratio{gpu="2"}') == []
    assert query(prom, 'gpu_memory_used_bytes{gpu="2"}') == []
    assert value(prom, 'count(gpu_info{model="NVIDIA A10G"})') == 3

    # Energy is a counter that grows at the power draw: ~240 W on GPU 0.
    time.sleep(4)
    rate = value(prom, f"rate(gpu_energy_joules_total{g0}[5s])")
    assert rate == pytest.approx(60 + 240 * 0.75, rel=0.2)

    # Time-slicing: each container its own value, not the device's copied.
    assert value(prom, 'container_gpu_utilization_ratio{pod="train-a"}') == 0.5
    assert value(prom, 'container_gpu_utilization_ratio{pod="train-b"}') == 0.25
    assert value(prom, 'container_gpu_memory_used_bytes{pod="train-a"}') == 6 * GIB
    assert value(prom, 'sum(container_gpu_allocated{namespace="ml"})') == 3
    assert value(prom, 'container_gpu_utilization_ratio{pod="notebook"}') == 0  # allocated-idle
    assert value(prom, 'count(gpu_pod_info{workload=~"PyTorchJob/.*"})') == 2
    assert value(prom, 'gpu_node_info{instance_type="g5.12xlarge"}') == 1

    assert value(prom, "gpu_exporter_nvml_up") == 1
    assert value(prom, 'gpu_exporter_collector_success{collector="simulated"}') == 1
    # No node/hostname label on our series beyond the one the scrape config adds.
    labels = query(prom, f"gpu_up{g0}")[0]["metric"]
    assert set(labels) == {"__name__", "gpu", "uuid", "instance", "job", "node"}
