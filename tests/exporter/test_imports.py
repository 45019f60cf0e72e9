"""What the simulated exporter loads: none of the heavy optional clients.

Each check runs in a fresh interpreter, since this test process has imported everything.
``ssl`` and ``http.client`` are not on the list: the standard library's ``http.server``, which
serves ``/metrics``, imports both itself (as does ``prometheus_client``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# grpcio ("grpc"): never in the exporter (only the tests' kubelet doubles use it); grpclib: no
# longer a dependency; h2 and protobuf: loaded by the first kubelet call, so never by the
# simulated source; lightkube: the API-server client; boto3: the CloudWatch sink; pynvml: the
# NVML source.
HEAVY = (
    "grpc",
    "grpclib",
    "h2",
    "google.protobuf",
    "lightkube",
    "tests.kubelet_api",
    "boto3",
    "botocore",
    "pynvml",
    "gpuscope.exporter.sources.nvml",
    "gpuscope.exporter.sinks.cloudwatch",
)


def loaded_after(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=True,
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_simulated_exporter_loads_no_heavy_client() -> None:
    loaded = loaded_after(
        "from gpuscope.exporter.cli import build_source\n"
        "from gpuscope.exporter.config import parse_config\n"
        "build_source(parse_config(['--source', 'simulated'], environ={}))\n"
    )
    assert "gpuscope.exporter.sources.simulated" in loaded  # the probe did build the source
    assert not {m for m in loaded for heavy in HEAVY if m == heavy or m.startswith(heavy + ".")}


def test_attribution_and_collectors_do_not_load_the_kube_client() -> None:
    loaded = loaded_after(
        "import gpuscope.exporter.kubernetes.attribution, gpuscope.exporter.kubernetes.simulated\n"
        "import gpuscope.exporter.sinks.prometheus.collectors.container\n"
        "import gpuscope.exporter.sinks.prometheus.collectors.exporter\n"
        "import gpuscope.exporter.sinks.prometheus.collectors.gpu\n"
    )
    assert "gpuscope.exporter.kubernetes.metadata" in loaded
    assert "gpuscope.exporter.kubernetes.apiserver" not in loaded
