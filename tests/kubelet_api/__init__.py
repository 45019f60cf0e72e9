"""The kubelet PodResources v1 API for the tests' kubelet doubles.

``exporter/kubernetes/podresources/api.proto`` is the one ``.proto``; from it come the
exporter's messages (committed in the package), the grpcio servicer here
(``podresources_v1_pb2_grpc.py``, committed; ``podresources_v1_pb2`` re-exports the package's
messages) and, at test time, the Go stubs of the grpc-go kubelet (``grpcgo.py`` builds
``grpcgo_server/``). Regenerate the Python code with
``bash exporter/kubernetes/podresources/generate.sh``.
"""
