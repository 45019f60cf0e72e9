"""PID -> container resolution on this machine's real /proc: path reads vs held stat files.

The exporter re-checks every GPU process's start time in every sampling round (PID reuse,
see ``exporter/kubernetes/cgroups.py``). ``exporter_bench.py --source nvml-fake`` cannot show what
that
costs on a node, because its processes live in a fake ``/proc`` tree of regular files, where
the resolver always reads by path. This script starts N real (sleeping) processes and times
``PidResolver.resolve`` over their PIDs on ``/proc``, both ways, alternating:

    python3 bench/resolver_bench.py            # 512 processes, 200 rounds each way
    python3 bench/resolver_bench.py --processes 64

It prints the median and p90 time of one round (all PIDs, every one a cache hit after the
first round) and the per-PID cost. Not a test: timings depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuscope.exporter.kubernetes.cgroups import PidResolver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)

    children = [subprocess.Popen(["sleep", "600"]) for _ in range(args.processes)]
    try:
        pids = [c.pid for c in children]
        resolvers = {
            "path reads (open/read/close per PID)": PidResolver("/proc", hold_fds=False),
            "held stat files (pread per PID)": PidResolver("/proc", hold_fds=True,
                                                           max_held_fds=args.processes),
        }
        times: dict[str, list[float]] = {name: [] for name in resolvers}
        for resolver in resolvers.values():
            resolver.resolve(pids)  # first round: every PID a miss, cgroup read
        for _ in range(args.rounds):
            for name, resolver in resolvers.items():
                started = time.perf_counter()
                resolver.resolve(pids)
                times[name].append(time.perf_counter() - started)
        print(f"PidResolver.resolve over {args.processes} live processes on /proc, "
              f"{args.rounds} rounds each, alternating:")
        for name, resolver in resolvers.items():
            samples = sorted(times[name])
            median = statistics.median(samples)
            p90 = samples[int(0.9 * (len(samples) - 1))]
            stats = resolver.stats()
            print(f"  {name:40s} median {median * 1e3:6.3f} ms, p90 {p90 * 1e3:6.3f} ms per "
                  f"round = {median / args.processes * 1e6:5.2f} µs per PID "
                  f"(hits {stats.cache_hits}, misses {stats.cache_misses}, "
                  f"held fds {stats.held_fds})")
            resolver.close()
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
