"""The demo fleet's hour of past (``DemoFleet.backfill``, what ``gpuscope-dashboard --demo``
does before it serves): seconds of wall clock and of this process' CPU, per run, and their
medians; ``--ingest`` times ``EmbeddedData.ingest`` alone over the hour's samples rendered
beforehand. Wall time follows the machine's load; CPU time much less.

    python3 bench/demo_backfill.py [--runs 3] [--ingest]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from gpuscope.dashboard.data import EmbeddedData, Sample
from gpuscope.dashboard.demo import DEMO_HISTORY, DEMO_SCRAPE_INTERVAL, DemoFleet, _samples
from gpuscope.dashboard.verdicts import registry
from gpuscope.exporter.sources.simulated import SimulatedSource


def backfill_once() -> tuple[float, float, int]:
    """Wall and CPU seconds of one backfill into a store set up as the CLI sets it up, and
    the points stored."""
    fleet = DemoFleet()
    store = EmbeddedData(fleet.start(), interval=DEMO_SCRAPE_INTERVAL,
                         extra_metrics=registry.step_metrics())
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        fleet.backfill(store, step=DEMO_SCRAPE_INTERVAL)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        points = sum(len(ring.times) for ring in store._rings.values())
    finally:
        store.close()
        fleet.stop()
    return wall, cpu, points


def ingest_once(scrapes: list[tuple[str, list[Sample], float]]) -> tuple[float, float, int]:
    """Wall and CPU seconds of ``EmbeddedData.ingest`` over ``scrapes``, and the points."""
    store = EmbeddedData([], interval=DEMO_SCRAPE_INTERVAL,
                         extra_metrics=registry.step_metrics())
    wall, cpu = time.perf_counter(), time.process_time()
    for node, samples, at in scrapes:
        store.ingest(node, samples, at)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    points = sum(len(ring.times) for ring in store._rings.values())
    store.close()
    return wall, cpu, points


def rendered() -> list[tuple[str, list[Sample], float]]:
    """The demo's hour as each node's exporter renders it, one scrape a step."""
    fleet = DemoFleet()
    fleet.start()
    start = time.time() - DEMO_HISTORY
    steps = int(DEMO_HISTORY / DEMO_SCRAPE_INTERVAL)
    try:
        out = []
        for node in fleet.nodes:
            past = SimulatedSource(node.scenario, start=start)
            for i in range(1, steps):
                at = i * DEMO_SCRAPE_INTERVAL
                out.append((node.name, list(_samples(past.sample_at(at, start + at), node)),
                            start + at))
        return out
    finally:
        fleet.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ingest", action="store_true",
                        help="time EmbeddedData.ingest alone over pre-rendered samples")
    args = parser.parse_args()
    scrapes = rendered() if args.ingest else []
    walls, cpus = [], []
    for _ in range(args.runs):
        wall, cpu, points = ingest_once(scrapes) if args.ingest else backfill_once()
        walls.append(wall)
        cpus.append(cpu)
        print(f"{'ingest' if args.ingest else 'backfill'}: {wall:.2f} s wall, {cpu:.2f} s CPU, "
              f"{points} points (load {os.getloadavg()[0]:.1f})", flush=True)
    print(f"median of {args.runs}: {statistics.median(walls):.2f} s wall, "
          f"{statistics.median(cpus):.2f} s CPU")


if __name__ == "__main__":
    main()
