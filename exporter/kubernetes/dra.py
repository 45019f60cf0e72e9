"""Dynamic Resource Allocation: which NVML device a kubelet-reported DRA device is.

With DRA (``resource.k8s.io/v1``, GA in Kubernetes 1.34) a GPU is not an extended resource
with an opaque device ID but a *device* in a *ResourceSlice*, named by the triple
``(driver, pool, device)``. The kubelet's PodResources v1 API reports, per container,
``dynamic_resources[].claim_resources[]`` with ``driver_name``, ``pool_name``,
``device_name`` and ``cdi_devices[].name``; the NVML UUID is only in the ResourceSlice that
the driver published. This module joins the two. Everything here is a pure function of its
arguments: the list/watch of slices and the join into attribution live elsewhere.

What NVIDIA's DRA driver publishes (driver name ``gpu.nvidia.com``; github
NVIDIA/k8s-dra-driver-gpu, now kubernetes-sigs/dra-driver-nvidia-gpu; read at v25.3.0,
v25.8.0, v25.12.0, v0.4.0 and main of 2026-05-15, ``cmd/gpu-kubelet-plugin/deviceinfo.go``,
``mig.go``, ``driver.go``, ``cdi.go``):

- One pool per node, named after the node; every slice has ``spec.nodeName`` set to it.
  A pool may span several slices (with the DynamicMIG feature on Kubernetes 1.35+: one slice
  of shared counters without devices plus one slice per GPU).
- Device attributes are *unqualified* names in the driver's domain (CEL:
  ``device.attributes["gpu.nvidia.com"].uuid``), each ``{"string": …}``, ``{"version": …}``,
  ``{"int": …}`` or ``{"bool": …}``:

  ======================  ============================================  =====================
  device                  name                                          identity attributes
  ======================  ============================================  =====================
  full GPU                ``gpu-<minor>``                               ``type="gpu"``,
                                                                        ``uuid="GPU-…"``
  MIG device (static)     ``gpu-<minor>-mig-<profile>-<gi profile id>-  ``type="mig"``,
                          <placement start>`` (v25.12+, profile         ``uuid="MIG-…"``,
                          ``1g.10gb`` written ``1g10gb``);              ``parentUUID="GPU-…"``,
                          ``gpu-<minor>-mig-<gi profile id>-<start>-    ``profile="1g.10gb"``
                          <size>`` (v25.3, v25.8)
  MIG device (DynamicMIG  same as static, v25.12+                       ``type="mig"``,
  feature, created on                                                   ``parentUUID``,
  allocation)                                                           ``profile``; **no**
                                                                        ``uuid``
  GPU for passthrough     ``gpu-vfio-<index>`` (v25.12+)                ``type="vfio"``,
                                                                        ``uuid`` not NVML's:
                                                                        a bare UUIDv5 (SHA-1)
                                                                        of the PCI address
  ======================  ============================================  =====================

  A DynamicMIG device has no MIG UUID before it is created, so the slice cannot carry one:
  it resolves only through ``mig_uuids`` (parent UUID, GPU-instance profile ID and placement
  start, as NVML's ``nvmlGpuInstanceGetInfo`` reports them) that the caller supplies.
  A passthrough (vfio) GPU is bound to ``vfio-pci`` and invisible to the host's NVML: it is
  indexed (its ``uuid``, the driver's own ``uuid.NewSHA1(NameSpaceDNS, <PCI address>)``
  in ``nvlib.go``, is not kept) but never resolved.
- The CDI device names the driver hands the kubelet are
  ``k8s.gpu.nvidia.com/claim=<claim UID>-<device name>`` (all versions) and, up to v25.8,
  also ``k8s.gpu.nvidia.com/device=<device name>``. They carry the device name but no UUID
  and no pool; with this driver the pool is the node's name, which is the fallback for a
  kubelet that reports CDI names only (:meth:`DeviceIndex.resolve`, ``node_pool``).

Sharing: the driver never sets ``allowMultipleAllocations``, so a GPU is allocated to one
ResourceClaim at a time; time-slicing and MPS are settings of that claim (opaque
``GpuConfig.sharing``), and several containers share the GPU by referencing the same claim
(two containers of a pod, or several pods naming one ResourceClaim). PodResources then lists
the same ``(driver, pool, device)`` under each of those containers, which resolves to the same
UUID for each: exactly the device-plugin time-slicing case.

Bad input never raises. A slice that is not a ResourceSlice object of the configured driver,
or is malformed where it matters, is skipped and counted (``rejected_slices``); a malformed
device inside a usable slice is skipped and counted (``skipped_devices``); both are logged at
debug level. A ClaimResource naming another driver, an unknown pool or device, or anything
unreadable resolves to ``None``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from gpuscope.exporter.kubernetes.podresources.client import Allocation
from gpuscope.exporter.kubernetes.podresources.devices import DeviceRef

__all__ = [
    "DEFAULT_DRIVER",
    "MEASURABLE_KINDS",
    "RESOURCE_SLICES_PATH",
    "ClaimResource",
    "ClaimResourceLike",
    "ClaimedDevice",
    "DeviceIndex",
    "DeviceKey",
    "DraDevice",
    "MigPlacement",
    "ParsedSlice",
    "allocations_from_claims",
    "device_name_from_cdi",
    "node_field_selector",
    "parse_resource_slice",
]

log = logging.getLogger(__name__)

#: The NVIDIA DRA driver's name (``spec.driver`` of its ResourceSlices, ``driver_name`` in
#: PodResources). Its ComputeDomain plugin is a different driver, ``compute-domain.nvidia.com``.
DEFAULT_DRIVER = "gpu.nvidia.com"

#: The collection to list/watch, with :func:`node_field_selector` as ``fieldSelector``.
RESOURCE_SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"

#: Device ``type`` values whose UUID names a device the host's NVML sees.
MEASURABLE_KINDS = frozenset({"gpu", "mig"})

# Same leniency as podresources/devices.py: NVML prints 8-4-4-4-12 hex, but an odd-but-valid
# UUID (vGPU guests, future formats) must still match NVML exactly rather than be dropped.
_NVML_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z-]*")
# Kubernetes object UIDs (a claim's metadata.uid), as the driver embeds them in CDI names.
_CLAIM_UID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# A DRA device name is a DNS label.
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_DEVICE_NAME = re.compile(_DNS_LABEL)
# The driver's MIG device name since v25.12: gpu-<minor>-mig-<profile>-<gi profile id>-<start>
# (mig.go, canonicalMigNameRegex).
_MIG_NAME = re.compile(r"gpu-([0-9]+)-mig-(.+)-([0-9]+)-([0-9]+)")
# Bounds on what is looked at, only to bound the work spent on garbage: pool names are at
# most 253 characters by API validation, UUIDs and device names far less.
_MAX_NAME = 253
_MAX_UUID = 256
_MAX_CDI_NAME = 512


@dataclass(frozen=True, slots=True, order=True)
class DeviceKey:
    """A DRA device's identity: ``<driver>/<pool>/<device>``, as the resource API defines it."""

    driver: str
    pool: str
    device: str

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True, slots=True, order=True)
class MigPlacement:
    """Where a MIG device sits on its GPU: what identifies a DynamicMIG device before and after
    it exists. ``profile_id`` is the GPU-instance profile ID and ``placement_start`` the first
    memory slice, both as ``nvmlGpuInstanceGetInfo`` reports them (``profileId``,
    ``placement.start``)."""

    parent_uuid: str
    profile_id: int
    placement_start: int


@dataclass(frozen=True, slots=True)
class DraDevice:
    """One device of the driver, as its ResourceSlice describes it.

    ``kind`` is the device's ``type`` attribute (``gpu``, ``mig``, ``vfio``), or inferred
    from the UUID's prefix when the attribute is absent, or ``""`` when neither says.
    ``uuid`` is the NVML UUID (``GPU-…`` or ``MIG-…``), ``None`` for a DynamicMIG device
    (created only when allocated) and for a passthrough (``vfio``) GPU, whose ``uuid``
    attribute is not an NVML UUID. ``parent_uuid`` and ``profile`` are set for MIG devices
    when published; ``placement`` for a MIG device without a UUID whose name gives it.
    """

    key: DeviceKey
    kind: str
    uuid: str | None
    parent_uuid: str | None = None
    profile: str | None = None
    placement: MigPlacement | None = None

    @property
    def measurable(self) -> bool:
        """True for a device the host's NVML can see (a GPU or a MIG device)."""
        return self.kind in MEASURABLE_KINDS


@dataclass(frozen=True, slots=True)
class ParsedSlice:
    """The part of one ResourceSlice that matters here. ``devices`` holds every well-formed
    device (of any kind); ``skipped_devices`` counts the others."""

    name: str
    driver: str
    pool: str
    generation: int
    resource_slice_count: int | None
    node_name: str | None
    devices: tuple[DraDevice, ...] = ()
    skipped_devices: int = 0


class ClaimResourceLike(Protocol):
    """What :meth:`DeviceIndex.resolve` reads of one PodResources ``ClaimResource``.

    The protobuf message satisfies it (``cdi_devices`` holds ``CDIDevice`` messages with a
    ``name``), and so does :class:`ClaimResource`.
    """

    @property
    def driver_name(self) -> str: ...

    @property
    def pool_name(self) -> str: ...

    @property
    def device_name(self) -> str: ...

    @property
    def cdi_devices(self) -> Iterable[object]: ...


@dataclass(frozen=True, slots=True)
class ClaimResource:
    """A plain :class:`ClaimResourceLike`. ``cdi_devices`` holds CDI device names (strings);
    objects with a ``name`` attribute are read the same way."""

    driver_name: str = ""
    pool_name: str = ""
    device_name: str = ""
    cdi_devices: tuple[object, ...] = ()


def node_field_selector(node_name: str) -> str:
    """The ``fieldSelector`` that lists only this node's ResourceSlices (``spec.nodeName``).

    Slices published for many nodes (``nodeSelector``, ``allNodes``,
    ``perDeviceNodeSelection``) do not match it; NVIDIA's GPU plugin publishes none.
    """
    return f"spec.nodeName={node_name}"


# --- ResourceSlice JSON --------------------------------------------------------------------


def _str(value: object, limit: int = _MAX_NAME) -> str | None:
    """``value`` when it is a non-empty string of at most ``limit`` characters."""
    if isinstance(value, str) and value and len(value) <= limit:
        return value
    return None


def _int(value: object) -> int | None:
    """``value`` when it is a JSON integer (``bool`` is not one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _device_attributes(device: Mapping[object, object]) -> Mapping[object, object] | None:
    """The attribute map of one device in any served version: ``attributes`` on the device
    (``v1``, ``v1beta2``) or on ``basic`` (``v1beta1``). An absent map is an empty one; a map
    of the wrong type is ``None``."""
    basic = device.get("basic")
    attributes = basic.get("attributes") if isinstance(basic, Mapping) else device.get("attributes")
    if attributes is None:
        return {}
    return attributes if isinstance(attributes, Mapping) else None


def _string_attribute(attributes: Mapping[object, object], driver: str, name: str) -> str | None:
    """A string attribute by its unqualified name, or by ``<driver>/<name>`` (the same
    attribute: unqualified names are in the driver's domain). Empty strings count as absent;
    the caller bounds the length."""
    for key in (name, f"{driver}/{name}"):
        value = attributes.get(key)
        if isinstance(value, Mapping):
            text = value.get("string")
            if isinstance(text, str) and text:
                return text
    return None


def _nvml_uuid(text: str) -> bool:
    return len(text) <= _MAX_UUID and _NVML_UUID.fullmatch(text) is not None


def _bounded(text: str | None) -> str | None:
    return text if text is not None and len(text) <= _MAX_NAME else None


def _mig_placement(
    device_name: str, parent_uuid: str | None, profile: str | None
) -> MigPlacement | None:
    """A DynamicMIG device's placement, from its name (``gpu-<minor>-mig-<profile>-<gi profile
    id>-<placement start>``) and its ``parentUUID``. When the ``profile`` attribute is there,
    the name must contain it as the driver writes it into names (lower case, dots dropped,
    any other character outside ``[a-z0-9-]`` made ``-``): a profile with dashes is then not
    misread."""
    if parent_uuid is None:
        return None
    if profile is None:
        match = _MIG_NAME.fullmatch(device_name)
    else:
        written = re.sub(r"[^a-z0-9-.]", "-", profile.replace(".", "").lower()).strip("-")
        match = re.fullmatch(
            rf"gpu-([0-9]+)-mig-({re.escape(written)})-([0-9]+)-([0-9]+)", device_name
        )
    if match is None:
        return None
    return MigPlacement(parent_uuid, int(match.group(3)), int(match.group(4)))


def _parse_device(raw: object, driver: str, pool: str) -> DraDevice | None:
    """One ``spec.devices[]`` entry, or ``None`` when it is malformed."""
    if not isinstance(raw, Mapping):
        return None
    name = _str(raw.get("name"), 63)
    if name is None or _DEVICE_NAME.fullmatch(name) is None:
        return None
    attributes = _device_attributes(raw)
    if attributes is None:
        return None

    uuid = _string_attribute(attributes, driver, "uuid")
    kind = _bounded(_string_attribute(attributes, driver, "type"))
    if kind == "vfio":
        uuid = None  # the driver's own UUID of the PCI address, no NVML UUID: nothing to keep
    elif uuid is not None and not _nvml_uuid(uuid):
        return None  # a uuid attribute that NVML would never print: do not guess
    if kind is None:
        kind = "gpu" if uuid and uuid.startswith("GPU-") else "mig" if uuid else ""

    parent_uuid = profile = None
    placement = None
    if kind == "mig":
        parent_uuid = _string_attribute(attributes, driver, "parentUUID")
        if parent_uuid is not None and not (
            parent_uuid.startswith("GPU-") and _nvml_uuid(parent_uuid)
        ):
            parent_uuid = None
        profile = _bounded(_string_attribute(attributes, driver, "profile"))
        if uuid is None:
            placement = _mig_placement(name, parent_uuid, profile)
    return DraDevice(
        key=DeviceKey(driver, pool, name),
        kind=kind,
        uuid=uuid,
        parent_uuid=parent_uuid,
        profile=profile,
        placement=placement,
    )


def parse_resource_slice(
    obj: object, *, driver: str = DEFAULT_DRIVER, node_name: str | None = None
) -> ParsedSlice | None:
    """One ResourceSlice as the API server returns it (an object of a list's ``items`` or a
    watch event's ``object``; ``resource.k8s.io/v1``, ``v1beta2`` or ``v1beta1``).

    ``None`` when the object is not a slice of ``driver`` or is unusable (no pool name or
    generation, devices not a list), or when ``node_name`` is given and the slice is another
    node's. Never raises.
    """
    if not isinstance(obj, Mapping):
        return None
    kind = obj.get("kind")
    if kind is not None and kind != "ResourceSlice":
        return None
    api_version = obj.get("apiVersion")
    if api_version is not None and not (
        isinstance(api_version, str) and api_version.startswith("resource.k8s.io/")
    ):
        return None
    spec = obj.get("spec")
    if not isinstance(spec, Mapping) or spec.get("driver") != driver:
        return None
    pool = spec.get("pool")
    if not isinstance(pool, Mapping):
        return None
    pool_name = _str(pool.get("name"))
    generation = _int(pool.get("generation"))
    if pool_name is None or generation is None:
        return None
    count = _int(pool.get("resourceSliceCount"))
    slice_node = _str(spec.get("nodeName"))
    per_device = spec.get("perDeviceNodeSelection") is True
    if node_name is not None and slice_node != node_name and not per_device:
        return None
    raw_devices = spec.get("devices")
    if raw_devices is None:
        raw_devices = []  # a slice of shared counters only (partitionable devices)
    if not isinstance(raw_devices, list):
        return None
    metadata = obj.get("metadata")
    name = _str(metadata.get("name")) if isinstance(metadata, Mapping) else None

    devices: list[DraDevice] = []
    skipped = 0
    for raw in raw_devices:
        if per_device and node_name is not None and not _device_on_node(raw, node_name):
            continue  # another node's device in a multi-node slice: not malformed
        device = _parse_device(raw, driver, pool_name)
        if device is None:
            skipped += 1
        else:
            devices.append(device)
    return ParsedSlice(
        name=name or "",
        driver=driver,
        pool=pool_name,
        generation=generation,
        resource_slice_count=count,
        node_name=slice_node,
        devices=tuple(devices),
        skipped_devices=skipped,
    )


def _device_on_node(raw: object, node_name: str) -> bool:
    """Under ``perDeviceNodeSelection``: whether a device is this node's (its ``nodeName``, or
    ``allNodes``). A device restricted by a ``nodeSelector`` is not evaluated here and counts
    as another node's. Malformed entries count as this node's, to be counted as skipped."""
    if not isinstance(raw, Mapping):
        return True
    if raw.get("allNodes") is True:
        return True
    other = raw.get("nodeName")
    if isinstance(other, str):
        return other == node_name
    return raw.get("nodeSelector") is None


# --- CDI device names ----------------------------------------------------------------------


def device_name_from_cdi(cdi_name: str, *, driver: str = DEFAULT_DRIVER) -> str | None:
    """The DRA device name in one of the driver's CDI device names, or ``None``.

    ``k8s.<driver>/claim=<claim UID>-<device>`` (per-claim spec, all versions) and
    ``k8s.<driver>/device=<device>`` (the base spec of v25.3 and v25.8). Any other vendor,
    class or shape gives ``None``.
    """
    if not isinstance(cdi_name, str) or len(cdi_name) > _MAX_CDI_NAME:
        return None
    vendor = re.escape(f"k8s.{driver}")
    match = re.fullmatch(
        rf"{vendor}/(?:claim={_CLAIM_UID}-|device=)({_DNS_LABEL})", cdi_name
    )
    return match.group(1) if match is not None else None


def _cdi_names(resource: object) -> list[str]:
    """The CDI device names of a ClaimResource: strings, or objects with a string ``name``."""
    try:
        entries = list(getattr(resource, "cdi_devices", ()) or ())
    except TypeError:
        return []
    names = []
    for entry in entries:
        name = entry if isinstance(entry, str) else getattr(entry, "name", None)
        if isinstance(name, str):
            names.append(name)
    return names


# --- The index -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceIndex:
    """This node's DRA devices of one driver, from its ResourceSlices; built by
    :meth:`from_slices`, read by :meth:`lookup` and :meth:`resolve`. Immutable.

    ``generations`` is the newest ``spec.pool.generation`` seen per pool: only slices of that
    generation are indexed, as the resource API requires of consumers (a driver updating a
    pool writes its new slices with a higher generation and deletes the old ones after).
    ``incomplete_pools`` are pools with fewer slices of that generation than their
    ``resourceSliceCount`` says (an update in progress): a device missing from one may
    appear shortly.
    """

    driver: str = DEFAULT_DRIVER
    devices: Mapping[DeviceKey, DraDevice] = field(default_factory=lambda: MappingProxyType({}))
    generations: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    incomplete_pools: frozenset[str] = frozenset()
    rejected_slices: int = 0
    stale_slices: int = 0
    skipped_devices: int = 0
    duplicate_devices: int = 0

    @classmethod
    def from_slices(
        cls,
        slices: Iterable[object],
        *,
        driver: str = DEFAULT_DRIVER,
        node_name: str | None = None,
    ) -> DeviceIndex:
        """Index ResourceSlice objects (raw JSON as decoded; any mix of drivers and versions).

        Slices of other drivers are ignored silently; unusable ones are counted in
        ``rejected_slices``. With ``node_name``, slices of other nodes are ignored too.
        """
        parsed: list[ParsedSlice] = []
        rejected = 0
        try:
            items = list(slices)
        except TypeError:
            log.debug("ResourceSlices: not an iterable of objects: %r", type(slices))
            items = []
        for obj in items:
            result = parse_resource_slice(obj, driver=driver, node_name=node_name)
            if result is not None:
                parsed.append(result)
            elif _claims_driver(obj, driver) and _is_for_node(obj, node_name):
                rejected += 1
                log.debug("ResourceSlice of %s not understood: %.200r", driver, obj)

        newest: dict[str, int] = {}
        for s in parsed:
            newest[s.pool] = max(newest.get(s.pool, s.generation), s.generation)

        devices: dict[DeviceKey, DraDevice] = {}
        stale = skipped = duplicates = 0
        slices_seen: dict[str, int] = {}
        declared: dict[str, int] = {}
        for s in parsed:
            if s.generation < newest[s.pool]:
                stale += 1
                continue
            slices_seen[s.pool] = slices_seen.get(s.pool, 0) + 1
            if s.resource_slice_count is not None:
                declared[s.pool] = max(declared.get(s.pool, 0), s.resource_slice_count)
            skipped += s.skipped_devices
            for device in s.devices:
                if device.key in devices:
                    duplicates += 1  # invalid per the API; keep the first, deterministically
                    log.debug("DRA device %s published twice; keeping the first", device.key)
                    continue
                devices[device.key] = device
        if skipped:
            log.debug("ResourceSlices of %s: %d malformed devices skipped", driver, skipped)
        incomplete = frozenset(
            pool for pool, want in declared.items() if slices_seen.get(pool, 0) < want
        )
        return cls(
            driver=driver,
            devices=MappingProxyType(devices),
            generations=MappingProxyType(newest),
            incomplete_pools=incomplete,
            rejected_slices=rejected,
            stale_slices=stale,
            skipped_devices=skipped,
            duplicate_devices=duplicates,
        )

    def lookup(self, driver: str, pool: str, device: str) -> DraDevice | None:
        """The indexed device ``<driver>/<pool>/<device>``, of any kind, or ``None``."""
        if not (isinstance(driver, str) and isinstance(pool, str) and isinstance(device, str)):
            return None
        return self.devices.get(DeviceKey(driver, pool, device))

    def resolve(
        self,
        resource: object,
        *,
        node_pool: str | None = None,
        mig_uuids: Mapping[MigPlacement, str] | None = None,
    ) -> str | None:
        """The NVML UUID of the device one PodResources ``ClaimResource`` names, or ``None``.

        By ``driver_name``/``pool_name``/``device_name``. When all three are empty (a kubelet
        that reports CDI names only) and ``node_pool`` (this node's name, the pool NVIDIA's
        driver publishes under) is given, by the device name in its CDI names, provided they
        name exactly one device (:meth:`resolve_all` returns every one).

        ``None`` for another driver, an unknown device, a passthrough (vfio) GPU, a
        DynamicMIG device not in ``mig_uuids``, or unreadable input. Never raises.
        """
        uuids = self.resolve_all(resource, node_pool=node_pool, mig_uuids=mig_uuids)
        return uuids[0] if len(uuids) == 1 else None

    def resolve_all(
        self,
        resource: object,
        *,
        node_pool: str | None = None,
        mig_uuids: Mapping[MigPlacement, str] | None = None,
    ) -> tuple[str, ...]:
        """Like :meth:`resolve`, but every UUID named (in order, each once): at most one by the
        driver/pool/device triple; any number by CDI names (one ClaimResource of a CDI-only
        kubelet lists the CDI names of all of the claim's devices)."""
        driver = _text_attr(resource, "driver_name")
        pool = _text_attr(resource, "pool_name")
        device = _text_attr(resource, "device_name")
        if driver is None or pool is None or device is None:
            return ()
        if driver or pool or device:
            uuid = self._uuid_of(self.lookup(driver, pool, device), mig_uuids)
            return (uuid,) if uuid is not None else ()
        if not node_pool:
            return ()
        found: list[str] = []
        for cdi_name in _cdi_names(resource):
            name = device_name_from_cdi(cdi_name, driver=self.driver)
            if name is None:
                continue
            uuid = self._uuid_of(self.lookup(self.driver, node_pool, name), mig_uuids)
            if uuid is not None and uuid not in found:
                found.append(uuid)
        return tuple(found)

    @staticmethod
    def _uuid_of(
        device: DraDevice | None, mig_uuids: Mapping[MigPlacement, str] | None
    ) -> str | None:
        if device is None or not device.measurable:
            return None
        if device.uuid is not None:
            return device.uuid
        if device.placement is not None and mig_uuids is not None:
            uuid = mig_uuids.get(device.placement)
            if isinstance(uuid, str) and uuid.startswith("MIG-"):
                return uuid
        return None


def _text_attr(obj: object, name: str) -> str | None:
    """A string attribute, ``""`` when absent, ``None`` when present but not a string."""
    value = getattr(obj, name, "")
    return value if isinstance(value, str) else None


def _claims_driver(obj: object, driver: str) -> bool:
    """Whether a raw object says it is a slice of ``driver`` (to count it as rejected rather
    than as another driver's)."""
    if not isinstance(obj, Mapping):
        return True  # garbage in a slice list: count it
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return True
    found = spec.get("driver")
    return not isinstance(found, str) or found == driver


def _is_for_node(obj: object, node_name: str | None) -> bool:
    """False only for a well-formed slice that names another node."""
    if node_name is None or not isinstance(obj, Mapping):
        return True
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return True
    other = spec.get("nodeName")
    return not (isinstance(other, str) and other and other != node_name)


# --- Into allocations ----------------------------------------------------------------------


class ClaimedDevice(ClaimResourceLike, Protocol):
    """What :func:`allocations_from_claims` reads of one container's DRA device: a
    :class:`ClaimResourceLike` and the container it went to (the PodResources client's
    ``ClaimDevice`` is one)."""

    @property
    def namespace(self) -> str: ...

    @property
    def pod(self) -> str: ...

    @property
    def container(self) -> str: ...


def allocations_from_claims(
    claimed: Iterable[ClaimedDevice],
    index: DeviceIndex,
    *,
    node_name: str | None = None,
) -> tuple[Allocation, ...]:
    """The GPUs the kubelet reports as claimed through DRA, as allocations shaped exactly
    like the device plugin's, so that the join treats both alike (time-sharing: a claim
    shared by several containers gives each of them the same device; MIG: the UUID is the
    slice's).

    Devices of other drivers are left out. A device of ``index.driver`` that the index cannot
    resolve (not (yet) in this node's ResourceSlices, a DynamicMIG device, a passthrough GPU)
    becomes an allocation whose device carries an ``error``: it counts as unresolved, like an
    unrecognised device-plugin ID. ``node_name`` is the pool to assume for a kubelet that
    reports CDI names only.
    """
    out: list[Allocation] = []
    resource_name = f"dra:{index.driver}"
    for item in claimed:
        driver = _text_attr(item, "driver_name")
        if driver != index.driver and not (
            driver == "" and any(device_name_from_cdi(n, driver=index.driver) is not None
                                 for n in _cdi_names(item))
        ):
            continue
        raw = "/".join(
            x for x in (driver or index.driver, _text_attr(item, "pool_name") or "",
                        _text_attr(item, "device_name") or "") if x
        )
        uuids = index.resolve_all(item, node_pool=node_name)
        if not uuids:
            out.append(Allocation(item.namespace, item.pod, item.container, resource_name,
                                  DeviceRef(raw=raw, error="DRA device not found in this "
                                            "node's ResourceSlices")))
            continue
        for uuid in uuids:
            out.append(Allocation(item.namespace, item.pod, item.container, resource_name,
                                  DeviceRef(raw=raw, uuid=uuid)))
    return tuple(out)
