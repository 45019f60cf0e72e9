"""Device-ID normalisation: every ID shape the NVIDIA and GKE device plugins hand the kubelet."""

from __future__ import annotations

import dataclasses

import pytest

from gpuscope.exporter.kubernetes.podresources.devices import (
    DeviceRef,
    NodeDevice,
    parse_device_id,
    resolve,
)
from gpuscope.exporter.model import DeviceSample

GPU0 = "GPU-5fd4f087-86f3-7a43-b711-4771313afc50"
GPU1 = "GPU-0c8a5b4e-12f0-4d6e-9b77-0e5d1c3f2a11"
MIG_A = "MIG-bf3b4cdb-6b93-5b34-9a1b-4a6e9b6d6ad3"
MIG_B = "MIG-1e0d9c3a-77f2-5a18-8c4e-2f6a9b0d4e51"

# A node as NVML shows it: GPU 0 whole, GPU 1 in MIG mode with slices in GPU instances 3 and 5
# (DeviceSample.index: "<gpu>" or "<gpu>/<gpu instance id>").
NODE = (
    NodeDevice("0", GPU0),
    NodeDevice("1", GPU1),
    NodeDevice("1/3", MIG_A, parent_uuid=GPU1),
    NodeDevice("1/5", MIG_B, parent_uuid=GPU1),
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # NVIDIA device plugin, exclusive GPU.
        (GPU0, {"uuid": GPU0}),
        # Time-slicing replicas: the plugin's annotated ID <id>::<replica>.
        (f"{GPU0}::0", {"uuid": GPU0, "replica": 0}),
        (f"{GPU0}::12", {"uuid": GPU0, "replica": 12}),
        # MIG slices (R470+), and a time-sliced MIG slice.
        (MIG_A, {"uuid": MIG_A}),
        (f"{MIG_A}::2", {"uuid": MIG_A, "replica": 2}),
        # Pre-R470 MIG form: MIG-GPU-<parent uuid>/<gi>/<ci>.
        (f"MIG-{GPU1}/3/0", {"parent_uuid": GPU1, "gpu_instance_id": 3, "compute_instance_id": 0}),
        (
            f"MIG-{GPU1}/5/1::1",
            {"parent_uuid": GPU1, "gpu_instance_id": 5, "compute_instance_id": 1, "replica": 1},
        ),
        # GKE device plugin.
        ("nvidia0", {"gpu_index": 0}),
        ("nvidia12", {"gpu_index": 12}),
        ("nvidia1/gi3", {"gpu_index": 1, "gpu_instance_id": 3}),
        ("nvidia0/vgpu4", {"gpu_index": 0, "replica": 4}),
        ("nvidia1/gi5/vgpu0", {"gpu_index": 1, "gpu_instance_id": 5, "replica": 0}),
    ],
)
def test_parse_recognised(raw: str, expected: dict[str, object]) -> None:
    ref = parse_device_id(raw)
    assert ref == DeviceRef(raw=raw, **expected)  # type: ignore[arg-type]
    assert ref.recognised
    assert ref.error is None


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " GPU-abc",
        "GPU-abc ",
        "GPU-",  # no uuid body
        "gpu-5fd4f087",  # wrong case of the prefix
        f"{GPU0}::",  # replica missing
        f"{GPU0}::x",  # replica not a number
        f"{GPU0}::-1",
        f"{GPU0}/3",  # a slash inside a GPU uuid
        "MIG-GPU-abc/3",  # legacy form without a compute instance
        "nvidia",
        "nvidia-0",
        "nvidia0/gi",
        "nvidia0/vgpu1/gi2",  # wrong order
        "nvidia0/vgpu1::2",  # two replica numbers
        "nvidia\u0663",  # a non-ASCII digit
        "0",  # bare index: no plugin hands these to the kubelet
        "/dev/nvidia0",
        "amd.com/gpu-0",
        "x" * 300,
    ],
)
def test_parse_unrecognised_gives_reason_not_exception(raw: str) -> None:
    ref = parse_device_id(raw)
    assert not ref.recognised
    assert ref.error
    assert ref.raw == raw
    assert (ref.uuid, ref.gpu_index, ref.parent_uuid, ref.replica) == (None, None, None, None)
    assert resolve(ref, NODE) is None


def test_non_string_input_is_an_error_not_an_exception() -> None:
    ref = parse_device_id(7)  # type: ignore[arg-type]
    assert ref.error == "device id is not a string"
    assert ref.raw == "7"


def test_ref_properties() -> None:
    assert not parse_device_id(GPU0).is_mig
    assert not parse_device_id(GPU0).is_shared
    assert parse_device_id(f"{GPU0}::1").is_shared
    assert parse_device_id(MIG_A).is_mig
    assert parse_device_id(f"MIG-{GPU1}/3/0").is_mig
    assert parse_device_id("nvidia1/gi3").is_mig
    assert not parse_device_id("nvidia1").is_mig
    assert parse_device_id("nvidia1/vgpu2").is_shared
    assert not parse_device_id("garbage").is_mig


def test_ref_is_frozen() -> None:
    ref = parse_device_id(GPU0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.uuid = GPU1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("raw", "uuid"),
    [
        (GPU0, GPU0),
        (f"{GPU0}::0", GPU0),
        (f"{GPU0}::2", GPU0),  # every replica resolves to the GPU it shares
        (MIG_A, MIG_A),
        (f"{MIG_B}::1", MIG_B),
        (f"MIG-{GPU1}/3/0", MIG_A),
        (f"MIG-{GPU1}/5/0", MIG_B),
        ("nvidia0", GPU0),
        ("nvidia1", GPU1),
        ("nvidia0/vgpu3", GPU0),
        ("nvidia1/gi3", MIG_A),
        ("nvidia1/gi5/vgpu1", MIG_B),
        # Named or positioned devices that this node does not have.
        ("GPU-00000000-0000-0000-0000-000000000000", None),
        ("MIG-00000000-0000-0000-0000-000000000000", None),
        (f"MIG-{GPU1}/9/0", None),
        (f"MIG-{GPU0}/3/0", None),  # GPU 0 has no MIG slices
        ("nvidia7", None),
        ("nvidia0/gi3", None),  # GPU 0 has no MIG slice 3
        ("nvidia1/gi4", None),
    ],
)
def test_resolve_against_node_devices(raw: str, uuid: str | None) -> None:
    assert resolve(parse_device_id(raw), NODE) == uuid


def test_resolve_does_not_confuse_a_gpu_with_a_slice_of_the_same_numbers() -> None:
    # "nvidia1" is the whole GPU 1, never one of its slices, and vice versa.
    only_slices = [d for d in NODE if d.parent_uuid is not None]
    assert resolve(parse_device_id("nvidia1"), only_slices) is None
    only_gpus = [d for d in NODE if d.parent_uuid is None]
    assert resolve(parse_device_id("nvidia1/gi3"), only_gpus) is None


def test_gke_ids_name_the_device_file_not_the_nvml_index() -> None:
    # GKE's plugin names a GPU by its /dev/nvidia<N>, whose minor number NVML's index (PCI
    # order) need not equal: here GPU 0 is /dev/nvidia1 and GPU 1 is /dev/nvidia0. Matched
    # by the index, each pod's usage went to the other's GPU.
    swapped = [
        NodeDevice("0", GPU0, minor_number=1),
        NodeDevice("1", GPU1, minor_number=0),
        NodeDevice("1/3", MIG_A, parent_uuid=GPU1, minor_number=0),
    ]
    assert resolve(parse_device_id("nvidia1"), swapped) == GPU0
    assert resolve(parse_device_id("nvidia0"), swapped) == GPU1
    assert resolve(parse_device_id("nvidia0/gi3"), swapped) == MIG_A
    assert resolve(parse_device_id("nvidia1/gi3"), swapped) is None
    assert resolve(parse_device_id("nvidia1/vgpu2"), swapped) == GPU0
    # UUIDs are not touched by it.
    assert resolve(parse_device_id(GPU0), swapped) == GPU0


def test_resolve_skips_devices_with_malformed_index() -> None:
    odd = [NodeDevice("x", GPU0), NodeDevice("1/y", MIG_A, parent_uuid=GPU1)]
    assert resolve(parse_device_id("nvidia0"), odd) is None
    assert resolve(parse_device_id(f"MIG-{GPU1}/3/0"), odd) is None
    assert resolve(parse_device_id("nvidia1/gi3"), odd) is None


def test_resolve_accepts_model_device_samples() -> None:
    # The sampler's DeviceSample is a DeviceIdentity as it stands.
    samples = [
        DeviceSample(index="0", uuid=GPU0, model="NVIDIA H100 80GB HBM3"),
        DeviceSample(index="1", uuid=GPU1, model="NVIDIA A100-SXM4-80GB"),
        DeviceSample(
            index="1/3", uuid=MIG_A, model="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
            parent_uuid=GPU1, mig_profile="1g.10gb",
        ),
    ]
    assert resolve(parse_device_id("nvidia1/gi3"), samples) == MIG_A
    assert resolve(parse_device_id(f"{GPU0}::1"), samples) == GPU0
    assert resolve(parse_device_id("nvidia0"), samples) == GPU0
    assert resolve(parse_device_id("nvidia1/gi5"), samples) is None


def test_resolve_with_no_devices() -> None:
    assert resolve(parse_device_id(GPU0), []) is None
    assert resolve(parse_device_id("nvidia0"), ()) is None


def test_a_device_without_a_uuid_resolves_to_nothing() -> None:
    # NVML gives a GPU it never identified (its handle or UUID unreadable), and a MIG slice
    # whose UUID read failed, the UUID "": nothing can be joined with it, so the positional
    # forms that land on it name no device (counted unresolved, never a uuid="" series).
    unknown = (
        NodeDevice("0", ""),
        NodeDevice("1", GPU1),
        NodeDevice("1/3", "", parent_uuid=GPU1),
    )
    assert resolve(parse_device_id("nvidia0"), unknown) is None
    assert resolve(parse_device_id("nvidia0/vgpu1"), unknown) is None
    assert resolve(parse_device_id("nvidia1/gi3"), unknown) is None
    assert resolve(parse_device_id(f"MIG-{GPU1}/3/0"), unknown) is None
    assert resolve(parse_device_id("nvidia1"), unknown) == GPU1


def test_an_unidentified_gpu_does_not_hide_the_gpu_with_its_device_file() -> None:
    # GPU 0 was never identified (no minor number: its index stands in, 0); GPU 1 is
    # /dev/nvidia0. "nvidia0" is GPU 1, not the GPU without a UUID.
    devices = (NodeDevice("0", ""), NodeDevice("1", GPU1, minor_number=0))
    assert resolve(parse_device_id("nvidia0"), devices) == GPU1
