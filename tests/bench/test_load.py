"""``bench/load.py``'s check of the dashboard's answer, against the real ``gpuscope-dashboard
--demo`` the load test starts: the fleet callback's body built from the app, and the answer
accepted as the load test accepts it before and after every wrk run (no wrk here; the
figures are the benchmark's, docs/reliability.md)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import exporter_bench as eb
from bench import load
from gpuscope.dashboard.demo import scenario_files


@pytest.fixture()
def demo(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    port = eb.free_port()
    log = tmp_path / "dashboard.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(load.dashboard_command("embedded", port, None), cwd=load.REPO,
                                env=eb.child_env(eb.parse_args([])),
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", proc, log
    finally:
        load.stop_quietly(proc)


def test_the_demo_fleet_view_passes_the_load_tests_check(
        demo: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    base, proc, log = demo
    deadline = time.monotonic() + 45
    while True:
        try:
            body = load.fleet_callback_body(base)
            break
        except (OSError, ValueError):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
    # One heatmap row per node of the demo, one node per bundled scenario; wait_for_view
    # raises with the check's problems if the answer never passes it.
    load.wait_for_view(base, body, len(scenario_files()), proc, log, timeout=45)
