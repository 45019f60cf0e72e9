"""Kubelet PodResources v1: which container was allocated which GPU.

Importing this package is cheap: ``grpc`` and the generated protobuf modules load only when
a :class:`PodResourcesClient` makes its first call. See ``client.py`` (the client and the
background watcher) and ``devices.py`` (device-ID normalisation).
"""

from exporter.podresources.client import (
    DEFAULT_KUBELET_SOCKET,
    DEFAULT_RESOURCES,
    Allocation,
    AllocationLister,
    PodResourcesClient,
    PodResourcesError,
    PodResourcesWatcher,
    WatcherStatus,
    matches_resource,
)
from exporter.podresources.devices import (
    DeviceIdentity,
    DeviceRef,
    NodeDevice,
    parse_device_id,
    resolve,
)

__all__ = [
    "DEFAULT_KUBELET_SOCKET",
    "DEFAULT_RESOURCES",
    "Allocation",
    "AllocationLister",
    "DeviceIdentity",
    "DeviceRef",
    "NodeDevice",
    "PodResourcesClient",
    "PodResourcesError",
    "PodResourcesWatcher",
    "WatcherStatus",
    "matches_resource",
    "parse_device_id",
    "resolve",
]
