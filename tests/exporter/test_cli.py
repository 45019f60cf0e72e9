"""The real ``gpuscope-exporter`` process: exit codes, one-line errors, live endpoints."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, ExporterProcess


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuscope.exporter", *args],
        cwd=REPO, capture_output=True, text=True, timeout=60, env=env,
    )


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--interval", "0"], "--interval: expected a positive number of seconds"),
        (["--listen", "nowhere"], "--listen: expected HOST:PORT"),
        (["--source", "simulated", "--scenario", "/nonexistent/s.yaml"], "/nonexistent/s.yaml"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(args: list[str], fragment: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpuscope-exporter: error: ")
    assert fragment in lines[0]
    assert "Traceback" not in result.stderr


def test_bad_scenario_content_gives_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus:\n  - memory_total: lots\n")
    result = run_cli("--source", "simulated", "--scenario", str(bad))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "gpus[0].memory_total" in result.stderr


def test_bad_env_var_gives_one_line() -> None:
    import os

    result = run_cli(env={**os.environ, "GPUSCOPE_INTERVAL": "fast"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "gpuscope-exporter: error: GPUSCOPE_INTERVAL: expected a number of seconds, got 'fast'"
    )


def test_port_in_use_is_one_line(start_exporter: Callable[..., ExporterProcess]) -> None:
    first = start_exporter("--source", "simulated", "--interval", "0.2")
    result = run_cli("--source", "simulated", "--listen", f"127.0.0.1:{first.port}")
    assert result.returncode == 2
    assert "cannot listen on 127.0.0.1:" in result.stderr
    assert result.stderr.count("\n") == 1


def test_live_metrics_pass_promtool(
    start_exporter: Callable[..., ExporterProcess], promtool: str
) -> None:
    exp = start_exporter("--source", "simulated", "--interval", "0.2", "--process-metrics")
    text = exp.metrics()
    families = {f.name for f in text_string_to_metric_families(text)}
    assert {"gpu_info", "gpu_up", "gpu_utilization_ratio", "gpu_process_utilization_ratio",
            "gpu_exporter_collector_success"} <= families
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_nvml_missing_keeps_serving_but_not_ready(
    start_exporter: Callable[..., ExporterProcess], tmp_path: Path
) -> None:
    # This machine has no libnvidia-ml.so.1 (CI never has a GPU); make sure by pointing the
    # loader path somewhere empty. The exporter must stay up, say so, and not be ready.
    exp = start_exporter("--source", "nvml", "--interval", "0.2", ready=False,
                         env={"LD_LIBRARY_PATH": str(tmp_path)})
    from tests.conftest import wait_for

    def has_sample() -> bool:
        try:
            return "gpu_exporter_last_sample_timestamp_seconds" in exp.metrics()
        except requests.RequestException:
            return False

    wait_for(has_sample, 60, "a sampling round")
    text = exp.metrics()
    assert "gpu_exporter_nvml_up 0.0" in text
    assert "gpu_info{" not in text
    assert requests.get(exp.url + "/healthz", timeout=5).status_code == 200
    assert requests.get(exp.url + "/readyz", timeout=5).status_code == 503
    assert exp.proc.poll() is None


def test_sigterm_exits_cleanly(start_exporter: Callable[..., ExporterProcess]) -> None:
    exp = start_exporter("--source", "simulated", "--interval", "0.2")
    exp.proc.terminate()
    assert exp.proc.wait(10) == 0
