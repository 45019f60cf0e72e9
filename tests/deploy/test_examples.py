"""deploy/examples: every NVIDIA device-plugin configuration shipped as supported produces
resource names and device IDs the exporter attributes (exporter/kubernetes/podresources)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kubernetes_validate import validate

from gpuscope.exporter.kubernetes.podresources.client import DEFAULT_RESOURCES, matches_resource
from gpuscope.exporter.kubernetes.podresources.devices import parse_device_id
from tests.deploy.render import DEPLOY

CONFIGMAP = DEPLOY / "examples" / "nvidia-device-plugin-config.yaml"


def _configs() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(CONFIGMAP.read_text())
    return {key: yaml.safe_load(text) for key, text in doc["data"].items()}


def test_configmap_is_valid_kubernetes() -> None:
    validate(yaml.safe_load(CONFIGMAP.read_text()), "1.31.0", strict=True)
    assert set(_configs()) == {"exclusive", "time-slicing", "mig-single", "mig-mixed",
                               "mig-mixed-time-slicing"}


def _exposed_resources(config: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(resource names the plugin advertises, example device IDs the kubelet reports), per the
    plugin's rules: MIG strategy, then time-slicing renames (`rename`, or `.shared` with
    renameByDefault) and `::<replica>` IDs."""
    strategy = config.get("flags", {}).get("migStrategy", "none")
    gpu = "GPU-5ba8a5b1-1e2c-4f7d-8a51-0d6a6d1c2f11"
    mig = "MIG-8f3e2c1d-6b5a-4e3f-9a2b-1c0d9e8f7a6b"
    base = {"none": ("nvidia.com/gpu", gpu), "single": ("nvidia.com/gpu", mig)}
    names: dict[str, str] = (
        {"nvidia.com/mig-1g.10gb": mig, "nvidia.com/mig-3g.40gb": mig} if strategy == "mixed"
        else dict([base[strategy]])
    )
    time_slicing = config.get("sharing", {}).get("timeSlicing")
    if not time_slicing:
        return list(names), list(names.values())
    resources, ids = dict(names), list(names.values())
    for shared in time_slicing["resources"]:
        assert shared["name"] in names, f"time-slicing a resource the plugin lacks: {shared}"
        assert isinstance(shared["replicas"], int) and shared["replicas"] >= 2
        renamed = shared.get("rename") or (
            shared["name"] + ".shared" if time_slicing.get("renameByDefault") else shared["name"])
        device = resources.pop(shared["name"])
        resources[renamed] = device
        ids += [f"{device}::{n}" for n in range(shared["replicas"])]
    return list(resources), ids


@pytest.mark.parametrize("key", sorted(_configs()))
def test_config_is_attributed_by_the_exporter(key: str) -> None:
    config = _configs()[key]
    assert config["version"] == "v1"
    flags = config.get("flags", {})
    assert flags.get("migStrategy", "none") in ("none", "single", "mixed")
    # Index IDs would be bare numbers the exporter cannot resolve.
    assert flags.get("deviceIDStrategy", "uuid") == "uuid"
    resources, device_ids = _exposed_resources(config)
    for name in resources:
        assert matches_resource(name, DEFAULT_RESOURCES), (
            f"{key}: {name} is not a default GPU resource (needs GPUSCOPE_GPU_RESOURCES)")
    for device_id in device_ids:
        ref = parse_device_id(device_id)
        assert ref.error is None and ref.uuid == device_id.split("::")[0], (device_id, ref)


def test_a_custom_rename_would_need_configuration() -> None:
    """The check above is not vacuous: a renamed resource is flagged."""
    config = {"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "rename": "example.com/small-gpu", "replicas": 2}]}}}
    (name,), _ = _exposed_resources(config)
    assert not matches_resource(name, DEFAULT_RESOURCES)


def test_index_device_ids_are_not_understood() -> None:
    """Why the examples pin deviceIDStrategy: uuid (deploy/examples/README.md)."""
    assert parse_device_id("0").error is not None
