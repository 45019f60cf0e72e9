#!/usr/bin/env bash
# Regenerates the committed Python modules for podresources_v1.proto:
#   podresources_v1_pb2.py, podresources_v1_pb2.pyi (typed messages) and
#   podresources_v1_pb2_grpc.py (stub and servicer; the test kubelet double uses it).
#
# The generated code embeds the versions of the generator: podresources_v1_pb2.py refuses
# to load on a protobuf runtime older than the bundled protoc, and podresources_v1_pb2_grpc.py
# refuses a grpcio older than grpcio-tools. Keep GRPCIO_TOOLS_VERSION in step with the
# lower bounds on grpcio and protobuf in pyproject.toml's test extra.
#
# Usage (from anywhere): bash tests/kubelet_api/generate.sh
set -euo pipefail

GRPCIO_TOOLS_VERSION="1.85.1"   # bundles protoc 35.1 -> protobuf Python gencode 7.35.1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-python3}"

installed="$("$python" -c 'from importlib.metadata import version; print(version("grpcio-tools"))' 2>/dev/null || true)"
if [[ "$installed" != "$GRPCIO_TOOLS_VERSION" ]]; then
    echo "generate.sh: needs grpcio-tools==$GRPCIO_TOOLS_VERSION (found: ${installed:-none});" \
         "pip install grpcio-tools==$GRPCIO_TOOLS_VERSION" >&2
    exit 1
fi

cd "$root"
# Proto path = repository root, so the generated _pb2_grpc module imports its _pb2 sibling as
# tests.kubelet_api.podresources_v1_pb2 (an absolute import that works from the repository root).
"$python" -m grpc_tools.protoc \
    --proto_path=. \
    --python_out=. \
    --pyi_out=. \
    --grpc_python_out=. \
    tests/kubelet_api/podresources_v1.proto
# Mark the output as generated for the linters wherever they run, whatever their config:
# ruff skips the files, mypy keeps using the .pyi types but reports nothing inside them.
for f in tests/kubelet_api/podresources_v1_pb2.py \
         tests/kubelet_api/podresources_v1_pb2.pyi \
         tests/kubelet_api/podresources_v1_pb2_grpc.py; do
    { printf '# ruff: noqa\n# mypy: ignore-errors\n'; cat "$f"; } > "$f.tmp"
    mv "$f.tmp" "$f"
done
echo "generate.sh: regenerated tests/kubelet_api/podresources_v1_pb2{.py,.pyi,_grpc.py}"
