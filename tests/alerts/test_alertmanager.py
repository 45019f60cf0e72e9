"""The example Alertmanager configuration: valid, routes by severity, groups by node."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.alerts.conftest import REPO

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
