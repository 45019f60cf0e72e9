"""Kubelet PodResources v1: which container was allocated which GPU.

``client.py``: the client and the background watcher, and the types they return (GPU
allocations from device plugins, devices from DRA claims, the devices the kubelet can
allocate); ``call.py``: one ``List()`` or ``GetAllocatableResources()`` call (gRPC's unary
call over ``h2``, pure Python, with the protobuf runtime), imported by the first call;
``api.proto``: the kubelet's API, and ``api_pb2.py``/``api_pb2.pyi`` the messages generated
from it (``generate.sh``; never edit by hand); ``devices.py``: device-ID normalisation.
"""

from gpuscope.exporter.kubernetes.podresources.client import (
    DEFAULT_ALLOCATABLE_RETRY,
    DEFAULT_KUBELET_SOCKET,
    DEFAULT_MAX_RECEIVE_BYTES,
    DEFAULT_RESOURCES,
    AllocatableDevice,
    AllocatableLister,
    AllocatableUnsupported,
    Allocation,
    AllocationLister,
    Assignments,
    ClaimDevice,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesWatcher,
    ResourceLister,
    WatcherStatus,
    matches_resource,
)
from gpuscope.exporter.kubernetes.podresources.devices import (
    DeviceIdentity,
    DeviceRef,
    NodeDevice,
    parse_device_id,
    resolve,
)

__all__ = [
    "DEFAULT_ALLOCATABLE_RETRY",
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_MAX_RECEIVE_BYTES",
    "DEFAULT_RESOURCES",
    "AllocatableDevice",
    "AllocatableLister",
    "AllocatableUnsupported",
    "Allocation",
    "AllocationLister",
    "Assignments",
    "ClaimDevice",
    "DeviceIdentity",
    "DeviceRef",
    "NodeDevice",
    "PodResourcesClient",
    "PodResourcesError",
    "PodResourcesWatcher",
    "ResourceLister",
    "WatcherStatus",
    "matches_resource",
    "parse_device_id",
    "resolve",
]
