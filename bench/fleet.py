#!/usr/bin/env python3
"""A large simulated GPU fleet as stored samples, and the verdicts the dashboard must find in it.

    python bench/fleet.py --nodes 200 --out /tmp/fleet200            # both stores, 15 s step
    python bench/fleet.py --nodes 5000 --step 60 --out $SETS/f57

Every node plays one of the demo fleet's scenarios (``dashboard/demo/*.yaml``, each with its
planted findings, see :data:`TEMPLATES`) through the exporter's own ``SimulatedSource``,
attribution and collectors, so the series are the ones the exporter serves (the families the
dashboard reads, :data:`KEEP`), one sample per series every ``--step`` seconds over
``--window`` plus 5 minutes of look-back, ending ``end`` (by default 2 minutes ago).

Each copy of a template gets its own node name (``gpu-node-00042``), GPU UUIDs, pod names,
workload (``PyTorchJob/llama-pretrain-0007``: every copy is its own job), a namespace of one
of :data:`TEAMS` teams (``ml-train-3``), a zone (:data:`ZONES`, in turn) and every
:data:`SPOT_EVERY`-th copy runs on spot capacity; its samples start at one of :data:`PHASES`
offsets in scenario time, so nodes of one template do not read alike.

With ``--clusters N`` the nodes are spread over N clusters (``eks-00``, ``eks-01``, ...:
:func:`spread`), their series labelled ``cluster`` as a central store holding several clusters
keeps them, and node names repeat from one cluster to the next (``gpu-node-00000`` in every
cluster), so the dashboard must key a node by its cluster and name (``eks-03/gpu-node-00042``).

:func:`expected` states what the dashboard must show for such a fleet, from the templates'
planted findings (written down here from the scenario files, as
``tests/dashboard/test_demo_views.py`` checks them on the demo) and the price table: the idle
nodes, spinning and throttled GPUs, starved containers, straggler ranks, allocated-idle
containers, idle MIG slices and the idle $/hour. It never runs the dashboard's analysis.

Output (``--out DIR``): ``tsdb/`` (Prometheus blocks, from ``promtool tsdb
create-blocks-from openmetrics``), ``vm/`` (a VictoriaMetrics ``-storageDataPath`` the samples
were imported into through ``/api/v1/import``), ``meta.json`` (size, times, build figures)
and ``expected.json``. ``tests/stores.py`` starts either store on them. The generator streams:
what it holds is one sampled copy of each template per phase, whatever the fleet's size.
"""

from __future__ import annotations

import argparse
import json
import math
import queue
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpuscope.dashboard.data.promql import node_key  # noqa: E402
from gpuscope.dashboard.prices import PriceTable, bundled_prices  # noqa: E402
from gpuscope.exporter.kubernetes.apiserver import NodeInfo  # noqa: E402
from gpuscope.exporter.kubernetes.attribution import attribute  # noqa: E402
from gpuscope.exporter.kubernetes.simulated import ScenarioInputs  # noqa: E402
from gpuscope.exporter.sinks.prometheus.collectors.container import (  # noqa: E402
    ContainerCollector,
)
from gpuscope.exporter.sinks.prometheus.collectors.gpu import GpuCollector  # noqa: E402
from gpuscope.exporter.sources.scenario import load_scenario  # noqa: E402
from gpuscope.exporter.sources.simulated import SimulatedSource  # noqa: E402

DEMO = REPO / "dashboard" / "demo"

#: The families the fleet page and the drill-downs read; the exporter's others are left out.
KEEP = frozenset({
    "gpu_info", "gpu_node_info", "gpu_pod_info", "gpu_utilization_ratio",
    "gpu_memory_used_bytes", "container_gpu_allocated", "container_gpu_utilization_ratio",
    "container_gpu_memory_used_bytes",
    # the work signals (issue 15)
    "gpu_busy_seconds_total", "gpu_sm_active_seconds_total", "gpu_tensor_active_seconds_total",
    "gpu_dram_active_seconds_total", "gpu_energy_joules_total", "gpu_power_watts",
    "gpu_power_limit_watts", "gpu_throttle_seconds_total", "gpu_sm_clock_hertz",
    "gpu_temperature_celsius",
})
LOOKBACK = 300.0         # seconds of samples before the window (Prometheus' look-back delta)
PAGE_POINTS = 60         # the dashboard's steps per window (``PrometheusStore`` max_points)
END_LAG = 120.0          # the default end: this many seconds before the build
SCENARIO_START = 3600.0  # scenario time of a node's first sample (scenarios are settled by then)
PHASES = 8               # distinct starting offsets (in steps) per template
TEAMS = 10               # namespaces are "<template namespace>-<copy % TEAMS>"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d")
SPOT_EVERY = 5           # every 5th copy of a template is a spot node
CLUSTER_LABEL = "cluster"  # the store label of a node's cluster (the dashboard's default)
JOB = "gpuscope"
PORT = 9463


# -- the templates and what they plant ------------------------------------------------------

@dataclass(frozen=True)
class Plant:
    """What one node of a template shows on the fleet page (``gpu`` as the dashboard names
    devices: ``"5"``, a MIG slice ``"6/2"``; pods and workloads by their template names)."""

    idle_node: tuple[int, int, int] | None = None   # (GPUs, allocated-idle GPUs, spinning)
    spinning: tuple[str, ...] = ()
    throttled: tuple[tuple[str, str], ...] = ()      # (gpu, reason)
    starved: tuple[tuple[str, str, str, str, str], ...] = ()  # kind, ns, pod, container, gpu
    # (workload, pod, gpu, kind, signal)
    stragglers: tuple[tuple[str, str, str, str, str], ...] = ()
    allocated_idle: tuple[tuple[str, str, str, str], ...] = ()  # ns, pod, gpu, signal
    idle_slices: tuple[tuple[str, str, bool], ...] = ()      # gpu, profile, allocated
    workloads_checked: int = 0  # workloads with two or more GPUs (on the whole unit)


@dataclass(frozen=True)
class Template:
    """One or more scenario files played together (a job over two nodes is one unit)."""

    name: str
    files: tuple[str, ...]
    share: float                   # of the fleet's nodes
    plants: tuple[Plant, ...]      # one per file
    instance_type: str | None = None  # overrides the scenario's (a priced busy node)

    @property
    def size(self) -> int:
        return len(self.files)


#: The fleet's mix. The plants are the demo scenarios' (their header comments;
#: ``tests/dashboard/test_demo_views.py`` checks the demo shows exactly these).
TEMPLATES: tuple[Template, ...] = (
    # busy, evenly loaded 8-GPU training (the on-prem DGX scenario, priced as a p4d): nothing
    Template("busy", ("onprem-dgx",), 0.28, (Plant(workloads_checked=1),),
             instance_type="p4d.24xlarge"),
    Template("straggler", ("p5-train",), 0.10, (Plant(
        stragglers=(("PyTorchJob/llama-pretrain", "llama-pretrain-worker-5", "5", "stalled",
                     "utilization"),), workloads_checked=1),)),
    Template("slow-rank", ("p5-slow-a", "p5-slow-b"), 0.10, (
        Plant(throttled=(("3", "thermal"),),
              stragglers=(("PyTorchJob/mixtral-pretrain", "mixtral-pretrain-worker-3", "3",
                           "slow", "sm"),), workloads_checked=1),
        Plant())),
    Template("mixed", ("p5-mixed",), 0.10, (Plant(
        allocated_idle=(("research", "notebook-carol", "6/2", "sm"),),
        idle_slices=(("6/2", "3g.40gb", True), ("7/2", "3g.40gb", False)),
        workloads_checked=2),)),  # llm-decode, cfd-solver (asr-api runs on MIG slices)
    Template("idle-allocated", ("p4d-idle",), 0.10, (Plant(
        idle_node=(8, 2, 0),
        allocated_idle=(("research", "jupyter-dana", "0", "utilization"),
                        ("research", "jupyter-dana", "1", "utilization"))),)),
    Template("hung", ("p5-hung",), 0.04, (Plant(
        idle_node=(8, 8, 8), spinning=tuple(str(i) for i in range(8)),
        workloads_checked=1),)),
    Template("unpriced", ("onprem-dgx",), 0.04, (Plant(workloads_checked=1),)),
    Template("serving", ("g5-serve",), 0.06, (Plant(
        starved=(("time-slice", "serving", "rerank-api-6b8c7d9f5-m3n8z", "server", "0"),
                 ("input-starved", "vision", "resnet-finetune-8kq2x", "trainer", "1")),
        workloads_checked=1),)),  # llm-api (2 replicas)
    Template("idle", ("g5-idle",), 0.06, (Plant(idle_node=(4, 0, 0)),)),
    Template("dev", ("g6-dev",), 0.06, (Plant(
        idle_node=(1, 1, 0),
        allocated_idle=(("research", "dev-erin-0", "0", "utilization"),)),)),
    Template("near-miss", ("g6-ocr",), 0.06, (Plant(),)),
)


def _has_finding(plant: Plant) -> bool:
    return bool(plant.idle_node or plant.spinning or plant.throttled or plant.starved
                or plant.stragglers or plant.allocated_idle or plant.idle_slices)


#: The templates whose units plant a finding (a two-node unit counts whole: its second node
#: belongs to the flagged job); the others (busy, unpriced, near miss) plant none.
FLAGGED = frozenset(t.name for t in TEMPLATES if any(_has_finding(p) for p in t.plants))


def flagged_mix(share: float) -> tuple[Template, ...]:
    """:data:`TEMPLATES` with the templates that plant a finding on ``share`` of the nodes
    together (in the default mix's proportions among themselves) and the others on the rest
    (likewise). The default mix has them on 62 % of the nodes (57 % carry a finding: a
    slow-rank job's second node carries none), a fleet in a bad hour; a fleet page's cost
    in the store grows with its findings (docs/benchmarks.md, tenth pass)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"the flagged share must be between 0 and 1, not {share}")
    flagged = sum(t.share for t in TEMPLATES if t.name in FLAGGED)
    clean = sum(t.share for t in TEMPLATES if t.name not in FLAGGED)
    return tuple(replace(t, share=t.share * (share / flagged if t.name in FLAGGED
                                             else (1.0 - share) / clean))
                 for t in TEMPLATES)


def _carrying(t: Template) -> float:
    """The share of a unit of ``t``'s nodes that carry a finding (a slow-rank job: 1 of 2)."""
    return sum(_has_finding(p) for p in t.plants) / t.size


def carrying_mix(share: float) -> tuple[Template, ...]:
    """A mix whose nodes carry a finding on ``share`` of the fleet: :func:`flagged_mix` at
    the flagged share that gives it where one does (up to 91 %); above that, no clean node,
    and the units of which only some nodes carry a finding (the slow-rank job) cut to the
    share that gives it, the other finding templates in the default mix's proportions."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"the carrying share must be between 0 and 1, not {share}")
    flagged = [t for t in TEMPLATES if t.name in FLAGGED]
    total = sum(t.share for t in flagged)
    most = sum(t.share * _carrying(t) for t in flagged) / total  # of the flagged nodes
    if share < most:
        return flagged_mix(share / most)
    whole = [t for t in flagged if _carrying(t) == 1.0]
    part = [t for t in flagged if _carrying(t) < 1.0]
    part_total = sum(t.share for t in part)
    part_carry = sum(t.share * _carrying(t) for t in part) / part_total
    # whole + parts = 1 and whole + parts * part_carry = share
    parts = (1.0 - share) / (1.0 - part_carry)
    whole_total = sum(t.share for t in whole)
    scale = {t.name: (1.0 - parts) / whole_total for t in whole}
    scale.update({t.name: parts / part_total for t in part})
    return tuple(replace(t, share=t.share * scale.get(t.name, 0.0)) for t in TEMPLATES)


def template(name: str) -> Template:
    for t in TEMPLATES:
        if t.name == name:
            return t
    raise KeyError(name)


# -- the plan: which node plays what ----------------------------------------------------------

@dataclass(frozen=True)
class NodePlan:
    index: int
    name: str
    template: str
    position: int   # which file of the template's unit
    copy: int       # the unit's number among its template's units
    unit: int       # the node index of the unit's first node: names its pods and workloads
    phase: int      # offset in steps into the template's samples
    zone: str
    capacity_type: str
    instance_type: str
    #: The cluster whose store label (``cluster``) the node's series carry, as a central
    #: store holding several clusters labels them ("": none, one cluster).
    cluster: str = ""

    @property
    def team(self) -> int:
        return self.copy % TEAMS


def node_name(index: int) -> str:
    return f"gpu-node-{index:05d}"


def plan(nodes: int, mix: Sequence[Template] = TEMPLATES) -> list[NodePlan]:
    """``nodes`` nodes, split by the templates' shares (largest remainders; a unit of two
    files counts two nodes), in template order. Deterministic."""
    if nodes < 1:
        raise ValueError("nodes must be at least 1")
    total = sum(t.share for t in mix)
    want = [nodes * t.share / total / t.size for t in mix]
    units = [math.floor(w) for w in want]
    order = sorted(range(len(mix)), key=lambda i: want[i] - units[i], reverse=True)
    for i in order:
        if sum(u * t.size for u, t in zip(units, mix, strict=True)) + mix[i].size > nodes:
            continue
        units[i] += 1
        if sum(u * t.size for u, t in zip(units, mix, strict=True)) >= nodes:
            break
    # Whatever is still missing (units of two left over): single-file templates, in turn.
    singles = [i for i, t in enumerate(mix) if t.size == 1]
    k = 0
    while sum(u * t.size for u, t in zip(units, mix, strict=True)) < nodes:
        units[singles[k % len(singles)]] += 1
        k += 1
    return layout(dict(zip((t.name for t in mix), units, strict=True)), mix)


def layout(units: dict[str, int], mix: Sequence[Template] = TEMPLATES) -> list[NodePlan]:
    """The nodes of ``units`` units of each template (by name), in ``mix`` order."""
    out: list[NodePlan] = []
    for t in mix:
        for copy in range(units.get(t.name, 0)):
            for position, file in enumerate(t.files):
                index = len(out)
                unit = index - position
                scenario = _scenario_node(file)
                spot = copy % SPOT_EVERY == SPOT_EVERY - 1
                out.append(NodePlan(
                    index=index, name=node_name(index), template=t.name, position=position,
                    copy=copy, unit=unit, phase=copy % PHASES, zone=ZONES[copy % len(ZONES)],
                    capacity_type="spot" if spot else scenario[1],
                    instance_type=t.instance_type or scenario[0]))
    return out


def cluster_name(k: int) -> str:
    return f"eks-{k:02d}"


def spread(nodes: Sequence[NodePlan], clusters: int) -> list[NodePlan]:
    """``nodes`` (:func:`plan`, :func:`layout`) over ``clusters`` clusters named by
    :func:`cluster_name`: unit by unit in plan order, each to the cluster with the fewest
    nodes so far (the first of them on a tie), so every cluster gets its share of every
    template and a two-node job stays in one cluster. Names count from 0 within each cluster
    (the same ``gpu-node-00000`` in every cluster, as EKS names nodes after their private
    addresses, which clusters in default VPCs share); index, unit, pods, workloads and GPU
    UUIDs stay the fleet's own."""
    if not 1 <= clusters <= len(nodes):
        raise ValueError(f"clusters must be between 1 and the number of nodes, not {clusters}")
    sizes = [0] * clusters
    k = 0
    out: list[NodePlan] = []
    for node in nodes:
        if node.position == 0:
            k = min(range(clusters), key=lambda i: sizes[i])
        out.append(replace(node, name=node_name(sizes[k]), cluster=cluster_name(k)))
        sizes[k] += 1
    return out


def plan_key(node: NodePlan) -> str:
    """A node's key on the fleet page: ``cluster/node`` where it has a cluster (the
    dashboard's :func:`~gpuscope.dashboard.data.promql.node_key`), else its name."""
    return node_key(node.cluster, node.name)


@cache
def _scenario_node(file: str) -> tuple[str, str]:
    node = load_scenario(DEMO / f"{file}.yaml").node
    return node.instance_type or "", node.capacity_type


# -- renaming a template's labels for one node -----------------------------------------------

def rename_namespace(namespace: str, node: NodePlan) -> str:
    return f"{namespace}-{node.team}" if namespace else namespace


def rename_workload(workload: str, node: NodePlan) -> str:
    """``Kind/name`` -> ``Kind/name-00042`` (the unit's first node): every unit is its own
    workload."""
    if not workload:
        return workload
    return f"{workload}-{node.unit:05d}"


def rename_pod(pod: str, node: NodePlan) -> str:
    """``llama-pretrain-worker-5`` -> ``llama-pretrain-worker-5-00042`` (the unit's first
    node): unique in its namespace, the same on both nodes of a two-node unit."""
    return f"{pod}-{node.unit:05d}"


def rename_uuid(uuid: str, node: NodePlan) -> str:
    """The node's number in place of the UUID's last 5 digits (a time-slicing replica's
    ``::n`` kept)."""
    if not uuid:
        return uuid
    base, sep, replica = uuid.partition("::")
    return f"{base[:-5]}{node.index:05d}{sep}{replica}"


# -- sampling the templates -------------------------------------------------------------------

Labels = tuple[tuple[str, str], ...]


@dataclass
class TemplateSeries:
    """One template file's series: values per step from scenario time ``SCENARIO_START``
    (``times + PHASES`` of them; NaN where the series is absent)."""

    node: str
    series: dict[tuple[str, Labels], list[float]]
    by_family: dict[str, list[tuple[Labels, list[float]]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for (name, labels), values in self.series.items():
            self.by_family.setdefault(name, []).append((labels, values))


def sample_template(file: str, times: int, step: float) -> TemplateSeries:
    """Plays ``dashboard/demo/<file>.yaml`` for ``times`` steps of ``step`` seconds through
    the exporter's SimulatedSource, attribution and collectors, keeping :data:`KEEP`."""
    scenario = load_scenario(DEMO / f"{file}.yaml")
    source = SimulatedSource(scenario, start=0.0)
    inputs = ScenarioInputs(scenario)
    series: dict[tuple[str, Labels], list[float]] = {}
    for k in range(times):
        t = SCENARIO_START + k * step
        snap = source.sample_at(t, timestamp=t)
        pids = {p.pid for d in snap.devices for p in d.processes}
        att = attribute(snap, inputs.allocations(), inputs.containers_of(pids),
                        inputs.metadata(), node_fallback=NodeInfo())
        collectors = (GpuCollector(lambda snap=snap: snap),  # type: ignore[misc]
                      ContainerCollector(lambda att=att: att))  # type: ignore[misc]
        for collector in collectors:
            for family in collector.collect():
                for s in family.samples:
                    if s.name not in KEEP:
                        continue
                    key = (s.name, tuple(sorted(s.labels.items())))
                    series.setdefault(key, [math.nan] * times)[k] = s.value
    return TemplateSeries(scenario.node.name, series)


def node_labels(labels: Labels, node: NodePlan) -> dict[str, str]:
    """A template series' labels as this node's exporter would serve them, with the target
    labels Prometheus adds (``job``, ``instance``) and ``node`` (the relabelled node name the
    dashboard groups by)."""
    lab = dict(labels)
    ns, pod = lab.get("namespace"), lab.get("pod")
    if pod:
        lab["pod"] = rename_pod(pod, node)
    if ns is not None:
        lab["namespace"] = rename_namespace(ns, node)
    if lab.get("workload"):
        lab["workload"] = rename_workload(lab["workload"], node)
    for key in ("uuid", "parent_uuid"):
        if lab.get(key):
            lab[key] = rename_uuid(lab[key], node)
    if "instance_type" in lab:  # gpu_node_info
        lab.update(instance_type=node.instance_type, zone=node.zone,
                   capacity_type=node.capacity_type, node_name=node.name)
    lab.update(node=node.name, job=JOB, instance=f"{node.name}:{PORT}")
    if node.cluster:
        lab[CLUSTER_LABEL] = node.cluster
    return lab


# -- the fleet's samples ----------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """The data set's time axis: ``times`` samples every ``step`` s ending at ``end``."""

    nodes: int
    step: float
    window: float
    end: float
    #: Seconds of samples before the window (:func:`build`'s sets: a page step more).
    lead: float = LOOKBACK

    @property
    def times(self) -> int:
        return int((self.window + self.lead) // self.step) + 1

    @property
    def start(self) -> float:
        return self.end - (self.times - 1) * self.step

    def stamps(self) -> list[float]:
        return [self.start + k * self.step for k in range(self.times)]


class Fleet:
    """The samples of :func:`plan`'s nodes over ``shape``, in two formats, streamed.
    ``families``: those written (:data:`KEEP`; a test's fleet may add one it makes)."""

    families: frozenset[str] = KEEP

    def __init__(self, shape: Shape, nodes: Sequence[NodePlan] | None = None, *,
                 replicas: Mapping[str, Sequence[str]] | None = None) -> None:
        """``nodes``: :func:`plan`'s for ``shape.nodes`` unless given (e.g. :func:`layout`).
        ``replicas``: an HA pair's copies, ``{label: (value, ...)}`` (e.g.
        ``{"prometheus_replica": ("0", "1")}``): every series once per value, with the
        label, as two Prometheus replicas scraping one cluster write it to one store."""
        if replicas is not None and (len(replicas) != 1 or not next(iter(replicas.values()))):
            raise ValueError("replicas: one label with one value or more")
        self.replicas = dict(replicas or {})
        self.shape = shape
        self.plan = list(nodes) if nodes is not None else plan(shape.nodes)
        if len(self.plan) != shape.nodes:
            raise ValueError(f"{len(self.plan)} nodes planned for a shape of {shape.nodes}")
        self._templates: dict[str, TemplateSeries] = {}
        self.series = 0
        self.samples = 0

    def template_series(self, file: str) -> TemplateSeries:
        if file not in self._templates:
            self._templates[file] = sample_template(file, self.shape.times + PHASES,
                                                    self.shape.step)
        return self._templates[file]

    def _files(self, node: NodePlan) -> str:
        return template(node.template).files[node.position]

    def series_of(self, family: str | None = None
                  ) -> Iterator[tuple[str, dict[str, str], list[float], list[int]]]:
        """Per series (of ``family``, or all): name, labels, values and the indexes of
        :meth:`Shape.stamps` they are at (absent samples left out)."""
        times = self.shape.times
        for node in self.plan:
            ts = self.template_series(self._files(node))
            names = [family] if family is not None else sorted(ts.by_family)
            for name, labels, values in ((n, lab, v) for n in names
                                         for lab, v in ts.by_family.get(n, ())):
                window = values[node.phase:node.phase + times]
                ks = [k for k, v in enumerate(window) if v == v]
                if not ks:
                    continue
                lab = node_labels(labels, node)
                if not self.replicas:
                    yield name, lab, window, ks
                for label, values_ in self.replicas.items():
                    for value in values_:
                        yield name, {**lab, label: value}, window, ks

    def openmetrics(self) -> Iterator[str]:
        """OpenMetrics text with timestamps (s), family by family, for ``promtool tsdb
        create-blocks-from openmetrics``. Counts :attr:`series` and :attr:`samples`."""
        stamps = [f"{t:.3f}" for t in self.shape.stamps()]
        self.series = self.samples = 0
        for family in sorted(self.families):
            counter = family.endswith("_total")
            base = family.removesuffix("_total") if counter else family
            yield f"# TYPE {base} {'counter' if counter else 'gauge'}\n"
            for name, lab, values, ks in self.series_of(family):
                text = ",".join(f'{k}="{v}"' for k, v in sorted(lab.items()))
                head = f"{name}{{{text}}} "
                self.series += 1
                self.samples += len(ks)
                yield "".join(f"{head}{values[k]!r} {stamps[k]}\n" for k in ks)
        yield "# EOF\n"

    def vm_json_lines(self) -> Iterator[bytes]:
        """VictoriaMetrics' ``/api/v1/import`` format: one JSON object per series with its
        values and timestamps (ms). Counts :attr:`series` and :attr:`samples`."""
        stamps = [round(t * 1000) for t in self.shape.stamps()]
        self.series = self.samples = 0
        for name, lab, values, ks in self.series_of():
            self.series += 1
            self.samples += len(ks)
            yield (json.dumps({"metric": {"__name__": name, **lab},
                               "values": [values[k] for k in ks],
                               "timestamps": [stamps[k] for k in ks]},
                              separators=(",", ":")) + "\n").encode()


def scrapes(fleet: Fleet) -> Iterator[tuple[float, str, list[tuple[str, dict[str, str], float]]]]:
    """The fleet's samples as its exporters serve them, scrape by scrape in time order: per
    stamp of :meth:`Shape.stamps` and node (plan order), the time, the node's name and its
    samples ``(name, labels, value)`` without the labels the scraper adds (``node``, from
    ``gpu_node_info{node_name}`` by the scrape config's relabelling; ``job`` and
    ``instance``, the target's), absent samples left out: for ``EmbeddedData.ingest(node,
    samples, time)``, the same samples :meth:`Fleet.openmetrics` and
    :meth:`Fleet.vm_json_lines` give the stores."""
    scraper = ("node", "job", "instance")
    stamps = fleet.shape.stamps()
    per_node: dict[tuple[str, str], list[tuple[str, dict[str, str], list[float]]]] = {}
    for name, lab, values, _ in fleet.series_of():
        bare = {k: v for k, v in lab.items() if k not in scraper}
        per_node.setdefault((lab.get(CLUSTER_LABEL, ""), lab["node"]), []).append(
            (name, bare, values))
    for k, t in enumerate(stamps):
        for node in fleet.plan:
            samples = [(name, lab, values[k]) for name, lab, values
                       in per_node.get((node.cluster, node.name), ()) if values[k] == values[k]]
            if samples:
                yield t, node.name, samples


# -- what the dashboard must find -------------------------------------------------------------

@dataclass
class IdleNode:
    instance_type: str
    zone: str
    capacity_type: str
    gpus: int
    allocated_idle: int
    spinning: int
    price_per_hour: float | None


@dataclass
class Expected:
    """The verdicts of a fleet from its plan and the templates' plants. Pods, namespaces and
    workloads are renamed as in the data; ``gpu`` as the dashboard names devices; ``node``
    as the dashboard keys nodes (:func:`plan_key`: ``cluster/node`` where the fleet has
    clusters)."""

    nodes: int
    gpus: int                                   # physical GPUs
    idle_nodes: dict[str, IdleNode]
    idle_gpus: int                              # idle, not spinning (the KPI "idle")
    spinning: list[tuple[str, str]]             # (node, gpu)
    throttled: list[tuple[str, str, str]]       # (node, gpu, reason)
    starved: list[tuple[str, str, str, str, str, str]]  # kind, ns, pod, container, node, gpu
    stragglers: list[tuple[str, str, str, str, str, str]]  # wl, pod, node, gpu, kind, signal
    allocated_idle: list[tuple[str, str, str, str, str]]   # node, ns, pod, gpu, signal
    idle_slices: list[tuple[str, str, str, bool]]          # node, gpu, profile, allocated
    idle_per_hour: float                        # idle nodes' $/h + idle slices' share
    unpriced_idle_nodes: list[str]
    workloads_checked: int
    by_template: dict[str, int]                 # nodes per template

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _slice_fraction(profile: str) -> float:
    """A MIG profile's share of its GPU: ``3g.40gb`` is 3 of 7 compute slices."""
    return int(profile.split("g.", 1)[0]) / 7


def expected(nodes: Sequence[NodePlan], prices: PriceTable | None = None) -> Expected:
    """What the dashboard must show for ``nodes`` (:func:`plan`), at the data's end, over
    a window of at least 30 minutes of data."""
    prices = prices or bundled_prices()
    gpus_of = {f: _gpus(f) for t in TEMPLATES for f in t.files}
    out = Expected(nodes=len(nodes), gpus=0, idle_nodes={}, idle_gpus=0, spinning=[],
                   throttled=[], starved=[], stragglers=[], allocated_idle=[], idle_slices=[],
                   idle_per_hour=0.0, unpriced_idle_nodes=[], workloads_checked=0,
                   by_template={})
    for node in nodes:
        key = plan_key(node)
        t = template(node.template)
        plant = t.plants[node.position]
        file = t.files[node.position]
        physical = gpus_of[file]
        out.gpus += physical
        out.by_template[t.name] = out.by_template.get(t.name, 0) + 1
        out.workloads_checked += plant.workloads_checked
        price = prices.node_price(node.instance_type, node.capacity_type).per_hour
        if plant.idle_node is not None:
            n, allocated, spinning = plant.idle_node
            out.idle_nodes[key] = IdleNode(node.instance_type, node.zone,
                                                 node.capacity_type, n, allocated, spinning,
                                                 price)
            out.idle_gpus += n - spinning
            if price is None:
                out.unpriced_idle_nodes.append(key)
            else:
                out.idle_per_hour += price
        out.spinning += [(key, g) for g in plant.spinning]
        out.throttled += [(key, g, reason) for g, reason in plant.throttled]
        out.starved += [(kind, rename_namespace(ns, node), rename_pod(pod, node),
                         container, key, g)
                        for kind, ns, pod, container, g in plant.starved]
        out.stragglers += [(rename_workload(wl, node), rename_pod(pod, node), key,
                            g, kind, signal)
                           for wl, pod, g, kind, signal in plant.stragglers]
        out.allocated_idle += [(key, rename_namespace(ns, node),
                                rename_pod(pod, node), g, signal)
                               for ns, pod, g, signal in plant.allocated_idle]
        for g, profile, allocated in plant.idle_slices:
            out.idle_slices.append((key, g, profile, allocated))
            if price is not None:
                out.idle_per_hour += price / physical * _slice_fraction(profile)
    return out


@cache
def _gpus(file: str) -> int:
    return len(load_scenario(DEMO / f"{file}.yaml").gpus)


# -- building a data set ----------------------------------------------------------------------

def write_openmetrics(fleet: Fleet, path: Path) -> float:
    """Writes :meth:`Fleet.openmetrics` to ``path``; returns the seconds it took."""
    began = time.perf_counter()
    with path.open("w", buffering=1 << 20) as f:
        for chunk in fleet.openmetrics():
            f.write(chunk)
    return time.perf_counter() - began


def build_blocks(fleet: Fleet, out: Path) -> dict[str, float]:
    """Prometheus TSDB blocks of the fleet in ``out`` (through a temporary OpenMetrics file
    next to it, removed after)."""
    from tests.stores import promtool_blocks

    om = out.parent / f"{out.name}.om"
    gen = write_openmetrics(fleet, om)
    om_bytes = om.stat().st_size
    try:
        blocks = promtool_blocks(om, out)
    finally:
        om.unlink()
    return {"openmetrics_s": gen, "openmetrics_bytes": om_bytes, "promtool_s": blocks,
            "series": fleet.series, "samples": fleet.samples}


def import_victoriametrics(fleet: Fleet, store: Any) -> dict[str, float]:
    """Streams :meth:`Fleet.vm_json_lines` into a running VictoriaMetrics (a
    ``tests.stores.Store``), generating in this thread while a second one posts, then
    flushes and waits until a query at the end sees every series."""
    chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
    sent: list[int] = []
    error: list[BaseException] = []

    def poster() -> None:
        def drain() -> Iterator[bytes]:
            while (chunk := chunks.get()) is not None:
                yield chunk
        try:
            sent.append(store.import_lines(drain()))
        except BaseException as exc:  # reported by the generating thread
            error.append(exc)
            while chunks.get() is not None:
                pass

    began = time.perf_counter()
    thread = threading.Thread(target=poster, name="vm-import", daemon=True)
    thread.start()
    batch: list[bytes] = []
    size = 0
    for line in fleet.vm_json_lines():
        batch.append(line)
        size += len(line)
        if size >= 1 << 20:
            chunks.put(b"".join(batch))
            batch, size = [], 0
    if batch:
        chunks.put(b"".join(batch))
    chunks.put(None)
    thread.join()
    if error:
        raise error[0]
    imported = time.perf_counter() - began
    store.wait_for_series(fleet.series, fleet.shape.end)
    return {"import_s": imported, "searchable_s": time.perf_counter() - began - imported,
            "import_bytes": sent[0] if sent else 0}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build(out: Path, nodes: int, *, step: float = 15.0, window: float = 3600.0,
          end: float | None = None, stores: Iterable[str] = ("prometheus", "victoriametrics"),
          flagged: float | None = None, clusters: int | None = None,
          carrying: float | None = None, log: Any = print) -> dict[str, Any]:
    """Builds a data set in ``out`` (replacing one there): see the module's docstring;
    ``clusters``: the nodes spread over that many clusters (:func:`spread`).
    Returns (and writes to ``meta.json``) what it built and how long each part took."""
    from tests.stores import start_victoriametrics

    stores = tuple(stores)
    end = float(int(time.time() - END_LAG)) if end is None else end
    # The page's window ends at the last multiple of its step (``PrometheusStore.window``),
    # up to a step before the set's end: a step more of samples before it, so that the data
    # reaches back past the window's start (as a store older than the window does), not
    # only to a point up to a step inside it (a store younger than the window: the 24 h
    # page's 24-minute step left the first 13 minutes without data).
    shape = Shape(nodes, step, window, end, lead=LOOKBACK + window / PAGE_POINTS)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tsdb", "vm", "meta.json", "expected.json"):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    nodes_plan = plan(nodes, carrying_mix(carrying) if carrying is not None
                      else TEMPLATES if flagged is None else flagged_mix(flagged))
    if clusters is not None:
        nodes_plan = spread(nodes_plan, clusters)
    fleet = Fleet(shape, nodes_plan)
    exp = expected(fleet.plan)
    meta: dict[str, Any] = {"nodes": nodes, "gpus": exp.gpus, "step": step, "window": window,
                            "end": end, "start": shape.start, "times": shape.times,
                            "by_template": exp.by_template, "flagged": flagged,
                            "carrying": carrying}
    if clusters is not None:
        # The store label dashboard_bench.py gives the page (``cluster_label``).
        meta.update(clusters=clusters, cluster_label=CLUSTER_LABEL)
    began = time.perf_counter()
    if "prometheus" in stores:
        figures = build_blocks(fleet, out / "tsdb")
        figures["tsdb_bytes"] = dir_bytes(out / "tsdb")
        meta["prometheus"] = figures
        log(f"prometheus: {fleet.series:,} series, {fleet.samples:,} samples; OpenMetrics "
            f"{figures['openmetrics_bytes'] / 2**20:,.0f} MiB in {figures['openmetrics_s']:.1f}s,"
            f" blocks in {figures['promtool_s']:.1f}s ({figures['tsdb_bytes'] / 2**20:,.0f} MiB)")
    if "victoriametrics" in stores:
        with start_victoriametrics(out / "vm", copy=False) as vm:
            figures = import_victoriametrics(fleet, vm)
            figures["rss_kib_after_import"] = vm.rss_kib()
        figures["vm_bytes"] = dir_bytes(out / "vm")
        meta["victoriametrics"] = figures
        log(f"victoriametrics: {fleet.series:,} series imported in {figures['import_s']:.1f}s "
            f"(+{figures['searchable_s']:.1f}s until searchable; "
            f"{figures['vm_bytes'] / 2**20:,.0f} MiB on disk)")
    meta.update(series=fleet.series, samples=fleet.samples,
                build_s=time.perf_counter() - began)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "expected.json").write_text(json.dumps(exp.to_json(), indent=1) + "\n")
    return meta


#: Prometheus' (and promtool's) block range: blocks cover whole multiples of it, in ms.
BLOCK_RANGE_MS = 2 * 3600 * 1000


def block_ranges(tsdb: Path, start: float, end: float) -> int:
    """How many of ``tsdb``'s 2-hour block ranges hold samples of ``[start, end]`` (Unix
    seconds), read from each block's ``meta.json``. Prometheus reads every series of a query
    once from each block it lies in: a window across a range's boundary costs its store
    about twice what the same window inside one range does (docs/benchmarks.md, eleventh
    pass). A live Prometheus serves its last hour from its head, one range."""
    lo, hi = start * 1000, end * 1000
    ranges = set()
    for meta_file in tsdb.glob("*/meta.json"):
        block = json.loads(meta_file.read_text())
        if block["minTime"] <= hi and block["maxTime"] > lo:  # maxTime is exclusive
            ranges.add(block["minTime"] // BLOCK_RANGE_MS)
    return len(ranges)


def load_meta(out: Path) -> dict[str, Any]:
    """A built data set's ``meta.json``."""
    meta: dict[str, Any] = json.loads((out / "meta.json").read_text())
    return meta


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--step", type=float, default=15.0, help="seconds between samples (15)")
    ap.add_argument("--window", type=float, default=3600.0,
                    help="seconds of data, plus 5 min of look-back (3600)")
    ap.add_argument("--end", type=float, help="Unix time of the last sample "
                    "(default: 2 minutes before now)")
    ap.add_argument("--store", choices=("prometheus", "victoriametrics", "both"),
                    default="both")
    ap.add_argument("--flagged", type=float, metavar="SHARE",
                    help="the share of nodes playing a template that plants a finding, the "
                    "templates' proportions otherwise kept (default: the demo's mix, 0.62)")
    ap.add_argument("--carrying", type=float, metavar="SHARE",
                    help="the share of nodes carrying a finding (instead of --flagged; above "
                    "0.91 there are no clean nodes and fewer slow-rank jobs)")
    ap.add_argument("--clusters", type=int, metavar="N",
                    help="the nodes spread over N clusters (eks-00, eks-01, ...), their series "
                    "labelled cluster, node names repeating from one cluster to the next "
                    "(default: one cluster, no label)")
    ap.add_argument("--out", type=Path, required=True, help="the data set's folder")
    args = ap.parse_args(argv)
    # Written so that NaN and infinity fail too (every comparison with NaN is false).
    if args.nodes < 1 or not 0 < args.step <= args.window < math.inf:
        print("fleet: --nodes must be >= 1, --step > 0 and --window >= --step",
              file=sys.stderr)
        return 2
    if args.flagged is not None and not 0.0 < args.flagged < 1.0:
        print("fleet: --flagged must be between 0 and 1", file=sys.stderr)
        return 2
    if args.carrying is not None and (args.flagged is not None
                                      or not 0.0 < args.carrying < 1.0):
        print("fleet: --carrying must be between 0 and 1, and not with --flagged",
              file=sys.stderr)
        return 2
    if args.clusters is not None and not 1 <= args.clusters <= args.nodes:
        print("fleet: --clusters must be between 1 and --nodes", file=sys.stderr)
        return 2
    stores = ("prometheus", "victoriametrics") if args.store == "both" else (args.store,)
    try:
        meta = build(args.out, args.nodes, step=args.step, window=args.window, end=args.end,
                     stores=stores, flagged=args.flagged, clusters=args.clusters,
                     carrying=args.carrying)
    except Exception as exc:  # one line, no traceback (bad input, a store that failed)
        print(f"fleet: {exc}", file=sys.stderr)
        return 1
    print(f"{args.out}: {meta['nodes']} nodes"
          + (f" over {meta['clusters']} clusters" if "clusters" in meta else "")
          + f", {meta['gpus']} GPUs, {meta['series']:,} "
          f"series, {meta['samples']:,} samples in {meta['build_s']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
