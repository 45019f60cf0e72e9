"""Compare gpuscope-exporter's NVML readings with nvidia-smi (and DCGM) on a real GPU machine.

Not a test (CI has no GPU). Run it on a node with a driver:

    python3 bench/real_gpu_check.py [--out DIR] [--window SECONDS] [--load] [--mps]
        [--only STEP,...] [--soak-seconds SECONDS] [--library SO]

(on a machine without a package index, ``bench/device_check.sh`` installs what it needs and
runs it: docs/real-gpu.md).

Part 1 starts ``gpuscope-exporter --source nvml`` on a free loopback port, waits for /readyz,
scrapes /metrics, queries ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` at
the same moment, and prints one row per GPU and field: exporter value (converted back to
nvidia-smi's units), nvidia-smi value, and whether they agree within a tolerance that allows
for the two reads being a few hundred milliseconds apart.

Part 2, the work signals, runs ``NvmlSource`` in this process with GPM every second for
``--window`` seconds (optionally under a matrix-multiply load, ``--load``, with PyTorch if
it is installed) and compares over the same window:

* busy time: the rate of ``busy_seconds`` against the mean of ``utilization.gpu`` read by
  nvidia-smi every second;
* throttle time: the counters' increases against those of ``nvidia-smi -q -d PERFORMANCE``'s
  clocks-event counters (SW power capping, sync boost, SW/HW thermal slowdown, HW power
  braking, in µs since the driver loaded; ours count from the source's first read); drivers
  without them print none, and then only the reasons nvidia-smi shows as active are
  compared: an active reason must have grown;
* GPM: the rates of SM, tensor and DRAM active seconds against ``dcgmi dmon -e
  1002,1004,1005`` (SM_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE), when DCGM is installed and
  its host engine runs (DCGM reads the same GPM counters on Hopper);
* which series exist: GPM only on Hopper and newer (absent, never 0, elsewhere).

Part 3, health (``health``): the exporter's row-remapping series (``gpu_remapped_rows``
by cause, ``gpu_row_remap_pending``, ``gpu_row_remap_failed``) and ECC counters against
``nvidia-smi -q -d ROW_REMAPPER`` and ``nvidia-smi --query-gpu=ecc.errors...``, with the raw
answers of ``nvmlDeviceGetRemappedRows``, the ECC calls, the GPU operation, persistence and
compute modes recorded alongside. A series the exporter lacks while NVML answers is a
mismatch; both sides unsupported is agreement.

Part 4, MPS (``--mps``, off by default): starts an MPS control daemon in a temporary pipe
directory, two PyTorch clients of different weight and memory on GPU 0, and records what
NVML says about them (compute and MPS process lists, per-process utilization, compute mode),
``nvidia-smi``'s views and the exporter's per-process series, to ``mps.json``, with a plain
answer to: does NVML list the server and each client with its own PID and memory, and does
per-process utilization give each client its share or only the server?

Part 5, GPM call cost (``gpm``): what ``nvmlGpmSampleGet`` and ``nvmlGpmMetricsGet`` cost
per call on each GPU (through the real pynvml, with the metrics the exporter asks for), and a
whole ``NvmlSource`` round with GPM and without, to ``gpm-cost.json``; idle, and again under
the load with ``--load``. Recorded, not compared; a GPU without GPM is reported as skipped.

Part 6, soak (``--only soak``, off by default; ``--soak-seconds``, 240): the exporter with
``--process-metrics`` (GPM on) sampling every second on the driver, scraped every second, while
short-lived PyTorch processes come and go on GPU 0; every 10 s its RSS, fds, threads, CPU, the
scrapes' latency and its own ``gpu_exporter_*`` series, and at the end the figures after a
warm-up and each process's PID against the ``gpu_process_*`` series, to ``soak.json``. Without
PyTorch or with ``--library`` it runs without the processes (reported as skipped). With
``--soak-mps`` the processes are the clients of one MPS control daemon started for the soak
(quit after it), and each scrape also records whether the exporter serves the GPUs as shared
through MPS and the MPS server's memory (``mps`` in ``soak.json``).

Part 7, identity (``identity``, after health): who each GPU is and how it is shared, read four
ways: NVML's UUID, bus id and MIG mode; the driver's ``/proc/driver/nvidia/gpus/*/information``
(``--proc-root``), parsed by the exporter's own ``procfs_uuids`` (what names a GPU NVML cannot
open at the exporter's start); ``nvidia-smi``'s ``uuid,pci.bus_id,mig.mode.current``; and the
exporter's ``gpu_sharing_info`` and its XID watch (``gpu_exporter_collector_success
{collector="xid"}``), to ``identity.json``.

Every step has a time limit, and one that fails does not stop the next. ``--only`` picks
steps (``exporter,health,identity,work,gpm,mps,soak``). Every missing tool is reported as
skipped, not as a failure. Raw outputs go to ``--out`` (``steps.json`` lists what ran, how
long, and what failed); the exit status is 1 on any mismatch or failed step.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# nvidia-smi field → (our metric, factor from our base unit to nvidia-smi's unit, tolerance)
FIELDS: dict[str, tuple[str, float, float]] = {
    "utilization.gpu": ("gpu_utilization_ratio", 100.0, 15.0),
    "utilization.memory": ("gpu_memory_utilization_ratio", 100.0, 15.0),
    "memory.used": ("gpu_memory_used_bytes", 1 / 1024**2, 64.0),
    "memory.total": ("gpu_memory_total_bytes", 1 / 1024**2, 0.5),
    "temperature.gpu": ("gpu_temperature_celsius", 1.0, 2.0),
    "power.draw": ("gpu_power_watts", 1.0, 25.0),
    "enforced.power.limit": ("gpu_power_limit_watts", 1.0, 0.5),
    "clocks.sm": ("gpu_sm_clock_hertz", 1e-6, 150.0),
    "clocks.mem": ("gpu_memory_clock_hertz", 1e-6, 50.0),
}


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds (a process that ignores the first).
    (``bench/exporter_bench.py`` has its own: this script runs alone on a device machine.)"""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return 0, str(e)


STEPS = ("exporter", "health", "identity", "work", "gpm", "mps", "soak")


@dataclasses.dataclass
class Shared:
    """What one step leaves for a later one."""

    metrics: str | None = None  # the exporter's /metrics from the exporter step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("real-gpu-out"))
    parser.add_argument("--window", type=float, default=30.0,
                        help="seconds over which the work signals are compared (default 30)")
    parser.add_argument("--load", action="store_true",
                        help="run a matrix-multiply load on every GPU during the window "
                             "(needs PyTorch with CUDA)")
    parser.add_argument("--skip-exporter", action="store_true",
                        help="only the work signals (part 2), and MPS with --mps")
    parser.add_argument("--mps", action="store_true",
                        help="also the MPS step: an MPS daemon and two PyTorch clients on "
                             "GPU 0, recorded through NVML and nvidia-smi (mps.json)")
    parser.add_argument("--mps-seconds", type=float, default=8.0,
                        help="seconds of NVML samples while the MPS clients run (default 8)")
    parser.add_argument("--soak-seconds", type=float, default=240.0,
                        help="seconds of the soak step (only with --only ...,soak; default 240)")
    parser.add_argument("--soak-mps", action="store_true",
                        help="the soak's processes as the clients of one MPS control daemon "
                             "(as pods sharing a GPU through MPS are); reported as skipped "
                             "without nvidia-cuda-mps-control")
    parser.add_argument("--only", metavar="STEPS",
                        help=f"comma-separated steps to run, of {','.join(STEPS)} "
                             "(default: exporter,health,work,gpm, and mps with --mps)")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"),
                        help="the proc file system the identity step reads the driver's "
                             "GPU list from (default /proc)")
    parser.add_argument("--library", type=Path, metavar="SO",
                        help="load this libnvidia-ml instead of libnvidia-ml.so.1 (the "
                             "exporter through LD_LIBRARY_PATH; e.g. bench/fake_libnvml's, to "
                             "try the script without a GPU: nvidia-smi's side is then skipped)")
    args = parser.parse_args()
    if args.only:
        steps = [s.strip() for s in args.only.split(",") if s.strip()]
        unknown = [s for s in steps if s not in STEPS]
        if unknown:
            parser.error(f"--only: unknown step(s) {', '.join(unknown)}; steps: {STEPS}")
    else:
        steps = ["work"] if args.skip_exporter else ["exporter", "health", "identity", "work",
                                                      "gpm"]
        steps += ["mps"] if args.mps else []
    if args.library is not None:
        args.library = args.library.resolve()
    if not have_smi():
        if args.library is None:
            print("nvidia-smi not found: run this on a GPU node with the NVIDIA driver "
                  "installed (or pass --library SO to try it on a fake libnvidia-ml)")
            return 2
        print("nvidia-smi not found: its side of every comparison is skipped (--library)")
    args.out.mkdir(parents=True, exist_ok=True)
    # A time limit's SIGTERM (bench/device_check.sh) or SIGINT ends the step that runs, through
    # its cleanup (the MPS daemon quits, the load stops), and records it; even where the shell
    # that started this ignores SIGINT (a background job), which Python would inherit.
    signal.signal(signal.SIGTERM, stop_on_signal)
    signal.signal(signal.SIGINT, stop_on_signal)
    shared = Shared()
    functions = {"exporter": check_exporter, "health": check_health, "identity": check_identity,
                 "work": check_work_signals, "gpm": check_gpm_cost, "mps": check_mps,
                 "soak": check_soak}
    record: list[dict[str, object]] = []
    bad = 0
    for name in STEPS:
        if name not in steps:
            continue
        print(f"\n=== step {name}", flush=True)
        started = time.monotonic()
        error = None
        stop = False
        try:
            mismatches = functions[name](args, shared)
        except Exception as exc:  # one step failing must not stop the next
            traceback.print_exc()
            error, mismatches = f"{type(exc).__name__}: {exc}", 1
        except KeyboardInterrupt as exc:  # out of time: record it, run nothing more
            error, mismatches, stop = f"interrupted ({exc or 'SIGINT'})", 1, True
        seconds = round(time.monotonic() - started, 1)
        bad += mismatches
        record.append({"step": name, "seconds": seconds, "mismatches": mismatches,
                       "error": error})
        print(f"=== step {name}: {seconds} s, "
              f"{'error ' + error if error else str(mismatches) + ' mismatch(es)'}", flush=True)
        (args.out / "steps.json").write_text(json.dumps(record, indent=1))
        if stop:
            break
    return 1 if bad else 0


def stop_on_signal(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def have_smi() -> bool:
    return shutil.which("nvidia-smi") is not None


def run_text(cmd: list[str], timeout: float = 30) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def run_all(cmd: list[str], timeout: float = 30, stdin: str | None = None,
            env: dict[str, str] | None = None) -> dict[str, object]:
    """A command's exit status and output, never raising: ``rc`` is None when it could not
    run or ran past ``timeout``."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              input=stdin, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"cmd": cmd, "rc": None, "stdout": "", "stderr": f"{type(exc).__name__}: {exc}"}
    return {"cmd": cmd, "rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def without_pythonpath() -> dict[str, str]:
    """This environment less PYTHONPATH: the PyTorch children run on the machine's own
    packages, not on the ones installed for the exporter."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


@contextlib.contextmanager
def exporter_running(args: argparse.Namespace, log_name: str,
                     process_metrics: bool = True) -> Iterator[int | None]:
    """``gpuscope-exporter --source nvml`` on a free loopback port, yielding the port once
    /readyz answers 200 (None when it never did within 30 s; see ``log_name``)."""
    with exporter_process(args, log_name, process_metrics) as (port, _):
        yield port


def die_with_parent() -> None:
    """In the exporter before it runs: SIGTERM when the check dies, even by SIGKILL (Linux's
    PR_SET_PDEATHSIG), so no exporter outlives it."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # the check died before prctl
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def exporter_process(args: argparse.Namespace, log_name: str, process_metrics: bool = True
                     ) -> Iterator[tuple[int | None, subprocess.Popen[bytes]]]:
    """``exporter_running``, also yielding the exporter's process (for its /proc)."""
    port = free_port()
    env = dict(os.environ)
    libdir = None
    if args.library is not None:
        # pynvml opens "libnvidia-ml.so.1" by name: a directory with that name for the
        # library, first on the search path, makes the exporter load it unchanged.
        libdir = tempfile.TemporaryDirectory(prefix="gpuscope-libnvml-")
        (Path(libdir.name) / "libnvidia-ml.so.1").symlink_to(args.library)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            p for p in (libdir.name, env.get("LD_LIBRARY_PATH")) if p)
    cmd = [sys.executable, "-m", "gpuscope.exporter", "--source", "nvml",
           "--listen", f"127.0.0.1:{port}", "--interval", "1"]
    with (args.out / log_name).open("w") as log:
        exporter = subprocess.Popen(cmd + (["--process-metrics"] if process_metrics else []),
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=die_with_parent)
        try:
            deadline = time.monotonic() + 30
            ready: int | None = port
            while get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
                if time.monotonic() > deadline or exporter.poll() is not None:
                    print(f"exporter never became ready; see {log_name}")
                    ready = None
                    break
                time.sleep(0.5)
            yield ready, exporter
        finally:
            stop_process(exporter)
            if libdir is not None:
                libdir.cleanup()


def series(text: str) -> dict[tuple[str, str], list[tuple[dict[str, str], float]]]:
    """(sample name, uuid) → [(labels, value)] of every sample with a ``uuid`` label."""
    out: dict[tuple[str, str], list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "uuid" in s.labels:
                out.setdefault((s.name, s.labels["uuid"]), []).append((s.labels, s.value))
    return out


def check_exporter(args: argparse.Namespace, shared: Shared) -> int:
    """Part 1: the exporter's /metrics against nvidia-smi's query; the number of mismatches."""
    with exporter_running(args, "exporter.log") as port:
        if port is None:
            return 1
        time.sleep(2.5)  # a couple of rounds, so per-process utilization has a window
        _, text = get(f"http://127.0.0.1:{port}/metrics")
        smi = run_text(["nvidia-smi", f"--query-gpu=index,uuid,{','.join(FIELDS)}",
                        "--format=csv,noheader,nounits"]) if have_smi() else None
        full = run_text(["nvidia-smi", "-q"], timeout=60) if have_smi() else None
    shared.metrics = text
    (args.out / "metrics.txt").write_text(text)
    if smi is None:
        if have_smi():
            print("nvidia-smi --query-gpu failed; fields not compared")
            return 1
        print("nvidia-smi: not installed; /metrics saved, fields not compared (skipped)")
        return 0
    (args.out / "nvidia-smi.csv").write_text(smi)
    (args.out / "nvidia-smi-q.txt").write_text(full or "")

    ours = {key: found[0][1] for key, found in series(text).items()}
    rows, bad = [], 0
    for line in smi.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        uuid = cells[1]
        for field, raw in zip(FIELDS, cells[2:], strict=True):
            metric, factor, tol = FIELDS[field]
            key = metric + ("_total" if metric.endswith("joules") else "")
            mine = ours.get((key, uuid))
            theirs = None if raw in ("[N/A]", "[Not Supported]", "N/A") else float(raw)
            if mine is None or theirs is None:
                ok = (mine is None) == (theirs is None)
            else:
                ok = abs(mine * factor - theirs) <= tol
            bad += not ok
            rows.append({"gpu": cells[0], "field": field, "exporter": None if mine is None
                         else round(mine * factor, 3), "nvidia_smi": theirs, "ok": ok})
    for r in rows:
        print(f"{r['gpu']:>3} {r['field']:<22} exporter={r['exporter']!s:<12} "
              f"nvidia-smi={r['nvidia_smi']!s:<12} {'ok' if r['ok'] else 'MISMATCH'}")
    (args.out / "comparison.json").write_text(json.dumps(rows, indent=1))
    print(f"{len(rows) - bad}/{len(rows)} fields agree")
    return bad


# --- part 2: work signals ---------------------------------------------------------------------

# nvidia-smi -q -d PERFORMANCE clocks-event counters (µs) -> our throttle reason.
SMI_COUNTERS = {
    "SW Power Capping": "power",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal",
    "HW Thermal Slowdown": "hw_thermal",
    "HW Power Braking": "hw_power_brake",
}
# nvidia-smi -q -d PERFORMANCE active clocks-event reasons -> our throttle reason.
SMI_ACTIVE = {
    "SW Power Cap": "power",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal",
    "HW Thermal Slowdown": "hw_thermal",
    "HW Power Brake Slowdown": "hw_power_brake",
}
DCGM_FIELDS = {"1002": "sm_active_seconds", "1004": "tensor_active_seconds",
               "1005": "dram_active_seconds"}
RATE_TOLERANCE = 0.05  # absolute, on a ratio 0..1 (the reads are not simultaneous)


@dataclasses.dataclass
class Performance:
    """One ``nvidia-smi -q -d PERFORMANCE`` read: per GPU (by bus id order), the counters in
    seconds (empty on drivers without them) and the reasons shown as active."""

    counters: list[dict[str, float]] = dataclasses.field(default_factory=list)
    active: list[set[str]] = dataclasses.field(default_factory=list)


def read_performance(text: str) -> Performance:
    perf = Performance()
    section = ""
    for line in text.splitlines():
        if re.match(r"^GPU [0-9A-Fa-f:.]+\s*$", line):
            perf.counters.append({})
            perf.active.append(set())
            continue
        if not perf.counters:
            continue
        stripped = line.strip()
        if stripped.endswith("Counters") or stripped.startswith("Clocks Event Reasons Counters"):
            section = "counters"
            continue
        if stripped.startswith(("Clocks Event Reasons", "Clocks Throttle Reasons")):
            section = "active"
            continue
        m = re.match(r"^([A-Za-z /]+?)\s*:\s*(.+)$", stripped)
        if m is None:
            continue
        name, value = m.group(1).strip(), m.group(2).strip()
        if section == "counters" and name in SMI_COUNTERS:
            us = re.match(r"^([0-9]+)\s*us$", value)
            if us:
                perf.counters[-1][SMI_COUNTERS[name]] = int(us.group(1)) / 1e6
        elif section == "active" and name in SMI_ACTIVE and value == "Active":
            perf.active[-1].add(SMI_ACTIVE[name])
    return perf


class Poller(threading.Thread):
    """nvidia-smi's utilization.gpu of every GPU, once a second, until stopped."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.values: dict[str, list[float]] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            out = run_text(["nvidia-smi", "--query-gpu=uuid,utilization.gpu",
                            "--format=csv,noheader,nounits"], timeout=10)
            for line in (out or "").strip().splitlines():
                uuid, _, util = (c.strip() for c in line.partition(","))
                if util.replace(".", "", 1).isdigit():
                    self.values.setdefault(uuid, []).append(float(util) / 100)
            self.stop.wait(1.0)


LOAD = """
import sys, time, torch
end = time.time() + float(sys.argv[1])
xs = [torch.randn(8192, 8192, device=f"cuda:{i}", dtype=torch.float16)
      for i in range(torch.cuda.device_count())]
for x in xs:
    x @ x
torch.cuda.synchronize()
print("ready", flush=True)
while time.time() < end:
    for x in xs:
        x @ x
    torch.cuda.synchronize()
"""


def have_torch() -> bool:
    """PyTorch installed (found without importing it: that takes seconds)."""
    return importlib.util.find_spec("torch") is not None


def start_load(seconds: float) -> subprocess.Popen[str] | None:
    """The load, once it multiplies on every GPU (PyTorch's import and CUDA's start take
    seconds), or after 60 s without that."""
    if not have_torch():
        print("--load: PyTorch is not installed; comparing the GPUs as they are")
        return None
    load = subprocess.Popen([sys.executable, "-c", LOAD, str(seconds + 60)], text=True,
                            stdout=subprocess.PIPE, env=without_pythonpath())
    ready = threading.Event()

    def read() -> None:
        assert load.stdout is not None
        for line in load.stdout:
            if line.startswith("ready"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    started = time.monotonic()
    while not ready.wait(0.2) and load.poll() is None and time.monotonic() - started < 60:
        pass
    print(f"--load: {'running' if ready.is_set() else 'NOT running'} after "
          f"{time.monotonic() - started:.1f} s" + (f" (exit {load.returncode})"
                                                    if load.poll() is not None else ""))
    return load


def start_dcgm(seconds: float, out: Path) -> subprocess.Popen[str] | None:
    if shutil.which("dcgmi") is None:
        print("DCGM: dcgmi not installed; GPM activity not compared with DCGM (skipped)")
        return None
    count = max(1, int(seconds))
    return subprocess.Popen(
        ["dcgmi", "dmon", "-e", ",".join(DCGM_FIELDS), "-d", "1000", "-c", str(count)],
        stdout=(out / "dcgmi-dmon.txt").open("w"), stderr=subprocess.STDOUT, text=True,
    )


def read_dcgm(text: str) -> dict[int, dict[str, float]]:
    """Mean of each field per GPU index from ``dcgmi dmon`` output (rows ``GPU <i> v v v``)."""
    values: dict[int, dict[str, list[float]]] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) == 2 + len(DCGM_FIELDS) and cells[0] == "GPU" and cells[1].isdigit():
            for name, cell in zip(DCGM_FIELDS.values(), cells[2:], strict=True):
                with contextlib.suppress(ValueError):  # "N/A"
                    values.setdefault(int(cells[1]), {}).setdefault(name, []).append(
                        float(cell))
    return {gpu: {k: statistics.fmean(v) for k, v in fields.items()}
            for gpu, fields in values.items()}


def check_work_signals(args: argparse.Namespace, shared: Shared) -> int:
    """Part 2: the work-signal counters over ``--window`` seconds against nvidia-smi and
    DCGM; the number of mismatches."""
    from gpuscope.exporter.sources.nvml import NvmlSource

    print(f"\nWork signals over {args.window:g} s{' under load' if args.load else ''}:")
    loader = None
    if args.library is not None:
        loader = functools.partial(ctypes.CDLL, str(args.library))
    source = NvmlSource(library_loader=loader, gpm_interval_seconds=1.0, xid_events=False)
    load = start_load(args.window + 10) if args.load else None
    try:
        time.sleep(2 if load else 1)  # the load ramps up; GPM needs a first sample
        source.sample()
        time.sleep(1.1)
        poller = Poller()
        perf_text_0 = run_text(["nvidia-smi", "-q", "-d", "PERFORMANCE"]) or ""
        first = source.sample()
        poller.start()
        dcgm = start_dcgm(args.window, args.out)
        snaps = [first]
        actives: list[Performance] = [read_performance(perf_text_0)]
        deadline = time.monotonic() + args.window
        while time.monotonic() < deadline:
            time.sleep(1.0)
            snaps.append(source.sample())
            if len(snaps) % 5 == 0:
                actives.append(read_performance(
                    run_text(["nvidia-smi", "-q", "-d", "PERFORMANCE"]) or ""))
        last = snaps[-1]
        perf_text_1 = run_text(["nvidia-smi", "-q", "-d", "PERFORMANCE"]) or ""
        poller.stop.set()
        poller.join(15)
        dcgm_text = ""
        if dcgm is not None:
            try:
                dcgm.wait(args.window + 30)
            except subprocess.TimeoutExpired:
                dcgm.kill()
            dcgm_text = (args.out / "dcgmi-dmon.txt").read_text()
    finally:
        source.close()
        if load is not None:
            stop_process(load, 30)
    (args.out / "performance-start.txt").write_text(perf_text_0)
    (args.out / "performance-end.txt").write_text(perf_text_1)
    if not first.source_up or not last.source_up:
        print("NVML unavailable to this process; work signals not compared")
        return 1
    elapsed = last.timestamp - first.timestamp
    perf_0, perf_1 = read_performance(perf_text_0), read_performance(perf_text_1)
    dcgm_means = read_dcgm(dcgm_text) if dcgm_text else {}
    if dcgm_text and not dcgm_means:
        print("DCGM: dcgmi dmon gave no values (is nv-hostengine running?); skipped")
    rows: list[dict[str, object]] = []
    gpus = [d for d in last.devices if d.parent_uuid is None]

    def row(gpu: str, what: str, ours: float | None, theirs: float | None, ok: bool) -> None:
        rows.append({"gpu": gpu, "signal": what, "gpuscope": ours, "reference": theirs,
                     "ok": ok})

    for n, (d0, d1) in enumerate((a, b) for a, b in zip(first.devices, last.devices,
                                                        strict=True) if b.parent_uuid is None):
        gpu = d1.index

        def rate(name: str, a: object = d0, b: object = d1) -> float | None:
            x, y = getattr(a, name), getattr(b, name)
            return None if x is None or y is None else (y - x) / elapsed

        busy = rate("busy_seconds")
        smi = poller.values.get(d1.uuid)
        ref = statistics.fmean(smi) if smi else None
        ok = busy is not None and ref is not None and abs(busy - ref) <= 0.1
        row(gpu, "busy (mean utilization)", busy, ref, ok or ref is None)

        hopper = d1.architecture in ("Hopper", "Blackwell")
        has_gpm = d1.sm_active_seconds is not None
        row(gpu, f"GPM series present ({d1.architecture})", float(has_gpm), float(hopper),
            has_gpm == hopper)
        if has_gpm and d1.index.isdigit() and int(d1.index) in dcgm_means:
            for name, mean in dcgm_means[int(d1.index)].items():
                ours = rate(name)
                row(gpu, f"{name} rate vs DCGM", ours, mean,
                    ours is not None and abs(ours - mean) <= RATE_TOLERANCE)

        ours_throttle = {t.reason: t.seconds for t in d1.throttle_seconds}
        before = {t.reason: t.seconds for t in d0.throttle_seconds}
        if n < len(perf_1.counters) and perf_1.counters[n]:
            for reason, theirs in perf_1.counters[n].items():
                # Ours counts from the source's first read, nvidia-smi's since the driver
                # loaded: only their increases over the window compare.
                ours = ours_throttle.get(reason)
                start = perf_0.counters[n].get(reason) if n < len(perf_0.counters) else None
                grew = None if ours is None or reason not in before else ours - before[reason]
                smi_grew = None if start is None else theirs - start
                row(gpu, f"throttle {reason} increase in the window", grew, smi_grew,
                    grew is not None and (smi_grew is None
                                          or abs(grew - smi_grew) <= 1.0 + 0.05 * args.window))
        else:
            seen_active = set().union(*(p.active[n] for p in actives if n < len(p.active)))
            for reason in sorted(seen_active):
                grew = ours_throttle.get(reason, 0.0) - before.get(reason, 0.0)
                row(gpu, f"throttle {reason} grew while nvidia-smi shows it active",
                    grew, None, grew > 0)
        row(gpu, "throttle reasons reported", float(len(ours_throttle)), None,
            len(ours_throttle) > 0)
    if not gpus:
        print("no GPU reported")
        return 1
    bad = sum(not r["ok"] for r in rows)
    for r in rows:
        shown = "None" if r["gpuscope"] is None else f"{r['gpuscope']:.4g}"
        reference = "-" if r["reference"] is None else f"{r['reference']:.4g}"
        print(f"{r['gpu']:>4} {r['signal']:<48} gpuscope={shown:<10} reference={reference:<10} "
              f"{'ok' if r['ok'] else 'MISMATCH'}")
    (args.out / "work-signals.json").write_text(json.dumps(rows, indent=1))
    print(f"{len(rows) - bad}/{len(rows)} work-signal checks agree")
    return bad


# --- GPM call cost (part 5) -----------------------------------------------------------------

GPM_CALLS = 200  # back-to-back calls of each GPM function per GPU
GPM_SPACED = 10  # sample + metrics pairs at the exporter's own spacing (> 0.1 s apart)
GPM_ROUNDS = 20  # whole NvmlSource rounds with and without GPM


def timing(seconds: list[float]) -> dict[str, Any]:
    """Median, p90, min and max of call times, in ms (``{"calls": 0}`` for none)."""
    if not seconds:
        return {"calls": 0}
    ms = sorted(s * 1000 for s in seconds)
    p90 = statistics.quantiles(ms, n=10, method="inclusive")[-1] if len(ms) > 1 else ms[0]
    return {"calls": len(ms), "median_ms": round(statistics.median(ms), 4),
            "p90_ms": round(p90, 4), "min_ms": round(ms[0], 4), "max_ms": round(ms[-1], 4)}


def timed(fn: Callable[..., Any], *call_args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*call_args)
    return time.perf_counter() - started, result


def gpm_call_cost(nv: Any, handle: object) -> dict[str, Any]:
    """What ``nvmlGpmSampleGet`` and ``nvmlGpmMetricsGet`` cost on one GPU, called through the
    exporter's own accessors (the real pynvml, the metrics the exporter asks for): the first
    sample, ``GPM_CALLS`` back-to-back samples, ``GPM_CALLS`` metrics requests on one pair of
    samples 0.2 s apart, and ``GPM_SPACED`` sample + metrics pairs 0.12 s apart (as the
    exporter takes them, if at a shorter interval)."""
    from gpuscope.exporter.sources.nvml import calls
    from gpuscope.exporter.sources.nvml.gpm import METRIC_IDS

    supported = ask(nv, "nvmlGpmQueryDeviceSupport", handle,
                    then=lambda s: bool(s.isSupportedDevice))
    if supported.get("value") is not True:
        why = supported.get("error", "isSupportedDevice is 0")
        return {"skipped": f"no GPM on this GPU (nvmlGpmQueryDeviceSupport: {why})"}
    buffers = (calls.gpm_sample_alloc(), calls.gpm_sample_alloc())
    try:
        request = calls.gpm_metrics_request(METRIC_IDS)
        first, _ = timed(calls.gpm_sample_get, handle, buffers[0])
        back_to_back = [timed(calls.gpm_sample_get, handle, buffers[(i + 1) % 2])[0]
                        for i in range(GPM_CALLS)]
        current = GPM_CALLS % 2  # the buffer the last sample went into
        time.sleep(0.2)
        calls.gpm_sample_get(handle, buffers[1 - current])
        pair = (buffers[current], buffers[1 - current])
        metrics: list[float] = []
        means: dict[int, float] = {}
        for _ in range(GPM_CALLS):
            seconds, means = timed(calls.gpm_metrics_get, request, *pair)
            metrics.append(seconds)
        current = 1 - current
        spaced_sample: list[float] = []
        spaced_metrics: list[float] = []
        for _ in range(GPM_SPACED):
            time.sleep(0.12)
            seconds, _ = timed(calls.gpm_sample_get, handle, buffers[1 - current])
            spaced_sample.append(seconds)
            seconds, _ = timed(calls.gpm_metrics_get, request, buffers[current],
                               buffers[1 - current])
            spaced_metrics.append(seconds)
            current = 1 - current
    finally:
        for buffer in buffers:
            with contextlib.suppress(Exception):
                calls.gpm_sample_free(buffer)
    return {
        "metrics_asked": len(METRIC_IDS),
        "metrics_answered": len(means),
        "sm_util_percent": means.get(nv.NVML_GPM_METRIC_SM_UTIL),
        "sample_get_first_ms": round(first * 1000, 4),
        "sample_get": timing(back_to_back),
        "metrics_get": timing(metrics),
        "sample_get_spaced": timing(spaced_sample),
        "metrics_get_spaced": timing(spaced_metrics),
    }


def round_cost(args: argparse.Namespace) -> dict[str, Any]:
    """One whole ``NvmlSource.sample()`` round (the exporter's defaults, XID thread off), with
    GPM every round and without GPM, ``GPM_ROUNDS`` of each, interleaved 0.15 s apart; and the
    GPM seconds the source itself counts per round (what its cadence is based on)."""
    from gpuscope.exporter.sources.nvml import NvmlSource

    loader = None
    if args.library is not None:
        loader = functools.partial(ctypes.CDLL, str(args.library))
    without = NvmlSource(library_loader=loader, gpm=False, xid_events=False)
    with_gpm = NvmlSource(library_loader=loader, gpm=True, gpm_interval_seconds=0.0,
                          gpm_cpu_budget=0.0, xid_events=False)
    seconds: dict[str, list[float]] = {"without_gpm": [], "with_gpm": []}
    gpm_seconds: list[float] = []
    try:
        without.sample()  # identify the devices, take the first GPM samples
        last = with_gpm.sample()
        for i in range(GPM_ROUNDS):
            time.sleep(0.15)
            order = [("without_gpm", without), ("with_gpm", with_gpm)]
            for name, source in (order if i % 2 else order[::-1]):
                took, snap = timed(source.sample)
                seconds[name].append(took)
                if source is with_gpm:
                    last = snap
                    gpm_seconds.append(float(getattr(with_gpm, "_gpm_seconds", 0.0)))
    finally:
        without.close()
        with_gpm.close()
    result: dict[str, Any] = {name: timing(values) for name, values in seconds.items()}
    result["gpm_seconds_counted_by_the_source"] = timing(gpm_seconds)
    result["devices"] = len(last.devices)
    result["source_up"] = last.source_up
    result["gpm_series_present"] = any(d.sm_active_seconds is not None for d in last.devices)
    if seconds["with_gpm"] and seconds["without_gpm"]:
        result["gpm_share_ms"] = round(1000 * (statistics.median(seconds["with_gpm"])
                                               - statistics.median(seconds["without_gpm"])), 4)
    return result


def check_gpm_cost(args: argparse.Namespace, shared: Shared) -> int:
    """Part 5: what the GPM calls cost per call on this GPU, and a whole sampling round with
    and without GPM; idle, and under the load with ``--load``. Recorded (``gpm-cost.json``),
    not compared; 1 when a measurement raised."""
    library = str(args.library) if args.library is not None else "driver"
    result: dict[str, Any] = {"library": library, "calls": GPM_CALLS, "spaced": GPM_SPACED,
                              "rounds": GPM_ROUNDS}
    bad = 0
    phases = ["idle", "load"] if args.load and have_torch() else ["idle"]
    for phase in phases:
        load = start_load(30) if phase == "load" else None
        if phase == "load" and load is None:
            continue
        try:
            time.sleep(1 if load else 0)
            entry: dict[str, Any] = {"gpus": []}
            with nvml_session(args) as nv:
                entry["system"] = system_facts(nv)
                for index, handle in enumerate(gpu_handles(nv)):
                    try:
                        cost = gpm_call_cost(nv, handle)
                    except Exception as exc:
                        bad += 1
                        cost = {"error": f"{type(exc).__name__}: {exc}"}
                    entry["gpus"].append({"gpu": index, **cost})
            try:
                entry["round"] = round_cost(args)
            except Exception as exc:
                bad += 1
                entry["round"] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            if load is not None:
                stop_process(load, 30)
        result[phase] = entry
        print(f"\nGPM call cost ({phase}, {library}), ms: median / p90 / max")
        for gpu in entry["gpus"]:
            if "sample_get" not in gpu:
                print(f"  {gpu['gpu']:>2} " + (f"skipped: {gpu['skipped']}" if "skipped" in gpu
                                              else f"ERROR {gpu.get('error')}"))
                continue
            print(f"  {gpu['gpu']:>2} first nvmlGpmSampleGet {gpu['sample_get_first_ms']:.3f}; "
                  f"{gpu['metrics_answered']}/{gpu['metrics_asked']} metrics answered, "
                  f"SM {gpu['sm_util_percent']}")
            for what in ("sample_get", "metrics_get", "sample_get_spaced",
                         "metrics_get_spaced"):
                t = gpu[what]
                print(f"     {what:<20} x{t['calls']:<4} {t['median_ms']:8.3f} "
                      f"{t['p90_ms']:8.3f} {t['max_ms']:8.3f}")
        rounds = entry["round"]
        if "error" in rounds:
            print(f"  round: {rounds['error']}")
        else:
            for what in ("without_gpm", "with_gpm", "gpm_seconds_counted_by_the_source"):
                t = rounds[what]
                print(f"  round {what:<34} x{t['calls']:<3} {t['median_ms']:8.3f} "
                      f"{t['p90_ms']:8.3f} {t['max_ms']:8.3f}")
            print(f"  GPM's share of a round (difference of medians): "
                  f"{rounds.get('gpm_share_ms')} ms; {rounds['devices']} device(s), "
                  f"GPM series present: {rounds['gpm_series_present']}")
    (args.out / "gpm-cost.json").write_text(json.dumps(result, indent=1))
    return bad


# --- raw NVML (parts 3 and 4) ---------------------------------------------------------------


@contextlib.contextmanager
def nvml_session(args: argparse.Namespace) -> Iterator[Any]:
    """pynvml, initialised (on ``--library`` when given) until the block ends."""
    import pynvml

    if args.library is not None:
        from gpuscope.exporter.sources.nvml import calls

        calls.install_library(ctypes.CDLL(str(args.library)))
    pynvml.nvmlInit()
    try:
        yield pynvml
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def jsonable(value: Any) -> Any:
    """pynvml's answers (ctypes structs, friendly objects, tuples) as JSON values."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list | tuple | ctypes.Array):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, ctypes.Structure):
        return {f[0]: jsonable(getattr(value, f[0])) for f in value._fields_}
    if hasattr(value, "__dict__"):
        return {k: jsonable(v) for k, v in vars(value).items() if not k.startswith("_")}
    return repr(value)


def ask(nv: Any, function: str, *call_args: Any,
        then: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """``{"value": ...}`` of one pynvml call, or ``{"error": ...}`` (NotSupported, a function
    the driver or this pynvml lacks, ...): never raises."""
    fn = getattr(nv, function, None)
    if fn is None:
        return {"error": f"{function} is not in this pynvml"}
    try:
        result = fn(*call_args)
        return {"value": jsonable(then(result) if then else result)}
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


class ProcessInfo(ctypes.Structure):
    """``nvmlProcessInfo_t`` (the element of the ``_v3`` and ``_v2`` process lists, which
    share this layout; pynvml names its class for it differently across releases)."""

    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


NOT_AVAILABLE_ULL = ctypes.c_ulonglong(-1).value


def process_list(nv: Any, function: str, handle: object) -> dict[str, Any]:
    """``{"value": [{pid, used_bytes, ...}]}`` of one ``nvmlDeviceGet*RunningProcesses_v*``
    call, or ``{"error": ...}``."""
    try:
        fn = nv._nvmlGetFunctionPointer(function)
        count = ctypes.c_uint(0)
        ret = fn(handle, ctypes.byref(count), None)
        if ret == nv.NVML_SUCCESS:
            return {"value": []}
        if ret != nv.NVML_ERROR_INSUFFICIENT_SIZE:
            raise nv.NVMLError(ret)
        count.value = count.value * 2 + 5
        infos = (ProcessInfo * count.value)()
        nv._nvmlCheckReturn(fn(handle, ctypes.byref(count), infos))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"value": [
        {"pid": p.pid,
         "used_bytes": None if p.usedGpuMemory == NOT_AVAILABLE_ULL else p.usedGpuMemory,
         "gpu_instance_id": p.gpuInstanceId, "compute_instance_id": p.computeInstanceId}
        for p in infos[: count.value]]}


def system_facts(nv: Any) -> dict[str, Any]:
    return {
        "driver_version": ask(nv, "nvmlSystemGetDriverVersion"),
        "nvml_version": ask(nv, "nvmlSystemGetNVMLVersion"),
        "cuda_driver_version": ask(nv, "nvmlSystemGetCudaDriverVersion_v2"),
        "pynvml": getattr(nv, "__file__", None),
    }


def gpu_handles(nv: Any) -> list[object]:
    return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]


def norm_bus_id(bus_id: str) -> str:
    """``00000000:19:00.0`` and ``0000:19:00.0`` alike: domain as a number, lower case."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        with contextlib.suppress(ValueError):
            parts[0] = format(int(parts[0], 16), "x")
    return ":".join(parts)


def smi_cell(cell: str) -> Any:
    """One nvidia-smi value: a number, 1/0 for Yes/No, None for N/A or Not Supported."""
    text = cell.strip()
    text = re.sub(r"\s*(bank\(s\)|rows?)$", "", text)
    if text.strip("[]") in ("N/A", "Not Supported", "Unknown Error", "Insufficient Permissions",
                            "Not Available", ""):
        return None
    if text in ("Yes", "No"):
        return int(text == "Yes")
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


# --- part 3: health (row remapping, ECC) ------------------------------------------------------

ECC_QUERY = ("ecc.mode.current", "ecc.errors.corrected.volatile.total",
             "ecc.errors.uncorrected.volatile.total", "retired_pages.pending")
REMAP_QUERY = ("remapped_rows.correctable", "remapped_rows.uncorrectable",
               "remapped_rows.pending", "remapped_rows.failure")
# What is compared: (name, NVML answer and how to read it, the exporter's series, nvidia-smi
# -q -d ROW_REMAPPER's field, nvidia-smi --query-gpu's field).
HEALTH_FIELDS: tuple[tuple[str, str, int | None, str, dict[str, str], str | None, str], ...] = (
    ("remapped rows, correctable", "remapped_rows", 0, "gpu_remapped_rows",
     {"cause": "correctable"}, "Correctable Error", "remapped_rows.correctable"),
    ("remapped rows, uncorrectable", "remapped_rows", 1, "gpu_remapped_rows",
     {"cause": "uncorrectable"}, "Uncorrectable Error", "remapped_rows.uncorrectable"),
    ("row remap pending", "remapped_rows", 2, "gpu_row_remap_pending", {}, "Pending",
     "remapped_rows.pending"),
    ("row remap failed", "remapped_rows", 3, "gpu_row_remap_failed", {},
     "Remapping Failure Occurred", "remapped_rows.failure"),
    ("ECC uncorrected errors (volatile)", "ecc_volatile_uncorrected", None,
     "gpu_ecc_uncorrected_errors_total", {}, None, "ecc.errors.uncorrected.volatile.total"),
    ("ECC corrected errors (volatile)", "ecc_volatile_corrected", None,
     "gpu_ecc_corrected_errors_total", {}, None, "ecc.errors.corrected.volatile.total"),
)


def nvml_health(nv: Any) -> list[dict[str, Any]]:
    """The raw NVML health answers of every GPU."""
    gpus = []
    for i, h in enumerate(gpu_handles(nv)):
        ecc = {f"ecc_{counter}_{kind}": ask(nv, "nvmlDeviceGetTotalEccErrors", h,
                                            getattr(nv, f"NVML_MEMORY_ERROR_TYPE_{kind.upper()}"),
                                            getattr(nv, f"NVML_{counter.upper()}_ECC"))
               for counter in ("volatile", "aggregate") for kind in ("corrected", "uncorrected")}
        gpus.append({
            "index": i,
            "name": ask(nv, "nvmlDeviceGetName", h),
            "uuid": ask(nv, "nvmlDeviceGetUUID", h),
            "pci_bus_id": ask(nv, "nvmlDeviceGetPciInfo", h, then=lambda p: p.busId),
            "remapped_rows": ask(nv, "nvmlDeviceGetRemappedRows", h),
            "row_remapper_histogram": ask(nv, "nvmlDeviceGetRowRemapperHistogram", h),
            "ecc_mode": ask(nv, "nvmlDeviceGetEccMode", h),
            **ecc,
            "retired_pages_pending": ask(nv, "nvmlDeviceGetRetiredPagesPendingStatus", h),
            "retired_pages_sbe": ask(
                nv, "nvmlDeviceGetRetiredPages", h,
                getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                then=len),
            "retired_pages_dbe": ask(
                nv, "nvmlDeviceGetRetiredPages", h,
                getattr(nv, "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1), then=len),
            "gpu_operation_mode": ask(nv, "nvmlDeviceGetGpuOperationMode", h),
            "persistence_mode": ask(nv, "nvmlDeviceGetPersistenceMode", h),
            "compute_mode": ask(nv, "nvmlDeviceGetComputeMode", h),
            "architecture": ask(nv, "nvmlDeviceGetArchitecture", h),
        })
    return gpus


def read_row_remapper(text: str) -> dict[str, dict[str, Any]]:
    """``nvidia-smi -q -d ROW_REMAPPER``: normalized bus id → {field: value} (the fields of
    its "Remapped Rows" section; none where it prints ``Remapped Rows : N/A``)."""
    gpus: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s*$", line)
        if m:
            current = gpus.setdefault(norm_bus_id(m.group(1)), {})
            continue
        m = re.match(r"^\s+([A-Za-z][A-Za-z0-9 /()-]*?)\s*:\s*(.*)$", line)
        if current is not None and m:
            current[m.group(1)] = smi_cell(m.group(2))
    return gpus


def read_query(text: str, fields: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``nvidia-smi --query-gpu=index,uuid,pci.bus_id,FIELDS --format=csv,noheader,nounits``:
    normalized bus id → {field: value}."""
    out: dict[str, dict[str, Any]] = {}
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 + len(fields):
            out[norm_bus_id(cells[2])] = {"uuid": cells[1], **{
                f: smi_cell(c) for f, c in zip(fields, cells[3:], strict=True)}}
    return out


def agree(a: Any, b: Any) -> bool:
    """Both unsupported, or both the same number."""
    if a is None or b is None:
        return a is None and b is None
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def shared_metrics(args: argparse.Namespace, shared: Shared, log_name: str) -> str | None:
    """The exporter step's ``/metrics`` where it ran, else one scrape of an exporter of this
    step's own (``log_name``; saved as ``metrics.txt`` then, and kept for the next step);
    None where it never became ready."""
    if shared.metrics is None:
        with exporter_running(args, log_name, process_metrics=False) as port:
            if port is not None:
                time.sleep(1.5)
                shared.metrics = get(f"http://127.0.0.1:{port}/metrics")[1]
                (args.out / "metrics.txt").write_text(shared.metrics)
    return shared.metrics


def check_health(args: argparse.Namespace, shared: Shared) -> int:
    """Part 3: row remapping and ECC, the exporter and nvidia-smi against NVML; the number
    of mismatches."""
    text = shared_metrics(args, shared, "exporter-health.log")
    with nvml_session(args) as nv:
        raw: dict[str, Any] = {"system": system_facts(nv), "gpus": nvml_health(nv)}
    smi: dict[str, dict[str, Any]] = {}
    if have_smi():
        bus_fields = "index,uuid,pci.bus_id"
        smi = {
            "row_remapper": run_all(["nvidia-smi", "-q", "-d", "ROW_REMAPPER"], timeout=60),
            "ecc_query": run_all(["nvidia-smi", f"--query-gpu={bus_fields},{','.join(ECC_QUERY)}",
                                  "--format=csv,noheader,nounits"]),
            "remap_query": run_all(["nvidia-smi",
                                    f"--query-gpu={bus_fields},{','.join(REMAP_QUERY)}",
                                    "--format=csv,noheader,nounits"]),
            "ecc_q": run_all(["nvidia-smi", "-q", "-d", "ECC"], timeout=60),
        }
    remapper = (read_row_remapper(str(smi["row_remapper"]["stdout"]))
                if smi.get("row_remapper", {}).get("rc") == 0 else {})
    queried: dict[str, dict[str, Any]] = {}
    for key, fields in (("ecc_query", ECC_QUERY), ("remap_query", REMAP_QUERY)):
        if smi.get(key, {}).get("rc") == 0:
            for bus, values in read_query(str(smi[key]["stdout"]), fields).items():
                queried.setdefault(bus, {}).update(values)
    exported = series(text) if text is not None else {}

    rows: list[dict[str, Any]] = []
    for gpu in raw["gpus"]:
        uuid = gpu["uuid"].get("value")
        bus = norm_bus_id(str(gpu["pci_bus_id"].get("value") or ""))
        for what, call, item, metric, labels, q_field, query_field in HEALTH_FIELDS:
            answer = gpu[call].get("value")
            nvml = answer[item] if item is not None and answer is not None else answer
            found = [v for name in (metric, metric + "_total") if uuid
                     for lab, v in exported.get((name, uuid), [])
                     if all(lab.get(k) == want for k, want in labels.items())]
            ours = found[0] if found else None
            smi_q = remapper.get(bus, {}).get(q_field) if q_field else None
            smi_query = queried.get(bus, {}).get(query_field)
            # nvidia-smi -q's section where it printed one, else its query field.
            reference_ran = bus in remapper if q_field else bus in queried
            theirs = smi_q if q_field and bus in remapper else smi_query
            exporter_ok = None if text is None else agree(nvml, ours)
            smi_ok = agree(nvml, theirs) if (reference_ran or bus in queried) else None
            rows.append({"gpu": gpu["index"], "field": what, "nvml": nvml,
                         "nvml_error": gpu[call].get("error"), "exporter": ours,
                         "nvidia_smi": theirs, "nvidia_smi_q": smi_q,
                         "nvidia_smi_query": smi_query,
                         "exporter_ok": exporter_ok, "nvidia_smi_ok": smi_ok,
                         "ok": exporter_ok is not False and smi_ok is not False})
    if text is None:
        print("exporter: no /metrics (it never became ready); its side not compared")
    if not have_smi():
        print("nvidia-smi: not installed; its side not compared (skipped)")
    for r in rows:
        def show(ok: bool | None) -> str:
            return "skipped" if ok is None else "ok" if ok else "MISMATCH"
        print(f"{r['gpu']:>3} {r['field']:<34} nvml={r['nvml']!s:<6} "
              f"exporter={r['exporter']!s:<6} {show(r['exporter_ok']):<8} "
              f"nvidia-smi={r['nvidia_smi']!s:<6} {show(r['nvidia_smi_ok'])}")
    for gpu in raw["gpus"]:
        facts = {k: gpu[k].get("value", gpu[k].get("error")) for k in (
            "ecc_mode", "gpu_operation_mode", "persistence_mode", "compute_mode",
            "retired_pages_pending", "row_remapper_histogram")}
        print(f"{gpu['index']:>3} NVML: {json.dumps(facts)}")
    bad = sum(not r["ok"] for r in rows) + (text is None)
    (args.out / "health.json").write_text(json.dumps(
        {"rows": rows, "nvml": raw, "nvidia_smi": smi}, indent=1))
    print(f"{len(rows) - sum(not r['ok'] for r in rows)}/{len(rows)} health checks agree")
    return bad


# --- part 7: identity ---------------------------------------------------------------------------

def procfs_gpus(proc_root: Path) -> dict[str, dict[str, Any]]:
    """Each GPU the driver lists under ``<proc_root>/driver/nvidia/gpus``, by normalised bus id:
    its information file's text and the UUID the exporter's pattern finds in it (None where
    it finds none); empty where the folder cannot be read."""
    from gpuscope.exporter.sources.nvml.source import PROCFS_UUID

    gpus: dict[str, dict[str, Any]] = {}
    folder = proc_root / "driver" / "nvidia" / "gpus"
    with contextlib.suppress(OSError):
        for bus in sorted(os.listdir(folder)):
            text = (folder / bus / "information").read_text(encoding="utf-8", errors="replace")
            found = PROCFS_UUID.search(text)
            gpus[norm_bus_id(bus)] = {"dir": bus, "uuid": found.group(1) if found else None,
                                      "information": text}
    return gpus


def smi_identity() -> dict[str, dict[str, str]]:
    """nvidia-smi's uuid, bus id and current MIG mode per GPU, by normalised bus id."""
    text = run_text(["nvidia-smi", "--query-gpu=uuid,pci.bus_id,mig.mode.current",
                     "--format=csv,noheader"]) if have_smi() else None
    rows: dict[str, dict[str, str]] = {}
    for line in (text or "").strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3:
            rows[norm_bus_id(cells[1])] = {"uuid": cells[0], "mig_mode": cells[2]}
    return rows


def check_identity(args: argparse.Namespace, shared: Shared) -> int:
    """Part 7: each GPU's UUID, bus id and MIG mode from NVML against the driver's procfs
    file (through the exporter's parser), nvidia-smi, and the exporter's sharing series and
    XID watch; the number of mismatches."""
    from gpuscope.exporter.sources.nvml.source import procfs_uuids

    text = shared_metrics(args, shared, "exporter-identity.log")
    with nvml_session(args) as nv:
        enabled = getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        nvml: list[dict[str, Any]] = [
            {"index": i, "uuid": ask(nv, "nvmlDeviceGetUUID", h).get("value"),
             "bus": norm_bus_id(str(ask(nv, "nvmlDeviceGetPciInfo", h,
                                        then=lambda p: p.busId).get("value") or "")),
             "mig_mode": ask(nv, "nvmlDeviceGetMigMode", h)}
            for i, h in enumerate(gpu_handles(nv))]
    procfs = procfs_gpus(args.proc_root)
    listed = procfs_uuids(str(args.proc_root))
    smi = smi_identity()
    exported = series(text) if text is not None else {}
    rows: list[dict[str, Any]] = []

    def row(gpu: object, what: str, want: object, got: object, ok: bool | None) -> None:
        rows.append({"gpu": gpu, "check": what, "nvml": want, "other": got, "ok": ok})

    for g in nvml:
        mode = g["mig_mode"].get("value")
        # (current, pending); NotSupported on a GPU without MIG, which is then never in it.
        mig = bool(mode and mode[0] == enabled)
        entry = procfs.get(g["bus"])
        found = entry["uuid"] if entry else None
        row(g["index"], "procfs UUID at NVML's bus id", g["uuid"], found,
            None if not procfs else found is not None and found == g["uuid"])
        if g["bus"] in smi:
            theirs = smi[g["bus"]]
            row(g["index"], "nvidia-smi UUID", g["uuid"], theirs["uuid"],
                theirs["uuid"] == g["uuid"])
            row(g["index"], "MIG mode: NVML current / nvidia-smi", mode, theirs["mig_mode"],
                (theirs["mig_mode"] == "Enabled") == mig)
        else:
            row(g["index"], "nvidia-smi UUID", g["uuid"], None, None if not have_smi() else False)
        sharing = [lab.get("sharing") for lab, _ in exported.get(("gpu_sharing_info", g["uuid"]),
                                                                   [])]
        want = "mig" if mig else "exclusive"
        row(g["index"], "exporter gpu_sharing_info", want, sharing,
            None if text is None else sharing == [want])
    # The exporter reads every listed GPU but the excluded ones, in bus order; NVML
    # enumerates the same set (in its own order).
    row("all", "exporter procfs_uuids() = NVML's UUIDs", sorted(str(g["uuid"]) for g in nvml),
        listed, None if not procfs else sorted(listed or []) == sorted(str(g["uuid"])
                                                                        for g in nvml))
    xid = [s.value for fam in text_string_to_metric_families(text or "")
           if fam.name == "gpu_exporter_collector_success"
           for s in fam.samples if s.labels.get("collector") == "xid"]
    row("all", "exporter XID watch (collector_success{collector=xid})", 1.0, xid,
        None if text is None else xid == [1.0])
    if not procfs:
        print(f"{args.proc_root}/driver/nvidia/gpus: not readable; procfs not compared (skipped)")
    for r in rows:
        show = "skipped" if r["ok"] is None else "ok" if r["ok"] else "MISMATCH"
        print(f"{r['gpu']!s:>3} {r['check']:<52} nvml={r['nvml']!s:<40} "
              f"other={r['other']!s:<40} {show}")
    bad = sum(r["ok"] is False for r in rows)
    (args.out / "identity.json").write_text(json.dumps(
        {"rows": rows, "nvml": nvml, "procfs": procfs, "nvidia_smi": smi}, indent=1,
        default=str))
    skipped = sum(r["ok"] is None for r in rows)
    print(f"{len(rows) - bad - skipped}/{len(rows)} identity checks agree, {skipped} skipped")
    return bad


# --- part 4: MPS --------------------------------------------------------------------------------

# One MPS client: a matrix of `size` in half precision, `extra_mib` more of device memory,
# `burst` multiplies per synchronize, then `pause` seconds; `seconds` at most.
MPS_CLIENT = """
import os, sys, time, torch
size, extra_mib, burst, pause, seconds = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                          float(sys.argv[4]), float(sys.argv[5]))
end = time.time() + seconds
x = torch.randn(size, size, device="cuda:0", dtype=torch.float16)
pad = torch.empty(extra_mib * 2**20, dtype=torch.uint8, device="cuda:0")
x @ x
torch.cuda.synchronize()
print("ready", os.getpid(), torch.cuda.memory_reserved(0), flush=True)
n = 0
while time.time() < end:
    for _ in range(burst):
        x @ x
    torch.cuda.synchronize()
    n += burst
    if pause:
        time.sleep(pause)
print("done", n, flush=True)
"""
# name → (size, extra MiB, burst, pause): one saturating, one light with less memory.
MPS_CLIENTS = {"heavy": (8192, 4096, 4, 0.0), "light": (4096, 1024, 8, 0.005)}
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


def mps_processes() -> dict[int, str]:
    """PID → executable name of every nvidia-cuda-mps-* process visible in /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            except OSError:
                continue
            if Path(argv0).name.startswith("nvidia-cuda-mps"):
                found[int(entry.name)] = Path(argv0).name
    return found


def describe_pid(pid: int) -> dict[str, Any]:
    """What /proc says about a PID NVML listed (NVML's PIDs are the host's: a process in
    another PID namespace is not visible here)."""
    try:
        cmdline = (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError as exc:
        return {"visible": False, "error": exc.strerror}
    argv = cmdline.decode(errors="replace").split("\0")
    return {"visible": True, "exe": Path(argv[0]).name, "cmdline": " ".join(argv)[:200]}


class Client:
    """One MPS client process, its ``ready`` line read by a thread."""

    def __init__(self, name: str, env: dict[str, str], workdir: Path, seconds: float) -> None:
        self.name = name
        self.ready = threading.Event()
        self.lines: list[str] = []
        self.stderr_path = workdir / f"client-{name}.err"
        size, extra, burst, pause = MPS_CLIENTS[name]
        with self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", MPS_CLIENT, str(size), str(extra), str(burst),
                 str(pause), str(seconds)],
                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith("ready"):
                self.ready.set()

    def stop(self) -> None:
        stop_process(self.proc)

    def report(self) -> dict[str, Any]:
        ready = next((ln.split() for ln in self.lines if ln.startswith("ready")), None)
        return {"name": self.name, "pid": self.proc.pid, "params": MPS_CLIENTS[self.name],
                "returncode": self.proc.poll(), "stdout": self.lines,
                "torch_reserved_bytes": int(ready[2]) if ready and len(ready) > 2 else None,
                "stderr_tail": self.stderr_path.read_text(errors="replace")[-3000:]}


def mps_snapshot(nv: Any, handles: list[object], cursors: dict[str, int]) -> dict[str, Any]:
    """One read of everything NVML says about the processes on every GPU; per-process
    utilization from the cursors on (advanced to the newest sample seen)."""
    snap: dict[str, Any] = {"time": time.time(), "gpus": []}
    for i, h in enumerate(handles):
        gpu: dict[str, Any] = {"gpu": i}
        gpu["compute_v3"] = process_list(nv, "nvmlDeviceGetComputeRunningProcesses_v3", h)
        if "error" in gpu["compute_v3"]:
            gpu["compute_v2"] = process_list(nv, "nvmlDeviceGetComputeRunningProcesses_v2", h)
        gpu["mps_v3"] = process_list(nv, "nvmlDeviceGetMPSComputeRunningProcesses_v3", h)
        if "error" in gpu["mps_v3"]:
            gpu["mps_v2"] = process_list(nv, "nvmlDeviceGetMPSComputeRunningProcesses_v2", h)
        for key, function in (("process_utilization", "nvmlDeviceGetProcessUtilization"),
                              ("processes_utilization_info",
                               "nvmlDeviceGetProcessesUtilizationInfo")):
            cursor = f"{key}/{i}"
            gpu[key] = ask(nv, function, h, cursors.get(cursor, 0))
            stamps = [s.get("timeStamp", 0) for s in gpu[key].get("value") or []]
            if stamps:
                cursors[cursor] = max(stamps)
        gpu["compute_mode"] = ask(nv, "nvmlDeviceGetComputeMode", h)
        gpu["utilization"] = ask(nv, "nvmlDeviceGetUtilizationRates", h)
        snap["gpus"].append(gpu)
    return snap


def mps_answers(result: dict[str, Any]) -> dict[str, Any]:
    """The plain answers from what ``check_mps`` recorded (GPU 0)."""
    clients = {c["name"]: c["pid"] for c in result.get("clients", [])}
    servers = set(result.get("server_pids", []))
    listed: dict[str, dict[int, int | None]] = {"compute": {}, "mps": {}}
    util: dict[str, dict[int, list[int]]] = {"process_utilization": {},
                                             "processes_utilization_info": {}}
    errors: dict[str, set[str]] = {}
    for snap in result.get("snapshots", []):
        gpu = snap["gpus"][0] if snap["gpus"] else {}
        for kind, keys in (("compute", ("compute_v3", "compute_v2")),
                           ("mps", ("mps_v3", "mps_v2"))):
            for key in keys:
                if key in gpu and "error" in gpu[key]:
                    errors.setdefault(key, set()).add(gpu[key]["error"])
                for p in gpu.get(key, {}).get("value") or []:
                    old = listed[kind].get(p["pid"])
                    listed[kind][p["pid"]] = max(old or 0, p["used_bytes"] or 0) or old
        for key in util:
            if key in gpu and "error" in gpu[key]:
                errors.setdefault(key, set()).add(gpu[key]["error"])
            for s in gpu.get(key, {}).get("value") or []:
                util[key].setdefault(s["pid"], []).append(s["smUtil"])

    def where(pid: int) -> str:
        found = []
        for kind, pids in listed.items():
            if pid in pids:
                used = pids[pid]
                memory = "memory n/a" if used is None else f"{used / 2**20:.0f} MiB"
                found.append(f"{kind} list ({memory})")
        return ", ".join(found) if found else "not listed"

    answers: dict[str, Any] = {
        "server": {str(pid): where(pid) for pid in sorted(servers)} or "no server PID known",
        "clients": {name: f"PID {pid}: {where(pid)}" for name, pid in clients.items()},
        "other_pids_listed": sorted(set(listed["compute"]) | set(listed["mps"])
                                    - servers - set(clients.values())),
        "errors": {k: sorted(v) for k, v in errors.items()},
        # Where the PIDs differ (NVML's are the host's; this may run in a container without
        # the host's PID namespace), memory tells the heavy client from the light one.
        "listed_by_memory_mib": {
            f"{kind} {pid}": None if used is None else round(used / 2**20)
            for kind, pids in listed.items()
            for pid, used in sorted(pids.items(), key=lambda kv: -(kv[1] or 0))},
        "nvml_pids_visible_here": (
            f"{sum(1 for v in result.get('pids', {}).values() if v.get('visible'))} of "
            f"{len(result.get('pids', {}))} (this PID namespace: {result.get('pid_namespace')})"),
    }
    for key, samples in util.items():
        per_pid = {pid: round(statistics.fmean(v), 1) for pid, v in samples.items()}
        named = {("server " if pid in servers else next(
            (f"client {n} " for n, p in clients.items() if p == pid), "other ")) + str(pid): mean
            for pid, mean in per_pid.items()}
        with_samples, client_pids = set(per_pid), set(clients.values())
        if not with_samples:
            verdict = "no samples"
        elif client_pids and client_pids <= with_samples:
            verdict = "per client (each client PID has its own samples)"
        elif with_samples & client_pids:
            verdict = "some clients only"
        elif with_samples & servers:
            verdict = "server only (the MPS server's PID carries all clients' work)"
        else:
            verdict = "neither server nor clients (other PIDs only)"
        answers[key] = {"verdict": verdict, "mean_sm_util_by_pid": named}
    return answers


def check_mps(args: argparse.Namespace, shared: Shared) -> int:
    """Part 4: what NVML reports under MPS (recorded, not compared); 1 when the step could
    not run its clients."""
    control = shutil.which("nvidia-cuda-mps-control")
    out = args.out / "mps.json"
    if control is None or not have_torch():
        why = ("nvidia-cuda-mps-control not installed" if control is None
               else "PyTorch is not installed")
        print(f"MPS: {why}; skipped")
        out.write_text(json.dumps({"skipped": why}, indent=1))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="gpuscope-mps-"))
    env = without_pythonpath()
    mps_folders(workdir, env)
    before = mps_processes()
    result: dict[str, Any] = {"mps_processes_before": before, "pipe_directory": str(workdir),
                              "clients": [], "snapshots": []}
    with contextlib.suppress(OSError):
        result["pid_namespace"] = os.readlink("/proc/self/ns/pid")
    clients: list[Client] = []
    bad = 0
    try:
        with nvml_session(args) as nv, contextlib.ExitStack() as stack:
            handles = gpu_handles(nv)
            result["system"] = system_facts(nv)
            modes = [ask(nv, "nvmlDeviceGetComputeMode", h) for h in handles]
            result["compute_mode_before"] = modes
            mode = modes[0].get("value") if modes else None
            result["ran_in_compute_mode"] = (COMPUTE_MODES.get(mode, mode)
                                             if isinstance(mode, int) else modes)
            port = stack.enter_context(exporter_running(args, "exporter-mps.log"))
            result["daemon_start"] = run_all([control, "-d"], timeout=15, env=env)
            if result["daemon_start"]["rc"] != 0:
                print(f"MPS: the control daemon did not start: {result['daemon_start']}")
                return 1
            seconds = args.mps_seconds + 60  # they are stopped once sampled
            clients = [Client(name, env, workdir, seconds) for name in MPS_CLIENTS]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(c.ready.is_set() for c in clients):
                if any(c.proc.poll() is not None for c in clients):
                    break
                time.sleep(0.2)
            result["clients_ready"] = {c.name: c.ready.is_set() for c in clients}
            if not all(c.ready.is_set() for c in clients):
                print(f"MPS: clients not ready within 60 s: {result['clients_ready']}")
                bad = 1
            cursors: dict[str, int] = {}
            mps_snapshot(nv, handles, cursors)  # moves the cursors past the start-up
            end = time.monotonic() + args.mps_seconds
            while time.monotonic() < end:
                time.sleep(1.0)
                result["snapshots"].append(mps_snapshot(nv, handles, cursors))
                if len(result["snapshots"]) == 3:
                    result["server_list"] = run_all([control], stdin="get_server_list\n",
                                                    timeout=10, env=env)
                    result["nvidia_smi"] = run_all(["nvidia-smi"], timeout=20)
                    result["nvidia_smi_compute_apps"] = run_all(
                        ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                         "--format=csv"], timeout=20)
                    if port is not None:
                        metrics = get(f"http://127.0.0.1:{port}/metrics")[1]
                        result["exporter_process_series"] = [
                            ln for ln in metrics.splitlines()
                            if ln.startswith(("gpu_process_", "container_gpu_", "gpu_info",
                                              "gpu_mps_", "gpu_sharing_"))]
            result["snapshots"].append(mps_snapshot(nv, handles, cursors))
            servers = [int(w) for w in str(result.get("server_list", {}).get("stdout", ""))
                       .split() if w.isdigit()]
            servers += [pid for pid, exe in mps_processes().items()
                        if exe == "nvidia-cuda-mps-server" and pid not in before
                        and pid not in servers]
            result["server_pids"] = servers
            result["client_lists"] = {
                str(pid): run_all([control], stdin=f"get_client_list {pid}\n", timeout=10,
                                  env=env) for pid in servers}
            seen = {p["pid"] for snap in result["snapshots"] for gpu in snap["gpus"]
                    for key in ("compute_v3", "compute_v2", "mps_v3", "mps_v2")
                    for p in gpu.get(key, {}).get("value") or []}
            result["pids"] = {str(pid): describe_pid(pid) for pid in sorted(seen)}
    finally:
        for c in clients:
            c.stop()
        result["clients"] = [c.report() for c in clients]
        result["daemon_quit"] = run_all([control], stdin="quit\n", timeout=15, env=env)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and set(mps_processes()) - set(before):
            time.sleep(0.5)
        left = {pid: exe for pid, exe in mps_processes().items() if pid not in before}
        for pid in left:  # ours, started by this step: still there after quit
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        result["left_running_after_quit"] = left
        result["mps_logs"] = {p.name: p.read_text(errors="replace")[-20000:]
                              for p in sorted((workdir / "log").glob("*"))}
        shutil.rmtree(workdir, ignore_errors=True)
        try:  # also when the step was cut short: what was sampled so far
            result["answers"] = mps_answers(result)
        except Exception as exc:
            result["answers"] = {"error": f"{type(exc).__name__}: {exc}"}
        out.write_text(json.dumps(result, indent=1, default=str))
    answers = result["answers"]
    if "error" in answers:
        print(f"MPS: no answers: {answers['error']}")
        return 1
    print(f"MPS ran in compute mode {result.get('ran_in_compute_mode')}")
    print(f"MPS server in NVML: {answers['server']}")
    for name, where in answers["clients"].items():
        print(f"MPS client {name}: {where}")
    if answers["other_pids_listed"]:
        print(f"other PIDs listed: {answers['other_pids_listed']}")
    print(f"listed by memory (MiB): {answers['listed_by_memory_mib']}")
    print(f"NVML's PIDs visible in /proc here: {answers['nvml_pids_visible_here']}")
    for key in ("process_utilization", "processes_utilization_info"):
        print(f"{key}: {answers[key]['verdict']}; mean SM % by PID: "
              f"{answers[key]['mean_sm_util_by_pid']}")
    if answers["errors"]:
        print(f"NVML errors: {answers['errors']}")
    if left:
        print(f"MPS processes still running after quit were killed: {left}")
    return bad


# --- part 6: soak on the real driver (``soak``) ------------------------------------------------

SOAK_EVERY = 10.0  # seconds between recorded points
SOAK_WARMUP = 30.0  # seconds left out of the RSS figures (imports, first rounds, the allocator)
SOAK_SPAWN_EVERY = 5.0  # a new PyTorch child this often, ...
SOAK_MAX_CHILDREN = 2  # ... while fewer than this many run
SOAK_QUIET_END = 20.0  # no new child this close to the end: the last ones' series can go
SOAK_CHILD_LIMIT = 90.0  # a child still running this long after its start is stopped
SOAK_STALE_AFTER = 5.0  # a child's series still served this long after it exited: stale
# Collectors whose errors are expected on a machine outside a cluster (no kubelet socket).
SOAK_EXPECTED_ERRORS = ("kubelet",)

# One short-lived PyTorch child: dies with the check (PR_SET_PDEATHSIG), allocates a matrix of
# `size` in half precision and `mib` MiB more on GPU 0, multiplies for `seconds`, exits.
SOAK_CHILD = """
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit(3)
import time, torch
seconds, size, mib = float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
x = torch.randn(size, size, device="cuda:0", dtype=torch.float16)
pad = torch.empty(mib * 2**20, dtype=torch.uint8, device="cuda:0")
x @ x
torch.cuda.synchronize()
print("ready", os.getpid(), torch.cuda.memory_reserved(0), flush=True)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end:
    for _ in range(4):
        x @ x
    torch.cuda.synchronize()
    n += 4
print("done", n, flush=True)
"""
# The n-th child's (seconds of work, matrix size, MiB more), in turn.
SOAK_CHILDREN = ((4.0, 8192, 1024), (6.0, 4096, 512), (5.0, 8192, 2048), (3.0, 4096, 256))


class SoakChild:
    """One short-lived PyTorch process; a thread reads its lines and notes when it was ready
    and when it exited (seconds on the soak's clock)."""

    def __init__(self, n: int, env: dict[str, str], workdir: Path,
                 clock: Callable[[], float]) -> None:
        self.n = n
        self.params = SOAK_CHILDREN[n % len(SOAK_CHILDREN)]
        self.clock = clock
        self.started = clock()
        self.ready_at: float | None = None
        self.exited_at: float | None = None
        self.stopped_by_us = False
        self.lines: list[str] = []
        self.stderr_path = workdir / f"child-{n}.err"
        seconds, size, mib = self.params
        with self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", SOAK_CHILD, str(os.getpid()), str(seconds), str(size),
                 str(mib)], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith("ready"):
                self.ready_at = self.clock()
        self.proc.wait()
        self.exited_at = self.clock()

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.stopped_by_us = True
            stop_process(self.proc)
        self.thread.join(5)

    def report(self) -> dict[str, Any]:
        seconds, size, mib = self.params
        return {"n": self.n, "pid": self.proc.pid, "seconds": seconds, "size": size,
                "mib": mib, "started": round(self.started, 2),
                "ready": None if self.ready_at is None else round(self.ready_at, 2),
                "exited": None if self.exited_at is None else round(self.exited_at, 2),
                "returncode": self.proc.poll(), "stopped_by_us": self.stopped_by_us,
                "stdout": self.lines[-3:],
                "stderr_tail": (self.stderr_path.read_text(errors="replace")[-1500:]
                                if self.proc.poll() not in (0, None) and not self.stopped_by_us
                                else "")}


def proc_stats(pid: int) -> dict[str, Any]:
    """RSS (KiB), threads, open fds and CPU seconds of a process, from /proc."""
    out: dict[str, Any] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_kib"] = int(line.split()[1])
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        # utime and stime, fields 14 and 15, after the command in parentheses.
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        out["cpu_seconds"] = round((int(fields[11]) + int(fields[12]))
                                   / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def read_soak_metrics(text: str) -> tuple[dict[int, set[str]], dict[str, float], int]:
    """From one /metrics: the PIDs in ``gpu_process_*`` series (with the series' names), the
    exporter's own ``gpu_exporter_*`` series (CloudWatch's left out; ``name{label=value}``
    less the prefix), and how many GPUs have GPM series (``gpu_sm_active_seconds_total``)."""
    pids: dict[int, set[str]] = {}
    own: dict[str, float] = {}
    gpm = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            if s.name.startswith("gpu_process_") and "pid" in s.labels:
                with contextlib.suppress(ValueError):
                    pids.setdefault(int(s.labels["pid"]), set()).add(s.name)
            elif s.name.startswith("gpu_exporter_") and "cloudwatch" not in s.name:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
                own[s.name.removeprefix("gpu_exporter_") + (f"{{{labels}}}" if labels else "")] \
                    = s.value
            elif s.name == "gpu_sm_active_seconds_total":
                gpm += 1
    return pids, own, gpm


def read_mps_series(text: str) -> tuple[int, int]:
    """From one /metrics: how many GPUs the exporter serves as shared through MPS
    (``gpu_sharing_info{sharing="mps"}``), and how many MPS servers' memory series
    (``gpu_mps_server_memory_used_bytes``) it serves."""
    shared = servers = 0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "gpu_sharing_info" and s.labels.get("sharing") == "mps" and s.value:
                shared += 1
            elif s.name == "gpu_mps_server_memory_used_bytes":
                servers += 1
    return shared, servers


def mps_folders(workdir: Path, env: dict[str, str]) -> None:
    """An MPS control daemon's pipe and log folders under ``workdir``, made and named in
    ``env`` (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_LOG_DIRECTORY``), which the daemon and
    its clients are started with."""
    for name, var in (("pipe", "CUDA_MPS_PIPE_DIRECTORY"), ("log", "CUDA_MPS_LOG_DIRECTORY")):
        (workdir / name).mkdir(exist_ok=True)
        env[var] = str(workdir / name)


def start_soak_mps(workdir: Path, env: dict[str, str]) -> dict[str, Any]:
    """An MPS control daemon for the soak's processes, its pipe and log folders under
    ``workdir`` (set in ``env``, which the children get); what starting it answered, or why
    it was skipped."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return {"skipped": "nvidia-cuda-mps-control not installed"}
    mps_folders(workdir, env)
    return {"control": control, "daemon_start": run_all([control, "-d"], timeout=15, env=env),
            "scrapes": 0, "scrapes_shared": 0, "server_series_max": 0}


def stop_soak_mps(mps: dict[str, Any], env: dict[str, str]) -> None:
    """Quits the soak's MPS control daemon (its server with it), if one was started."""
    if "control" in mps:
        mps["daemon_quit"] = run_all([mps["control"]], stdin="quit\n", timeout=15, env=env)


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value), per minute; None for fewer than 2 points."""
    if len(points) < 2:
        return None
    mx = statistics.fmean(t for t, _ in points)
    my = statistics.fmean(v for _, v in points)
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return None
    return 60 * sum((t - mx) * (v - my) for t, v in points) / var


def soak_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures of a soak from its points, scrapes, children and PIDs; ``errors`` lists what
    counts against it."""
    points: list[dict[str, Any]] = result["points"]
    warmup = result["warmup_seconds"]
    summary: dict[str, Any] = {"points": len(points)}
    errors: list[str] = []
    if result.get("error"):
        errors.append(result["error"])
    good = [p for p in points if "rss_kib" in p]
    after = [p for p in good if p["t"] >= warmup] or good[-1:]
    if after:
        rss = [p["rss_kib"] for p in after]
        slope = slope_per_minute([(p["t"], p["rss_kib"]) for p in after])
        summary["rss_mib_after_warmup"] = {
            "from_t": after[0]["t"], "first": round(rss[0] / 1024, 2),
            "last": round(rss[-1] / 1024, 2), "max": round(max(rss) / 1024, 2),
            "min": round(min(rss) / 1024, 2)}
        summary["rss_mib_at_start"] = round(good[0]["rss_kib"] / 1024, 2)
        summary["rss_slope_kib_per_min"] = None if slope is None else round(slope, 1)
        for key in ("fds", "threads"):
            values = [p[key] for p in good]
            summary[key] = {"first": values[0], "last": values[-1], "min": min(values),
                            "max": max(values)}
        if len(after) > 1 and after[-1]["t"] > after[0]["t"]:
            summary["cpu_percent_after_warmup"] = round(
                100 * (after[-1]["cpu_seconds"] - after[0]["cpu_seconds"])
                / (after[-1]["t"] - after[0]["t"]), 2)
    latencies = result["scrape_seconds"]
    summary["scrapes"] = {"count": len(latencies), "failed": len(result["scrape_errors"]),
                          **timing(latencies)}
    if result["scrape_errors"]:
        errors.append(f"{len(result['scrape_errors'])} scrape(s) failed")
    own = [p["self"] for p in points if p.get("self")]
    if own:
        first, last = own[0], own[-1]

        def delta(key: str) -> float | None:
            return None if key not in last else last[key] - first.get(key, 0.0)

        summary["sampling_rounds"] = delta("sampling_rounds_total")
        summary["missed_rounds"] = delta("missed_rounds_total")
        summary["series_dropped"] = {k: delta(k) for k in last
                                     if k.startswith("series_dropped_total")}
        grew = {k.partition("=")[2].rstrip("}"): delta(k) for k in last
                if k.startswith("collector_errors_total")}
        summary["collector_errors"] = grew
        for collector, n in grew.items():
            if n and collector not in SOAK_EXPECTED_ERRORS:
                errors.append(f"collector {collector}: {n:g} error(s)")
        summary["collector_duration_max_ms"] = {
            collector: max(p["collector_duration_max_ms"].get(collector, 0.0) for p in points
                           if "collector_duration_max_ms" in p)
            for collector in {c for p in points for c in p.get("collector_duration_max_ms", {})}}
    summary["nvml_up_min"] = result.get("nvml_up_min")
    if result.get("nvml_up_min") == 0:
        errors.append("gpu_exporter_nvml_up was 0 in a scrape")
    summary["last_sample_age_max_s"] = result.get("last_sample_age_max")
    summary["gpm_series"] = result.get("gpm_series")
    # Processes: the children's PIDs against the gpu_process_* series.
    pids: dict[str, dict[str, Any]] = result["pids"]
    children: list[dict[str, Any]] = result["children"]
    ours = {str(c["pid"]) for c in children}
    seen = [c for c in children if str(c["pid"]) in pids]
    horizon = result.get("scraped_until", 0.0)
    appear = [pids[str(c["pid"])]["first"] - c["ready"] for c in seen if c["ready"] is not None]
    gone = [pids[str(c["pid"])]["last"] - c["exited"] for c in seen if c["exited"] is not None]
    stale = [c["pid"] for c in children if str(c["pid"]) in pids and c["exited"] is not None
             and pids[str(c["pid"])]["last"] - c["exited"] > SOAK_STALE_AFTER]
    unjudged = [c["pid"] for c in children if c["pid"] not in stale
                and (c["exited"] is None or c["exited"] + SOAK_STALE_AFTER > horizon)]
    summary["processes"] = {
        "spawned": len(children),
        "ready": sum(c["ready"] is not None for c in children),
        "failed": sum(c["returncode"] not in (0, None) and not c["stopped_by_us"]
                      for c in children),
        "seen": len(seen),
        "seen_in": {name: sum(name in pids[str(c["pid"])]["series"] for c in seen)
                    for name in ("gpu_process_memory_used_bytes",
                                 "gpu_process_utilization_ratio")},
        "distinct_pids_in_series": len(pids),
        "other_pids": sorted(int(p) for p in pids if p not in ours),
        "appeared_after_ready_s": timing_s(appear),
        "gone_after_exit_s": timing_s(gone),
        "stale": stale,
        "not_judged": len(unjudged),
    }
    if stale:
        errors.append(f"{len(stale)} exited child(ren) still in gpu_process_* series more "
                      f"than {SOAK_STALE_AFTER:g} s later: {stale}")
    churn = result["churn"]
    if "skipped" not in churn:
        ready = summary["processes"]["ready"]
        if not ready:
            errors.append("churn: no child got to its GPU work")
        elif not seen:
            errors.append("churn: no child's PID appeared in the gpu_process_* series")
    mps = result.get("mps")
    if mps is not None:
        summary["mps"] = {k: mps[k] for k in ("skipped", "scrapes", "scrapes_shared",
                                              "server_series_max") if k in mps}
        start = mps.get("daemon_start")
        if isinstance(start, dict) and start.get("rc") != 0:
            errors.append(f"MPS: the control daemon did not start: {start}")
        elif "skipped" not in mps and "skipped" not in churn and not mps.get("scrapes_shared"):
            errors.append("MPS: no scrape served a GPU as shared through MPS")
    summary["errors"] = errors
    return summary


def timing_s(values: list[float]) -> dict[str, Any]:
    """Median and max in seconds (``{"count": 0}`` for none)."""
    if not values:
        return {"count": 0}
    return {"count": len(values), "median": round(statistics.median(values), 2),
            "min": round(min(values), 2), "max": round(max(values), 2)}


def soak_churn_skipped(args: argparse.Namespace) -> str | None:
    """Why the soak runs without PyTorch's processes, or None when it runs them."""
    if args.library is not None:
        return "--library: a libnvidia-ml double, no GPU for PyTorch's processes"
    return None if have_torch() else "PyTorch is not installed"


def check_soak(args: argparse.Namespace, shared: Shared) -> int:
    """Part 6: the exporter (``--process-metrics``, GPM on, every second) on the driver for
    ``--soak-seconds`` while short-lived PyTorch processes come and go, scraped every second;
    every ``SOAK_EVERY`` s its RSS, fds, threads, CPU, the scrapes' latency and its own
    series (``soak.json``). The number of errors: failed scrapes, the exporter gone, collector
    errors (but the kubelet's: no cluster here), NVML down, stale process series, a churn
    that never reached the GPU or the series."""
    seconds = float(args.soak_seconds)
    warmup = min(SOAK_WARMUP, seconds / 3)
    skip = soak_churn_skipped(args)
    result: dict[str, Any] = {
        "seconds": seconds, "every": SOAK_EVERY, "warmup_seconds": warmup,
        "library": str(args.library) if args.library is not None else "driver",
        "exporter": {"command": "gpuscope-exporter --source nvml --interval 1 "
                                "--process-metrics (GPM on: the source's default cadence)"},
        "churn": {"skipped": skip} if skip else {
            "spawn_every_s": SOAK_SPAWN_EVERY, "max_at_once": SOAK_MAX_CHILDREN,
            "quiet_end_s": SOAK_QUIET_END, "children_seconds_size_mib": SOAK_CHILDREN},
        "points": [], "scrape_seconds": [], "scrape_errors": [], "pids": {},
        "children": [], "nvml_up_min": None, "last_sample_age_max": None, "gpm_series": None,
    }
    print(f"Soak: {seconds:g} s, a point every {SOAK_EVERY:g} s, warm-up {warmup:g} s; churn: "
          + (f"skipped ({skip})" if skip else
             f"a PyTorch process every {SOAK_SPAWN_EVERY:g} s, at most {SOAK_MAX_CHILDREN} "
             "at once"), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="gpuscope-soak-"))
    children: list[SoakChild] = []
    pids: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()

    def clock() -> float:
        return time.monotonic() - t0

    bad = 0
    env = without_pythonpath()
    mps: dict[str, Any] | None = None
    if getattr(args, "soak_mps", False):
        mps = result["mps"] = (start_soak_mps(workdir, env) if skip is None
                               else {"skipped": f"no processes to share it ({skip})"})
        print(f"  MPS: {mps.get('skipped') or mps['daemon_start']}", flush=True)
    try:
        with exporter_process(args, "exporter-soak.log") as (port, exporter):
            if port is None:
                result["error"] = "the exporter never became ready (exporter-soak.log)"
                return 1
            result["exporter"]["pid"] = exporter.pid
            url = f"http://127.0.0.1:{port}/metrics"
            t0 = time.monotonic()
            window: list[float] = []
            durations: dict[str, float] = {}
            own: dict[str, float] = {}
            next_spawn, tick = 1.0, 0
            while True:
                now = clock()
                if exporter.poll() is not None:
                    result["error"] = (f"the exporter exited (rc {exporter.returncode}) "
                                       f"after {now:.0f} s")
                    print(result["error"], flush=True)
                    break
                started = time.perf_counter()
                status, text = get(url)
                took = time.perf_counter() - started
                result["scrape_seconds"].append(took)
                window.append(took)
                scraped = clock()
                result["scraped_until"] = round(scraped, 2)
                try:
                    if status != 200:
                        raise ValueError(f"HTTP {status}: {text[:200]}")
                    found, own, gpm = read_soak_metrics(text)
                except Exception as exc:
                    result["scrape_errors"].append({"t": round(now, 1),
                                                    "error": f"{type(exc).__name__}: {exc}"})
                else:
                    for pid, names in found.items():
                        entry = pids.setdefault(pid, {"first": round(scraped, 2),
                                                      "series": set()})
                        entry["last"] = round(scraped, 2)
                        entry["series"] |= names
                    for key, value in own.items():
                        if key.startswith("collector_duration_seconds"):
                            name = key.partition("=")[2].rstrip("}")
                            durations[name] = max(durations.get(name, 0.0), value * 1000)
                    if "nvml_up" in own:
                        up = own["nvml_up"]
                        low = result["nvml_up_min"]
                        result["nvml_up_min"] = up if low is None else min(low, up)
                    if "last_sample_timestamp_seconds" in own:
                        age = round(time.time() - own["last_sample_timestamp_seconds"], 2)
                        result["last_sample_age_max"] = max(
                            age, result["last_sample_age_max"] or 0.0)
                    result["gpm_series"] = gpm
                    if mps is not None and "control" in mps:
                        mps_gpus, servers = read_mps_series(text)
                        mps["scrapes"] += 1
                        mps["scrapes_shared"] += mps_gpus > 0
                        mps["server_series_max"] = max(mps["server_series_max"], servers)
                if skip is None:
                    running = [c for c in children if c.running()]
                    for c in running:
                        if now - c.started > SOAK_CHILD_LIMIT:
                            c.stop()
                    if (now >= next_spawn and now < seconds - SOAK_QUIET_END
                            and len(running) < SOAK_MAX_CHILDREN):
                        children.append(SoakChild(len(children), env, workdir, clock))
                        next_spawn = now + SOAK_SPAWN_EVERY
                if now >= len(result["points"]) * SOAK_EVERY or now >= seconds:
                    point: dict[str, Any] = {"t": round(now, 1), **proc_stats(exporter.pid)}
                    point.update({
                        "scrapes": len(window),
                        "scrape_ms_median": round(1000 * statistics.median(window), 2),
                        "scrape_ms_max": round(1000 * max(window), 2),
                        "self": dict(own),
                        "collector_duration_max_ms": {k: round(v, 3)
                                                      for k, v in durations.items()},
                        "process_pids_now": sum(1 for e in pids.values()
                                                if e["last"] == round(scraped, 2)),
                        "process_pids_seen": len(pids),
                        "children_spawned": len(children),
                        "children_running": sum(c.running() for c in children)})
                    result["points"].append(point)
                    print(f"  t={point['t']:>6.1f} s  RSS {point.get('rss_kib', 0) / 1024:7.2f}"
                          f" MiB  fds {point.get('fds')}  threads {point.get('threads')}  "
                          f"scrape {point['scrape_ms_median']:.1f}/{point['scrape_ms_max']:.1f}"
                          f" ms  PIDs now/seen {point['process_pids_now']}/"
                          f"{point['process_pids_seen']}  children {point['children_spawned']}",
                          flush=True)
                    window, durations = [], {}
                if now >= seconds:
                    break
                tick += 1
                time.sleep(max(0.0, t0 + tick - time.monotonic()))
    finally:
        for c in children:
            c.stop()
        if mps is not None:
            stop_soak_mps(mps, env)
        result["children"] = [c.report() for c in children]
        result["pids"] = {str(pid): {"first": e["first"], "last": e["last"],
                                     "series": sorted(e["series"])}
                          for pid, e in sorted(pids.items())}
        result["scrape_seconds"] = [round(s, 5) for s in result["scrape_seconds"]]
        log = args.out / "exporter-soak.log"
        if log.is_file():
            lines = log.read_text(errors="replace").splitlines()
            result["exporter_log"] = {
                "lines": len(lines),
                "warnings": sum(" WARNING " in ln for ln in lines),
                "errors": sum(" ERROR " in ln or " CRITICAL " in ln for ln in lines),
                "tracebacks": sum(ln.startswith("Traceback") for ln in lines)}
        try:
            result["summary"] = soak_summary(result)
        except Exception as exc:
            result["summary"] = {"errors": [f"no summary: {type(exc).__name__}: {exc}"]}
        (args.out / "soak.json").write_text(json.dumps(result, indent=1, default=str))
        shutil.rmtree(workdir, ignore_errors=True)
    summary = result["summary"]
    print_soak(result)
    return bad + len(summary["errors"])


def print_soak(result: dict[str, Any]) -> None:
    s = result["summary"]
    print(f"\nSoak summary ({result['seconds']:g} s, {result['library']}):")
    rss = s.get("rss_mib_after_warmup")
    if rss:
        print(f"  RSS after {rss['from_t']:g} s: {rss['first']} -> {rss['last']} MiB (max "
              f"{rss['max']}, min {rss['min']}; {s['rss_mib_at_start']} at the start), slope "
              f"{s['rss_slope_kib_per_min']} KiB/min")
        for key in ("fds", "threads"):
            v = s[key]
            print(f"  {key}: {v['first']} -> {v['last']} (min {v['min']}, max {v['max']})")
        print(f"  CPU after the warm-up: {s.get('cpu_percent_after_warmup')} % of one core")
    sc = s["scrapes"]
    if sc.get("calls"):
        print(f"  scrapes: {sc['count']}, failed {sc['failed']}; ms median {sc['median_ms']}, "
              f"p90 {sc['p90_ms']}, max {sc['max_ms']}")
    print(f"  sampling rounds {s.get('sampling_rounds')}, missed {s.get('missed_rounds')}; "
          f"newest sample at most {s.get('last_sample_age_max_s')} s old at a scrape; NVML up "
          f"(min) {s.get('nvml_up_min')}; GPU(s) with GPM series {s.get('gpm_series')}")
    print(f"  collector errors during the soak: {s.get('collector_errors')} (expected here: "
          f"{', '.join(SOAK_EXPECTED_ERRORS)}); max duration ms: "
          f"{s.get('collector_duration_max_ms')}")
    if "exporter_log" in result:
        print(f"  exporter log: {result['exporter_log']}")
    if "skipped" in result["churn"]:
        print(f"  churn: skipped ({result['churn']['skipped']})")
    p = s.get("processes")
    if p:
        memory = p["seen_in"]["gpu_process_memory_used_bytes"]
        util = p["seen_in"]["gpu_process_utilization_ratio"]
        print(f"  processes: {p['spawned']} spawned, {p['ready']} ready, {p['failed']} failed; "
              f"{p['seen']} seen in gpu_process_* (memory {memory}, utilization {util}); "
              f"{p['distinct_pids_in_series']} distinct PIDs in the series, others "
              f"{p['other_pids']}")
        print(f"  appeared after ready (s): {p['appeared_after_ready_s']}; gone after exit (s): "
              f"{p['gone_after_exit_s']}; stale {p['stale']}, not judged {p['not_judged']}")
    m = s.get("mps")
    if m is not None:
        print("  MPS: " + (f"skipped ({m['skipped']})" if "skipped" in m else
                           f"{m.get('scrapes_shared')} of {m.get('scrapes')} scrapes served a "
                           f"GPU as shared through MPS; MPS servers' memory series at most "
                           f"{m.get('server_series_max')}"))
    print(f"  errors: {s['errors'] or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
