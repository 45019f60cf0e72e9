"""``gpuscope-exporter --cloudwatch`` as a real process: dry run, live publishing through the
proxy to moto, the shutdown flush, one-line errors, and boto3 staying unimported."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO, ExporterProcess, free_port
from tests.exporter.sinks.cloudwatch.conftest import MotoServer
from tests.exporter.sinks.cloudwatch.helpers import list_all_metrics
from tests.exporter.sinks.cloudwatch.wire import WireProxy, wait_until


def no_aws_env(tmp_path: Path) -> dict[str, str]:
    """The environment without any AWS setting: no region, no credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_CONFIG_FILE"] = str(tmp_path / "none")
    env["AWS_SHARED_CREDENTIALS_FILE"] = str(tmp_path / "none")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


def test_importing_the_cli_does_not_import_boto3() -> None:
    code = ("import sys, gpuscope.exporter.cli, gpuscope.exporter.sinks.cloudwatch, "
            "gpuscope.exporter.sinks.prometheus.collectors.cloudwatch; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dry_run_prints_datums_without_aws(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "gpuscope.exporter", "--source", "simulated", "--interval", "0.25",
           "--listen", f"127.0.0.1:{free_port()}", "--cloudwatch", "--cloudwatch-dry-run",
           "--cloudwatch-interval", "1", "--cluster-name", "demo"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=no_aws_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout or ()],
                              daemon=True)
    reader.start()
    got: list[dict[str, object]] = []
    deadline = time.monotonic() + 20
    try:
        # Two intervals' worth: one flushed by the timer, at least one more.
        while time.monotonic() < deadline and len({d["Timestamp"] for d in got}) < 2:
            try:
                got.append(json.loads(lines.get(timeout=0.5)))
            except queue.Empty:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert len({d["Timestamp"] for d in got}) >= 2
    names = {d["MetricName"] for d in got}
    assert {"nvidia_smi_utilization_gpu", "nvidia_smi_memory_used", "pod_gpu_utilization",
            "pod_gpu_memory_used", "node_gpu_utilization"} <= names
    util = next(d for d in got if d["MetricName"] == "nvidia_smi_utilization_gpu")
    assert util["Namespace"] == "CWAgent" and "Unit" not in util
    assert [x["Name"] for x in util["Dimensions"]][:4] == ["host", "index", "name", "arch"]  # type: ignore[index]
    assert len(util["Values"]) == len(util["Counts"])  # type: ignore[arg-type]
    assert "Traceback" not in err


def test_live_exporter_publishes_and_flushes_on_sigterm(
    moto: MotoServer, proxy: WireProxy, start_exporter: Callable[..., ExporterProcess]
) -> None:
    exp = start_exporter(
        "--source", "simulated", "--interval", "0.2", "--cloudwatch",
        "--cloudwatch-endpoint-url", proxy.url, "--cloudwatch-region", "us-east-1",
        "--cloudwatch-interval", "1", "--cluster-name", "live", "--node-name", "node-live",
        "--instance-id", "i-0123456789abcdef0",
    )
    wait_until(lambda: len(proxy.put_requests(ok=True)) >= 1, 60, "a PutMetricData")
    text = exp.metrics()
    sent = next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("gpu_exporter_cloudwatch_datums_sent_total "))
    assert sent > 0
    assert 'gpu_exporter_cloudwatch_datums_dropped_total{reason="buffer_full"} 0.0' in text
    listed = list_all_metrics(moto.client(), "CWAgent", ["nvidia_smi_utilization_gpu"])
    assert any(("host", "node-live") in key[1] and ("InstanceId", "i-0123456789abcdef0")
               in key[1] for key in listed)
    # SIGTERM: the open interval is flushed before the process exits.
    before = len(proxy.put_requests(ok=True))
    time.sleep(0.3)  # a few samples into the next interval
    exp.proc.send_signal(signal.SIGTERM)
    assert exp.proc.wait(15) == 0
    assert len(proxy.put_requests(ok=True)) > before
    with pytest.raises(requests.RequestException):
        requests.get(exp.url + "/healthz", timeout=1)


def test_region_from_AWS_REGION_alone(
    moto: MotoServer, proxy: WireProxy, start_exporter: Callable[..., ExporterProcess],
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the README and the eks-cloudwatch overlay document: AWS_REGION, no
    # AWS_DEFAULT_REGION (botocore reads only the latter).
    monkeypatch.delenv("AWS_DEFAULT_REGION")  # set by the autouse aws_env fixture
    env = {**no_aws_env(tmp_path), "AWS_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    start_exporter(
        "--source", "simulated", "--interval", "0.2", "--cloudwatch",
        "--cloudwatch-endpoint-url", proxy.url, "--cloudwatch-interval", "1",
        "--node-name", "node-region", env=env,
    )
    wait_until(lambda: len(proxy.put_requests(ok=True)) >= 1, 60, "a PutMetricData")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--cloudwatch", "--cloudwatch-region", "nowhere"],
         "--cloudwatch-region: expected an AWS region like us-east-1, got 'nowhere'"),
        (["--cloudwatch", "--cloudwatch-namespace", "AWS/EC2"],
         "--cloudwatch-namespace: namespaces starting with AWS/ are reserved"),
        (["--cloudwatch", "--cloudwatch-interval", "0.5"],
         "--cloudwatch-interval: expected 1 to 3600 seconds"),
        (["--cloudwatch-dry-run"], "--cloudwatch-dry-run only applies with --cloudwatch"),
        (["--cloudwatch"], "--cloudwatch-region: no region given and none in the AWS"),
    ],
)
def test_bad_cloudwatch_input_is_one_line_and_exit_2(
    args: list[str], fragment: str, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.exporter", "--source", "simulated",
         "--listen", f"127.0.0.1:{free_port()}", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=no_aws_env(tmp_path),
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuscope-exporter: error: ")
    assert fragment in lines[0]


def test_missing_boto3_is_one_line(tmp_path: Path) -> None:
    # A directory on PYTHONPATH whose boto3 cannot be imported: what an image built without
    # the CloudWatch client sees.
    (tmp_path / "boto3").mkdir()
    (tmp_path / "boto3" / "__init__.py").write_text("raise ImportError('no boto3 here')\n")
    env = {**no_aws_env(tmp_path), "PYTHONPATH": str(tmp_path), "AWS_REGION": "us-east-1"}
    result = subprocess.run(
        [sys.executable, "-m", "gpuscope.exporter", "--source", "simulated",
         "--listen", f"127.0.0.1:{free_port()}", "--cloudwatch"],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=env,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gpuscope-exporter: error: --cloudwatch needs boto3, which is not installed "
        "(pip install 'gpuscope[cloudwatch]', or boto3)")
