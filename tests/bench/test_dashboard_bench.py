"""``bench/dashboard_bench.py``'s store settings: ``--store-gogc`` reaches the store's process
(and only a positive target is taken), the store's peak RSS is read beside its RSS, and its
CPU time, garbage collections and allocation, which the bench reports per page."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.stores import cpu_seconds, start_prometheus, start_victoriametrics

REPO = Path(__file__).resolve().parents[2]


def test_a_bad_gc_target_is_one_line_and_exit_2() -> None:
    run = subprocess.run([sys.executable, str(REPO / "bench" / "dashboard_bench.py"),
                          "--store-gogc", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "dashboard_bench: --nodes, --runs and --store-gogc must be >= 1, --step > 0 and "
        "--window >= --step"]
    assert "Traceback" not in run.stdout + run.stderr


def test_the_store_runs_with_the_environment_given_and_reports_its_peak_rss() -> None:
    with start_prometheus(env={"GOGC": "300"}) as prom:
        environ = Path(f"/proc/{prom.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GOGC=300" in environ
        assert prom.peak_rss_kib() >= prom.rss_kib() > 0
    with start_prometheus() as prom:  # without: this process' environment as it is
        environ = Path(f"/proc/{prom.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GOGC=300" not in environ


def test_the_stores_cpu_time_collections_and_allocation_are_read_from_the_store() -> None:
    """What the bench reports per page: the store's CPU seconds (``/proc``), completed
    garbage collections and bytes allocated (its ``/metrics``); all grow with the work asked
    of it, on both stores."""
    for start in (start_prometheus, start_victoriametrics):
        with start() as store:
            cpu, go = store.cpu_seconds(), store.go_counters()
            assert cpu >= 0 and go.collections is not None and go.collections >= 0
            assert go.allocated_bytes is not None and go.allocated_bytes > 0
            deadline = time.monotonic() + 30
            # Queries until the store has both spent CPU and collected (a Go program
            # collects at least every 2 minutes; these queries allocate and make it sooner).
            while time.monotonic() < deadline:
                store.query('count({__name__=~".+"})')
                store.query("sum(rate(process_cpu_seconds_total[5m]))")
                now = store.go_counters()
                if store.cpu_seconds() > cpu and (now.collections or 0) > go.collections:
                    break
            now = store.go_counters()
            assert store.cpu_seconds() > cpu
            assert (now.collections or 0) > go.collections
            assert (now.allocated_bytes or 0) > go.allocated_bytes


def test_cpu_seconds_reads_a_process_whose_name_holds_spaces(tmp_path: Path) -> None:
    script = tmp_path / "a name with spaces"
    script.write_text("#!/bin/sh\nwhile :; do :; done\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script)])
    try:
        # The busy loop's CPU time grows, read through the spaces in /proc/PID/stat's name.
        # Polled, not slept for: on a loaded host it got 0.1 s of CPU in 0.5 s (CI, stop 28).
        first = cpu_seconds(proc.pid)
        deadline = time.monotonic() + 60
        while (now := cpu_seconds(proc.pid)) < first + 0.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first + 0.2 <= now < 120
    finally:
        proc.kill()
        proc.wait()
