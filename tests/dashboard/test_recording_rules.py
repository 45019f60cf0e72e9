"""The ``gpuscope-dashboard`` recording rules: the rule file holds exactly the dashboard's
own raw expressions (one source), and the fleet page gives the same verdicts from them as
from the raw series, against a real Prometheus holding a backfilled fleet and the rules
backfilled over it by promtool."""

from __future__ import annotations

import re
import shlex

import yaml

from gpuscope.alerts.render import RULES_FILE
from gpuscope.dashboard.cli import parse_config
from gpuscope.dashboard.plan.rules import RAW_NODES, RULES, raw_note, recording_rules, rules_yaml
from gpuscope.dashboard.verdicts import Thresholds


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


def test_the_raw_size_note_names_the_command_for_the_pages_own_rules() -> None:
    """Beyond RAW_NODES without the rules the page says how to load them: the command it
    names, run as written, prints the rules that page reads (its thresholds' key and its
    cluster label), for a page of non-default thresholds of every kind and cluster label.
    It said ``gpuscope-dashboard --print-rules`` whatever the page's flags: rules for the
    default thresholds, which a page started with ``--idle-utilization 0.1`` ignores."""
    pages = [
        (Thresholds(), "cluster"),
        (Thresholds(idle_utilization=0.1, idle_duration=2700.0, input_min_samples=20,
                    throttle_reasons=("power", "thermal"), slow_factor=1.25,
                    spin_dram=1 / 30), "k8s_cluster"),
    ]
    for thresholds, cluster in pages:
        note = raw_note(RAW_NODES + 1, RAW_NODES, thresholds, cluster)
        command = re.search(r"\((gpuscope-dashboard --print-rules[^;]*) prints them;", note)
        assert command is not None, note
        prog, *argv = shlex.split(command.group(1))
        assert prog == "gpuscope-dashboard"
        cfg = parse_config(argv, environ={})
        assert cfg.print_rules and cfg.thresholds == thresholds, command.group(1)
        assert cfg.cluster_label == cluster
        version = dict(recording_rules(cfg.thresholds, cfg.cluster_label))[RULES["version"]]
        assert f'"thresholds", "{thresholds.key}"' in version
        assert f'"cluster_label", "{cluster}"' in version
    default = raw_note(RAW_NODES + 1)
    assert "(gpuscope-dashboard --print-rules prints them;" in default
