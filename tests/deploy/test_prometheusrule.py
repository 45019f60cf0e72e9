"""The PrometheusRule in the kustomize base is the alerts' generated one, unchanged.

kustomize refuses files outside a kustomization's directory (without
--load-restrictor LoadRestrictionsNone, which `kubectl apply -k` users would all need), so
deploy/base/prometheusrule.yaml is a byte-for-byte copy of alerts/generated/prometheusrule.yaml
(rendered by `python -m gpuscope.alerts.render` from alerts/gpuscope-rules.yaml). After changing the
rules:  python -m gpuscope.alerts.render && cp alerts/generated/prometheusrule.yaml deploy/base/
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from tests.deploy.render import DEPLOY, REPO, one, render

SOURCE = REPO / "alerts" / "generated" / "prometheusrule.yaml"
COPY = DEPLOY / "base" / "prometheusrule.yaml"


def test_copy_is_identical_to_the_generated_rules() -> None:
    assert SOURCE.is_file(), (
        f"{SOURCE.relative_to(REPO)} is missing: run python -m gpuscope.alerts.render")
    assert COPY.read_bytes() == SOURCE.read_bytes(), (
        "deploy/base/prometheusrule.yaml differs from alerts/generated/prometheusrule.yaml: "
        "cp alerts/generated/prometheusrule.yaml deploy/base/prometheusrule.yaml"
    )


def test_rendered_rules_pass_promtool(promtool: str, tmp_path: Path) -> None:
    (doc,) = [o for o in render("base") if o["kind"] == "PrometheusRule"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}, sort_keys=False))
    result = subprocess.run([promtool, "check", "rules", str(rules)],
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    # kube-prometheus-stack's default ruleSelector, added by the base without touching the copy.
    assert doc["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    namespace = one(render("base"), "Namespace", "gpuscope")
    assert doc["metadata"]["namespace"] == namespace["metadata"]["name"]
