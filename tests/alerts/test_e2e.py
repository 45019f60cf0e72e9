"""End to end: exporters → Prometheus (the real rules) → Alertmanager (the example routing)
→ a webhook receiver in this test; and the dashboard's idle-node verdict on the same data.

Four simulated nodes (tests/alerts/scenarios/): ``idle-node`` (every GPU idle), and three near
misses: ``busy-node`` (one GPU of four at work), ``mig-node`` (a GPU in MIG mode, its slices
without utilization) and ``lost-node`` (an idle GPU beside a lost one). The rules are the
shipped ones with every ``for:`` capped at a few seconds (:func:`gpuscope.alerts.render.cap_for`,
the
only change); the Alertmanager configuration is the example one with its receivers pointed at
the webhook and its waits shortened. One stack serves the module's tests.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuscope.alerts.render import cap_for, dump_yaml, load_rules
from tests.alerts.conftest import REPO
from tests.conftest import ExporterProcess, free_port, wait_for

SCENARIOS = Path(__file__).parent / "scenarios"
NODES = ("idle-node", "busy-node", "mig-node", "lost-node")
FOR_CAP = "3s"


class Webhook:
    """An HTTP server that records every Alertmanager notification by receiver (URL path)."""

    def __init__(self) -> None:
        self.received: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.put((self.path.strip("/"), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def alertmanager_config(webhook_url: str) -> dict[str, Any]:
    """alerts/alertmanager.yml with each receiver replaced by a webhook to
    ``<webhook_url>/<receiver name>`` and every wait shortened; routing and grouping kept."""
    config: dict[str, Any] = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())
    config["receivers"] = [
        {"name": r["name"], "webhook_configs": [{"url": f"{webhook_url}/{r['name']}",
                                                 "send_resolved": False}]}
        for r in config["receivers"]
    ]
    routes = [config["route"], *config["route"].get("routes", [])]
    for route in routes:
        route.update({"group_wait": "1s", "group_interval": "1s"})
    return config


class Process:
    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.log.name}: exited {self.proc.returncode}: "
                                 f"{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def ready(url: str, proc: Process) -> Callable[[], bool]:
    def check() -> bool:
        proc.check()
        try:
            return requests.get(url, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    return check


def query(prometheus: str, promql: str) -> list[dict[str, Any]]:
    r = requests.get(prometheus + "/api/v1/query", params={"query": promql}, timeout=5)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


class Stack:
    def __init__(self, prometheus: str, webhook: Webhook, prom: Process, am: Process,
                 began: float) -> None:
        self.prometheus = prometheus
        self.webhook = webhook
        self.prom = prom
        self.am = am
        self.began = began
        self.delivered: list[tuple[str, dict[str, Any]]] = []

    def firing(self, alertname: str) -> set[str]:
        """Nodes with ``alertname`` firing in Prometheus."""
        found = query(self.prometheus, f'ALERTS{{alertname="{alertname}", alertstate="firing"}}')
        return {r["metric"].get("node", "") for r in found}

    def wait_for_notification(self, receiver: str, alertname: str, timeout: float
                              ) -> dict[str, Any]:
        """The first notification to ``receiver`` that carries ``alertname``."""
        def match(entry: tuple[str, dict[str, Any]]) -> bool:
            return entry[0] == receiver and any(
                a["labels"]["alertname"] == alertname for a in entry[1]["alerts"])

        deadline = time.monotonic() + timeout
        while True:
            for entry in self.delivered:
                if match(entry):
                    return entry[1]
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no {alertname} notification to {receiver} in {timeout} s; got "
                    f"{self.delivered}; firing: {query(self.prometheus, 'ALERTS')}")
            try:
                self.delivered.append(self.webhook.received.get(timeout=0.5))
            except queue.Empty:
                self.prom.check()
                self.am.check()


@pytest.fixture(scope="module")
def stack(
    prometheus_bin: str, alertmanager_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    began = time.monotonic()
    tmp_path = tmp_path_factory.mktemp("alerts-e2e")
    hook = Webhook()
    processes: list[Process] = []
    exporters: dict[str, ExporterProcess] = {}
    try:
        # The exporters, all started at once (ready is awaited below).
        for node in NODES:
            exporters[node] = ExporterProcess(
                ["--source", "simulated", "--scenario", str(SCENARIOS / f"{node}.yaml"),
                 "--interval", "0.5"])

        am_port = free_port()
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(yaml.safe_dump(alertmanager_config(hook.url)))
        am = Process([alertmanager_bin, f"--config.file={am_config}",
                      f"--storage.path={tmp_path / 'am-data'}",
                      f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address="],
                     tmp_path / "alertmanager.log")
        processes.append(am)

        rules = tmp_path / "rules.yaml"
        rules.write_text(dump_yaml(cap_for(load_rules(), FOR_CAP)))
        targets = "\n".join(
            f"      - targets: ['127.0.0.1:{exp.port}']\n        labels: {{node: {node}}}"
            for node, exp in exporters.items()
        )
        prom_config = tmp_path / "prometheus.yml"
        prom_config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{rules}']\n"
            "alerting:\n"
            "  alertmanagers:\n"
            f"    - static_configs: [{{targets: ['127.0.0.1:{am_port}']}}]\n"
            "scrape_configs:\n"
            "  - job_name: gpuscope\n"
            "    static_configs:\n"
            f"{targets}\n"
        )
        prom_port = free_port()
        prometheus = f"http://127.0.0.1:{prom_port}"
        prom = Process([prometheus_bin, f"--config.file={prom_config}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{prom_port}"],
                       tmp_path / "prometheus.log")
        processes.append(prom)

        for exp in exporters.values():
            exp.wait_ready()
        wait_for(ready(f"http://127.0.0.1:{am_port}/-/ready", am), 20, "Alertmanager ready")
        wait_for(ready(prometheus + "/-/ready", prom), 20, "Prometheus ready")
        yield Stack(prometheus, hook, prom, am, began)
    finally:
        for proc in reversed(processes):
            proc.stop()
        for exp in exporters.values():
            exp.stop()
        hook.close()


@pytest.mark.timeout(90)
def test_idle_node_alert_reaches_the_webhook_through_alertmanager(stack: Stack) -> None:
    # Routed by severity (warning → the team chat receiver), grouped by node.
    payload = stack.wait_for_notification("gpu-team-chat", "GpuNodeUnderutilized", 45)
    assert payload["groupLabels"] == {"node": "idle-node"}
    [alert] = [a for a in payload["alerts"] if a["labels"]["alertname"] == "GpuNodeUnderutilized"]
    assert alert["status"] == "firing"
    assert alert["labels"] == {"alertname": "GpuNodeUnderutilized", "node": "idle-node",
                               "severity": "warning"}
    assert alert["annotations"]["summary"] == "GPU node idle-node has been idle for 1h"
    # The instance type came from gpu_node_info through the annotation's query.
    assert alert["annotations"]["description"] == (
        "Every GPU on node idle-node (g5.12xlarge) has stayed below 5% utilization for 1h; "
        "the busiest is at 0%. The node is paid for and does no GPU work.")
    assert alert["annotations"]["runbook_url"] == "docs/alerts.md#gpunodeunderutilized"

    # A critical fault pages: the lost GPU, to the pager receiver.
    payload = stack.wait_for_notification("gpu-oncall-pager", "GpuLost", 20)
    assert payload["groupLabels"] == {"node": "lost-node"}
    assert {a["labels"]["gpu"] for a in payload["alerts"]} == {"1"}

    # The near misses: no idle verdict for busy-node, mig-node, lost-node, not even pending.
    for _receiver, sent in stack.delivered:
        for a in sent["alerts"]:
            assert a["labels"]["alertname"] != "GpuNodeUnderutilized" or (
                a["labels"]["node"] == "idle-node"), sent
    pending_or_firing = query(stack.prometheus, 'ALERTS{alertname="GpuNodeUnderutilized"}')
    assert {r["metric"]["node"] for r in pending_or_firing} == {"idle-node"}
    idle_counts = {r["metric"]["node"]: float(r["value"][1])
                   for r in query(stack.prometheus, "node:gpu_idle_devices:count")}
    assert idle_counts == {"idle-node": 4.0, "busy-node": 3.0, "mig-node": 1.0,
                           "lost-node": 1.0}
    unmeasured = {r["metric"]["node"]: float(r["value"][1])
                  for r in query(stack.prometheus, "node:gpu_unmeasured_devices:count")}
    assert unmeasured == {"mig-node": 1.0, "lost-node": 1.0}
    # Nothing else fires on these nodes (exporter health, starvation, heat...).
    firing = query(stack.prometheus, 'ALERTS{alertstate="firing"}')
    assert {(r["metric"]["alertname"], r["metric"]["node"]) for r in firing} == {
        ("GpuNodeUnderutilized", "idle-node"), ("GpuLost", "lost-node")}, firing

    assert time.monotonic() - stack.began < 60


@pytest.mark.timeout(90)
def test_dashboard_idle_nodes_agree_with_the_alert(stack: Stack) -> None:
    """The dashboard's idle-node flag (its idle-nodes table) and GpuNodeUnderutilized, on the
    same Prometheus data, with the same threshold and the same (shortened) duration."""
    from gpuscope.dashboard.analysis import Thresholds
    from gpuscope.dashboard.data import PrometheusData
    from gpuscope.dashboard.prices import bundled_prices
    from gpuscope.dashboard.views import build_fleet_view

    wait_for(lambda: stack.firing("GpuNodeUnderutilized") == {"idle-node"}, 45,
             "GpuNodeUnderutilized to fire for idle-node")
    source = PrometheusData(stack.prometheus, min_step=1.0, lookback=2.0)
    try:
        thresholds = Thresholds(idle_duration=float(FOR_CAP.removesuffix("s")))
        view = build_fleet_view(source.fleet(60.0), bundled_prices(), thresholds)
    finally:
        source.close()
    dashboard_idle = {row.node for row in view.idle_rows}
    assert dashboard_idle == stack.firing("GpuNodeUnderutilized") == {"idle-node"}
    assert set(view.nodes) >= set(NODES)
