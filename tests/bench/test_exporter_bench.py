"""``bench/exporter_bench.py``'s budget configuration, run briefly: the real
``python -m gpuscope.exporter --source nvml`` over the C libnvidia-ml double, with the fake
kubelet (grpcio) and the fake API server (HTTPS, CA and token files) the benchmark starts,
under the environment the exporter image sets (``--as-image``: ``PYTHONOPTIMIZE=2``, no
docstrings and no ``assert``; ``MALLOC_ARENA_MAX=2``). What is checked is behaviour, not
memory: every process is still attributed to its container and named after its pod, so
nothing the exporter runs needs what ``-OO`` strips. (The memory figures are the benchmark's,
docs/benchmarks.md; here the libraries compile from source, as no level-2 bytecode of them
need exist on a CI machine.)"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench import exporter_bench as eb
from bench.nvml_c_exporter import BuildError, build_library

GPUS, PROCESSES = 2, 8


@pytest.fixture()
def image_run(tmp_path: Path) -> Iterator[tuple[eb.Exporter, list[str]]]:
    try:
        library = build_library(tmp_path / "build")
    except BuildError as exc:  # gcc is installed by scripts/setup --test
        pytest.fail(str(exc))
    args = eb.parse_args(["--source", "nvml-c", "--as-image", "--gpus", str(GPUS),
                          "--processes-per-gpu", str(PROCESSES), "--log-level", "warning"])
    args.fake_library = library
    kubelet = eb.start_fake_kubelet(args, tmp_path / "kubelet.sock")
    api = eb.start_fake_api(args, tmp_path)
    exp = eb.start_exporter(args, tmp_path)
    try:
        eb.wait_ready(exp, 60)
        yield exp, exp.command
    finally:
        exp.stop()
        eb.stop_process(kubelet)
        eb.stop_process(api)


def _scrape(port: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def test_budget_configuration_runs_as_the_image_runs_it(
    image_run: tuple[eb.Exporter, list[str]],
) -> None:
    exp, command = image_run
    # The console script's own module, from the byte-compiled copy (--bytecode), nothing of
    # the benchmark in the process.
    assert command[1:5] == ["-m", "gpuscope.exporter", "--source", "nvml"]
    environ = Path(f"/proc/{exp.pid}/environ").read_bytes().split(b"\0")
    for key, value in eb.IMAGE_ENV.items():
        assert f"{key}={value}".encode() in environ
    from tests.conftest import wait_for

    def settled() -> bool:
        # Before its first answer a part reads 0 (not yet working): the kubelet's first List()
        # can land after the API server has named the pods from the cgroups' pod UIDs.
        text = _scrape(exp.port)
        return 'pod="synth-' in text and not _failed_parts(text)

    wait_for(settled, 60, "pod names from the fake API server and every part answering")
    families = {f.name: f for f in text_string_to_metric_families(_scrape(exp.port))}
    gpus = {s.labels["uuid"] for s in families["gpu_info"].samples}
    assert len(gpus) == GPUS
    # Every container the fake kubelet allocates is attributed and named: the kubelet client
    # (h2, protobuf) and the API-server client (lightkube, httpx2) both work under -OO.
    containers = {(s.labels["namespace"], s.labels["pod"])
                  for s in families["container_gpu_utilization_ratio"].samples}
    assert len(containers) == GPUS * eb_pods_per_gpu()
    assert all(ns == "synthetic" and pod.startswith("synth-") for ns, pod in containers)
    # Once working, no part drops out again.
    text = _scrape(exp.port)
    assert "gpu_exporter_collector_success" in text
    assert not _failed_parts(text), text


def _failed_parts(text: str) -> list[str]:
    """The parts whose ``gpu_exporter_collector_success`` is not 1 in a scrape."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    success = families.get("gpu_exporter_collector_success")
    if success is None:
        return ["(no gpu_exporter_collector_success)"]
    return sorted(s.labels.get("collector", "") for s in success.samples if s.value != 1.0)


def eb_pods_per_gpu() -> int:
    from bench.nvml_fake_exporter import pods_per_gpu

    return pods_per_gpu(PROCESSES)


def test_help_and_version_under_the_image_optimization_level() -> None:
    """``--help`` and ``--version`` print what they say without docstrings."""
    env = {**os.environ, **eb.IMAGE_ENV}
    for flag in ("--help", "--version"):
        done = subprocess.run([sys.executable, "-m", "gpuscope.exporter", flag],
                              capture_output=True, text=True, timeout=60, env=env,
                              cwd=eb.REPO)
        assert done.returncode == 0, done.stderr
        assert "None" not in done.stdout.split()
    assert "--source {nvml,simulated}" in subprocess.run(
        [sys.executable, "-m", "gpuscope.exporter", "--help"], capture_output=True, text=True,
        timeout=60, env=env, cwd=eb.REPO).stdout
