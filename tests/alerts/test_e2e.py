"""End to end: exporters → Prometheus (the real rules) → Alertmanager (the example routing)
→ a webhook receiver in this test; and the dashboard's verdicts on the same data.

Four simulated nodes (tests/alerts/scenarios/): ``idle-node`` (every GPU idle), and three near
misses: ``busy-node`` (one GPU of four at work), ``mig-node`` (a GPU in MIG mode, one slice at
work) and ``lost-node`` (an idle GPU beside a lost one); and the dashboard's work-signal nodes
(tests/dashboard/scenarios/wsig-*.yaml): a node spinning in a hung collective, near misses
beside a notebook that holds a GPU it does not use, a thermally throttled slow rank, an idle
MIG slice beside a busy one and an idle MIG node without GPM. The rules are the shipped ones
with every ``for:`` capped at a few seconds and every range selector at 10 s
(:func:`gpuscope.alerts.render.cap_for`, :func:`~gpuscope.alerts.render.cap_ranges`, the only
changes); the Alertmanager configuration is the example one with its receivers pointed at the
webhook and its waits shortened. One stack serves the module's tests.
"""

from __future__ import annotations

import queue
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuscope.alerts.render import cap_for, cap_ranges, dump_yaml, load_rules
from tests.alerts.conftest import REPO, Webhook
from tests.conftest import ExporterProcess, free_port, stop_all, wait_for

SCENARIOS = Path(__file__).parent / "scenarios"
WORK_SIGNAL_SCENARIOS = REPO / "tests" / "dashboard" / "scenarios"
NODES = ("idle-node", "busy-node", "mig-node", "lost-node", "wsig-hung", "wsig-mixed",
         "wsig-ddp", "wsig-mig", "wsig-mig-nogpm")
FOR_CAP = "3s"
RANGE_CAP = "10s"


def scenario(node: str) -> Path:
    return (WORK_SIGNAL_SCENARIOS if node.startswith("wsig-") else SCENARIOS) / f"{node}.yaml"


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

    def firing_alerts(self) -> set[tuple[str, str]]:
        """(alert name, node) of every firing alert."""
        found = query(self.prometheus, 'ALERTS{alertstate="firing"}')
        return {(r["metric"]["alertname"], r["metric"].get("node", "")) for r in found}

    def wait_for_notification(self, receiver: str, alertname: str, timeout: float,
                              node: str | None = None) -> dict[str, Any]:
        """The first notification to ``receiver`` that carries ``alertname`` (of ``node``)."""
        def match(entry: tuple[str, dict[str, Any]]) -> bool:
            return entry[0] == receiver and any(
                a["labels"]["alertname"] == alertname
                and (node is None or a["labels"].get("node") == node)
                for a in entry[1]["alerts"])

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
                ["--source", "simulated", "--scenario", str(scenario(node)),
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
        rules.write_text(dump_yaml(cap_ranges(cap_for(load_rules(), FOR_CAP), RANGE_CAP)))
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
        wait_for(ready(f"http://127.0.0.1:{am_port}/-/ready", am), 60, "Alertmanager ready")
        wait_for(ready(prometheus + "/-/ready", prom), 60, "Prometheus ready")
        yield Stack(prometheus, hook, prom, am, began)
    finally:
        for proc in reversed(processes):
            proc.stop()
        stop_all(exporters.values())
        hook.close()


# Everything that fires on these nodes, and nothing else (exporter health, heat, the near
# misses...): (alert, node).
EXPECTED_FIRING = {
    ("GpuNodeUnderutilized", "idle-node"), ("GpuLost", "lost-node"),
    # A node hung in a collective: its GPUs spin, which counts as idle.
    ("GpuNodeUnderutilized", "wsig-hung"), ("GpuSpinning", "wsig-hung"),
    # A MIG node without GPM whose slices run nothing, beside an idle GPU.
    ("GpuNodeUnderutilized", "wsig-mig-nogpm"), ("GpuAllocatedButIdle", "wsig-mig-nogpm"),
    # A notebook holding a GPM GPU that does nothing; an idle MIG slice held by a pod.
    ("GpuAllocatedButIdle", "wsig-mixed"), ("GpuAllocatedButIdle", "wsig-mig"),
    # The slow rank, throttled by heat; the MIG GPU, held down by its power limit.
    ("GpuThrottled", "wsig-ddp"), ("GpuThrottled", "wsig-mig"),
}


@pytest.mark.timeout(120)
def test_alerts_reach_the_webhook_through_alertmanager(stack: Stack) -> None:
    # Routed by severity (warning → the team chat receiver), grouped by node.
    payload = stack.wait_for_notification("gpu-team-chat", "GpuNodeUnderutilized", 45,
                                          node="idle-node")
    assert payload["groupLabels"] == {"node": "idle-node"}
    [alert] = [a for a in payload["alerts"] if a["labels"]["alertname"] == "GpuNodeUnderutilized"]
    assert alert["status"] == "firing"
    assert alert["labels"] == {"alertname": "GpuNodeUnderutilized", "node": "idle-node",
                               "severity": "warning"}
    assert alert["annotations"]["summary"] == "GPU node idle-node has been idle for 1h"
    # The instance type came from gpu_node_info through the annotation's query.
    assert alert["annotations"]["description"] == (
        "Every GPU on node idle-node (g5.12xlarge) has been idle for 1h: below 5% "
        "utilization, or busy without doing any work (spinning), or, for a MIG slice, without "
        "SM activity or processes; the busiest reads 0% utilization. The node is paid for and "
        "does no GPU work.")
    assert alert["annotations"]["runbook_url"] == "docs/alerts.md#gpunodeunderutilized"

    # A critical fault pages: the lost GPU, to the pager receiver.
    payload = stack.wait_for_notification("gpu-oncall-pager", "GpuLost", 20)
    assert payload["groupLabels"] == {"node": "lost-node"}
    assert {a["labels"]["gpu"] for a in payload["alerts"]} == {"1"}

    # The hung job: each spinning GPU with its pod and workload, to the team.
    payload = stack.wait_for_notification("gpu-team-chat", "GpuSpinning", 45, node="wsig-hung")
    spinning = [a["labels"] for a in payload["alerts"] if a["labels"]["alertname"] == "GpuSpinning"]
    assert {(a["gpu"], a["pod"], a["workload"]) for a in spinning} <= {
        ("0", "hung-run-worker-0", "PyTorchJob/hung-run"),
        ("1", "hung-run-worker-1", "PyTorchJob/hung-run")}

    wait_for(lambda: stack.firing_alerts() == EXPECTED_FIRING, 45,
             "the expected alerts, and only them, to fire")
    # The near misses: no idle verdict for busy-node, mig-node, lost-node, not even pending.
    for _receiver, sent in stack.delivered:
        for a in sent["alerts"]:
            assert (a["labels"]["alertname"], a["labels"]["node"]) in EXPECTED_FIRING, sent
    pending_or_firing = query(stack.prometheus, 'ALERTS{alertname="GpuNodeUnderutilized"}')
    assert {r["metric"]["node"] for r in pending_or_firing} == {
        "idle-node", "wsig-hung", "wsig-mig-nogpm"}
    idle_counts = {r["metric"]["node"]: float(r["value"][1])
                   for r in query(stack.prometheus, "node:gpu_idle_devices:count")}
    assert idle_counts == {
        "idle-node": 4.0, "busy-node": 3.0, "lost-node": 1.0,
        "mig-node": 2.0,         # the whole GPU and the slice with no process
        "wsig-hung": 2.0,        # spinning
        "wsig-mixed": 1.0,       # the notebook's GPU
        "wsig-ddp": 0.0,
        "wsig-mig": 1.0,         # the idle slice (SM activity, GPM)
        "wsig-mig-nogpm": 3.0,   # the whole GPU and both slices (no process)
    }
    unmeasured = {r["metric"]["node"]: float(r["value"][1])
                  for r in query(stack.prometheus, "node:gpu_unmeasured_devices:count")}
    assert unmeasured == {"lost-node": 1.0}

    assert time.monotonic() - stack.began < 90


@pytest.mark.timeout(120)
def test_dashboard_verdicts_agree_with_the_alerts(stack: Stack) -> None:
    """The dashboard's tables and the alerts, on the same Prometheus data, with the same
    thresholds and the same (shortened) durations: idle nodes and GpuNodeUnderutilized,
    spinning GPUs and GpuSpinning, throttled GPUs and GpuThrottled, allocated-idle
    containers and GpuAllocatedButIdle."""
    from gpuscope.dashboard.plan import PrometheusData
    from gpuscope.dashboard.prices import bundled_prices
    from gpuscope.dashboard.verdicts import Thresholds
    from gpuscope.dashboard.views import page_view

    wait_for(lambda: stack.firing_alerts() == EXPECTED_FIRING, 60,
             "the expected alerts to fire")
    cap = float(FOR_CAP.removesuffix("s"))
    thresholds = Thresholds(idle_duration=cap, spin_duration=cap, throttle_duration=cap,
                            allocated_idle_duration=cap, straggler_duration=cap,
                            starvation_duration=cap)
    # One-second steps looking back 4 s (no gaps when a scrape is late on a busy machine).
    source = PrometheusData(stack.prometheus, min_step=1.0, lookback=4.0, max_points=120)
    try:
        view = page_view(source, 60.0, bundled_prices(), thresholds)
    finally:
        source.close()

    def firing(alertname: str, *labels: str) -> set[tuple[str, ...]]:
        found = query(stack.prometheus, f'ALERTS{{alertname="{alertname}", alertstate="firing"}}')
        return {tuple(r["metric"].get(k, "") for k in labels) for r in found}

    assert {(r.node,) for r in view.idle_rows} == firing("GpuNodeUnderutilized", "node") == {
        ("idle-node",), ("wsig-hung",), ("wsig-mig-nogpm",)}
    assert {(r.node, r.gpu) for r in view.spinning_rows} == firing(
        "GpuSpinning", "node", "gpu") == {("wsig-hung", "0"), ("wsig-hung", "1")}
    assert {(r.node, r.gpu, r.reason) for r in view.findings["throttled"]} == firing(
        "GpuThrottled", "node", "gpu", "reason") == {("wsig-ddp", "0", "thermal"),
                                                     ("wsig-mig", "0", "power")}
    assert {(r.node, r.namespace, r.pod) for r in view.allocated_idle_rows} == firing(
        "GpuAllocatedButIdle", "node", "namespace", "pod") == {
        ("wsig-mixed", "research", "notebook-x"), ("wsig-mig", "serving", "mig-idle-api"),
        ("wsig-mig-nogpm", "research", "mig-notebook")}
    assert set(view.nodes) >= set(NODES)
