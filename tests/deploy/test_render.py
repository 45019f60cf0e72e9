"""Every kustomization renders, and every object it renders is valid.

Built-in kinds: ``kubernetes-validate --strict`` (unknown fields are errors) against the oldest
and the newest Kubernetes minor this project targets. Prometheus Operator kinds: the
structural schemas in crd_schemas.py, plus the rule semantics a schema cannot express.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.deploy.crd_schemas import SCHEMAS
from tests.deploy.render import KUSTOMIZATIONS, Obj, render, render_text

#: Oldest minor still offered by EKS, GKE and AKS when this was written, and the newest
#: kubernetes-validate has schemas for.
KUBERNETES_VERSIONS = ("1.31.0", "1.37.0")
CRD_KINDS = frozenset(SCHEMAS)
_NO_SCHEMA = re.compile(r"Couldn't find schema for kind (\S+) with api version (\S+)")


@pytest.mark.parametrize("name", sorted(KUSTOMIZATIONS))
def test_renders(name: str) -> None:
    objs = render(name)
    assert objs, f"{name} rendered nothing"
    kinds = {o["kind"] for o in objs}
    assert {"DaemonSet", "Service", "ServiceAccount", "ClusterRole"} <= kinds


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_builtin_kinds_validate_strictly(version: str, tmp_path: Path) -> None:
    files = []
    for name in sorted(KUSTOMIZATIONS):
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(render_text(name))
        files.append(str(manifest))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet",
         "--kubernetes-version", version, *files],
        capture_output=True, text=True, timeout=60, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "ERROR" not in output, output
    # The only kinds it may not know are the operator's, which the tests below check.
    unknown = set(_NO_SCHEMA.findall(output))
    assert {kind for kind, _ in unknown} <= CRD_KINDS, unknown
    assert {api for _, api in unknown} <= {"monitoring.coreos.com/v1"}, unknown


def _crd_objects() -> list[tuple[str, Obj]]:
    seen: list[tuple[str, Obj]] = []
    for name in sorted(KUSTOMIZATIONS):
        seen.extend((name, o) for o in render(name) if o["kind"] in CRD_KINDS)
    return seen


def test_every_operator_kind_is_covered() -> None:
    kinds = {o["kind"] for _, o in _crd_objects()}
    assert kinds == CRD_KINDS, "some kustomization must render each operator kind"


@pytest.mark.parametrize(
    ("name", "obj"), _crd_objects(), ids=lambda v: v if isinstance(v, str) else v["kind"]
)
def test_operator_kinds_match_crd_schema(name: str, obj: Obj) -> None:
    jsonschema.validate(obj, SCHEMAS[obj["kind"]])
    if obj["kind"] == "PrometheusRule":
        _check_rules(obj)
    else:
        endpoints = obj["spec"].get("endpoints") or obj["spec"].get("podMetricsEndpoints")
        assert endpoints, f"{name}: {obj['kind']} without endpoints scrapes nothing"
        for endpoint in endpoints:
            relabels = [*endpoint.get("relabelings", []), *endpoint.get("metricRelabelings", [])]
            for relabel in relabels:
                _check_relabel(relabel)


def _check_rules(rule: Obj) -> None:
    groups = rule["spec"]["groups"]
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names)), f"duplicate rule group names: {names}"
    for group in groups:
        for r in group.get("rules", []):
            assert ("record" in r) != ("alert" in r), f"need exactly one of record/alert: {r}"
            if "record" in r:
                assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", r["record"]), r["record"]
                assert "for" not in r and "annotations" not in r, r


def _check_relabel(relabel: Obj) -> None:
    """What Prometheus' config loader enforces per relabel action."""
    action = relabel.get("action", "replace").lower()
    regex = relabel.get("regex", "(.*)")
    re.compile(regex)  # RE2 and Python agree on the simple patterns used here
    if action in ("labeldrop", "labelkeep"):
        extra = set(relabel) - {"action", "regex"}
        assert not extra, f"{action} accepts only regex, got {sorted(extra)}"
    if action in ("replace", "hashmod", "lowercase", "uppercase", "keepequal", "dropequal"):
        assert relabel.get("targetLabel"), f"{action} needs targetLabel: {relabel}"
    if action in ("keep", "drop", "hashmod", "keepequal", "dropequal"):
        assert relabel.get("sourceLabels"), f"{action} needs sourceLabels: {relabel}"
