"""``gpuscope.exporter.kubernetes.podresources.wire`` against the official protobuf runtime.

The oracle is the generated ``podresources_v1_pb2`` (protobuf-python, upb backend): for any
bytes, either both decoders accept with equal known fields, or both reject (ours with
:class:`WireError`, nothing else). Inputs: responses built with the generated classes,
hand-encoded ones with unknown fields of every wire type at every level (groups included),
repeated singular strings, known numbers with wrong wire types, and mutations of all of
these. Hypothesis settings: ``tests/fuzz/_profile.py`` (derandomized in CI;
``GPUSCOPE_FUZZ_EXAMPLES=N`` for a longer random run).
"""

from __future__ import annotations

import ast
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError
from hypothesis import event, example, given
from hypothesis import strategies as st

from gpuscope.exporter.kubernetes.podresources import wire
from gpuscope.exporter.kubernetes.podresources.wire import (
    ContainerDevices,
    ContainerResources,
    PodResources,
    WireError,
    decode_list_response,
    encode_list_request,
)
from tests.fuzz._profile import fuzz
from tests.kubelet_api import podresources_v1_pb2 as pb2

Pods = tuple[PodResources, ...]

# The corner cases below were verified on upb, protobuf's default backend; the pure-Python
# one differs in a few (see wire.py's docstring), so the comparisons need upb.
needs_upb = pytest.mark.skipif(
    api_implementation.Type() != "upb",
    reason="wire.py follows protobuf's upb backend; another backend is in use",
)


# --- hand encoding -------------------------------------------------------------------------


def varint(value: int, width: int = 0) -> bytes:
    """``value`` (negative: as 64-bit two's complement) as a varint, padded with 0x80 bytes
    to ``width`` bytes when that is longer (protobuf accepts over-long varints)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value or len(out) + 1 < width:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def ld(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


def group(number: int, *fields: bytes) -> bytes:
    return tag(number, 3) + b"".join(fields) + tag(number, 4)


# --- the oracle ----------------------------------------------------------------------------


def from_pb2(message: pb2.ListPodResourcesResponse) -> Pods:
    """The known fields of a protobuf message, as our values."""
    return tuple(
        PodResources(
            pod.name,
            pod.namespace,
            tuple(
                ContainerResources(
                    container.name,
                    tuple(
                        ContainerDevices(devices.resource_name, tuple(devices.device_ids))
                        for devices in container.devices
                    ),
                )
                for container in pod.containers
            ),
        )
        for pod in message.pod_resources
    )


def protobuf_decode(data: bytes) -> Pods | None:
    """What protobuf makes of ``data``: the known fields, or None where it raises."""
    try:
        return from_pb2(pb2.ListPodResourcesResponse.FromString(data))
    except DecodeError:
        return None


def ours(data: bytes) -> Pods | None:
    """What we make of ``data``: also from a memoryview (at an offset in a bigger buffer)
    and a bytearray, which must agree; a WireError must be one non-empty line."""
    try:
        pods = decode_list_response(data)
    except WireError as error:
        message = str(error)
        assert message and "\n" not in message, repr(message)
        for other in _other_buffers(data):
            with pytest.raises(WireError):
                decode_list_response(other)
        return None
    assert isinstance(pods, tuple)
    for other in _other_buffers(data):
        assert decode_list_response(other) == pods
    return pods


def _other_buffers(data: bytes) -> list[bytes | memoryview]:
    padded = memoryview(b"\x0a\x7f" + data + b"\xff\xff")[2:-2]
    return [padded, memoryview(bytearray(data))]


def agree(data: bytes) -> Pods | None:
    """Both accept with equal known fields, or both reject."""
    expected = protobuf_decode(data)
    got = ours(data)
    if expected is None:
        assert got is None, f"protobuf rejects {data!r}, we accept: {got!r}"
    else:
        assert got is not None, f"protobuf accepts {data!r}, we reject"
        assert got == expected
    return got


# --- strategies ----------------------------------------------------------------------------

texts = st.one_of(
    st.text(max_size=12),  # every code point but surrogates (protobuf cannot encode them)
    st.sampled_from(["", "nvidia.com/gpu", "GPU-5a9c7c0e-62bd-3a3f-5b7b-1d2c7f1e1a10",
                     "MIG-GPU-8c2c/1/0", "kube-system", "ÿ", "名前空間", "🙂 gpu", "\x00"]),
)
numa_ids = st.one_of(st.integers(-(2**63), 2**63 - 1), st.integers(0, 7))


@st.composite
def pb2_responses(draw: st.DrawFn, max_pods: int = 4) -> pb2.ListPodResourcesResponse:
    """A response built with the generated classes."""
    response = pb2.ListPodResourcesResponse()
    for _ in range(draw(st.integers(0, max_pods))):
        pod = response.pod_resources.add(name=draw(texts), namespace=draw(texts))
        for _ in range(draw(st.integers(0, 3))):
            container = pod.containers.add(name=draw(texts))
            for _ in range(draw(st.integers(0, 3))):
                devices = container.devices.add(resource_name=draw(texts))
                devices.device_ids.extend(draw(st.lists(texts, max_size=4)))
                if draw(st.booleans()):
                    devices.topology.SetInParent()
                    for numa in draw(st.lists(numa_ids, max_size=3)):
                        devices.topology.nodes.add(ID=numa)
    return response


# An unknown field: any number up to 2**29 - 1 (with over-long tags sometimes), any wire
# type, groups nested with unknown fields inside (field number 0 included: upb allows it).
field_numbers = st.one_of(st.integers(1, 6), st.integers(7, 2**29 - 1))
tag_widths = st.sampled_from([0, 0, 0, 5])
scalar_values = st.one_of(
    st.tuples(st.just(0), st.builds(varint, st.integers(0, 2**64 - 1), st.sampled_from([0, 10]))),
    st.tuples(st.just(1), st.binary(min_size=8, max_size=8)),
    st.tuples(st.just(5), st.binary(min_size=4, max_size=4)),
    st.tuples(st.just(2), st.binary(max_size=12).map(lambda b: varint(len(b)) + b)),
)


def _unknown(number: int, width: int, value: tuple[int, bytes]) -> bytes:
    return varint(number << 3 | value[0], width) + value[1]


def _group_of(number: int, inside: list[bytes]) -> bytes:
    return group(number, *inside)


in_group = st.recursive(
    st.builds(_unknown, st.integers(0, 2**29 - 1), tag_widths, scalar_values),
    lambda inner: st.builds(_group_of, field_numbers, st.lists(inner, max_size=3)),
    max_leaves=6,
)


def unknown_fields(known: frozenset[tuple[int, int]]) -> st.SearchStrategy[bytes]:
    """A field (tag and value) that the message with fields ``known`` (number, wire type)
    does not know: an unknown number, or a known one with another wire type."""

    def scalar(number: int, width: int, value: tuple[int, bytes]) -> bytes:
        if (number, value[0]) in known:
            number += 100
        return _unknown(number, width, value)

    return st.one_of(
        st.builds(scalar, field_numbers, tag_widths, scalar_values),
        st.builds(_group_of, field_numbers, st.lists(in_group, max_size=3)),
    )


RESPONSE = frozenset({(1, 2)})
POD = frozenset({(1, 2), (2, 2), (3, 2)})
CONTAINER = frozenset({(1, 2), (2, 2)})
DEVICES = frozenset({(1, 2), (2, 2), (3, 2)})
TOPOLOGY = frozenset({(1, 2)})
NUMA = frozenset({(1, 0)})


def _message(
    draw: st.DrawFn,
    repeated: list[bytes],
    singles: Sequence[tuple[int, str]],
    known: frozenset[tuple[int, int]],
) -> bytes:
    """Encode one message: ``repeated`` in order, each singular string at a random place
    (left out when empty, or sent explicitly), sometimes after earlier occurrences it must
    override, and unknown fields anywhere."""
    out = list(repeated)
    for number, value in singles:
        if not value and draw(st.booleans()):
            continue
        at = draw(st.integers(0, len(out)))
        out.insert(at, ld(number, value.encode()))
        for decoy in draw(st.lists(texts, max_size=2)):
            out.insert(draw(st.integers(0, at)), ld(number, decoy.encode()))
            at += 1
    for extra in draw(st.lists(unknown_fields(known), max_size=2)):
        out.insert(draw(st.integers(0, len(out))), extra)
    return b"".join(out)


@st.composite
def hand_encoded(draw: st.DrawFn, max_pods: int = 3) -> tuple[bytes, Pods]:
    """A response encoded by hand with unknown fields at every level, and its known
    fields."""
    pods: list[PodResources] = []
    pod_fields: list[bytes] = []
    for _ in range(draw(st.integers(0, max_pods))):
        containers: list[ContainerResources] = []
        container_fields: list[bytes] = []
        for _ in range(draw(st.integers(0, 3))):
            all_devices: list[ContainerDevices] = []
            devices_fields: list[bytes] = []
            for _ in range(draw(st.integers(0, 2))):
                devices = ContainerDevices(draw(texts), tuple(draw(st.lists(texts, max_size=3))))
                repeated = [ld(2, device_id.encode()) for device_id in devices.device_ids]
                for _ in range(draw(st.integers(0, 2))):  # topology, merged when repeated
                    nodes = [
                        ld(1, _message(draw, [tag(1, 0) + varint(numa)], (), NUMA))
                        for numa in draw(st.lists(numa_ids, max_size=2))
                    ]
                    topology = ld(3, _message(draw, nodes, (), TOPOLOGY))
                    repeated.insert(draw(st.integers(0, len(repeated))), topology)
                singles = [(1, devices.resource_name)]
                devices_fields.append(ld(2, _message(draw, repeated, singles, DEVICES)))
                all_devices.append(devices)
            container = ContainerResources(draw(texts), tuple(all_devices))
            singles = [(1, container.name)]
            container_fields.append(ld(3, _message(draw, devices_fields, singles, CONTAINER)))
            containers.append(container)
        pod = PodResources(draw(texts), draw(texts), tuple(containers))
        singles = [(1, pod.name), (2, pod.namespace)]
        pod_fields.append(ld(1, _message(draw, container_fields, singles, POD)))
        pods.append(pod)
    return _message(draw, pod_fields, (), RESPONSE), tuple(pods)


valid_encodings = st.one_of(
    pb2_responses(max_pods=2).map(lambda message: message.SerializeToString()),
    hand_encoded(max_pods=2).map(lambda pair: pair[0]),
)


def _mutate(draw: st.DrawFn, data: bytes) -> bytes:
    """One to three mutations: cut, bit flip, byte set, insertion, deletion."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["cut", "flip", "set", "insert", "delete"]))
        at = draw(st.integers(0, len(out)))
        if kind == "cut":
            del out[at:]
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif at < len(out):
            if kind == "flip":
                out[at] ^= 1 << draw(st.integers(0, 7))
            elif kind == "set":
                out[at] = draw(st.sampled_from([0x00, 0x07, 0x0B, 0x0C, 0x80, 0xFF]))
            else:
                del out[at : at + draw(st.integers(1, 3))]
    return bytes(out)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid encoding, mutated."""
    return _mutate(draw, draw(valid_encodings))


@st.composite
def mutated_topologies(draw: st.DrawFn) -> bytes:
    """A response whose only device has a mutated ``topology``: protobuf parses that field,
    so we must check it, though we do not keep it."""
    nodes = [
        ld(1, _message(draw, [tag(1, 0) + varint(numa)], (), NUMA))
        for numa in draw(st.lists(numa_ids, max_size=3))
    ]
    topology = _mutate(draw, _message(draw, nodes, (), TOPOLOGY))
    return ld(1, ld(3, ld(2, ld(1, b"nvidia.com/gpu") + ld(3, topology))))


# --- properties ----------------------------------------------------------------------------


@needs_upb
@fuzz(150)
@given(pb2_responses())
def test_messages_built_with_protobuf(message: pb2.ListPodResourcesResponse) -> None:
    data = message.SerializeToString()
    assert ours(data) == from_pb2(message)
    assert agree(data) == from_pb2(message)


@needs_upb
@fuzz(80)
@given(hand_encoded())
def test_unknown_fields_at_every_level(pair: tuple[bytes, Pods]) -> None:
    data, pods = pair
    assert agree(data) == pods


@needs_upb
@fuzz(200)
@given(mutated())
@example(b"\x0a\x02\x0a\x80")  # a length that runs into the next message's bytes
@example(b"\x0a\x04\x1a\x02\x12\x00")  # devices with nothing
def test_mutations_agree_with_protobuf(data: bytes) -> None:
    event("accepted" if agree(data) is not None else "rejected")


@needs_upb
@fuzz(100)
@given(mutated_topologies())
def test_mutated_topology_agrees_with_protobuf(data: bytes) -> None:
    event("accepted" if agree(data) is not None else "rejected")


@fuzz(300)
@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_wire_error(data: bytes) -> None:
    ours(data)


# --- the behaviours verified against protobuf ----------------------------------------------

POD_A = ld(1, ld(1, b"a"))  # a response with one pod named "a"

CASES: dict[str, tuple[bytes, Pods | None]] = {
    "empty": (b"", ()),
    "empty pod": (ld(1, b""), (PodResources("", "", ()),)),
    "explicit empty strings": (ld(1, ld(1, b"") + ld(2, b"")), (PodResources("", "", ()),)),
    "name twice: last wins": (
        ld(1, ld(1, b"first") + ld(2, b"ns") + ld(1, b"second")),
        (PodResources("second", "ns", ()),),
    ),
    "resource name twice: last wins": (
        ld(1, ld(3, ld(2, ld(1, b"x") + ld(2, b"id") + ld(1, b"nvidia.com/gpu")))),
        (PodResources("", "", (ContainerResources("", (ContainerDevices(
            "nvidia.com/gpu", ("id",)),)),)),),
    ),
    "pod name as a varint: skipped": (ld(1, tag(1, 0) + varint(5)), (PodResources("", "", ()),)),
    "pod name as 64-bit: skipped": (ld(1, tag(1, 1) + bytes(8)), (PodResources("", "", ()),)),
    "pod name as 32-bit: skipped": (ld(1, tag(1, 5) + bytes(4)), (PodResources("", "", ()),)),
    "pod name as a group: skipped": (
        ld(1, group(1, ld(1, b"x")) + ld(2, b"ns")),
        (PodResources("", "ns", ()),),
    ),
    "pods as a group: skipped": (group(1, ld(1, b"x")) + POD_A, (PodResources("a", "", ()),)),
    "containers as a varint: skipped": (ld(1, tag(3, 0) + varint(1)), (PodResources("", "", ()),)),
    "device ids as 32-bit: skipped": (
        ld(1, ld(3, ld(2, tag(2, 5) + bytes(4)))),
        (PodResources("", "", (ContainerResources("", (ContainerDevices("", ()),)),)),),
    ),
    "kubelet's newer fields": (  # cpu_ids = 3 (packed int64), memory = 4, dynamic = 5
        ld(1, ld(3, ld(1, b"c") + ld(3, varint(2) + varint(3)) + ld(4, ld(1, b"memory"))
                 + ld(5, ld(1, b"claim")))),
        (PodResources("", "", (ContainerResources("c", ()),)),),
    ),
    "unknown group": (group(7, tag(1, 0) + varint(1), group(8), ld(2, b"\xff")) + POD_A,
                      (PodResources("a", "", ()),)),
    "field 0 inside a group": (group(7, tag(0, 0) + varint(1), group(0)) + POD_A,
                               (PodResources("a", "", ()),)),
    "end-group tag spelled over-long": (tag(7, 3) + varint(7 << 3 | 4, 3) + POD_A,
                                        (PodResources("a", "", ()),)),
    "over-long tag of a known field": (varint(0x0A, 5) + varint(3) + ld(1, b"a"),
                                       (PodResources("a", "", ()),)),
    "over-long length": (tag(1, 2) + varint(3, 5) + ld(1, b"a"), (PodResources("a", "", ()),)),
    "largest field number": (tag(2**29 - 1, 0) + varint(0), ()),
    "10-byte varint": (tag(7, 0) + varint(2**64 - 1), ()),
    "10-byte varint, high bits": (tag(7, 0) + b"\xff" * 9 + b"\x7f", ()),
    "NUMA ID of 10 bytes": (
        ld(1, ld(3, ld(2, ld(3, ld(1, tag(1, 0) + varint(-1)))))),
        (PodResources("", "", (ContainerResources("", (ContainerDevices("", ()),)),)),),
    ),
    "NUMA ID as a string: skipped": (
        ld(1, ld(3, ld(2, ld(3, ld(1, ld(1, b"\xff")))))),
        (PodResources("", "", (ContainerResources("", (ContainerDevices("", ()),)),)),),
    ),
    "unknown bytes that are not UTF-8": (ld(7, b"\xff\xfe") + POD_A, (PodResources("a", "", ()),)),
    "non-ASCII": (ld(1, ld(1, "ÿ名🙂".encode())), (PodResources("ÿ名🙂", "", ()),)),
    "bad UTF-8: pod name": (ld(1, ld(1, b"\xff")), None),
    "bad UTF-8: namespace": (ld(1, ld(2, b"a\xc3")), None),
    "bad UTF-8: surrogate": (ld(1, ld(1, b"\xed\xa0\x80")), None),
    "bad UTF-8: over-long": (ld(1, ld(1, b"\xc0\x80")), None),
    "bad UTF-8: above U+10FFFF": (ld(1, ld(1, b"\xf4\x90\x80\x80")), None),
    "bad UTF-8: container name": (ld(1, ld(3, ld(1, b"\x80"))), None),
    "bad UTF-8: resource name": (ld(1, ld(3, ld(2, ld(1, b"\xff")))), None),
    "bad UTF-8: device id": (ld(1, ld(3, ld(2, ld(2, b"\xff")))), None),
    "bad UTF-8, later overridden": (ld(1, ld(1, b"\xff") + ld(1, b"a")), None),
    "field number 0": (tag(0, 0) + varint(1), None),
    "field number 0 in a pod": (ld(1, tag(0, 2) + varint(0)), None),
    "group of field 0": (group(0), None),
    "wire type 6": (tag(7, 6), None),
    "wire type 7": (ld(1, tag(7, 7)), None),
    "wire type 6 in a group": (group(7, tag(1, 6)), None),
    "end-group without a group": (tag(7, 4), None),
    "end-group without a group, in a pod": (ld(1, ld(1, b"a") + tag(7, 4)), None),
    "end-group of another number": (tag(7, 3) + tag(8, 4), None),
    "nested groups closed in the wrong order": (tag(7, 3) + tag(8, 3) + tag(7, 4) + tag(8, 4),
                                                None),
    "group not closed": (tag(7, 3) + tag(1, 0) + varint(1), None),
    "group closed outside its pod": (ld(1, tag(7, 3)) + tag(7, 4), None),
    "varint of 11 bytes": (tag(7, 0) + b"\xff" * 10 + b"\x00", None),
    "varint of 11 bytes, zero padded": (tag(7, 0) + varint(0, 11), None),
    "NUMA ID of 11 bytes": (ld(1, ld(3, ld(2, ld(3, ld(1, tag(1, 0) + varint(1, 11)))))), None),
    "tag of 6 bytes": (varint(7 << 3, 6) + varint(0), None),
    "tag above 32 bits": (varint(2**29 << 3) + varint(0), None),
    "length of 6 bytes": (tag(1, 2) + varint(0, 6), None),
    "length of 6 bytes, unknown": (tag(7, 2) + varint(0, 6), None),
    "length of 2**31": (tag(7, 2) + varint(2**31), None),
    "length past the end": (tag(7, 2) + varint(3) + b"ab", None),
    "length past its message": (ld(1, tag(1, 2) + varint(3)) + b"abc", None),
    "truncated tag": (b"\x80", None),
    "truncated varint": (tag(7, 0) + b"\x80", None),
    "truncated length": (tag(1, 2) + b"\x80", None),
    "no length": (tag(1, 2), None),
    "truncated 64-bit": (tag(7, 1) + bytes(7), None),
    "truncated 32-bit": (tag(7, 5) + bytes(3), None),
    "malformed topology": (ld(1, ld(3, ld(2, ld(3, b"\x0a\x05")))), None),
    "malformed NUMA node": (ld(1, ld(3, ld(2, ld(3, ld(1, b"\x08"))))), None),
    "second topology malformed": (
        ld(1, ld(3, ld(2, ld(3, ld(1, tag(1, 0) + varint(1))) + ld(3, tag(7, 7))))),
        None,
    ),
}


@needs_upb
@pytest.mark.parametrize(("data", "expected"), CASES.values(), ids=CASES.keys())
def test_verified_protobuf_behaviour(data: bytes, expected: Pods | None) -> None:
    assert protobuf_decode(data) == expected, "protobuf itself changed"
    assert ours(data) == expected


@pytest.mark.parametrize(("data", "expected"), CASES.values(), ids=CASES.keys())
def test_cases_without_the_oracle(data: bytes, expected: Pods | None) -> None:
    assert ours(data) == expected


def _nested_groups(depth: int) -> bytes:
    return tag(7, 3) * depth + tag(7, 4) * depth


# Where a group is placed, and the message level it is at: upb allows 100 levels in all.
PLACES: dict[str, tuple[Callable[[bytes], bytes], int]] = {
    "response": (lambda inner: inner, 0),
    "pod": (lambda inner: ld(1, inner), 1),
    "container": (lambda inner: ld(1, ld(3, inner)), 2),
    "devices": (lambda inner: ld(1, ld(3, ld(2, inner))), 3),
    "topology": (lambda inner: ld(1, ld(3, ld(2, ld(3, inner)))), 4),
    "NUMA node": (lambda inner: ld(1, ld(3, ld(2, ld(3, ld(1, inner))))), 5),
}


@needs_upb
@pytest.mark.parametrize(("place", "level"), PLACES.values(), ids=PLACES.keys())
def test_group_nesting_limit(place: Callable[[bytes], bytes], level: int) -> None:
    deepest = 100 - level
    assert agree(place(_nested_groups(deepest))) is not None
    assert agree(place(_nested_groups(deepest + 1))) is None


def test_deep_groups_raise_wire_error_not_recursion_error() -> None:
    with pytest.raises(WireError, match="nested deeper"):
        decode_list_response(_nested_groups(100_000))
    with pytest.raises(WireError, match="not closed"):
        decode_list_response(tag(7, 3) * 100)


# --- the rest of the API -------------------------------------------------------------------


def test_list_request_is_the_empty_message() -> None:
    assert encode_list_request() == b"" == pb2.ListPodResourcesRequest().SerializeToString()


def test_values_are_frozen_and_hashable() -> None:
    pods = decode_list_response(ld(1, ld(1, b"p") + ld(3, ld(2, ld(1, b"r") + ld(2, b"i")))))
    assert pods == (PodResources("p", "", (ContainerResources("", (ContainerDevices(
        "r", ("i",)),)),)),)
    with pytest.raises(AttributeError):
        pods[0].name = "other"  # type: ignore[misc]
    assert hash(pods) == hash(decode_list_response(pb2.ListPodResourcesResponse(
        pod_resources=[pb2.PodResources(name="p", containers=[pb2.ContainerResources(
            devices=[pb2.ContainerDevices(resource_name="r", device_ids=["i"])])])],
    ).SerializeToString()))


def test_not_a_buffer() -> None:
    view = memoryview(b"abc")
    view.release()
    with pytest.raises(WireError):
        decode_list_response(view)


def test_imports_only_the_standard_library() -> None:
    tree = ast.parse(Path(wire.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in imported} <= set(sys.stdlib_module_names)


def big_response(pods: int = 500) -> bytes:
    """A big node's answer: ``pods`` pods of 8 containers, each with four GPUs (and their
    NUMA node), a NIC, and the kubelet's ``cpu_ids`` and ``memory`` (unknown fields here);
    about 1 MiB for 500 pods."""
    out = []
    for p in range(pods):
        containers = []
        for c in range(8):
            gpu_ids = [f"GPU-{p:08x}-{c:04x}-{g:04x}-0000-{p * 8 + c:012x}" for g in range(4)]
            gpus = ld(1, b"nvidia.com/gpu") + b"".join(ld(2, i.encode()) for i in gpu_ids)
            gpus += ld(3, ld(1, tag(1, 0) + varint(c % 2)))
            nic = ld(1, b"example.com/rdma") + ld(2, f"mlx5_{c}".encode())
            cpu_ids = ld(3, b"".join(varint(c * 4 + i) for i in range(4)))
            memory = ld(4, ld(1, b"memory") + tag(2, 0) + varint(2**34) + ld(3, b""))
            containers.append(ld(3, ld(1, f"container-{c}".encode()) + ld(2, gpus) + ld(2, nic)
                                 + cpu_ids + memory))
        name = ld(1, f"train-{p:04d}-worker".encode()) + ld(2, f"team-{p % 9}".encode())
        out.append(ld(1, name + b"".join(containers)))
    return b"".join(out)


def test_big_response() -> None:
    data = big_response()
    assert 0.9 * 2**20 < len(data) < 1.2 * 2**20
    started = time.perf_counter()
    pods = decode_list_response(data)
    elapsed = time.perf_counter() - started
    assert pods == protobuf_decode(data)
    assert len(pods) == 500 and {len(pod.containers) for pod in pods} == {8}
    assert pods[499].containers[7].devices[0] == ContainerDevices("nvidia.com/gpu", (
        "GPU-000001f3-0007-0000-0000-000000000f9f",
        "GPU-000001f3-0007-0001-0000-000000000f9f",
        "GPU-000001f3-0007-0002-0000-000000000f9f",
        "GPU-000001f3-0007-0003-0000-000000000f9f",
    ))
    assert pods[499].containers[7].devices[1] == ContainerDevices("example.com/rdma", ("mlx5_7",))
    # About 30 ms (see wire.py); the bound only catches a decoder gone quadratic.
    assert elapsed < 2.0, elapsed
