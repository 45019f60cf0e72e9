"""DRA: ResourceSlices of NVIDIA's DRA driver (gpu.nvidia.com) and PodResources ClaimResources
resolved to NVML UUIDs.

The slice documents are shaped exactly as the driver publishes them (kubernetes-sigs/
dra-driver-nvidia-gpu, formerly NVIDIA/k8s-dra-driver-gpu: cmd/gpu-kubelet-plugin/deviceinfo.go,
mig.go, partitions.go and driver.go at v0.4.0; the MIG names of v25.3/v25.8) and as the API
server returns them in a list's ``items`` (no apiVersion/kind) or a watch event (with them).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest

from gpuscope.exporter.kubernetes.attribution import attribute
from gpuscope.exporter.kubernetes.cgroups import ContainerRef
from gpuscope.exporter.kubernetes.dra import (
    DEFAULT_DRIVER,
    RESOURCE_SLICES_PATH,
    ClaimResource,
    ClaimResourceLike,
    DeviceIndex,
    DeviceKey,
    DraDevice,
    MigPlacement,
    allocations_from_claims,
    device_name_from_cdi,
    node_field_selector,
    parse_resource_slice,
)
from gpuscope.exporter.kubernetes.metadata import MetadataSnapshot, PodInfo
from gpuscope.exporter.model import DeviceSample, ProcessSample, Snapshot

NODE = "gpu-node-1"
GPU0 = "GPU-5fd4f087-86f3-7a43-b711-4771313afc50"
GPU1 = "GPU-0c8a5b4e-12f0-4d6e-9b77-0e5d1c3f2a11"
GPU2 = "GPU-9e3b1c27-4f0a-4c1e-a6d2-6b7f0e8c5d33"
MIG_A = "MIG-bf3b4cdb-6b93-5b34-9a1b-4a6e9b6d6ad3"
MIG_B = "MIG-1e0d9c3a-77f2-5a18-8c4e-2f6a9b0d4e51"
CLAIM_UID = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"

JSON = dict[str, Any]


# --- Documents as the driver publishes them -----------------------------------------------


def _common(product: str = "NVIDIA H100 80GB HBM3") -> JSON:
    """Attributes every GPU and MIG device carries (GpuInfo.Attributes, CommonAttributesMig)."""
    return {
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "570.158.1"},
        "cudaDriverVersion": {"version": "12.8.0"},
    }


def gpu_device(minor: int, uuid: str, bus: str) -> JSON:
    """A full GPU (GpuInfo.GetDevice): name gpu-<minor>, unqualified driver attributes plus the
    standard resource.kubernetes.io/ PCI attributes."""
    return {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": uuid},
            **_common(),
            "resource.kubernetes.io/pciBusID": {"string": bus},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def mig_device(
    minor: int,
    profile: str,
    profile_id: int,
    start: int,
    size: int,
    parent: str,
    uuid: str | None,
) -> JSON:
    """A MIG device (MigDeviceInfo.GetDevice; without ``uuid``: MigSpec.PartGetDevice, a
    DynamicMIG device not created yet). Name: gpu-<minor>-mig-<profile>-<gi profile>-<start>,
    the profile with dots dropped and '+' made '-' (the driver's toRFC1123Compliant)."""
    written = profile.replace(".", "").replace("+", "-")
    attributes: JSON = {
        "type": {"string": "mig"},
        "parentUUID": {"string": parent},
        "profile": {"string": profile},
        **_common(),
        "resource.kubernetes.io/pciBusID": {"string": "0000:2a:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
    }
    if uuid is not None:
        attributes["uuid"] = {"string": uuid}
    capacity: JSON = {
        "multiprocessors": {"value": str(16 * size)},
        "copyEngines": {"value": "1"},
        "decoders": {"value": "1"},
        "encoders": {"value": "0"},
        "jpegEngines": {"value": "1"},
        "ofaEngines": {"value": "0"},
        "memory": {"value": f"{9984 * size}Mi"},
    }
    for i in range(start, start + size):
        capacity[f"memorySlice{i}"] = {"value": "1"}
    return {
        "name": f"gpu-{minor}-mig-{written}-{profile_id}-{start}",
        "attributes": attributes,
        "capacity": capacity,
    }


def resource_slice(
    devices: list[Any] | None,
    *,
    pool: str = NODE,
    generation: int = 1,
    count: int = 1,
    driver: str = DEFAULT_DRIVER,
    name: str = f"{NODE}-gpu.nvidia.com-7x2kq",
    node: str | None = NODE,
    with_type_meta: bool = False,
) -> JSON:
    obj: JSON = {
        "metadata": {
            "name": name,
            "generateName": f"{NODE}-{driver}-",
            "uid": "3f1b2c4d-0000-4000-8000-00000000a001",
            "resourceVersion": "18829",
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": NODE,
                 "uid": "a1b2c3d4-0000-4000-8000-000000000001", "controller": True}
            ],
        },
        "spec": {
            "driver": driver,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        },
    }
    if node is not None:
        obj["spec"]["nodeName"] = node
    if devices is not None:
        obj["spec"]["devices"] = devices
    if with_type_meta:
        obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **obj}
    return obj


def to_v1beta1(obj: JSON) -> JSON:
    """The same slice served as resource.k8s.io/v1beta1: attributes and capacity under
    ``basic`` (BasicDevice)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = "resource.k8s.io/v1beta1"
    out["kind"] = "ResourceSlice"
    out["spec"]["devices"] = [
        {"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
        for d in obj["spec"].get("devices", [])
    ]
    return out


# A node with GPU 0 whole and GPU 1 in MIG mode with two static MIG devices (a 1g.10gb at
# memory slice 0 and a 3g.40gb at slice 4), one slice for the pool (standard announcement).
STANDARD = resource_slice([
    gpu_device(0, GPU0, "0000:18:00.0"),
    mig_device(1, "1g.10gb", 19, 0, 1, GPU1, MIG_A),
    mig_device(1, "3g.40gb", 9, 4, 4, GPU1, MIG_B),
])

# The ComputeDomain plugin of the same driver package: another driver, IMEX channels.
COMPUTE_DOMAIN = resource_slice(
    [{"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}},
     {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}}}],
    driver="compute-domain.nvidia.com",
    name=f"{NODE}-compute-domain.nvidia.com-p9z4d",
)


def claim(device: str, *, driver: str = DEFAULT_DRIVER, pool: str = NODE) -> ClaimResource:
    """A ClaimResource as a 1.31+ kubelet reports it (driver/pool/device plus CDI name)."""
    return ClaimResource(
        driver_name=driver,
        pool_name=pool,
        device_name=device,
        cdi_devices=(f"k8s.{driver}/claim={CLAIM_UID}-{device}",),
    )


# --- Parsing slices -----------------------------------------------------------------------


def test_standard_slice_gpu_and_static_mig() -> None:
    parsed = parse_resource_slice(STANDARD)
    assert parsed is not None
    assert (parsed.driver, parsed.pool, parsed.generation, parsed.node_name) == (
        DEFAULT_DRIVER, NODE, 1, NODE)
    assert parsed.resource_slice_count == 1
    assert parsed.name == f"{NODE}-gpu.nvidia.com-7x2kq"
    assert parsed.skipped_devices == 0
    assert parsed.devices == (
        DraDevice(DeviceKey(DEFAULT_DRIVER, NODE, "gpu-0"), "gpu", GPU0),
        DraDevice(DeviceKey(DEFAULT_DRIVER, NODE, "gpu-1-mig-1g10gb-19-0"), "mig", MIG_A,
                  parent_uuid=GPU1, profile="1g.10gb"),
        DraDevice(DeviceKey(DEFAULT_DRIVER, NODE, "gpu-1-mig-3g40gb-9-4"), "mig", MIG_B,
                  parent_uuid=GPU1, profile="3g.40gb"),
    )
    assert all(d.measurable for d in parsed.devices)


def test_watch_event_object_with_type_meta() -> None:
    with_meta = resource_slice(STANDARD["spec"]["devices"], with_type_meta=True)
    assert parse_resource_slice(with_meta) == parse_resource_slice(STANDARD)


def test_v1beta1_basic_attributes_parse_the_same() -> None:
    assert parse_resource_slice(to_v1beta1(STANDARD)) == parse_resource_slice(STANDARD)


def test_v1beta2_shape_is_the_v1_shape() -> None:
    beta2 = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "ResourceSlice", **STANDARD}
    assert parse_resource_slice(beta2) == parse_resource_slice(STANDARD)


def test_older_driver_mig_names_and_attributes() -> None:
    """v25.3/v25.8: MIG name gpu-<minor>-mig-<gi profile>-<start>-<size>, extra ``minor``,
    ``index`` and unqualified ``pcieBusID`` attributes."""
    old_gpu = gpu_device(0, GPU0, "0000:18:00.0")
    old_gpu["attributes"].update({"minor": {"int": 0}, "index": {"int": 0},
                                  "pcieBusID": {"string": "0000:18:00.0"}})
    old_mig = mig_device(1, "1g.10gb", 19, 0, 1, GPU1, MIG_A)
    old_mig["name"] = "gpu-1-mig-19-0-1"
    old_mig["attributes"].update({"index": {"int": 0}, "parentIndex": {"int": 1}})
    index = DeviceIndex.from_slices([resource_slice([old_gpu, old_mig])])
    assert index.resolve(claim("gpu-0")) == GPU0
    assert index.resolve(claim("gpu-1-mig-19-0-1")) == MIG_A
    device = index.lookup(DEFAULT_DRIVER, NODE, "gpu-1-mig-19-0-1")
    assert device is not None and device.placement is None  # has a UUID: no guessing


def test_qualified_attribute_names_are_the_same_attributes() -> None:
    """Unqualified names are in the driver's domain: ``gpu.nvidia.com/uuid`` is ``uuid``."""
    dev = {"name": "gpu-3", "attributes": {"gpu.nvidia.com/type": {"string": "gpu"},
                                          "gpu.nvidia.com/uuid": {"string": GPU2}}}
    index = DeviceIndex.from_slices([resource_slice([dev])])
    assert index.resolve(claim("gpu-3")) == GPU2
    # Another domain's "uuid" is not ours.
    foreign = {"name": "gpu-4", "attributes": {"example.com/uuid": {"string": GPU2}}}
    parsed = parse_resource_slice(resource_slice([foreign]))
    assert parsed is not None
    assert parsed.devices[0].uuid is None and parsed.devices[0].kind == ""


def test_type_missing_is_inferred_from_the_uuid() -> None:
    devs = [{"name": "gpu-0", "attributes": {"uuid": {"string": GPU0}}},
            {"name": "gpu-0-mig-x", "attributes": {"uuid": {"string": MIG_A}}}]
    parsed = parse_resource_slice(resource_slice(devs))
    assert parsed is not None
    assert [(d.kind, d.uuid) for d in parsed.devices] == [("gpu", GPU0), ("mig", MIG_A)]


# VfioDeviceInfo.GetDevice (deviceinfo.go): the ``uuid`` attribute is no NVML UUID but the
# driver's uuid.NewSHA1(uuid.NameSpaceDNS, <PCI address>) (nvlib.go, getVfioDeviceInfo; v25.12.0
# 0882da87, v0.4.0 6910a2be, main 22407113), i.e. Python's uuid5(NAMESPACE_DNS, address).
VFIO_UUID = "b53eaf43-551f-5a8d-9ac3-5dd2fd504061"  # of 0000:3a:00.0


def test_vfio_passthrough_gpu_is_indexed_but_never_resolved() -> None:
    vfio = {"name": "gpu-vfio-0", "attributes": {
        "type": {"string": "vfio"}, "uuid": {"string": VFIO_UUID},
        "deviceID": {"string": "0x2330"}, "vendorID": {"string": "0x10de"},
        "numa": {"int": 0}, "productName": {"string": "GH100 [H100 SXM5 80GB]"},
        "iommuFDEnabled": {"bool": False},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3a:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:36"}},
        "capacity": {"addressableMemory": {"value": "80Gi"}}}
    index = DeviceIndex.from_slices([resource_slice([gpu_device(0, GPU0, "0000:18:00.0"),
                                                     vfio])])
    assert index.skipped_devices == 0  # a real device of the driver, not a malformed one
    device = index.lookup(DEFAULT_DRIVER, NODE, "gpu-vfio-0")
    assert device is not None and device.kind == "vfio" and not device.measurable
    assert device.uuid is None  # not an NVML UUID: never matched against NVML's
    assert index.resolve(claim("gpu-vfio-0")) is None
    assert index.resolve(claim("gpu-0")) == GPU0


# --- DynamicMIG and partitionable devices (split slices, Kubernetes 1.35+) ------------------


def _dynamic_mig_pool(generation: int = 1) -> list[JSON]:
    counters = resource_slice(None, generation=generation, count=3, name=f"{NODE}-0-a")
    counters["spec"]["sharedCounters"] = [{
        "name": "gpu-1-counter-set",
        "counters": {"multiprocessors": {"value": "132"}, "memory": {"value": "80Gi"},
                     **{f"memory-slice-{i}": {"value": "1"} for i in range(8)}},
    }]
    full = gpu_device(0, GPU0, "0000:18:00.0")
    full["consumesCounters"] = [{"counterSet": "gpu-0-counter-set",
                                 "counters": {"multiprocessors": {"value": "132"}}}]
    abstract = mig_device(1, "1g.10gb+me", 20, 3, 1, GPU1, None)
    abstract["consumesCounters"] = [{"counterSet": "gpu-1-counter-set",
                                     "counters": {"memory-slice-3": {"value": "1"}}}]
    return [
        counters,
        resource_slice([full], generation=generation, count=3, name=f"{NODE}-1-b"),
        resource_slice([abstract], generation=generation, count=3, name=f"{NODE}-2-c"),
    ]


def test_dynamic_mig_device_has_a_placement_and_no_uuid() -> None:
    index = DeviceIndex.from_slices(_dynamic_mig_pool())
    name = "gpu-1-mig-1g10gb-me-20-3"  # "1g.10gb+me" as the driver writes it into names
    device = index.lookup(DEFAULT_DRIVER, NODE, name)
    assert device is not None
    assert (device.kind, device.uuid, device.parent_uuid, device.profile) == (
        "mig", None, GPU1, "1g.10gb+me")
    assert device.placement == MigPlacement(GPU1, 20, 3)
    assert index.resolve(claim(name)) is None  # not created yet as far as the slice knows
    live = {MigPlacement(GPU1, 20, 3): MIG_B}
    assert index.resolve(claim(name), mig_uuids=live) == MIG_B
    assert index.resolve(claim(name), mig_uuids={MigPlacement(GPU1, 20, 4): MIG_B}) is None
    assert index.resolve(claim("gpu-0"), mig_uuids=live) == GPU0
    assert index.incomplete_pools == frozenset()


def test_dynamic_mig_name_not_matching_the_profile_has_no_placement() -> None:
    odd = mig_device(1, "1g.10gb", 19, 0, 1, GPU1, None)
    odd["name"] = "gpu-1-mig-2g20gb-19-0"
    parsed = parse_resource_slice(resource_slice([odd]))
    assert parsed is not None and parsed.devices[0].placement is None


def test_counters_only_slice_is_a_slice_without_devices() -> None:
    parsed = parse_resource_slice(_dynamic_mig_pool()[0])
    assert parsed is not None and parsed.devices == () and parsed.skipped_devices == 0


def test_pool_with_missing_slices_is_incomplete() -> None:
    index = DeviceIndex.from_slices(_dynamic_mig_pool()[:2])
    assert index.incomplete_pools == frozenset({NODE})
    assert index.resolve(claim("gpu-0")) == GPU0


# --- Pool generations ---------------------------------------------------------------------


def test_newest_generation_of_a_pool_wins() -> None:
    old = resource_slice([gpu_device(0, GPU0, "0000:18:00.0"),
                          gpu_device(1, GPU1, "0000:2a:00.0")], generation=3, name="old")
    # GPU 1 went into MIG mode: the driver republished the pool with a higher generation.
    new = resource_slice([gpu_device(0, GPU0, "0000:18:00.0"),
                          mig_device(1, "1g.10gb", 19, 0, 1, GPU1, MIG_A)],
                         generation=4, name="new")
    for order in ([old, new], [new, old]):
        index = DeviceIndex.from_slices(order)
        assert index.generations == {NODE: 4}
        assert index.stale_slices == 1
        assert index.resolve(claim("gpu-0")) == GPU0
        assert index.resolve(claim("gpu-1")) is None  # only in the stale generation
        assert index.resolve(claim("gpu-1-mig-1g10gb-19-0")) == MIG_A


def test_generations_are_per_pool() -> None:
    other_pool = resource_slice([gpu_device(0, GPU2, "0000:18:00.0")], pool="gpu-node-2",
                                node="gpu-node-2", generation=1, name="other")
    index = DeviceIndex.from_slices([resource_slice(STANDARD["spec"]["devices"],
                                                    generation=7), other_pool])
    assert index.generations == {NODE: 7, "gpu-node-2": 1}
    assert index.resolve(claim("gpu-0")) == GPU0
    assert index.resolve(claim("gpu-0", pool="gpu-node-2")) == GPU2


def test_node_filter() -> None:
    other_node = resource_slice([gpu_device(0, GPU2, "0000:18:00.0")], pool="gpu-node-2",
                                node="gpu-node-2", name="other")
    index = DeviceIndex.from_slices([STANDARD, other_node], node_name=NODE)
    assert index.generations == {NODE: 1}
    assert index.rejected_slices == 0  # another node's slice is not an error
    assert index.resolve(claim("gpu-0", pool="gpu-node-2")) is None


def test_per_device_node_selection() -> None:
    shared = resource_slice(None, node=None, pool="shared-pool", name="shared")
    shared["spec"]["perDeviceNodeSelection"] = True
    mine, theirs = gpu_device(0, GPU0, "0000:18:00.0"), gpu_device(1, GPU1, "0000:2a:00.0")
    mine["nodeName"], theirs["nodeName"] = NODE, "gpu-node-2"
    shared["spec"]["devices"] = [mine, theirs]
    index = DeviceIndex.from_slices([shared], node_name=NODE)
    assert index.resolve(claim("gpu-0", pool="shared-pool")) == GPU0
    assert index.resolve(claim("gpu-1", pool="shared-pool")) is None
    assert index.skipped_devices == 0
    # Without a node filter every device is indexed.
    assert DeviceIndex.from_slices([shared]).resolve(claim("gpu-1", pool="shared-pool")) == GPU1


def test_duplicate_device_in_one_generation_keeps_the_first() -> None:
    a = resource_slice([gpu_device(0, GPU0, "0000:18:00.0")], count=2, name="a")
    b = resource_slice([gpu_device(0, GPU2, "0000:18:00.0")], count=2, name="b")
    index = DeviceIndex.from_slices([a, b])
    assert index.duplicate_devices == 1
    assert index.resolve(claim("gpu-0")) == GPU0


# --- Other drivers and garbage ------------------------------------------------------------


def test_other_drivers_slices_are_ignored_silently() -> None:
    index = DeviceIndex.from_slices([COMPUTE_DOMAIN, STANDARD])
    assert index.rejected_slices == 0
    assert index.generations == {NODE: 1}
    assert len(index.devices) == 3
    assert parse_resource_slice(COMPUTE_DOMAIN) is None
    # A ClaimResource of that driver resolves to nothing, even for a name we index.
    assert index.resolve(claim("channel-0", driver="compute-domain.nvidia.com")) is None
    assert index.resolve(claim("gpu-0", driver="compute-domain.nvidia.com")) is None


def test_driver_name_is_configurable() -> None:
    index = DeviceIndex.from_slices([COMPUTE_DOMAIN, STANDARD], driver="compute-domain.nvidia.com")
    assert index.driver == "compute-domain.nvidia.com"
    assert set(index.devices) == {
        DeviceKey("compute-domain.nvidia.com", NODE, "channel-0"),
        DeviceKey("compute-domain.nvidia.com", NODE, "daemon-0"),
    }
    # Those devices carry no NVML UUID.
    assert index.resolve(claim("channel-0", driver="compute-domain.nvidia.com")) is None
    assert index.resolve(claim("gpu-0")) is None


GARBAGE_SLICES: list[object] = [
    None, 42, "ResourceSlice", [], {}, {"spec": None}, {"spec": []},
    {"spec": {"driver": DEFAULT_DRIVER}},
    {"spec": {"driver": DEFAULT_DRIVER, "pool": "node"}},
    {"spec": {"driver": DEFAULT_DRIVER, "pool": {"name": NODE}}},
    {"spec": {"driver": DEFAULT_DRIVER, "pool": {"name": NODE, "generation": "1"}}},
    {"spec": {"driver": DEFAULT_DRIVER, "pool": {"name": NODE, "generation": True}}},
    {"spec": {"driver": DEFAULT_DRIVER, "pool": {"name": "", "generation": 1}}},
    {"spec": {"driver": DEFAULT_DRIVER, "pool": {"name": 7, "generation": 1}}},
    {"spec": {"driver": DEFAULT_DRIVER, "pool": {"name": NODE, "generation": 1},
              "devices": {"gpu-0": {}}}},
    {"kind": "Pod", "spec": {"driver": DEFAULT_DRIVER, "pool": {"name": NODE, "generation": 1}}},
    {"apiVersion": "v1", "spec": {"driver": DEFAULT_DRIVER,
                                  "pool": {"name": NODE, "generation": 1}}},
]


@pytest.mark.parametrize("obj", GARBAGE_SLICES)
def test_garbage_slices_give_nothing(obj: object) -> None:
    assert parse_resource_slice(obj) is None


def test_garbage_slices_are_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="gpuscope.exporter.kubernetes.dra"):
        index = DeviceIndex.from_slices([*GARBAGE_SLICES, STANDARD, COMPUTE_DOMAIN])
    assert index.rejected_slices == len(GARBAGE_SLICES)
    assert index.resolve(claim("gpu-0")) == GPU0
    assert "not understood" in caplog.text


GARBAGE_DEVICES: list[object] = [
    None, "gpu-0", [], {}, {"name": ""}, {"name": 5}, {"name": "GPU_0"}, {"name": "x" * 64},
    {"name": "gpu-5", "attributes": []},
    {"name": "gpu-6", "basic": {"attributes": "uuid"}},
    {"name": "gpu-7", "attributes": {"uuid": {"string": "not a uuid"}}},
    {"name": "gpu-8", "attributes": {"uuid": {"string": "GPU-" + "a" * 300}}},
]


def test_garbage_devices_are_skipped_and_counted() -> None:
    odd_values = {"name": "gpu-9", "attributes": {
        "type": "gpu", "uuid": {"int": 3}, "parentUUID": None}}
    index = DeviceIndex.from_slices(
        [resource_slice([*GARBAGE_DEVICES, odd_values, gpu_device(0, GPU0, "0000:18:00.0")])]
    )
    assert index.skipped_devices == len(GARBAGE_DEVICES)
    assert index.resolve(claim("gpu-0")) == GPU0
    # Unreadable attribute values make a device with no identity, which resolves to nothing.
    device = index.lookup(DEFAULT_DRIVER, NODE, "gpu-9")
    assert device == DraDevice(DeviceKey(DEFAULT_DRIVER, NODE, "gpu-9"), "", None)
    assert index.resolve(claim("gpu-9")) is None


def test_mig_parent_uuid_must_be_a_gpu_uuid() -> None:
    dev = mig_device(1, "1g.10gb", 19, 0, 1, "MIG-not-a-parent", MIG_A)
    parsed = parse_resource_slice(resource_slice([dev]))
    assert parsed is not None
    assert parsed.devices[0].uuid == MIG_A and parsed.devices[0].parent_uuid is None


def test_not_an_iterable_gives_an_empty_index() -> None:
    index = DeviceIndex.from_slices(42)  # type: ignore[arg-type]
    assert index.devices == {} and index.rejected_slices == 0


def test_index_is_immutable() -> None:
    index = DeviceIndex.from_slices([STANDARD])
    assert isinstance(index.devices, MappingProxyType)
    with pytest.raises(TypeError):
        index.devices[DeviceKey("a", "b", "c")] = index.devices[  # type: ignore[index]
            DeviceKey(DEFAULT_DRIVER, NODE, "gpu-0")]
    with pytest.raises(dataclasses.FrozenInstanceError):
        index.driver = "x"  # type: ignore[misc]


def test_empty_index() -> None:
    index = DeviceIndex()
    assert index.resolve(claim("gpu-0")) is None
    assert index.lookup(DEFAULT_DRIVER, NODE, "gpu-0") is None


# --- ClaimResources -----------------------------------------------------------------------


INDEX = DeviceIndex.from_slices([STANDARD, COMPUTE_DOMAIN])


def test_time_sharing_one_claim_in_two_containers_and_two_pods() -> None:
    """A shared claim (gpu-test2: two containers of one pod; gpu-test3: two pods naming one
    ResourceClaim) appears under every container with the same device: same UUID each."""
    per_container = [claim("gpu-0"), claim("gpu-0"), claim("gpu-0")]
    assert {INDEX.resolve(c) for c in per_container} == {GPU0}


def test_protobuf_shaped_claim_resource() -> None:
    """The generated message's attribute names: cdi_devices hold CDIDevice(name=...)."""
    message = SimpleNamespace(
        driver_name=DEFAULT_DRIVER, pool_name=NODE, device_name="gpu-1-mig-3g40gb-9-4",
        cdi_devices=[SimpleNamespace(name=f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-"
                                          "gpu-1-mig-3g40gb-9-4")],
        share_id=None,
    )
    assert INDEX.resolve(message) == MIG_B
    assert INDEX.resolve_all(message) == (MIG_B,)
    typed: ClaimResourceLike = claim("gpu-0")
    assert INDEX.resolve(typed) == GPU0


@pytest.mark.parametrize(
    "resource",
    [
        claim("gpu-7"),                                    # not published
        claim("gpu-0", pool="gpu-node-2"),                 # another pool (node)
        claim("gpu-0", driver="example.com/gpu"),          # another driver
        ClaimResource(driver_name=DEFAULT_DRIVER, device_name="gpu-0"),  # no pool
        SimpleNamespace(),                                 # nothing at all
        SimpleNamespace(driver_name=None, pool_name=NODE, device_name="gpu-0"),
        SimpleNamespace(driver_name=DEFAULT_DRIVER, pool_name=NODE, device_name=b"gpu-0"),
        None, 17, "gpu-0",
    ],
)
def test_unresolvable_claim_resources_give_none(resource: object) -> None:
    assert INDEX.resolve(resource) is None
    assert INDEX.resolve(resource, node_pool=NODE) is None


# --- CDI-only kubelets --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cdi", "device"),
    [
        (f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0", "gpu-0"),
        (f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-1-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-0"),
        ("k8s.gpu.nvidia.com/device=gpu-1-mig-19-0-1", "gpu-1-mig-19-0-1"),  # v25.3, v25.8
        ("k8s.gpu.nvidia.com/device=gpu-0", "gpu-0"),
        ("k8s.gpu.nvidia.com/claim=gpu-0", None),          # no claim UID
        (f"k8s.gpu.nvidia.com/claim={CLAIM_UID}", None),   # no device
        (f"k8s.gpu.nvidia.com/claim={CLAIM_UID.upper()}-gpu-0", None),
        (f"k8s.compute-domain.nvidia.com/claim={CLAIM_UID}-channel-0", None),
        ("nvidia.com/gpu=all", None),                      # the container toolkit's CDI names
        ("nvidia.com/gpu=GPU-5fd4f087-86f3-7a43-b711-4771313afc50", None),
        ("k8s.gpu.nvidiaXcom/device=gpu-0", None),         # the dot is literal
        ("", None),
        ("k8s.gpu.nvidia.com/device=" + "g" * 600, None),
    ],
)
def test_device_name_from_cdi(cdi: str, device: str | None) -> None:
    assert device_name_from_cdi(cdi) == device


def test_device_name_from_cdi_of_another_driver() -> None:
    name = f"k8s.compute-domain.nvidia.com/claim={CLAIM_UID}-channel-0"
    assert device_name_from_cdi(name, driver="compute-domain.nvidia.com") == "channel-0"
    assert device_name_from_cdi(None) is None  # type: ignore[arg-type]


def test_cdi_only_fallback_needs_the_node_pool() -> None:
    cdi_only = ClaimResource(cdi_devices=(f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0",))
    assert INDEX.resolve(cdi_only) is None
    assert INDEX.resolve(cdi_only, node_pool=NODE) == GPU0
    assert INDEX.resolve(cdi_only, node_pool="gpu-node-2") is None


def test_cdi_only_claim_with_several_devices() -> None:
    """One ClaimResource of a CDI-only kubelet lists the CDI names of all the claim's devices
    (and, up to driver v25.8, each device twice: a base-spec and a claim-spec name)."""
    cdi_only = ClaimResource(cdi_devices=(
        "k8s.gpu.nvidia.com/device=gpu-0",
        f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0",
        f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-1-mig-1g10gb-19-0",
        "k8s.gpu.nvidia.com/claim=garbage",
        SimpleNamespace(name=None),
        42,
    ))
    assert INDEX.resolve_all(cdi_only, node_pool=NODE) == (GPU0, MIG_A)
    assert INDEX.resolve(cdi_only, node_pool=NODE) is None  # ambiguous for a single answer


def test_triplet_wins_over_cdi_names() -> None:
    """A 1.31+ kubelet may list earlier devices' CDI names too (it accumulates them per driver
    within a claim): only driver/pool/device count when they are there."""
    resource = ClaimResource(
        driver_name=DEFAULT_DRIVER, pool_name=NODE, device_name="gpu-1-mig-3g40gb-9-4",
        cdi_devices=(f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0",
                     f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-1-mig-3g40gb-9-4"),
    )
    assert INDEX.resolve_all(resource, node_pool=NODE) == (MIG_B,)


def test_cdi_devices_not_iterable() -> None:
    resource = SimpleNamespace(driver_name="", pool_name="", device_name="", cdi_devices=3)
    assert INDEX.resolve_all(resource, node_pool=NODE) == ()


# --- API helpers --------------------------------------------------------------------------


def test_list_path_and_field_selector() -> None:
    assert RESOURCE_SLICES_PATH == "/apis/resource.k8s.io/v1/resourceslices"
    assert node_field_selector(NODE) == "spec.nodeName=gpu-node-1"


def test_device_key_string() -> None:
    assert str(DeviceKey(DEFAULT_DRIVER, NODE, "gpu-0")) == "gpu.nvidia.com/gpu-node-1/gpu-0"


# --- Into allocations, and through the join -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Claimed:
    """One container's DRA device, shaped as the PodResources client reports it."""

    namespace: str
    pod: str
    container: str
    driver_name: str = DEFAULT_DRIVER
    pool_name: str = NODE
    device_name: str = ""
    cdi_devices: tuple[str, ...] = ()


def _claimed(pod: str, container: str, device: str, **kw: Any) -> Claimed:
    return Claimed("ml", pod, container, device_name=device,
                   cdi_devices=(f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-{device}",), **kw)


def test_claimed_gpu_mig_and_shared_claim_become_allocations() -> None:
    index = DeviceIndex.from_slices([STANDARD, COMPUTE_DOMAIN], node_name=NODE)
    claimed = [
        _claimed("trainer", "main", "gpu-0"),                    # a whole GPU
        _claimed("infer", "server", "gpu-1-mig-1g10gb-19-0"),    # a MIG slice
        _claimed("pair", "a", "gpu-1-mig-3g40gb-9-4"),          # one claim shared by two
        _claimed("pair", "b", "gpu-1-mig-3g40gb-9-4"),          # containers of one pod
        Claimed("ml", "imex", "w", driver_name="compute-domain.nvidia.com",
                device_name="channel-0"),                         # another driver: ignored
    ]
    got = allocations_from_claims(claimed, index, node_name=NODE)
    assert [(a.pod, a.container, a.device.uuid, a.resource_name) for a in got] == [
        ("trainer", "main", GPU0, "dra:gpu.nvidia.com"),
        ("infer", "server", MIG_A, "dra:gpu.nvidia.com"),
        ("pair", "a", MIG_B, "dra:gpu.nvidia.com"),
        ("pair", "b", MIG_B, "dra:gpu.nvidia.com"),
    ]
    assert all(a.device.recognised for a in got)
    assert got[0].device.raw == f"gpu.nvidia.com/{NODE}/gpu-0"


def test_unknown_dra_device_is_an_unresolved_allocation() -> None:
    index = DeviceIndex.from_slices([STANDARD], node_name=NODE)
    (alloc,) = allocations_from_claims([_claimed("p", "c", "gpu-7")], index)
    assert alloc.device.uuid is None and not alloc.device.recognised


def test_cdi_only_kubelet_resolves_with_the_node_pool() -> None:
    index = DeviceIndex.from_slices([STANDARD], node_name=NODE)
    cdi_only = Claimed("ml", "old", "c", driver_name="", pool_name="",
                       cdi_devices=(f"k8s.gpu.nvidia.com/claim={CLAIM_UID}-gpu-0",))
    (alloc,) = allocations_from_claims([cdi_only], index, node_name=NODE)
    assert alloc.device.uuid == GPU0
    other = Claimed("ml", "x", "c", driver_name="", pool_name="",
                    cdi_devices=("vendor.example/fpga=0",))
    assert allocations_from_claims([other], index, node_name=NODE) == ()


def test_dra_allocations_are_attributed_like_device_plugin_ones() -> None:
    """A claimed GPU, a claimed MIG slice and a shared claim through the real join: the same
    series as device-plugin allocations (allocated, each container its own processes)."""
    index = DeviceIndex.from_slices([STANDARD], node_name=NODE)
    allocations = allocations_from_claims([
        _claimed("trainer", "main", "gpu-0"),
        _claimed("infer", "server", "gpu-1-mig-1g10gb-19-0"),
        _claimed("pair", "a", "gpu-1-mig-3g40gb-9-4"),
        _claimed("pair", "b", "gpu-1-mig-3g40gb-9-4"),
    ], index)
    snapshot = Snapshot(timestamp=100.0, source_up=True, devices=(
        DeviceSample(index="0", uuid=GPU0, model="H100", utilization_ratio=0.9,
                     processes=(ProcessSample(pid=10, kinds=("compute",),
                                              memory_used_bytes=1 << 30,
                                              sm_utilization_ratio=0.9),)),
        DeviceSample(index="1", uuid=GPU1, model="H100"),
        DeviceSample(index="1/19", uuid=MIG_A, model="H100", parent_uuid=GPU1),
        DeviceSample(index="1/9", uuid=MIG_B, model="H100", parent_uuid=GPU1,
                     processes=(ProcessSample(pid=20, kinds=("compute",),
                                              memory_used_bytes=2 << 30),)),
    ))
    pods = {
        "uid-t": PodInfo("uid-t", "ml", "trainer", containers=MappingProxyType({"c" * 64: "main"})),
        "uid-p": PodInfo("uid-p", "ml", "pair", containers=MappingProxyType({"d" * 64: "b"})),
    }
    result = attribute(
        snapshot, allocations,
        {10: ContainerRef("uid-t", "c" * 64, "containerd"),
         20: ContainerRef("uid-p", "d" * 64, "containerd")},
        MetadataSnapshot(pods=MappingProxyType(pods)),
    )
    rows = {(u.key.pod, u.key.container, u.uuid): u for u in result.containers}
    assert set(rows) == {("trainer", "main", GPU0), ("infer", "server", MIG_A),
                         ("pair", "a", MIG_B), ("pair", "b", MIG_B)}
    assert all(u.allocated for u in rows.values())
    assert rows["trainer", "main", GPU0].utilization_ratio == pytest.approx(0.9)
    # The MIG slices report no utilization (no GPM here): absent, never a made-up 0.
    assert rows["infer", "server", MIG_A].utilization_ratio is None
    # The shared claim: the container running the process has its memory, the other none.
    assert rows["pair", "b", MIG_B].memory_used_bytes == 2 << 30
    assert rows["pair", "a", MIG_B].memory_used_bytes == 0
    assert result.unresolved_allocations == 0
