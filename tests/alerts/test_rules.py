"""The rule file: promtool's checks and unit tests, and what every alert must carry."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuscope.alerts.render import RULES_FILE, load_rules
from tests.alerts.conftest import REPO
from tests.alerts.promtool_groups import write_specs

PROMTOOL_TESTS = sorted((Path(__file__).parent / "promtool").glob("*_test.yaml"))
DOCS = REPO / "docs" / "alerts.md"

# Issue 6's alert list and issue 15's (the work signals): each one must exist (a rename fails
# here, not in a pager).
EXPECTED_ALERTS = {
    "GpuNodeUnderutilized", "GpuAllocatedButIdle", "GpuTimeSliceStarvation", "GpuLost",
    "GpuMissing", "GpuXidCritical", "GpuEccUncorrected", "GpuTemperatureHigh",
    "GpuMemoryNearFull", "GpuExporterDown", "GpuExporterStale", "GpuSpinning", "GpuThrottled",
    "GpuRowRemapFailed", "GpuRowRemapPending",
}
SEVERITIES = {"critical", "warning", "info"}


def alerting_rules() -> list[dict[str, Any]]:
    return [r for g in load_rules()["groups"] for r in g["rules"] if "alert" in r]


def run(cmd: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_promtool_check_rules(promtool: str) -> None:
    result = run([promtool, "check", "rules", str(RULES_FILE)])
    assert result.returncode == 0, result.stdout + result.stderr


# Every promtool file in one promtool run, each on the groups it tests
# (tests/alerts/promtool_groups.py): some 25 s on a quiet 2-core machine, more on a loaded one.
@pytest.mark.timeout(360)
def test_promtool_unit_tests(promtool: str, tmp_path: Path) -> None:
    assert PROMTOOL_TESTS, "no promtool unit tests found"
    specs = {p.name: yaml.safe_load(p.read_text(encoding="utf-8")) for p in PROMTOOL_TESTS}
    paths = write_specs(specs, RULES_FILE, tmp_path)
    result = run([promtool, "test", "rules", *paths], timeout=330)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(specs), result.stdout


def test_the_groups_left_out_record_nothing_the_tested_groups_read() -> None:
    """What makes a promtool test on its own groups (``group_eval_order``) the same as on
    the whole file: no group it names reads a series a group it leaves out records. (A test
    that checks a left-out group's series fails instead: ``got: nil``.)"""
    groups = load_rules()["groups"]
    records = {g["name"]: {r["record"] for r in g["rules"] if "record" in r} for g in groups}
    assert sum(map(len, records.values())) > 50
    tested = {tuple(yaml.safe_load(p.read_text(encoding="utf-8"))["group_eval_order"])
              for p in PROMTOOL_TESTS}
    assert ("gpuscope.rules", "gpuscope.alerts") in tested
    for names in tested:
        left_out = {n for other, rec in records.items() if other not in names for n in rec}
        for group in groups:
            if group["name"] not in names:
                continue
            text = " ".join(r["expr"] for r in group["rules"])
            read = sorted(n for n in left_out
                          if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", text))
            assert not read, f"{group['name']} reads {read}, which {names} leaves out"


def test_the_issue_alerts_exist_once_each() -> None:
    names = [r["alert"] for r in alerting_rules()]
    assert sorted(names) == sorted(EXPECTED_ALERTS)


@pytest.mark.parametrize("rule", alerting_rules(), ids=lambda r: r["alert"])
def test_alert_carries_name_severity_annotations_and_runbook(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert re.fullmatch(r"Gpu(?:[A-Z][a-z]+)+", name), f"{name} is not CamelCase Gpu*"
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["summary"].strip() and "\n" not in annotations["summary"]
    assert len(annotations["description"]) > len(annotations["summary"])
    assert annotations["runbook_url"] == f"docs/alerts.md#{name.lower()}"


def github_anchors(markdown: str) -> set[str]:
    """Heading anchors as GitHub renders them (lowercase, punctuation dropped, spaces to -)."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            text = re.sub(r"[`*_]", "", m.group(1)).strip().lower()
            anchors.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text)))
    return anchors


def test_every_runbook_url_lands_on_a_section_of_docs_alerts() -> None:
    anchors = github_anchors(DOCS.read_text(encoding="utf-8"))
    for rule in alerting_rules():
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, f"{rule['alert']}: no '#{anchor}' heading in docs/alerts.md"
    # The CloudWatch alarms link there too.
    assert "cloudwatch-alarms" in anchors


def test_every_alert_has_a_firing_test_and_a_near_miss() -> None:
    """Across the promtool files, each alert is expected to fire at least once and to stay
    silent at least once."""
    fires: dict[str, int] = defaultdict(int)
    silent: dict[str, int] = defaultdict(int)
    for path in PROMTOOL_TESTS:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert spec["rule_files"] == ["../../../alerts/gpuscope-rules.yaml"], path
        for case in spec["tests"]:
            for check in case.get("alert_rule_test", []):
                expected = check.get("exp_alerts") or []
                if expected:
                    fires[check["alertname"]] += 1
                    for alert in expected:
                        # A firing case pins the labels and every annotation.
                        assert "severity" in alert["exp_labels"], (path, check)
                        assert set(alert["exp_annotations"]) == {
                            "summary", "description", "runbook_url"}, (path, check)
                else:
                    silent[check["alertname"]] += 1
    for name in EXPECTED_ALERTS:
        assert fires[name], f"{name}: no promtool case where it fires"
        assert silent[name], f"{name}: no promtool near-miss where it stays silent"


def test_idle_threshold_is_written_once_for_devices_and_once_for_containers() -> None:
    """docs/alerts.md tells operators to change the idle threshold in one place for devices
    (nodes are built on them) and one for containers."""
    # The alerting groups only: the gpuscope-dashboard group is generated from the dashboard's
    # own thresholds (tests/dashboard/test_recording_rules.py), and gpuscope-grafana prices.
    groups = {g["name"]: g for g in load_rules()["groups"]}
    text = yaml.safe_dump([groups["gpuscope.rules"], groups["gpuscope.alerts"]], width=10_000)
    assert text.count("< bool 0.05") == 1
    assert text.count("< 0.05") == 1
    rules = {r.get("record") or r["alert"]: r for g in load_rules()["groups"]
             for r in g["rules"]}
    assert "0.05" not in rules["GpuNodeUnderutilized"]["expr"]
    assert "uuid:gpu_activity:ratio < bool 0.05" in rules["uuid:gpu_idle:bool"]["expr"]
    assert "uuid:gpu_idle:bool" in rules["node:gpu_idle_devices:count"]["expr"]
    assert "container:gpu_held_usage:ratio[2m]) < 0.05" in rules["GpuAllocatedButIdle"]["expr"]
