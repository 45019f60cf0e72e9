"""Per-call cost of four paths the exporter's sampler thread pays every round, timed in
this process (wall clock, ``time.perf_counter``), median and p90 over ``--rounds`` calls:

- ``simulated``: ``SimulatedSource.sample()`` over ``synthetic(8, 64)`` (8 GPUs, up to 64
  processes each), on a fake clock one second apart;
- ``processes``: the same over ``synthetic(8, 1250)`` (10,000 processes, every fourth one
  coming and going), then the 500-series process cap (``keep_processes``): a crowded node's
  round with ``--process-metrics``;
- ``cloudwatch``: ``CloudWatchSink.__call__`` (the sampler's listener) for one snapshot of 8
  GPUs with both dimension sets, the client a recording double (sending is the flush
  thread's, not this path's);
- ``kubelet``: one ``PodResourcesClient.list_allocations()`` over the unix socket to the
  benchmark's fake kubelet (grpcio, the 8x64 node's allocations, 32 of them): a new HTTP/2
  connection, the call, its close.

These were assertions in unit tests once; a bound of milliseconds there tests the host's
scheduler, so the numbers live here and in docs/benchmarks.md. Usage::

    python bench/hot_paths.py [--rounds 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _timed(call: Callable[[], object], rounds: int) -> dict[str, float]:
    """Median and p90 of ``rounds`` calls, milliseconds."""
    took = []
    for _ in range(rounds):
        began = time.perf_counter()
        call()
        took.append((time.perf_counter() - began) * 1e3)
    took.sort()
    return {"median_ms": round(statistics.median(took), 3),
            "p90_ms": round(took[int(0.9 * (len(took) - 1))], 3), "calls": rounds}


def _simulated(rounds: int, per_gpu: int, cap: int | None) -> dict[str, float]:
    from gpuscope.exporter.cardinality import keep_processes
    from gpuscope.exporter.sources.scenario import synthetic_scenario
    from gpuscope.exporter.sources.simulated import SimulatedSource

    now = [0.0]
    source = SimulatedSource(synthetic_scenario(8, per_gpu), clock=lambda: now[0], start=0.0)

    def one() -> None:
        now[0] += 1.0
        snap = source.sample()
        if cap is not None:
            keep_processes(snap, cap)

    one()  # the first round builds the per-device state
    return _timed(one, rounds)


def simulated(rounds: int) -> dict[str, float]:
    return _simulated(rounds, 64, None)


def processes(rounds: int) -> dict[str, float]:
    return _simulated(rounds, 1250, 500)


def cloudwatch(rounds: int) -> dict[str, float]:
    from gpuscope.exporter.sinks.cloudwatch import Identity
    from tests.exporter.sinks.cloudwatch.helpers import (
        FakeClock,
        FakeCloudWatch,
        fake_sink,
        gpu,
        snapshot,
    )

    t0 = 1_784_000_040.0
    clock = FakeClock(t0)
    sink = fake_sink(clock, FakeCloudWatch(), identity=Identity(
        host="h", cluster_name="c", instance_type="p4d.24xlarge"))
    snaps = [snapshot(t0 + i, [gpu(g, (i % 7) / 7) for g in range(8)])
             for i in range(rounds + 1)]
    feed = iter(snaps)
    sink(next(feed))
    return _timed(lambda: sink(next(feed)), rounds)


def kubelet(rounds: int) -> dict[str, float]:
    from bench import exporter_bench as eb
    from gpuscope.exporter.kubernetes.podresources.client import PodResourcesClient

    args = eb.parse_args(["--gpus", "8", "--processes-per-gpu", "64"])
    with tempfile.TemporaryDirectory(prefix="gpuscope-hot-") as tmp:
        socket_path = Path(tmp) / "kubelet.sock"
        proc = eb.start_fake_kubelet(args, socket_path)
        try:
            client = PodResourcesClient(str(socket_path))
            try:
                allocations = client.list_allocations()  # imports h2 and protobuf
                result = _timed(client.list_allocations, rounds)
                result["allocations"] = len(allocations)
                return result
            finally:
                client.close()
        finally:
            eb.stop_process(proc)


PATHS: dict[str, Callable[[int], dict[str, float]]] = {
    "simulated": simulated, "processes": processes, "cloudwatch": cloudwatch,
    "kubelet": kubelet,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=200, help="timed calls per path (default 200)")
    p.add_argument("--only", choices=sorted(PATHS), action="append",
                   help="time only this path (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    results = {name: PATHS[name](args.rounds) for name in (args.only or PATHS)}
    if args.json:
        print(json.dumps(results, sort_keys=True))
    else:
        for name, r in results.items():
            extra = f", {r['allocations']} allocations" if "allocations" in r else ""
            print(f"{name:<11} median {r['median_ms']:.3f} ms, p90 {r['p90_ms']:.3f} ms "
                  f"({r['calls']} calls{extra})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
