"""Compare gpuscope-exporter's NVML readings with nvidia-smi (and DCGM) on a real GPU machine.

Not a test (CI has no GPU). Run it on a node with a driver:

    python3 bench/real_gpu_check.py [--out DIR] [--window SECONDS] [--load]

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
* throttle time: the counters against ``nvidia-smi -q -d PERFORMANCE``'s clocks-event
  counters (SW power capping, sync boost, SW/HW thermal slowdown, HW power braking, in µs;
  drivers without them print none, and then only the reasons nvidia-smi shows as active are
  compared: an active reason must have grown);
* GPM: the rates of SM, tensor and DRAM active seconds against ``dcgmi dmon -e
  1002,1004,1005`` (SM_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE), when DCGM is installed and
  its host engine runs (DCGM reads the same GPM counters on Hopper);
* which series exist: GPM only on Hopper and newer (absent, never 0, elsewhere).

Every missing tool is reported as skipped, not as a failure. Raw outputs go to ``--out``;
the exit status is 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import functools
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("real-gpu-out"))
    parser.add_argument("--window", type=float, default=30.0,
                        help="seconds over which the work signals are compared (default 30)")
    parser.add_argument("--load", action="store_true",
                        help="run a matrix-multiply load on every GPU during the window "
                             "(needs PyTorch with CUDA)")
    parser.add_argument("--skip-exporter", action="store_true",
                        help="only the work signals (part 2)")
    parser.add_argument("--library", type=Path, metavar="SO",
                        help="part 2 loads this libnvidia-ml instead of libnvidia-ml.so.1 "
                             "(e.g. bench/fake_libnvml's, to try the script without a GPU)")
    args = parser.parse_args()
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi not found: run this on a GPU node with the NVIDIA driver installed")
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    bad = 0 if args.skip_exporter else check_exporter(args)
    bad += check_work_signals(args)
    return 1 if bad else 0


def check_exporter(args: argparse.Namespace) -> int:
    """Part 1: the exporter's /metrics against nvidia-smi's query; the number of mismatches."""
    port = free_port()
    exporter = subprocess.Popen(
        [sys.executable, "-m", "gpuscope.exporter",
         "--source", "nvml", "--listen", f"127.0.0.1:{port}",
         "--interval", "1", "--process-metrics"],
        stdout=(args.out / "exporter.log").open("w"), stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while get(f"http://127.0.0.1:{port}/readyz")[0] != 200:
            if time.monotonic() > deadline or exporter.poll() is not None:
                print("exporter never became ready; see exporter.log")
                return 1
            time.sleep(0.5)
        time.sleep(2.5)  # a couple of rounds, so per-process utilization has a window
        _, text = get(f"http://127.0.0.1:{port}/metrics")
        smi = subprocess.run(
            ["nvidia-smi", f"--query-gpu=index,uuid,{','.join(FIELDS)}",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, check=True,
        ).stdout
        full = subprocess.run(["nvidia-smi", "-q"], capture_output=True, text=True).stdout
    finally:
        exporter.terminate()
        exporter.wait(10)
    (args.out / "metrics.txt").write_text(text)
    (args.out / "nvidia-smi.csv").write_text(smi)
    (args.out / "nvidia-smi-q.txt").write_text(full)

    ours: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if "uuid" in s.labels:
                ours[(s.name, s.labels["uuid"])] = s.value
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


def run_text(cmd: list[str], timeout: float = 30) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


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
while time.time() < end:
    for x in xs:
        x @ x
    torch.cuda.synchronize()
"""


def start_load(seconds: float) -> subprocess.Popen[bytes] | None:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("--load: PyTorch is not installed; comparing the GPUs as they are")
        return None
    return subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)])


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


def check_work_signals(args: argparse.Namespace) -> int:
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
        time.sleep(3 if load else 1)  # the load ramps up; GPM needs a first sample
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
            load.terminate()
            load.wait(30)
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
                ours = ours_throttle.get(reason)
                # Cumulative since the driver loaded on both sides, read a moment apart.
                ok = ours is not None and abs(ours - theirs) <= 1.5 + 0.02 * theirs
                row(gpu, f"throttle {reason} (s since driver load)", ours, theirs, ok)
                start = perf_0.counters[n].get(reason) if n < len(perf_0.counters) else None
                if ours is not None and start is not None and reason in before:
                    grew, smi_grew = ours - before[reason], theirs - start
                    row(gpu, f"throttle {reason} increase in the window", grew, smi_grew,
                        abs(grew - smi_grew) <= 1.0 + 0.05 * args.window)
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
        ours = "None" if r["gpuscope"] is None else f"{r['gpuscope']:.4g}"
        ref = "-" if r["reference"] is None else f"{r['reference']:.4g}"
        print(f"{r['gpu']:>4} {r['signal']:<48} gpuscope={ours:<10} reference={ref:<10} "
              f"{'ok' if r['ok'] else 'MISMATCH'}")
    (args.out / "work-signals.json").write_text(json.dumps(rows, indent=1))
    print(f"{len(rows) - bad}/{len(rows)} work-signal checks agree")
    return bad


if __name__ == "__main__":
    sys.exit(main())
