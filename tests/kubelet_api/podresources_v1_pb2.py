"""The kubelet PodResources v1 messages for the tests: the exporter's own generated module.

One module, not a second one generated from the same ``.proto``: protobuf's default descriptor
pool refuses two files defining ``v1.ListPodResourcesResponse``. The tests build answers with
these classes and serve them from grpcio (``podresources_v1_pb2_grpc``) or grpc-go
(``grpcgo``).
"""

from gpuscope.exporter.kubernetes.podresources.api_pb2 import *  # noqa: F403
from gpuscope.exporter.kubernetes.podresources.api_pb2 import DESCRIPTOR as DESCRIPTOR
