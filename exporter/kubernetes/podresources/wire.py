"""The kubelet's ``ListPodResourcesResponse``, decoded from protobuf wire format by hand.

What: :func:`decode_list_response` turns the bytes of a PodResources v1 ``List()`` answer into
frozen :class:`PodResources` / :class:`ContainerResources` / :class:`ContainerDevices` values;
:func:`encode_list_request` gives the request's bytes. Nothing else of the API is needed.

Sources: the messages and field numbers of the kubelet's ``api.proto``
(``k8s.io/kubelet/pkg/apis/podresources/v1``; the subset we read is in
``podresources_v1.proto`` next to this file) and the protobuf encoding specification
(https://protobuf.dev/programming-guides/encoding/)::

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources       { string name = 1; string namespace = 2;
                         repeated ContainerResources containers = 3; }
    ContainerResources { string name = 1; repeated ContainerDevices devices = 2; }
    ContainerDevices   { string resource_name = 1; repeated string device_ids = 2;
                         TopologyInfo topology = 3; }
    TopologyInfo       { repeated NUMANode nodes = 1; }      // checked, not kept
    NUMANode           { int64 ID = 1; }                      // checked, not kept

Why by hand: the exporter runs on every GPU node, and grpcio plus the protobuf runtime cost
about 19.6 MiB of resident memory there, for one small unary call. This module imports only
``dataclasses``; the generated ``podresources_v1_pb2`` stays in the tree for the tests, which
check this decoder against it.

Compatibility: the answer is what the official runtime (protobuf-python 7.x, its default
``upb`` backend, proto3 semantics) gives for the same bytes with our ``.proto``; where that
runtime raises ``DecodeError``, we raise :class:`WireError`, and where it accepts, we accept
with equal known fields. Verified against protobuf 7.36.2 (upb) and tested in
``tests/exporter/kubernetes/podresources/test_wire.py``:

* A string field that is absent is ``""``; a repeated field absent is ``()``; repeated
  fields keep wire order. A singular string that appears twice: the last one wins (every
  occurrence must still be valid UTF-8). For a singular *message* field appearing twice
  protobuf merges the occurrences; the only one here, ``topology``, is not kept, so merging
  makes no difference.
* Unknown fields of wire types 0 (varint), 1 (64-bit), 2 (length-delimited, contents not
  looked at) and 5 (32-bit) are skipped; so are the kubelet's newer fields (``cpu_ids = 3``,
  ``memory = 4``, ``dynamic_resources = 5`` of ``ContainerResources``, ...).
* A known field number with another wire type than its declared one (``name`` sent as a
  varint, ``containers`` as a group, ...) is an unknown field to protobuf: skipped, the
  field keeps its value. Same here.
* Groups (wire types 3/4, proto2's delimited encoding): protobuf accepts a well-formed group
  as an unknown field, whatever its number, and so do we: its contents are walked (wire
  types checked, values skipped; a field number 0 *inside* a group is accepted, as upb
  does) up to the end-group tag of the same number. Rejected: an end-group tag with no open
  group or of another number, a group left open, nesting deeper than upb's limit of 100
  (counting message levels: the response is level 0, a ``NUMANode`` level 5).
* Rejected (:class:`WireError`): wire types 6 and 7; field number 0 (outside groups); a tag
  longer than 5 bytes or above 2**32 - 1 (so field numbers stop at 2**29 - 1); a varint
  longer than 10 bytes (a 10th byte without the continuation bit is fine, whatever its
  value); a length prefix longer than 5 bytes or past the end of the enclosing message;
  anything truncated; a string field (``name``, ``namespace``, ``resource_name``,
  ``device_ids``) that is not valid UTF-8 (upb raises "String field had bad UTF-8");
  a malformed ``topology`` (protobuf parses it: it is a known field).
* protobuf's pure-Python backend (``PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python``) differs
  from upb in corners we follow upb on: it accepts tags and length prefixes longer than 5
  bytes and field numbers >= 2**29, allows only 99 nested groups, and rejects an end-group
  tag spelled as an over-long varint.

Speed: bytes are read by index (no copy of a sub-message is ever made; a string is sliced
once, to decode it; a memoryview or bytearray argument is copied to ``bytes`` once, as
indexing ``bytes`` is faster). A 1.01 MiB answer (``big_response()`` in the tests: 500 pods x 8
containers, each with 4 GPU IDs and their NUMA node, a NIC, and the kubelet's ``cpu_ids`` and
``memory`` as unknown fields; 12,500 objects and 33,000 strings built) decodes in 29-35 ms
(best / median of 30) on one core of the development machine (CPython 3.11, a shared Xeon
VM); protobuf's upb parses it in about 2 ms there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "ContainerDevices",
    "ContainerResources",
    "PodResources",
    "WireError",
    "decode_list_response",
    "encode_list_request",
]

# upb's default nesting limit: message levels plus open groups.
_MAX_DEPTH = 100


class WireError(Exception):
    """Bytes that are not a valid ``ListPodResourcesResponse``; one-line message."""


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """Devices of one resource allocated to one container (``topology`` is not kept)."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerResources:
    name: str
    devices: tuple[ContainerDevices, ...]


@dataclass(frozen=True, slots=True)
class PodResources:
    name: str
    namespace: str
    containers: tuple[ContainerResources, ...]


def encode_list_request() -> bytes:
    """The ``ListPodResourcesRequest``: a message with no fields, which protobuf encodes as
    zero bytes (an encoding is just its fields' tag-value pairs, with no header or
    terminator). gRPC still frames it: flag byte 0, length 0."""
    return b""


def decode_list_response(data: bytes | memoryview) -> tuple[PodResources, ...]:
    """The pods of a ``ListPodResourcesResponse`` encoding, in wire order.

    Raises :class:`WireError` (and nothing else) for bytes protobuf would refuse.
    """
    if isinstance(data, bytes):
        buf = data
    else:
        try:
            buf = bytes(memoryview(data))  # one copy: indexing bytes is faster than a view
        except (TypeError, ValueError) as error:  # released view, not a buffer
            raise WireError(f"not a byte buffer: {error}") from None
    return tuple(_pod(buf, start, stop)
                 for _, start, stop in _fields(buf, 0, len(buf), 0, (0x0A,)))


def _fields(
    buf: bytes, pos: int, end: int, level: int, wanted: tuple[int, ...]
) -> Iterator[tuple[int, int, int]]:
    """The length-delimited fields of the message in ``buf[pos:end]`` whose tags are in
    ``wanted``, as (tag, start, stop) in wire order; every other field is skipped (checked
    as protobuf checks it). ``level``: the message depth, for the nesting limit of groups."""
    while pos < end:
        tag = buf[pos]
        pos += 1
        if tag > 0x7F:
            tag, pos = _tag(buf, pos - 1, end)
        if tag not in wanted:
            pos = _skip(buf, pos, end, tag, level)
            continue
        start, pos = _delimited(buf, pos, end)
        yield tag, start, pos


def _pod(buf: bytes, pos: int, end: int) -> PodResources:
    # name = 1, namespace = 2, containers = 3 (level 1)
    name = namespace = ""
    containers: list[ContainerResources] = []
    for tag, start, stop in _fields(buf, pos, end, 1, (0x0A, 0x12, 0x1A)):
        if tag == 0x1A:
            containers.append(_container(buf, start, stop))
        elif tag == 0x0A:
            name = _text(buf, start, stop)
        else:
            namespace = _text(buf, start, stop)
    return PodResources(name, namespace, tuple(containers))


def _container(buf: bytes, pos: int, end: int) -> ContainerResources:
    # name = 1, devices = 2 (level 2)
    name = ""
    devices: list[ContainerDevices] = []
    for tag, start, stop in _fields(buf, pos, end, 2, (0x0A, 0x12)):
        if tag == 0x12:
            devices.append(_devices(buf, start, stop))
        else:
            name = _text(buf, start, stop)
    return ContainerResources(name, tuple(devices))


def _devices(buf: bytes, pos: int, end: int) -> ContainerDevices:
    # resource_name = 1, device_ids = 2, topology = 3 (level 3)
    resource_name = ""
    device_ids: list[str] = []
    for tag, start, stop in _fields(buf, pos, end, 3, (0x0A, 0x12, 0x1A)):
        if tag == 0x12:
            device_ids.append(_text(buf, start, stop))
        elif tag == 0x0A:
            resource_name = _text(buf, start, stop)
        else:
            _topology(buf, start, stop)  # not kept, but protobuf parses it
    return ContainerDevices(resource_name, tuple(device_ids))


def _topology(buf: bytes, pos: int, end: int) -> None:
    """Check a ``TopologyInfo``: ``repeated NUMANode nodes = 1`` (level 4)."""
    for _, at, stop in _fields(buf, pos, end, 4, (0x0A,)):
        # NUMANode { int64 ID = 1; } (level 5): a varint, checked and skipped.
        while at < stop:
            tag = buf[at]
            at += 1
            if tag == 0x08 and at < stop and buf[at] < 0x80:  # ID < 128: the usual case
                at += 1
                continue
            if tag > 0x7F:
                tag, at = _tag(buf, at - 1, stop)
            at = _skip(buf, at, stop, tag, 5)


def _delimited(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The value of a length-delimited field whose tag was just read: (start, stop) of its
    bytes, which must lie inside the enclosing message (``end``)."""
    if pos >= end:
        raise _truncated(pos)
    size = buf[pos]
    pos += 1
    if size > 0x7F:
        size, pos = _length(buf, pos - 1)
    stop = pos + size
    if stop > end:
        raise _past_end(pos, size)
    return pos, stop


def _text(buf: bytes, start: int, stop: int) -> str:
    """A proto3 ``string``: UTF-8, checked as protobuf checks it."""
    try:
        return buf[start:stop].decode()
    except UnicodeDecodeError:
        raise _bad_utf8(start) from None


def _tag(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """A tag of two or more bytes at ``pos``: (tag, position after it). Like upb: at most 5
    bytes, and the value must fit in 32 bits."""
    value = 0
    shift = 0
    for i in range(pos, min(pos + 5, end)):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value > 0xFFFFFFFF:
                raise WireError(f"tag above 2**32 - 1 at byte {pos}")
            return value, i + 1
        shift += 7
    if pos + 5 <= end:
        raise WireError(f"tag longer than 5 bytes at byte {pos}")
    raise _truncated(pos)


def _length(buf: bytes, pos: int) -> tuple[int, int]:
    """A length prefix of two or more bytes at ``pos``: (length, position after it). Like
    upb: at most 5 bytes. Read up to the end of the buffer, not of the enclosing message: a
    prefix that runs past the message ends past it, which the caller's length check
    rejects."""
    value = 0
    shift = 0
    for i in range(pos, min(pos + 5, len(buf))):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if value >= 0x7FFFFFFF:  # upb's limit (INT32_MAX), whatever the bytes left
                raise WireError(f"length {value} at byte {pos} above 2 GiB")
            return value, i + 1
        shift += 7
    if pos + 5 <= len(buf):
        raise WireError(f"length prefix longer than 5 bytes at byte {pos}")
    raise _truncated(pos)


def _skip(buf: bytes, pos: int, end: int, tag: int, level: int) -> int:
    """Skip the value of an unknown field (or a known one of another wire type) whose tag
    was just read; ``level`` is the message depth, for the nesting limit of groups."""
    if tag < 8:
        raise WireError(f"field number 0 before byte {pos}")
    wire_type = tag & 7
    if wire_type == 3:
        return _skip_group(buf, pos, end, tag >> 3, level)
    if wire_type == 4:
        raise WireError(f"end-group tag of field {tag >> 3} with no open group before byte {pos}")
    return _skip_value(buf, pos, end, wire_type)


def _skip_value(buf: bytes, pos: int, end: int, wire_type: int) -> int:
    """Skip a value of wire type 0, 1, 2 or 5 at ``pos``; reject 6 and 7."""
    if wire_type == 0:
        for i in range(pos, min(pos + 10, end)):
            if buf[i] < 0x80:
                return i + 1
        if pos + 10 <= end:
            raise WireError(f"varint longer than 10 bytes at byte {pos}")
        raise _truncated(pos)
    if wire_type == 2:
        if pos >= end:
            raise _truncated(pos)
        size = buf[pos]
        pos += 1
        if size > 0x7F:
            size, pos = _length(buf, pos - 1)
        if size > end - pos:
            raise _past_end(pos, size)
        return pos + size
    if wire_type == 1 or wire_type == 5:
        stop = pos + (8 if wire_type == 1 else 4)
        if stop > end:
            raise _truncated(pos)
        return stop
    raise WireError(f"invalid wire type {wire_type} before byte {pos}")


def _skip_group(buf: bytes, pos: int, end: int, number: int, level: int) -> int:
    """Skip a group (field ``number``, start tag just read) up to its end-group tag, without
    recursion. Field number 0 is accepted inside, as upb does."""
    open_groups = [number]
    limit = _MAX_DEPTH - level
    while True:
        if pos >= end:
            raise WireError(f"group of field {open_groups[-1]} not closed before byte {end}")
        tag = buf[pos]
        pos += 1
        if tag > 0x7F:
            tag, pos = _tag(buf, pos - 1, end)
        wire_type = tag & 7
        if wire_type == 4:
            if tag >> 3 != open_groups[-1]:
                raise WireError(
                    f"end-group tag of field {tag >> 3} closes group of field "
                    f"{open_groups[-1]} before byte {pos}"
                )
            open_groups.pop()
            if not open_groups:
                return pos
        elif wire_type == 3:
            open_groups.append(tag >> 3)
            if len(open_groups) > limit:
                raise WireError(f"groups nested deeper than {_MAX_DEPTH} levels at byte {pos}")
        else:
            pos = _skip_value(buf, pos, end, wire_type)


def _truncated(pos: int) -> WireError:
    return WireError(f"truncated message at byte {pos}")


def _past_end(pos: int, size: int) -> WireError:
    return WireError(f"length {size} at byte {pos} runs past the end of its message")


def _bad_utf8(pos: int) -> WireError:
    return WireError(f"string field at byte {pos} is not valid UTF-8")
