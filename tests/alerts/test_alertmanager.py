"""The example Alertmanager configuration: valid, routes by severity, groups by node."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
import requests
import yaml

from gpuscope.alerts.render import load_rules
from tests.alerts.conftest import REPO
from tests.conftest import free_port, wait_for

CONFIG = REPO / "alerts" / "alertmanager.yml"


def test_amtool_check_config(amtool: str) -> None:
    result = subprocess.run([amtool, "check-config", str(CONFIG)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(("labels", "receiver"), [
    (["alertname=GpuLost", "severity=critical", "node=n1"], "gpu-oncall-pager"),
    (["alertname=GpuNodeUnderutilized", "severity=warning", "node=n1"], "gpu-team-chat"),
    (["alertname=GpuAllocatedButIdle", "severity=info", "node=n1"], "gpu-team-digest"),
    (["alertname=SomethingElse", "node=n1"], "gpu-team-chat"),
])
def test_routes_by_severity(amtool: str, labels: list[str], receiver: str) -> None:
    result = subprocess.run(
        [amtool, "config", "routes", "test", f"--config.file={CONFIG}", *labels],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [receiver]


def test_groups_by_node_on_every_route() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert "node" in config["route"]["group_by"]
    for route in config["route"]["routes"]:
        assert "group_by" not in route or "node" in route["group_by"]


# ---- inhibition, in a real Alertmanager ----------------------------------------------------

def _critical_alerts() -> list[str]:
    """Every alert the shipped rules raise with severity critical (read from the rules, so a
    new critical alert is covered without touching this test)."""
    return sorted(
        rule["alert"] for group in load_rules()["groups"] for rule in group["rules"]
        if "alert" in rule and rule.get("labels", {}).get("severity") == "critical")


@pytest.fixture(scope="module")
def alertmanager(alertmanager_bin: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[str]:
    """The example configuration in a real Alertmanager, its receivers pointed at a closed
    port (nothing needs to be delivered: the API reports inhibition itself)."""
    tmp = tmp_path_factory.mktemp("alertmanager")
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    config["receivers"] = [{"name": r["name"], "webhook_configs": [
        {"url": f"http://127.0.0.1:{free_port()}/", "send_resolved": False}]}
        for r in config["receivers"]]
    (tmp / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp / "alertmanager.log").open("wb") as log:
        proc = subprocess.Popen(
            [alertmanager_bin, f"--config.file={tmp / 'alertmanager.yml'}",
             f"--storage.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             "--cluster.listen-address="], stdout=log, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            assert proc.poll() is None, (tmp / "alertmanager.log").read_text()
            try:
                return requests.get(url + "/-/ready", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, 60, "Alertmanager ready")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _inhibited_by(url: str, alertname: str, node: str) -> list[str]:
    r = requests.get(url + "/api/v2/alerts", timeout=5,
                     params={"filter": [f'alertname="{alertname}"', f'node="{node}"']})
    r.raise_for_status()
    (alert,) = r.json()
    inhibited: list[str] = alert["status"]["inhibitedBy"]
    return inhibited


@pytest.mark.parametrize("critical", _critical_alerts())
def test_every_critical_gpu_fault_inhibits_the_idle_alerts_of_its_node(
    alertmanager: str, critical: str
) -> None:
    # The node is idle because its GPU is broken (and drained, as the runbooks say): the idle
    # alerts are a symptom. Another node's idle alert is left alone.
    node, other = f"{critical}-node", f"{critical}-other"
    alerts = [
        {"labels": {"alertname": critical, "severity": "critical", "cluster": "c1",
                    "node": node, "gpu": "0"}},
        *({"labels": {"alertname": "GpuNodeUnderutilized", "severity": "warning",
                      "cluster": "c1", "node": n}} for n in (node, other)),
        {"labels": {"alertname": "GpuAllocatedButIdle", "severity": "info", "cluster": "c1",
                    "node": node, "namespace": "ml", "pod": "p", "container": "c",
                    "gpu": "1"}},
    ]
    requests.post(alertmanager + "/api/v2/alerts", json=alerts, timeout=5).raise_for_status()
    # The inhibitor learns of new alerts asynchronously: wait for it (a few ms), and fail
    # when the source never mutes the targets.
    for target in ("GpuNodeUnderutilized", "GpuAllocatedButIdle"):
        wait_for(lambda t=target: bool(_inhibited_by(alertmanager, t, node)), 10,
                 f"{critical} to inhibit {target} of its node")
    assert not _inhibited_by(alertmanager, "GpuNodeUnderutilized", other)
    assert not _inhibited_by(alertmanager, critical, node)
