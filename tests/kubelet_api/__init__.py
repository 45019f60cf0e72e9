"""The kubelet PodResources v1 API as protobuf/gRPC stubs, for the tests' kubelet doubles.

The exporter itself does not use these: it speaks the API with ``exporter/kubernetes/podresources/``
(``grpc_call.py`` + ``wire.py``, no grpcio or protobuf on the node). The tests serve ``List()``
from a real grpcio server built on these stubs and check the hand-written decoder against
the protobuf runtime. Regenerate with ``bash tests/kubelet_api/generate.sh``.
"""
