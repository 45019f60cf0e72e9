"""promtool's rule tests on the groups each test names.

Every promtool test file names the groups it tests in ``group_eval_order``, but promtool
evaluates every group of its rule files at every step of every case: the alerting files paid
for the ``gpuscope-dashboard`` and ``gpuscope-grafana`` groups too (72 of the file's rules;
``gpu_missing_test.yaml``, six hours of one-minute steps, took about four times as long on
the whole file). A copy of the rule file with those groups alone is what these helpers
hand promtool; ``test_rules.py::test_the_groups_left_out_record_nothing_the_tested_groups_read``
keeps that copy equivalent (no group reads what another records).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import yaml

from gpuscope.alerts.render import dump_yaml, parse_rules, read_rules_text


def rules_of(rules: Path, groups: list[str], work: Path) -> Path:
    """``rules`` with ``groups`` alone (in the file's order), written into ``work`` once per
    rule file (by its content) and set of groups."""
    text = read_rules_text(rules)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = work / f"rules-{digest}-{'+'.join(groups)}.yaml"
    if not path.exists():
        data = parse_rules(text, rules)
        data["groups"] = [g for g in data["groups"] if g["name"] in groups]
        assert {g["name"] for g in data["groups"]} == set(groups), (rules, groups)
        path.write_text(dump_yaml(data), encoding="utf-8")
    return path


def on_own_groups(spec: dict[str, Any], rules: Path, work: Path) -> dict[str, Any]:
    """``spec`` (a promtool test file's content) reading ``rules``' groups that it names in
    ``group_eval_order`` (the whole file where it names none)."""
    groups = spec.get("group_eval_order")
    path = rules_of(rules, list(groups), work) if groups else rules
    return {**spec, "rule_files": [str(path)]}


def write_specs(specs: dict[str, dict[str, Any]], rules: Path, work: Path) -> list[str]:
    """``specs`` (file name -> content) written into ``work``, each on its own groups of
    ``rules``: the paths to hand ``promtool test rules``."""
    paths = []
    for name, spec in specs.items():
        path = work / name
        path.write_text(yaml.safe_dump(on_own_groups(spec, rules, work), width=1 << 16,
                                       allow_unicode=True), encoding="utf-8")
        paths.append(str(path))
    return paths
