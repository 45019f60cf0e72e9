"""``bench/real_gpu_check.py``'s GPM-cost step (part 5) and soak step (part 6) on the C double of
libnvidia-ml, through the real pynvml: the GPM cost is measured where the double has GPM and each
GPU reported as skipped where it has none (as on a pre-Hopper GPU); the soak runs the exporter
against the double, without PyTorch's processes. The numbers are the double's, not a GPU's: only
their shape is checked here (docs/real-gpu.md has a real GPU's)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import real_gpu_check
from bench.nvml_c_exporter import library_env, load_library
from tests.exporter.sources.fake_nvml import restored_pynvml
from tests.exporter.sources.test_nvml import write_gpu_information


@pytest.fixture(scope="module")
def library(fake_libnvml_path: Path) -> Path:
    return fake_libnvml_path


@pytest.fixture
def fast(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fewer spaced samples and rounds (each waits over 0.1 s); pynvml's state put back."""
    monkeypatch.setattr(real_gpu_check, "GPM_CALLS", 20)
    monkeypatch.setattr(real_gpu_check, "GPM_SPACED", 2)
    monkeypatch.setattr(real_gpu_check, "GPM_ROUNDS", 3)
    with restored_pynvml():
        yield


def run_step(library: Path, out: Path, monkeypatch: pytest.MonkeyPatch,
             gpm: bool) -> tuple[int, dict[str, object]]:
    for name, value in library_env(2, 1, gpm=gpm).items():
        monkeypatch.setenv(name, value)
    args = argparse.Namespace(library=library, out=out, load=False)
    bad = real_gpu_check.check_gpm_cost(args, real_gpu_check.Shared())
    assert load_library(library).fakeNvmlInitCount() == 0  # every session shut down
    return bad, json.loads((out / "gpm-cost.json").read_text())


def test_timing_in_ms() -> None:
    assert real_gpu_check.timing([]) == {"calls": 0}
    t = real_gpu_check.timing([0.001 * i for i in range(1, 11)])
    assert t == {"calls": 10, "median_ms": 5.5, "p90_ms": 9.1, "min_ms": 1.0, "max_ms": 10.0}
    assert real_gpu_check.timing([0.002])["p90_ms"] == 2.0


@pytest.mark.usefixtures("fast")
def test_gpm_cost_is_measured_per_gpu_and_round(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, result = run_step(library, tmp_path, monkeypatch, gpm=True)
    assert bad == 0
    idle = result["idle"]
    assert isinstance(idle, dict)
    assert "load" not in result
    assert [g["gpu"] for g in idle["gpus"]] == [0, 1]
    for gpu in idle["gpus"]:
        assert gpu["metrics_answered"] == gpu["metrics_asked"] == 9
        assert gpu["sample_get"]["calls"] == gpu["metrics_get"]["calls"] == 20
        assert gpu["sample_get_spaced"]["calls"] == gpu["metrics_get_spaced"]["calls"] == 2
        for what in ("sample_get", "metrics_get"):
            t = gpu[what]
            assert 0 <= t["min_ms"] <= t["median_ms"] <= t["p90_ms"] <= t["max_ms"]
    rounds = idle["round"]
    assert rounds["with_gpm"]["calls"] == rounds["without_gpm"]["calls"] == 3
    assert rounds["devices"] == 2 and rounds["source_up"] and rounds["gpm_series_present"]
    assert rounds["gpm_seconds_counted_by_the_source"]["max_ms"] > 0


@pytest.mark.usefixtures("fast")
def test_a_gpu_without_gpm_is_skipped_not_failed(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad, result = run_step(library, tmp_path, monkeypatch, gpm=False)
    assert bad == 0
    idle = result["idle"]
    assert isinstance(idle, dict)
    assert all("no GPM on this GPU" in g["skipped"] for g in idle["gpus"])
    assert len(idle["gpus"]) == 2
    rounds = idle["round"]
    assert not rounds["gpm_series_present"]
    assert rounds["gpm_seconds_counted_by_the_source"]["max_ms"] == 0


# --- the soak step (part 6) -------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_soak_runs_on_the_double_without_churn(library: Path, tmp_path: Path) -> None:
    """``--only soak --soak-seconds 15`` as device_check.sh runs it, on the double: the
    exporter is sampled and scraped throughout, the churn reported as skipped, soak.json
    written, and the exporter gone afterwards."""
    env = {**os.environ, **library_env(2, 2)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "real_gpu_check.py"), "--only", "soak",
         "--soak-seconds", "15", "--library", str(library), "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=90, env=env, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "churn: skipped (--library" in done.stdout
    result = json.loads((tmp_path / "soak.json").read_text())
    steps = json.loads((tmp_path / "steps.json").read_text())
    assert [s["step"] for s in steps] == ["soak"] and steps[0]["error"] is None
    assert "skipped" in result["churn"] and result["children"] == []
    summary = result["summary"]
    assert summary["errors"] == []
    assert [round(p["t"]) for p in result["points"]] == [0, 10, 15]
    for point in result["points"]:
        assert point["rss_kib"] > 0 and point["fds"] > 0 and point["threads"] > 0
        assert point["self"]["nvml_up"] == 1.0
    assert summary["scrapes"]["count"] >= 14 and summary["scrapes"]["failed"] == 0
    assert summary["rss_mib_after_warmup"]["first"] > 0
    assert summary["rss_slope_kib_per_min"] is not None
    assert summary["sampling_rounds"] >= 10 and summary["missed_rounds"] == 0
    assert summary["gpm_series"] == 2 and summary["nvml_up_min"] == 1.0
    processes = summary["processes"]
    assert processes["spawned"] == processes["seen"] == 0
    assert processes["distinct_pids_in_series"] == 4  # the double's 2 x 2 processes
    with pytest.raises(ProcessLookupError):
        os.kill(result["exporter"]["pid"], 0)


CHILD = """
import os, sys, time
time.sleep(0.2)
print("ready", os.getpid(), 0, flush=True)
time.sleep(float(sys.argv[2]) / 4)
print("done", 1, flush=True)
"""


def test_soak_churn_starts_and_reaps_its_processes(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The churn, with plain Python processes for PyTorch's: each starts, is ready, exits and
    is reaped, never more than two at once; on the double their PIDs are in no series, which
    the soak reports as an error (a churn the exporter never saw)."""
    for name, value in library_env(1, 1).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(real_gpu_check, "SOAK_CHILD", CHILD)
    monkeypatch.setattr(real_gpu_check, "SOAK_SPAWN_EVERY", 1.0)
    monkeypatch.setattr(real_gpu_check, "SOAK_QUIET_END", 2.0)
    monkeypatch.setattr(real_gpu_check, "SOAK_EVERY", 2.0)
    monkeypatch.setattr(real_gpu_check, "soak_churn_skipped", lambda args: None)
    args = argparse.Namespace(library=library, out=tmp_path, soak_seconds=8.0)
    bad = real_gpu_check.check_soak(args, real_gpu_check.Shared())
    result = json.loads((tmp_path / "soak.json").read_text())
    children = result["children"]
    assert len(children) >= 3
    for child in children:
        assert child["ready"] is not None and child["returncode"] is not None
        with pytest.raises(ProcessLookupError):
            os.kill(child["pid"], 0)
    for n, later in enumerate(children[2:], 2):  # at most two at once (exits seen by poll)
        assert later["started"] >= min(c["exited"] for c in children[n - 2:n]) - 0.5
    assert max(p["children_running"] for p in result["points"]) <= 2
    summary = result["summary"]
    assert summary["processes"]["ready"] == len(children) and summary["processes"]["seen"] == 0
    assert summary["errors"] == ["churn: no child's PID appeared in the gpu_process_* series"]
    assert bad == 1


def test_soak_summary_judges_the_children() -> None:
    """Seen, when a child's series appeared and went, and a stale one (still served long
    after its process exited) counted as an error; the kubelet's errors are expected."""
    def point(t: float, rss: int, errors: float) -> dict[str, Any]:
        return {"t": t, "rss_kib": rss, "fds": 5, "threads": 8, "cpu_seconds": t / 100,
                "self": {"sampling_rounds_total": t, "missed_rounds_total": 0.0,
                         "collector_errors_total{collector=kubelet}": errors,
                         "collector_errors_total{collector=proc}": 0.0},
                "collector_duration_max_ms": {"proc": 0.5}}

    def child(pid: int, ready: float, exited: float) -> dict[str, Any]:
        return {"pid": pid, "ready": ready, "exited": exited, "returncode": 0,
                "stopped_by_us": False}

    result = {
        "warmup_seconds": 30.0, "error": None, "churn": {"spawn_every_s": 5.0},
        "points": [point(0, 30_000, 1), point(30, 40_000, 3), point(60, 40_960, 5),
                   point(90, 41_984, 7)],
        "scrape_seconds": [0.002] * 90, "scrape_errors": [], "nvml_up_min": 1.0,
        "last_sample_age_max": 0.9, "gpm_series": 1, "scraped_until": 90.0,
        "children": [child(101, 10.0, 20.0), child(102, 30.0, 40.0), child(103, 50.0, 60.0),
                     child(104, 86.0, 88.0)],
        "pids": {"101": {"first": 11.0, "last": 20.0, "series": ["gpu_process_memory_used_bytes",
                                                                 "gpu_process_utilization_ratio"]},
                 "102": {"first": 32.0, "last": 52.0, "series": ["gpu_process_memory_used_bytes"]},
                 "7": {"first": 0.0, "last": 90.0, "series": ["gpu_process_memory_used_bytes"]}},
    }
    summary = real_gpu_check.soak_summary(result)
    assert summary["rss_mib_after_warmup"] == {"from_t": 30, "first": 39.06, "last": 41.0,
                                               "max": 41.0, "min": 39.06}
    assert summary["rss_slope_kib_per_min"] == 1984.0
    assert summary["fds"] == {"first": 5, "last": 5, "min": 5, "max": 5}
    assert summary["collector_errors"] == {"kubelet": 6.0, "proc": 0.0}
    processes = summary["processes"]
    assert processes["spawned"] == 4 and processes["ready"] == 4 and processes["seen"] == 2
    assert processes["seen_in"] == {"gpu_process_memory_used_bytes": 2,
                                    "gpu_process_utilization_ratio": 1}
    assert processes["other_pids"] == [7] and processes["distinct_pids_in_series"] == 3
    assert processes["stale"] == [102]
    assert processes["not_judged"] == 1  # 104 exited 2 s before the last scrape
    assert processes["appeared_after_ready_s"] == {"count": 2, "median": 1.5, "min": 1.0,
                                                   "max": 2.0}
    assert summary["errors"] == ["1 exited child(ren) still in gpu_process_* series more than "
                                 "5 s later: [102]"]


MPS_CHILD = """
import os, sys, time
time.sleep(0.2)
print("ready", os.getpid(), 0, flush=True)
print("pipe", os.environ.get("CUDA_MPS_PIPE_DIRECTORY", ""), flush=True)
time.sleep(float(sys.argv[2]) / 4)
print("done", 1, flush=True)
"""

# A stand-in for nvidia-cuda-mps-control: "-d" starts (it notes its pipe folder), "quit" on
# stdin stops; each call appended to the file named by MPS_CALLS.
FAKE_CONTROL = """#!/bin/sh
if [ "$1" = "-d" ]; then echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$MPS_CALLS"; exit 0; fi
read line; echo "$line $CUDA_MPS_PIPE_DIRECTORY" >> "$MPS_CALLS"
"""


def test_the_mps_soak_runs_its_processes_as_one_daemons_clients(
    library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--soak-mps``: the control daemon started before the processes and quit after them,
    each process with its pipe folder; on the double no GPU is served as shared through MPS,
    which the soak reports as an error (beside the churn the exporter never saw)."""
    for name, value in library_env(1, 1).items():
        monkeypatch.setenv(name, value)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    control = bin_dir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_CONTROL)
    control.chmod(0o755)
    calls = tmp_path / "calls"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("MPS_CALLS", str(calls))
    monkeypatch.setattr(real_gpu_check, "SOAK_CHILD", MPS_CHILD)
    monkeypatch.setattr(real_gpu_check, "SOAK_SPAWN_EVERY", 1.0)
    monkeypatch.setattr(real_gpu_check, "SOAK_QUIET_END", 2.0)
    monkeypatch.setattr(real_gpu_check, "SOAK_EVERY", 2.0)
    monkeypatch.setattr(real_gpu_check, "soak_churn_skipped", lambda args: None)
    out = tmp_path / "out"
    out.mkdir()
    args = argparse.Namespace(library=library, out=out, soak_seconds=6.0, soak_mps=True)
    bad = real_gpu_check.check_soak(args, real_gpu_check.Shared())
    result = json.loads((out / "soak.json").read_text())
    start, quit_ = calls.read_text().splitlines()
    pipe = start.removeprefix("start ")
    assert pipe.endswith("/pipe") and quit_ == f"quit {pipe}"
    assert result["mps"]["daemon_start"]["rc"] == 0 and result["mps"]["daemon_quit"]["rc"] == 0
    assert result["children"] and all(f"pipe {pipe}" in c["stdout"]
                                      for c in result["children"])
    mps = result["summary"]["mps"]
    assert mps["scrapes"] >= 5 and mps["scrapes_shared"] == 0 and mps["server_series_max"] == 0
    assert result["summary"]["errors"] == [
        "churn: no child's PID appeared in the gpu_process_* series",
        "MPS: no scrape served a GPU as shared through MPS"]
    assert bad == 2


def test_the_mps_soak_is_skipped_without_the_control_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No nvidia-cuda-mps-control: skipped, not an error; and MPS series are counted."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert real_gpu_check.start_soak_mps(tmp_path, {}) == {
        "skipped": "nvidia-cuda-mps-control not installed"}
    summary = real_gpu_check.soak_summary({
        "warmup_seconds": 1.0, "error": None, "churn": {"spawn_every_s": 5.0}, "points": [],
        "scrape_seconds": [], "scrape_errors": [], "pids": {}, "children": [],
        "mps": {"skipped": "nvidia-cuda-mps-control not installed"}})
    assert summary["mps"] == {"skipped": "nvidia-cuda-mps-control not installed"}
    assert not any("MPS" in e for e in summary["errors"])
    text = ('gpu_sharing_info{gpu="0",sharing="mps",uuid="GPU-a"} 1.0\n'
            'gpu_sharing_info{gpu="1",sharing="none",uuid="GPU-b"} 1.0\n'
            'gpu_mps_server_memory_used_bytes{gpu="0",uuid="GPU-a"} 6.9e+07\n')
    assert real_gpu_check.read_mps_series(text) == (1, 1)


# --- the identity step (part 7) ----------------------------------------------------------------

def run_identity(library: Path, tmp_path: Path, uuids: list[str]) -> tuple[int, dict[str, Any]]:
    """``--only identity`` on the double (2 GPUs) with the driver's information file of each
    GPU, bus 00000000:1<g>:00.0, naming ``uuids[g]``."""
    proc = tmp_path / "proc"
    for g, uuid in enumerate(uuids):
        write_gpu_information(proc, f"0000:{0x10 + g:02x}:00.0", uuid)
    env = {**os.environ, **library_env(2, 1)}
    env.pop("PYTHONPATH", None)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "real_gpu_check.py"), "--only", "identity",
         "--library", str(library), "--proc-root", str(proc), "--out", str(out)],
        capture_output=True, text=True, timeout=90, env=env, cwd=REPO)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done.returncode, json.loads((out / "identity.json").read_text())


DOUBLE_UUIDS = [f"GPU-00000000-0000-0000-0000-0000a100000{g}" for g in range(2)]


def test_identity_agrees_on_the_double(library: Path, tmp_path: Path) -> None:
    """The driver's file read by the exporter's own parser names NVML's UUID at NVML's bus
    id; the exporter serves each GPU as exclusive (MIG off) and watches XIDs; nvidia-smi's
    side is skipped where it is not installed."""
    rc, result = run_identity(library, tmp_path, DOUBLE_UUIDS)
    checks = {(r["gpu"], r["check"]): r for r in result["rows"]}
    assert rc == 0, result["rows"]
    for g in (0, 1):
        assert checks[(g, "procfs UUID at NVML's bus id")]["ok"] is True
        assert checks[(g, "procfs UUID at NVML's bus id")]["other"] == DOUBLE_UUIDS[g]
        assert checks[(g, "exporter gpu_sharing_info")]["other"] == ["exclusive"]
        assert checks[(g, "nvidia-smi UUID")]["ok"] is None  # no nvidia-smi here
    assert checks[("all", "exporter procfs_uuids() = NVML's UUIDs")]["other"] == DOUBLE_UUIDS
    assert checks[("all", "exporter XID watch (collector_success{collector=xid})")]["ok"]


def test_identity_names_a_procfs_uuid_that_is_not_nvmls(library: Path, tmp_path: Path) -> None:
    """A driver file naming another UUID at GPU 1's bus id is a mismatch (exit 1), on that
    GPU's row and on the list the exporter would read."""
    other = "GPU-00000000-0000-0000-0000-0000b1000001"
    rc, result = run_identity(library, tmp_path, [DOUBLE_UUIDS[0], other])
    bad = [(r["gpu"], r["check"]) for r in result["rows"] if r["ok"] is False]
    assert rc == 1
    assert bad == [(1, "procfs UUID at NVML's bus id"),
                   ("all", "exporter procfs_uuids() = NVML's UUIDs")]
