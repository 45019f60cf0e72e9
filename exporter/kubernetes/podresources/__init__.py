"""Kubelet PodResources v1: which container was allocated which GPU.

Pure Python and stdlib only: no grpcio, no protobuf runtime. See ``client.py`` (the client
and the background watcher), ``grpc_call.py`` (one unary gRPC call over HTTP/2 on a unix
socket), ``hpack.py`` (HTTP/2 header compression), ``wire.py`` (the answer's protobuf
encoding) and ``devices.py`` (device-ID normalisation).
"""

from gpuscope.exporter.kubernetes.podresources.client import (
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
from gpuscope.exporter.kubernetes.podresources.devices import (
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
