"""``bench/dashboard_bench.py``'s store settings: ``--store-gogc`` reaches the store's process
(and only a positive target is taken), and the store's peak RSS is read beside its RSS."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.stores import start_prometheus

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
