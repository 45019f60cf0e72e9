"""Fuzzing ``gpuscope.exporter.kubernetes.podresources.devices``: kubelet device IDs to NVML
devices.

``parse_device_id`` "never raises: unknown shapes set ``error``" (a one-line reason), and
``resolve`` is a pure lookup. Every documented shape (``GPU-<uuid>``, ``MIG-<uuid>``, either
with ``::<n>``, ``MIG-GPU-<uuid>/<gi>/<ci>``, GKE's ``nvidia<N>[/gi<M>][/vgpu<K>]``) must be
taken apart into the numbers it was built from, and re-rendering an understood ID gives an
ID that parses to the same device (idempotent normal form). Settings: ``_profile.py``.
"""

from __future__ import annotations

import dataclasses

from hypothesis import example, given
from hypothesis import strategies as st

from gpuscope.exporter.kubernetes.podresources.devices import (
    DeviceRef,
    NodeDevice,
    parse_device_id,
    resolve,
)
from tests.fuzz._profile import fuzz


def render(ref: DeviceRef) -> str:
    """The canonical spelling of an understood ID."""
    suffix = f"::{ref.replica}" if ref.replica is not None else ""
    if ref.uuid is not None:
        return ref.uuid + suffix
    if ref.parent_uuid is not None:
        return f"MIG-{ref.parent_uuid}/{ref.gpu_instance_id}/{ref.compute_instance_id}{suffix}"
    assert ref.gpu_index is not None
    gi = f"/gi{ref.gpu_instance_id}" if ref.gpu_instance_id is not None else ""
    vgpu = f"/vgpu{ref.replica}" if ref.replica is not None else ""
    return f"nvidia{ref.gpu_index}{gi}{vgpu}"


def fields(ref: DeviceRef) -> DeviceRef:
    return dataclasses.replace(ref, raw="")


def check_total(raw: str) -> DeviceRef:
    ref = parse_device_id(raw)
    assert ref.raw == raw
    if ref.error is not None:
        assert ref.error and "\n" not in ref.error and len(ref.error.splitlines()) == 1
        assert (ref.uuid, ref.parent_uuid, ref.gpu_index) == (None, None, None)
        assert resolve(ref, NODE) is None
        return ref
    # Exactly one way of naming the device.
    assert sum(x is not None for x in (ref.uuid, ref.parent_uuid, ref.gpu_index)) == 1
    again = parse_device_id(render(ref))
    assert again.error is None and fields(again) == fields(ref), (raw, render(ref))
    assert render(again) == render(ref)
    return ref


ID_PIECES = st.sampled_from([
    "GPU-", "MIG-", "MIG-GPU-", "nvidia", "/gi", "/vgpu", "::", ":", "/", "-", "0", "1", "12",
    "5fd4f087-86f3-7a43-b711-4771313afc50", " ", "\n", "\x00", "٣", "²", "é", "::-1", "/gi/",
])
IDISH = st.lists(st.one_of(ID_PIECES, st.text(max_size=4)), max_size=12).map("".join)


@fuzz(500)
@given(raw=st.one_of(st.text(), IDISH))
@example("GPU-a::1::2")
@example("nvidia٣")  # a non-ASCII digit
@example("nvidia0/vgpu1::2")  # two replica numbers
@example("GPU-x::" + "9" * 249)  # a long replica number (within the length cap)
@example("x" * 10_000)
@example(" GPU-abc")
@example("GPU-abc\n")
def test_any_string_parses_without_raising(raw: str) -> None:
    check_total(raw)


@fuzz(50)
@given(raw=st.one_of(st.none(), st.integers(), st.floats(), st.binary(), st.lists(st.text())))
def test_non_strings_are_an_error_not_an_exception(raw: object) -> None:
    ref = parse_device_id(raw)  # type: ignore[arg-type]
    assert ref.error is not None and resolve(ref, NODE) is None


# -- valid IDs ---------------------------------------------------------------------------------

uuid_bodies = st.one_of(st.uuids().map(str), st.uuids().map(lambda u: str(u).upper()))
small = st.integers(0, 10**6)
replicas = st.none() | small


@st.composite
def valid_ids(draw: st.DrawFn) -> tuple[str, DeviceRef]:
    kind = draw(st.sampled_from(["gpu", "mig", "legacy", "gke"]))
    replica = draw(replicas)
    suffix = f"::{replica}" if replica is not None else ""
    if kind in ("gpu", "mig"):
        uuid = f"{kind.upper()}-{draw(uuid_bodies)}"
        return uuid + suffix, DeviceRef(raw=uuid + suffix, uuid=uuid, replica=replica)
    if kind == "legacy":
        parent = f"GPU-{draw(uuid_bodies)}"
        gi, ci = draw(small), draw(small)
        raw = f"MIG-{parent}/{gi}/{ci}{suffix}"
        return raw, DeviceRef(raw=raw, parent_uuid=parent, gpu_instance_id=gi,
                              compute_instance_id=ci, replica=replica)
    index, gi = draw(small), draw(st.none() | small)
    zeros = "0" * draw(st.integers(0, 2))  # leading zeros are still the same number
    raw = f"nvidia{zeros}{index}" + (f"/gi{gi}" if gi is not None else "")
    if replica is not None and draw(st.booleans()):
        raw += f"/vgpu{replica}"
    else:
        raw += suffix
    return raw, DeviceRef(raw=raw, gpu_index=index, gpu_instance_id=gi, replica=replica)


@fuzz(300)
@given(case=valid_ids())
def test_every_documented_shape_is_taken_apart(case: tuple[str, DeviceRef]) -> None:
    raw, expected = case
    ref = check_total(raw)
    assert ref == expected
    assert ref.is_shared == (expected.replica is not None)


# -- resolution against this node's devices ----------------------------------------------------

GPU0 = "GPU-5fd4f087-86f3-7a43-b711-4771313afc50"
GPU1 = "GPU-0c8a5b4e-12f0-4d6e-9b77-0e5d1c3f2a11"
MIG_A = "MIG-bf3b4cdb-6b93-5b34-9a1b-4a6e9b6d6ad3"
NODE = (
    NodeDevice("0", GPU0),
    NodeDevice("1", GPU1),
    NodeDevice("1/3", MIG_A, parent_uuid=GPU1),
)


@st.composite
def nodes(draw: st.DrawFn) -> list[NodeDevice]:
    """A node: GPUs 0..n-1, some in MIG mode with slices in distinct GPU instances."""
    devices = []
    for index in range(draw(st.integers(0, 4))):
        uuid = f"GPU-{draw(st.uuids())}"
        devices.append(NodeDevice(str(index), uuid))
        for gi in draw(st.sets(st.integers(0, 14), max_size=3)):
            devices.append(NodeDevice(f"{index}/{gi}", f"MIG-{draw(st.uuids())}", uuid))
    return devices


@fuzz(200)
@given(devices=nodes(), data=st.data())
def test_every_form_resolves_to_the_device_it_names(
    devices: list[NodeDevice], data: st.DataObject,
) -> None:
    for device in devices:
        replica = data.draw(replicas)
        suffix = f"::{replica}" if replica is not None else ""
        forms = [device.uuid + suffix]
        gpu, _, gi = device.index.partition("/")
        if device.parent_uuid is None:
            forms.append(f"nvidia{gpu}{suffix}")
        else:
            forms += [f"nvidia{gpu}/gi{gi}{suffix}", f"MIG-{device.parent_uuid}/{gi}/0{suffix}"]
        for raw in forms:
            assert resolve(check_total(raw), devices) == device.uuid, raw


@fuzz(200)
@given(raw=st.one_of(IDISH, valid_ids().map(lambda c: c[0])), devices=nodes())
def test_resolve_is_total_and_only_answers_present_devices(
    raw: str, devices: list[NodeDevice],
) -> None:
    found = resolve(parse_device_id(raw), devices)
    assert found is None or found in {d.uuid for d in devices}
