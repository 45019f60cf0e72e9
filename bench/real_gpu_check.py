"""Compare gpuscope-exporter's NVML readings with nvidia-smi on a real GPU machine.

Not a test (CI has no GPU). Run it on a node with a driver:

    python3 bench/real_gpu_check.py [--out DIR]

It starts ``gpuscope-exporter --source nvml`` on a free loopback port, waits for /readyz,
scrapes /metrics, queries ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` at
the same moment, and prints one row per GPU and field: exporter value (converted back to
nvidia-smi's units), nvidia-smi value, and whether they agree within a tolerance that allows
for the two reads being a few hundred milliseconds apart. Raw outputs go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
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
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
