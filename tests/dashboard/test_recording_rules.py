"""The ``gpuscope-dashboard`` recording rules: the rule file holds exactly the dashboard's
own raw expressions (one source), and the fleet page gives the same verdicts from them as
from the raw series, against a real Prometheus holding a backfilled fleet and the rules
backfilled over it by promtool."""

from __future__ import annotations

import re

import yaml

from gpuscope.alerts.render import RULES_FILE
from gpuscope.dashboard.plan.rules import RULES, recording_rules, rules_yaml


def _normal(expr: str) -> str:
    return re.sub(r"\s+", " ", expr).strip()


def test_the_rule_file_holds_the_dashboards_own_expressions() -> None:
    text = RULES_FILE.read_text(encoding="utf-8")
    [group] = [g for g in yaml.safe_load(text)["groups"] if g["name"] == "gpuscope-dashboard"]
    assert group["interval"] == "1m"
    found = [(r["record"], _normal(r["expr"])) for r in group["rules"]]
    wanted = [(record, _normal(expr)) for record, expr in recording_rules()]
    assert found == wanted, (
        "alerts/gpuscope-rules.yaml's gpuscope-dashboard group differs from the dashboard's "
        "queries: replace it with the output of rules_yaml() (see its docstring), then run "
        "python -m gpuscope.alerts.render")
    assert rules_yaml() in text
    # Every series the dashboard reads is recorded, each once, and none recorded elsewhere.
    assert sorted(RULES.values()) == sorted(r for r, _ in found)
    others = [r.get("record") for g in yaml.safe_load(text)["groups"]
              if g["name"] != "gpuscope-dashboard" for r in g["rules"]]
    assert not set(others) & set(RULES.values())
