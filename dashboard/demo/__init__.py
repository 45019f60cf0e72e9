"""``gpuscope-dashboard --demo``: a simulated fleet in-process, and embedded scraping of it.

Every node is a real exporter, assembled the way ``gpuscope-exporter --source simulated``
assembles one (scenario -> :class:`SimulatedSource` + :class:`ScenarioInputs` ->
:class:`Attributor` + :class:`Sampler` -> ``build_registry`` -> :class:`ExporterServer`), on
a free loopback port. The scenarios next to this file plant one of each finding:

==============================  ==================  ========================================
node                            instance type       planted
==============================  ==================  ========================================
ip-10-0-1-11.ec2.internal       p5.48xlarge         straggler: rank 5 of PyTorchJob/llama-pretrain
ip-10-0-2-37.ec2.internal       p4d.24xlarge        idle node: 2 GPUs allocated-idle, 6 unallocated
ip-10-0-3-52.ec2.internal       g5.12xlarge         time-slice starved rerank-api; input-starved
                                                    resnet-finetune trainer
ip-10-0-4-18.ec2.internal       g5.12xlarge         idle node: all unallocated
ip-10-0-5-90.ec2.internal       g6.xlarge           idle node: allocated-idle dev pod
ip-10-0-5-91.ec2.internal       g6.xlarge           near miss: steady 6 % (not idle)
dgx-a100-01                     DGX-A100 (no price) busy, evenly loaded (nothing)
==============================  ==================  ========================================

The simulation is deterministic in scenario time, so the fleet can be given a past: the
demo starts its scenarios ``history`` seconds ago and fills the dashboard's store with
what the exporters would have served then (the same collectors render each past snapshot),
so the "for >= 30 min" verdicts have their evidence from the first page load. The
embedded mode itself (``--targets``) starts empty.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpuscope.dashboard.data import EmbeddedData, Sample, Target
from gpuscope.exporter.cli import build_registry
from gpuscope.exporter.config import parse_config
from gpuscope.exporter.kubernetes.apiserver import NodeInfo
from gpuscope.exporter.kubernetes.attribution import Attributor, attribute
from gpuscope.exporter.kubernetes.simulated import ScenarioInputs
from gpuscope.exporter.model import Snapshot
from gpuscope.exporter.sampler import Sampler
from gpuscope.exporter.sinks.prometheus.collectors.container import ContainerCollector
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector
from gpuscope.exporter.sinks.prometheus.server import ExporterServer
from gpuscope.exporter.sources.scenario import Scenario, load_scenario
from gpuscope.exporter.sources.simulated import SimulatedSource

log = logging.getLogger(__name__)

DEMO_HISTORY = 3600.0      # seconds of past the demo fleet comes with
DEMO_SCRAPE_INTERVAL = 5.0  # the demo's scrape interval, and the spacing of its past samples
#: At most this many passes fill the past (each catches up with the time the last one took:
#: the second covers some seconds, the third is usually empty).
_BACKFILL_PASSES = 5


def scenario_files() -> list[Path]:
    """The bundled demo scenarios, in a stable order."""
    folder = resources.files("gpuscope.dashboard.demo")
    return sorted(Path(str(folder.joinpath(name.name))) for name in folder.iterdir()
                  if name.name.endswith(".yaml"))


@dataclass
class _Node:
    scenario: Scenario
    source: SimulatedSource
    inputs: ScenarioInputs
    attributor: Attributor
    sampler: Sampler
    server: ExporterServer

    @property
    def name(self) -> str:
        return self.scenario.node.name

    @property
    def target(self) -> Target:
        return Target(url=f"http://127.0.0.1:{self.server.port}/metrics", node=self.name)


def _samples(snapshot: Snapshot, node: _Node) -> Iterator[Sample]:
    """What the exporter's collectors would have rendered for ``snapshot``."""
    pids = {p.pid for d in snapshot.devices for p in d.processes}
    attribution = attribute(
        snapshot, node.inputs.allocations(), node.inputs.containers_of(pids),
        node.inputs.metadata(), node_fallback=NodeInfo(),
    )
    for collector in (GpuCollector(lambda: snapshot), ContainerCollector(lambda: attribution)):
        for family in collector.collect():
            for s in family.samples:
                yield s.name, s.labels, s.value


class DemoFleet:
    """Starts one simulated exporter per scenario on 127.0.0.1 (free ports)."""

    def __init__(
        self,
        scenarios: Sequence[str | Path] | None = None,
        *,
        interval: float = 1.0,
        history: float = DEMO_HISTORY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._paths = [Path(p) for p in scenarios] if scenarios else scenario_files()
        self._interval = interval
        self._history = history
        self._clock = clock
        self._started = clock()
        self.nodes: list[_Node] = []

    def start(self) -> tuple[Target, ...]:
        for path in self._paths:
            scenario = load_scenario(path)
            cfg = parse_config(
                ["--source", "simulated", "--listen", "127.0.0.1:0",
                 "--node-name", scenario.node.name, "--interval", str(self._interval)],
                environ={},
            )
            source = SimulatedSource(scenario, clock=self._clock,
                                     start=self._started - self._history)
            inputs = ScenarioInputs(scenario)
            attributor = Attributor(inputs)
            sampler = Sampler(source, cfg.interval, clock=self._clock, listeners=(attributor,))
            registry = build_registry(cfg, sampler, attributor)
            server = ExporterServer(cfg.listen_host, 0, registry, sampler.alive, sampler.ready)
            node = _Node(scenario, source, inputs, attributor, sampler, server)
            sampler.start()
            server.start()
            self.nodes.append(node)
            log.info("demo node %s on %s", node.name, node.target.url)
        return tuple(n.target for n in self.nodes)

    def backfill(self, store: EmbeddedData, step: float = DEMO_SCRAPE_INTERVAL) -> int:
        """Fills ``store`` with the fleet's past (``history`` seconds, every ``step``: use
        the store's scrape interval, so past and live data are equally dense).

        The past reaches up to now, so that the first page load has data in its latest
        step before the first live scrape, and so that no step of a short window goes
        without a sample between the past and the live scrapes (a missing step breaks every
        run a verdict rests on). Generating an hour takes a while (20 s on a busy 2-core
        machine, longer than the 15-minute window's 7.5 s step), so the past is filled in
        passes, each up to where the clock stood at its start, until less than a step is
        left.

        Each pass stops two sampling intervals short of the clock, and the last sample is
        placed there, off the step grid: a live scrape stamped now serves the exporter's
        latest sample, taken up to an interval earlier, and a past sample later than that
        would make every counter seem to go back (a reset: the rate of its whole value, 36
        instead of 0.1 for an SM activity in one run). The first live scrape follows some
        2 s later.
        Returns the number of past scrapes stored."""
        count = 0
        start = self._started - self._history
        # A source of its own per node (the live one belongs to the sampler thread), kept
        # across the passes: each continues where the last one stopped.
        pasts = [(node, SimulatedSource(node.scenario, clock=self._clock, start=start))
                 for node in self.nodes]

        def ingest(times: Sequence[float]) -> int:
            for node, past in pasts:
                for at in times:
                    store.ingest(node.name, _samples(past.sample_at(at, start + at), node),
                                 start + at)
            return len(times) * len(pasts)

        t = step
        for _ in range(_BACKFILL_PASSES):
            until = self._clock() - start - 2 * self._interval
            if t >= until:
                break
            n = math.ceil((until - t) / step)
            count += ingest([t + i * step for i in range(n)])
            t += n * step
        if until > t - step:
            count += ingest([until])
        return count

    def stop(self) -> None:
        # The servers stop together: each one's shutdown waits for its serve loop's next
        # poll (up to 0.5 s), and after a backfill, with their loops out of step, the 11
        # nodes' one after the other took 2.4 s.
        if self.nodes:
            with ThreadPoolExecutor(len(self.nodes), "gpuscope-demo-stop") as pool:
                list(pool.map(lambda node: node.server.stop(), self.nodes))
        for node in self.nodes:
            node.sampler.stop()
            node.attributor.close()
            node.source.close()
        self.nodes.clear()
