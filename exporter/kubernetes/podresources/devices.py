"""Device IDs as the kubelet reports them, normalised to something NVML can be joined with.

The kubelet's PodResources API hands back, per container and resource name, the opaque
device IDs that the *device plugin* advertised. Their shape depends on the plugin:

NVIDIA k8s-device-plugin (EKS, AKS, self-managed; also the GPU operator)
    ``GPU-<uuid>``                 an exclusive GPU (``nvidia.com/gpu``).
    ``GPU-<uuid>::<n>``            time-slicing replica ``n`` of that GPU (``nvidia.com/gpu`` or,
                                   with ``renameByDefault``, ``nvidia.com/gpu.shared``); the
                                   plugin's "annotated ID" (``<id>::<replica>``).
    ``MIG-<uuid>``                 a MIG slice (``nvidia.com/mig-<profile>``), driver R470+.
    ``MIG-<uuid>::<n>``            time-slicing replica of a MIG slice.
    ``MIG-GPU-<uuid>/<gi>/<ci>``   a MIG slice as drivers before R470 named it: parent GPU UUID,
                                   GPU-instance id, compute-instance id (older plugins; the
                                   format dcgm-exporter's older releases parse).
GKE's own device plugin
    ``nvidia<N>``                  the GPU whose device file is ``/dev/nvidia<N>`` (its minor
                                   number, not necessarily its NVML index).
    ``nvidia<N>/gi<M>``            MIG slice: GPU-instance M on GPU N.
    ``nvidia<N>/vgpu<K>``          time-sharing replica K of GPU N.
    ``nvidia<N>/gi<M>/vgpu<K>``    time-sharing replica K of a MIG slice.

UUID forms name the NVML device directly. The GKE forms (and the pre-R470 MIG form) name it
by position, so :func:`resolve` looks them up among the devices NVML sees on this node:
``DeviceSample.index`` is ``"<N>"`` for a GPU and ``"<N>/<gi>"`` for a MIG slice, exactly the
numbers GKE uses.

Everything here is a pure function of its arguments. An ID we do not understand never raises:
it yields a :class:`DeviceRef` whose ``error`` says why, and which resolves to ``None``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DeviceIdentity",
    "DeviceRef",
    "NodeDevice",
    "parse_device_id",
    "resolve",
]

# An NVML UUID body. NVML prints canonical 8-4-4-4-12 hex, but we only require "no separator
# characters" so that an odd-but-valid UUID (vGPU guests, future formats) still matches
# exactly against NVML instead of being dropped by an over-strict pattern.
_UUID_BODY = r"[0-9A-Za-z][0-9A-Za-z-]*"
_GPU_UUID = re.compile(rf"GPU-{_UUID_BODY}")
_MIG_UUID = re.compile(rf"MIG-{_UUID_BODY}")
# Pre-R470 MIG identifier: MIG-GPU-<parent uuid>/<gpu instance id>/<compute instance id>.
_LEGACY_MIG = re.compile(rf"MIG-(GPU-{_UUID_BODY})/([0-9]+)/([0-9]+)")
# GKE device plugin: nvidia<N>[/gi<M>][/vgpu<K>].
_GKE = re.compile(r"nvidia([0-9]+)(?:/gi([0-9]+))?(?:/vgpu([0-9]+))?")
# NVIDIA device plugin's annotated ID for a shared (time-sliced) device: <id>::<replica>.
_REPLICA = re.compile(r"(.+)::([0-9]+)")
# DeviceSample.index: "<gpu>" or "<gpu>/<gpu instance id>".
_INDEX = re.compile(r"([0-9]+)(?:/([0-9]+))?")
# Longest ID we look at. Real device IDs are a few tens of characters (a legacy MIG ID with a
# replica suffix is under 60); the cap only bounds the work spent on garbage input.
_MAX_ID_LENGTH = 256


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """One device ID from the kubelet, taken apart.

    Exactly one way of naming the device is set when the ID was understood:

    - ``uuid``: the NVML UUID (``GPU-…`` or ``MIG-…``) the ID names directly;
    - ``parent_uuid`` + ``gpu_instance_id`` (+ ``compute_instance_id``): a MIG slice in the
      pre-R470 form;
    - ``gpu_index`` (+ ``gpu_instance_id`` for a MIG slice): GKE's positional form.

    ``replica`` is the time-sharing replica number (``::<n>`` or GKE ``/vgpu<K>``), ``None`` for
    an exclusive allocation. ``error`` is ``None`` for an understood ID, else a one-line reason;
    ``raw`` is always the ID exactly as the kubelet sent it.
    """

    raw: str
    uuid: str | None = None
    parent_uuid: str | None = None
    gpu_index: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    replica: int | None = None
    error: str | None = None

    @property
    def recognised(self) -> bool:
        return self.error is None

    @property
    def is_mig(self) -> bool:
        """True when the ID names a MIG slice (in any of the three forms)."""
        if self.uuid is not None:
            return self.uuid.startswith("MIG-")
        return self.gpu_instance_id is not None

    @property
    def is_shared(self) -> bool:
        """True for a time-sharing replica (several containers may hold the same device)."""
        return self.replica is not None


class DeviceIdentity(Protocol):
    """What :func:`resolve` needs to know about a device NVML sees on this node.

    ``exporter.model.DeviceSample`` satisfies it, and so does :class:`NodeDevice`.
    ``index`` is ``"<N>"`` for a GPU and ``"<N>/<gi>"`` for a MIG slice (parent GPU index and
    GPU-instance id); ``parent_uuid`` is set for MIG slices only; ``minor_number`` is the
    GPU's ``/dev/nvidia<N>`` (None: not known, taken to be the index).
    """

    @property
    def index(self) -> str: ...

    @property
    def uuid(self) -> str: ...

    @property
    def parent_uuid(self) -> str | None: ...

    @property
    def minor_number(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """A plain :class:`DeviceIdentity`, for callers that hold no ``DeviceSample`` objects."""

    index: str
    uuid: str
    parent_uuid: str | None = None
    minor_number: int | None = None


def parse_device_id(raw: str) -> DeviceRef:
    """Take a kubelet device ID apart. Never raises: unknown shapes set ``error``."""
    if not isinstance(raw, str):  # defensive: callers pass protobuf strings, but be total
        return DeviceRef(raw=str(raw), error="device id is not a string")
    if not raw:
        return DeviceRef(raw=raw, error="empty device id")
    if len(raw) > _MAX_ID_LENGTH:
        return DeviceRef(raw=raw, error=f"device id longer than {_MAX_ID_LENGTH} characters")
    if raw != raw.strip():
        return DeviceRef(raw=raw, error="device id has surrounding whitespace")

    base, replica = raw, None
    annotated = _REPLICA.fullmatch(raw)
    if annotated is not None:
        base, replica = annotated.group(1), int(annotated.group(2))
    elif "::" in raw:
        return DeviceRef(raw=raw, error="replica suffix after '::' is not a number")

    legacy = _LEGACY_MIG.fullmatch(base)
    if legacy is not None:
        return DeviceRef(
            raw=raw,
            parent_uuid=legacy.group(1),
            gpu_instance_id=int(legacy.group(2)),
            compute_instance_id=int(legacy.group(3)),
            replica=replica,
        )
    if _GPU_UUID.fullmatch(base) or _MIG_UUID.fullmatch(base):
        return DeviceRef(raw=raw, uuid=base, replica=replica)

    gke = _GKE.fullmatch(base)
    if gke is not None:
        index, gi, vgpu = gke.groups()
        if vgpu is not None and replica is not None:
            return DeviceRef(raw=raw, error="both a '/vgpu' and a '::' replica number")
        return DeviceRef(
            raw=raw,
            gpu_index=int(index),
            gpu_instance_id=int(gi) if gi is not None else None,
            replica=int(vgpu) if vgpu is not None else replica,
        )
    return DeviceRef(
        raw=raw,
        error="unrecognised device id (expected GPU-<uuid>, MIG-<uuid>, "
        "MIG-GPU-<uuid>/<gi>/<ci> or nvidia<N>[/gi<M>][/vgpu<K>], optionally '::<n>')",
    )


def _split_index(index: str) -> tuple[int, int | None] | None:
    """``"3"`` -> (3, None); ``"3/5"`` -> (3, 5); anything else -> None."""
    match = _INDEX.fullmatch(index)
    if match is None:
        return None
    gpu, gi = match.groups()
    return int(gpu), (int(gi) if gi is not None else None)


def resolve(ref: DeviceRef, devices: Iterable[DeviceIdentity]) -> str | None:
    """The NVML UUID of the device ``ref`` names, among ``devices`` (this node's GPUs and MIG
    slices), or ``None`` when the ID was not understood or names no device present here.

    A time-sharing replica resolves to the device it shares: replicas 0..n of one GPU all
    return that GPU's UUID. A device whose UUID is ``""`` (a GPU NVML never identified, a MIG
    slice whose UUID it did not read) is passed over: nothing can be joined with it, so a
    positional ID that lands on it names no device (never an empty UUID).
    """
    if ref.error is not None:
        return None
    if ref.uuid is not None:
        # Named directly; still only answer for devices this node has, so that a stale
        # allocation (device gone, GPU fell off the bus) is not reported as present.
        return next((d.uuid for d in devices if d.uuid == ref.uuid), None)
    if ref.parent_uuid is not None:
        for device in devices:
            if not device.uuid or device.parent_uuid != ref.parent_uuid:
                continue
            position = _split_index(device.index)
            if position is not None and position[1] == ref.gpu_instance_id:
                return device.uuid
        return None
    if ref.gpu_index is not None:
        # GKE's plugin names a GPU by its device file, /dev/nvidia<N>: its minor number,
        # which NVML's index need not equal; the index where the minor is not known.
        want_mig = ref.gpu_instance_id is not None
        for device in devices:
            if not device.uuid or (device.parent_uuid is not None) != want_mig:
                continue
            position = _split_index(device.index)
            if position is None:
                continue
            number = device.minor_number if device.minor_number is not None else position[0]
            if (number, position[1]) == (ref.gpu_index, ref.gpu_instance_id):
                return device.uuid
        return None
    return None
