"""The fleet's findings counted and priced from numbers per entity (the verdicts' run
records, read by ``dashboard/plan/entities.py``) instead of from each finding: the KPIs'
GPU states, the idle nodes and MIG slices with what they waste, the allocated-idle
containers' and the straggler groups' $/hour, and which nodes hold each table's first
rows (the page reads those rows' findings whole, and no others).

A node's numbers give its idle verdict where every run on it began by the history's start
or two steps after it or later (:func:`~.idle.node_idle_of`); the nodes in between and the
nodes with MIG slices are judged from their devices' runs (:class:`Devices`), by the same
functions as the page's (:func:`~.idle.idle_nodes`, :func:`~.idle.idle_slices`,
:func:`~.idle.gpu_states`), so the two agree by construction. Pure: no I/O (but
:class:`IdleGpus`, which reads through the function it is given).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscope.dashboard.data.source import DataError
from gpuscope.dashboard.series import (
    MAX_HEATMAP_NODES,
    ContainerRef,
    GpuInfo,
    GpuRef,
    NodeSummary,
    Window,
    summary_mean,
)
from gpuscope.dashboard.verdicts.allocated import AllocatedIdle
from gpuscope.dashboard.verdicts.idle import (
    IDLE_DURATION,
    GpuIdle,
    IdleRow,
    NodeIdle,
    NodeRun,
    SliceIdle,
    gpu_states,
    idle_nodes,
    idle_slices,
    node_given,
    node_idle_of,
)
from gpuscope.dashboard.verdicts.mig import fleet_of
from gpuscope.dashboard.verdicts.waste import WasteReport, waste

#: How many rows a table is sent at first (dearest first): the page reads the findings of
#: those rows' nodes and shows the rest a click away.
FIRST_ROWS = 50


@dataclass(frozen=True, slots=True)
class States:
    """Whole GPUs by state (:func:`~.idle.gpu_states`): idle (and not spinning), spinning,
    and with nothing to judge them by."""

    idle: int = 0
    spinning: int = 0
    no_data: int = 0

    def __add__(self, other: States) -> States:
        return States(self.idle + other.idle, self.spinning + other.spinning,
                      self.no_data + other.no_data)


@dataclass(frozen=True, slots=True)
class Entities:
    """What the run records say at a page's end about its history, per entity (each
    verdict one that holds: its run at least the verdict's required time):

    - ``states``: per node without MIG slices, its whole GPUs by state (nodes with none of
      them left out: all busy);
    - ``node_runs``: per node without MIG slices all of whose whole GPUs are in an idle run,
      its numbers (:class:`~.idle.NodeRun`);
    - ``mig_nodes``: the nodes with MIG slices (judged from their devices);
    - ``allocated``: each allocated-idle container, its share of its GPU's price (a MIG
      slice's share, else 1 / the device's users).
    """

    states: Mapping[str, States] = field(default_factory=dict)
    node_runs: Mapping[str, NodeRun] = field(default_factory=dict)
    mig_nodes: frozenset[str] = frozenset()
    allocated: Mapping[ContainerRef, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Devices:
    """The idle verdicts of some nodes' devices from their runs (``dashboard/plan/
    entities.py``): every device of those nodes (``gpus``), the idle and spinning ones'
    verdicts (the others are busy), which spin (their spinning verdict holds) and which
    have no data."""

    gpus: Mapping[GpuRef, GpuInfo] = field(default_factory=dict)
    idle: Mapping[GpuRef, GpuIdle] = field(default_factory=dict)
    spinning: frozenset[GpuRef] = frozenset()
    silent: frozenset[GpuRef] = frozenset()

    @property
    def nodes(self) -> set[str]:
        return {ref.node for ref in self.gpus}


@dataclass(frozen=True, slots=True)
class Totals:
    """The fleet's findings in numbers: whole GPUs by state; the idle nodes and slices with
    their waste (``report``, priced as the page prices them); the allocated-idle containers
    and their $/hour."""

    states: States
    report: WasteReport
    allocated_idle: int
    allocated_idle_per_hour: float
    #: Per node with an idle, spinning or silent whole GPU, its whole GPUs by state (the
    #: heatmap draws the nodes with idle or spinning ones first, and sums them by type).
    per_node: Mapping[str, States] = field(default_factory=dict)


def open_nodes(entities: Entities, window: Window, history_start: float) -> set[str]:
    """The nodes whose idle verdict their numbers do not give (:func:`~.idle.node_given`:
    a run on them began in the history's first steps, or within it while others are
    older) and the nodes with MIG slices: their devices' runs are read."""
    return {node for node, run in entities.node_runs.items()
            if not node_given(run, window, history_start)} | set(entities.mig_nodes)


def idle_of(entities: Entities, devices: Devices, window: Window, history_start: float,
            duration: float = IDLE_DURATION,
            ) -> tuple[dict[str, NodeIdle], list[SliceIdle]]:
    """Every idle node (from its numbers, else from its devices) and every idle MIG slice
    on a node that is not idle. A node from its numbers has ``allocated_gpus`` and
    ``spinning_gpus`` 0 (its rows read them of its devices)."""
    out: dict[str, NodeIdle] = {}
    judged = devices.nodes
    for node, run in entities.node_runs.items():
        if node in judged:
            continue
        found = node_idle_of(node, run, window, history_start, duration=duration)
        if found is not None:
            out[node] = found
    fleet = fleet_of(devices.gpus)
    by_devices = idle_nodes(devices.gpus, devices.idle, fleet=fleet)
    out.update(by_devices)
    slices = idle_slices(devices.gpus, devices.idle, by_devices, fleet=fleet)
    return out, slices


def fleet_totals(entities: Entities, devices: Devices, window: Window, history_start: float,
                 node_price: Mapping[str, float | None], gpus_on: Mapping[str, int],
                 duration: float = IDLE_DURATION) -> Totals:
    """The fleet's :class:`Totals` from ``entities`` and the ``devices`` of the nodes it
    does not give a verdict for (:func:`open_nodes`), priced per node by ``node_price``
    ($/hour; None or absent: unknown) over ``gpus_on`` whole GPUs."""
    nodes, slices = idle_of(entities, devices, window, history_start, duration)
    report = waste(nodes, node_price, slices=slices, gpus_per_node=gpus_on)
    judged = devices.nodes
    per_node = {node: s for node, s in entities.states.items() if node not in judged}
    found = gpu_states(devices.gpus, devices.idle, devices.spinning,
                       set(devices.gpus) - devices.silent, fleet=fleet_of(devices.gpus))
    counts: dict[str, list[int]] = {}
    order = ("idle", "spinning", "no data")
    for ref, state in found.items():
        if state in order:
            counts.setdefault(ref.node, [0, 0, 0])[order.index(state)] += 1
    per_node.update({node: States(*c) for node, c in counts.items()})
    states = States()
    for s in per_node.values():
        states += s

    def gpu_price(node: str) -> float | None:
        price, n = node_price.get(node), gpus_on.get(node, 0)
        return price / n if price is not None and n > 0 else None

    per_hour = 0.0
    for held, share in entities.allocated.items():
        price = gpu_price(held.node)
        per_hour += price * share if price is not None else 0.0
    return Totals(states, report, len(entities.allocated), per_hour, per_node)


def drawn_nodes(wasted: Mapping[str, int], summaries: Mapping[str, NodeSummary],
                limit: int = MAX_HEATMAP_NODES) -> list[str]:
    """The nodes the heatmap draws, in its order: the most idle or spinning GPUs first,
    then the least busy (the nodes' means), then by name."""
    return sorted(summaries, key=lambda n: (-wasted.get(n, 0), summary_mean(summaries[n]),
                                            n))[:limit]


@dataclass
class IdleGpus:
    """What the idle table's rows from a node's numbers lack, read when they are shown
    (:meth:`__call__`, the page's ``RowDetails``): how many of the node's GPUs a container
    held and how many spun in their idle run, of the node's devices (``read``: the idle
    verdicts of the given nodes from their devices' runs, ``FleetData.found``'s store);
    ``judged``: the nodes whose rows have them (read with the page, or since)."""

    read: Callable[[Collection[str]], Mapping[str, NodeIdle]]
    judged: set[str] = field(default_factory=set)

    def __call__(self, rows: Sequence[IdleRow], first: int
                 ) -> tuple[tuple[IdleRow, ...], str | None]:
        todo = {r.node for r in rows[:first] if r.node not in self.judged}
        if not todo:
            return tuple(rows), None
        try:
            found = self.read(todo)
        except DataError as exc:
            return tuple(rows), f"The idle nodes' held and spinning GPUs could not be read ({exc})."
        self.judged |= todo
        return tuple(
            replace(r, allocated_gpus=v.allocated_gpus, spinning_gpus=v.spinning_gpus)
            if r.node in todo and (v := found.get(r.node)) is not None else r
            for r in rows), None


@dataclass(frozen=True, slots=True)
class Found:
    """The fleet page's findings as the run records give them (``dashboard/plan/``, where
    they cover the page's history): the fleet's :class:`Totals`; the idle verdicts of the
    devices read (``devices``: the nodes the numbers leave open, those with MIG slices, the
    first idle rows' and the drawn ones); every allocated-idle container's finding and its
    price share. The views show these instead of judging the steps."""

    totals: Totals
    devices: Devices
    allocated: tuple[AllocatedIdle, ...] = ()
    shares: Mapping[ContainerRef, float] = field(default_factory=dict)
    #: Reads the idle verdicts of the given idle nodes from their devices (the held and
    #: spinning GPUs of rows from a node's numbers: :class:`IdleGpus`); None: all read.
    read_nodes: Callable[[Collection[str]], Mapping[str, NodeIdle]] | None = None


def allocated_nodes(entities: Entities, node_price: Mapping[str, float | None],
                    gpus_on: Mapping[str, int], rows: int = FIRST_ROWS) -> set[str]:
    """The nodes that hold the allocated-idle table's first ``rows`` rows in its own order
    (by $/hour, namespace, pod; the rows tied with the last one too), whose GPUs' index the
    page reads."""
    def per_hour(c: ContainerRef) -> float:
        price, n = node_price.get(c.node), gpus_on.get(c.node, 0)
        return price / n * entities.allocated[c] if price is not None and n > 0 else 0.0

    dear = sorted(entities.allocated, key=lambda c: (-per_hour(c), c.namespace, c.pod))
    return {c.node for c in _with_ties(dear, lambda c: (per_hour(c), c.namespace, c.pod),
                                       rows)}


def shown_nodes(entities: Entities, window: Window, history_start: float,
                node_price: Mapping[str, float | None], gpus_on: Mapping[str, int],
                summaries: Mapping[str, NodeSummary], rows: int = FIRST_ROWS,
                duration: float = IDLE_DURATION) -> set[str]:
    """The nodes whose devices the page reads with the numbers per entity, known from them
    alone: the nodes they leave open (:func:`open_nodes`, MIG ones included), and of the
    others the first ``rows`` idle nodes by waste and the nodes the heatmap may draw
    (:func:`drawn_nodes` by the numbers' counts): the idle table's first rows and the
    heatmap are among these whatever the open nodes turn out to be."""
    opened = open_nodes(entities, window, history_start)
    known, _ = idle_of(entities, Devices(), window, history_start, duration)
    report = waste({n: v for n, v in known.items() if n not in opened}, node_price)
    wasted = {n: s.idle + s.spinning for n, s in entities.states.items()}
    return (opened | {w.idle.node for w in report.nodes[:rows]}
            | set(drawn_nodes(wasted, {n: v for n, v in summaries.items()
                                       if n not in opened})))


def _with_ties(ordered: list[Any], rank: Callable[[Any], Any], rows: int) -> list[Any]:
    """The first ``rows`` of ``ordered`` and those ranked as the last of them."""
    if len(ordered) <= rows:
        return ordered
    last = rank(ordered[rows - 1])
    return ordered[:rows] + [k for k in ordered[rows:] if rank(k) == last]


