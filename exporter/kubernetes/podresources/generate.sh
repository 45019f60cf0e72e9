#!/usr/bin/env bash
# Regenerates the committed Python code of the kubelet PodResources v1 API from api.proto:
#   exporter/kubernetes/podresources/api_pb2.py, api_pb2.pyi  messages (protobuf runtime)
#   tests/kubelet_api/podresources_v1_pb2_grpc.py             grpcio servicer (the tests' kubelet)
# (The Go stubs of the tests' grpc-go kubelet are generated at test time from the same file:
# tests/kubelet_api/grpcgo.py.)
#
# The generated code embeds the versions of its generators: api_pb2.py refuses to load on a
# protobuf runtime older than the protoc bundled with grpcio-tools, and the grpcio servicer
# refuses a grpcio older than grpcio-tools. Keep GRPCIO_TOOLS_VERSION in step with the floors on
# protobuf (dependencies) and grpcio (test extra) in pyproject.toml. The exporter's client
# needs no generated stub: call.py makes its one unary call over h2 with the messages above.
#
# Usage (from anywhere):
#   bash exporter/kubernetes/podresources/generate.sh           rewrite the committed files
#   bash exporter/kubernetes/podresources/generate.sh --check   exit 1 if any is stale
set -euo pipefail

GRPCIO_TOOLS_VERSION="1.85.1"   # bundles protoc 35.1 -> protobuf Python gencode 7.35.1

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
python="${PYTHON:-python3}"
check=false
[[ "${1:-}" == "--check" ]] && check=true

installed="$("$python" -c 'from importlib.metadata import version; print(version("grpcio-tools"))' 2>/dev/null || true)"
if [[ "$installed" != "$GRPCIO_TOOLS_VERSION" ]]; then
    echo "generate.sh: needs grpcio-tools==$GRPCIO_TOOLS_VERSION (found: ${installed:-none});" \
         "pip install grpcio-tools==$GRPCIO_TOOLS_VERSION" >&2
    exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# protoc names modules after the .proto's path under --proto_path: lay the file out where the
# installed package lives (gpuscope.exporter = exporter/), so that the generated modules
# register as, and import each other as, gpuscope.exporter.kubernetes.podresources.api_pb2.
pkg="gpuscope/exporter/kubernetes/podresources"
mkdir -p "$work/in/$pkg" "$work/out"
cp "$here/api.proto" "$work/in/$pkg/api.proto"
"$python" -m grpc_tools.protoc \
    --proto_path="$work/in" \
    --python_out="$work/out" \
    --pyi_out="$work/out" \
    --grpc_python_out="$work/out" \
    "$pkg/api.proto"

# generated file -> committed file
declare -A targets=(
    ["$pkg/api_pb2.py"]="exporter/kubernetes/podresources/api_pb2.py"
    ["$pkg/api_pb2.pyi"]="exporter/kubernetes/podresources/api_pb2.pyi"
    ["$pkg/api_pb2_grpc.py"]="tests/kubelet_api/podresources_v1_pb2_grpc.py"
)
stale=()
for generated in "${!targets[@]}"; do
    target="${targets[$generated]}"
    # Mark the output as generated for the linters wherever they run, whatever their config:
    # ruff skips the file, mypy keeps using its types but reports nothing inside it.
    { printf '# ruff: noqa\n# mypy: ignore-errors\n'; cat "$work/out/$generated"; } \
        > "$work/final"
    if $check; then
        cmp -s "$work/final" "$root/$target" || stale+=("$target")
    else
        cp "$work/final" "$root/$target"
    fi
done
if $check; then
    if ((${#stale[@]})); then
        echo "generate.sh: stale (run bash exporter/kubernetes/podresources/generate.sh):" \
             "${stale[*]}" >&2
        exit 1
    fi
    echo "generate.sh: the committed generated files match api.proto"
else
    echo "generate.sh: regenerated ${targets[*]}"
fi
