"""A real Prometheus scrapes the simulated exporter: ``rate()`` of the work-signal counters is
the scenario's mean, and the exposition passes ``promtool check metrics``.

The counters are exact integrals of scenario time, so a rate over 20 s is the pattern's
mean over those 20 s whatever the sampling and scrape intervals; a bursty pattern whose
period divides neither adds only the error of a partial period at the window's ends.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ExporterProcess, wait_for
from tests.e2e.test_prometheus import prometheus, query, value  # noqa: F401 (a fixture)

MIB = 1024**2

SCENARIO = """
version: 1
node: {name: e2e-work, seed: 11}
gpus:
  - model: NVIDIA H100 80GB HBM3        # 0: steady work; GPM (Hopper)
    throttle:
      thermal: 0.5
      power: {pattern: bursty, high: 0.4, period: 0.35, duty: 0.5}
  - model: NVIDIA H100 80GB HBM3        # 1: bursty work
  - model: NVIDIA A100-SXM4-80GB        # 2: no GPM
processes:
  - pid: 1
    gpu: 0
    utilization: 0.6
    activity: {sm: 0.5, tensor: 0.25, dram: 0.4, occupancy: 0.3, pcie_rx: 100MiB,
               nvlink_tx: 1GiB}
  - pid: 2
    gpu: 1
    utilization: {pattern: bursty, low: 0.1, high: 0.9, period: 0.35, duty: 0.5}
    activity: {sm: 0.8}
  - {pid: 3, gpu: 2, utilization: 0.7}
"""


def test_rates_of_the_work_counters_are_the_scenario_means(
    start_exporter: Callable[..., ExporterProcess],
    prometheus: Callable[[str], str],  # noqa: F811 (the fixture imported above)
    promtool: str,
    tmp_path: Path,
) -> None:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    exp = start_exporter("--source", "simulated", "--scenario", str(scenario), "--interval", "0.2")

    # The exposition: counters typed as such, no GPM series on the A100, promtool clean.
    text = exp.metrics()
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    for name in ("gpu_busy_seconds", "gpu_sm_active_seconds", "gpu_tensor_active_seconds",
                 "gpu_dram_active_seconds", "gpu_graphics_active_seconds",
                 "gpu_pcie_receive_bytes", "gpu_nvlink_transmit_bytes", "gpu_throttle_seconds"):
        assert types[name] == "counter", name
    assert types["gpu_sm_occupancy_ratio"] == "gauge"
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr

    prom = prometheus(f"127.0.0.1:{exp.port}")

    def enough_scraped() -> bool:
        # More than the rate's 20 s: rate() over a window that holds the series' first
        # sample extrapolates only to its zero point, not to the window's start. (20 s hold
        # 57 periods of the bursty patterns below: a part-period moves their mean by under
        # 2 %, inside the 3 % they are checked to.)
        try:
            got = query(prom, 'count_over_time(gpu_busy_seconds_total{gpu="0"}[30s])')
        except requests.RequestException:
            return False
        return bool(got) and float(got[0]["value"][1]) >= 24

    wait_for(enough_scraped, 120, "20 s of scrapes")

    def rate(metric: str, gpu: str, extra: str = "") -> float:
        return value(prom, f'rate({metric}{{gpu="{gpu}"{extra}}}[20s])')

    # GPU 0, steady: the rates are the means exactly (up to the sampling/scrape offset).
    assert rate("gpu_busy_seconds_total", "0") == pytest.approx(0.6, rel=0.01)
    assert rate("gpu_sm_active_seconds_total", "0") == pytest.approx(0.3, rel=0.01)
    assert rate("gpu_tensor_active_seconds_total", "0") == pytest.approx(0.15, rel=0.01)
    assert rate("gpu_dram_active_seconds_total", "0") == pytest.approx(0.24, rel=0.01)
    assert rate("gpu_graphics_active_seconds_total", "0") == pytest.approx(0.6, rel=0.01)
    assert rate("gpu_pcie_receive_bytes_total", "0") == pytest.approx(60 * MIB, rel=0.01)
    assert rate("gpu_nvlink_transmit_bytes_total", "0") == pytest.approx(0.6 * 1024 * MIB,
                                                                          rel=0.01)
    assert rate("gpu_pcie_transmit_bytes_total", "0") == 0
    assert value(prom, 'gpu_sm_occupancy_ratio{gpu="0"}') == pytest.approx(0.18)
    assert rate("gpu_throttle_seconds_total", "0", ', reason="thermal"') == pytest.approx(
        0.5, rel=0.01)
    assert rate("gpu_throttle_seconds_total", "0", ', reason="power"') == pytest.approx(
        0.2, rel=0.03)
    assert rate("gpu_throttle_seconds_total", "0", ', reason="reliability"') == 0

    # GPU 1, bursty (0.9 half the time, 0.1 the other half): the mean, where the gauge of a
    # scrape would be one or the other.
    assert rate("gpu_busy_seconds_total", "1") == pytest.approx(0.5, rel=0.03)
    assert rate("gpu_sm_active_seconds_total", "1") == pytest.approx(0.4, rel=0.03)

    # GPU 2 (A100): busy time and throttling, no GPM series at all (absent, not 0).
    assert rate("gpu_busy_seconds_total", "2") == pytest.approx(0.7, rel=0.01)
    for name in ("gpu_sm_active_seconds_total", "gpu_tensor_active_seconds_total",
                 "gpu_sm_occupancy_ratio", "gpu_nvlink_receive_bytes_total"):
        assert query(prom, f'{name}{{gpu="2"}}') == [], name
    assert value(prom, 'count(gpu_throttle_seconds_total{gpu="2"})') == 11
