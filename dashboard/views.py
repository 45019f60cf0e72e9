"""From :class:`~gpuscope.dashboard.series.FleetData` to what the page shows: runs the analysis and
prices the waste. Pure (no I/O), so every number on the page is testable without a browser.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuscope.dashboard import ids
from gpuscope.dashboard.data.promql import node_parts
from gpuscope.dashboard.data.source import DataError, DataSource
from gpuscope.dashboard.evidence import (
    RowEvidence,
)
from gpuscope.dashboard.prices import NodePrice, PriceTable
from gpuscope.dashboard.scope import clusters, scoped_data, scoped_steps
from gpuscope.dashboard.series import (
    MAX_HEATMAP_NODES,
    ContainerRef,
    FleetData,
    GpuInfo,
    GpuRef,
    NodeSummary,
    Window,
    gc_paused,
    index_key,
    summary_mean,
)
from gpuscope.dashboard.verdicts import Thresholds, registry
from gpuscope.dashboard.verdicts.allocated import AllocatedIdleRow, allocated_idle, held_usage
from gpuscope.dashboard.verdicts.allocated import allocated_rows as allocated_table
from gpuscope.dashboard.verdicts.idle import (
    GpuIdle,
    IdleRow,
    SliceRow,
    gpu_states,
    idle_gpus,
    idle_nodes,
    idle_slices,
)
from gpuscope.dashboard.verdicts.idle import idle_rows as idle_table
from gpuscope.dashboard.verdicts.idle import slice_rows as slice_table
from gpuscope.dashboard.verdicts.mig import Fleet, fleet_of, physical_gpus, slices_per_gpu
from gpuscope.dashboard.verdicts.mps import active_thread_shares
from gpuscope.dashboard.verdicts.owners import OwnerCost, showback
from gpuscope.dashboard.verdicts.page import PageContext, StepAnswers
from gpuscope.dashboard.verdicts.spinning import (
    RowWork,
    SpinningRow,
    spin_begins,
    spinning_gpus,
    spinning_steps,
)
from gpuscope.dashboard.verdicts.spinning import spinning_rows as spinning_table
from gpuscope.dashboard.verdicts.starvation import (
    ShareRow,
    StarvedRow,
    input_starved,
    timeslice_shares,
)
from gpuscope.dashboard.verdicts.starvation import share_rows as share_table
from gpuscope.dashboard.verdicts.starvation import starved_rows as starved_table
from gpuscope.dashboard.verdicts.stragglers import StragglerReport, StragglerRow, stragglers
from gpuscope.dashboard.verdicts.stragglers import straggler_rows as straggler_table
from gpuscope.dashboard.verdicts.throttle import VERDICT as THROTTLE
from gpuscope.dashboard.verdicts.totals import Found, IdleGpus, States
from gpuscope.dashboard.verdicts.waste import WasteReport, waste


@dataclass(frozen=True, slots=True)
class Kpis:
    gpus: int
    busy: int
    idle: int
    no_data: int
    mean_utilization: float | None
    idle_nodes: int
    burning_per_hour: float
    wasted: float
    wasted_unallocated: float
    wasted_allocated: float
    unpriced_idle_nodes: tuple[str, ...]
    spinning: int = 0
    throttled: int = 0
    allocated_idle: int = 0
    allocated_idle_per_hour: float = 0.0
    idle_slices: int = 0
    wasted_spinning: float = 0.0
    fleet_per_hour: float = 0.0            # every priced node, busy or not
    unpriced_nodes: tuple[str, ...] = ()   # nodes of unknown price (not in fleet_per_hour)
    spot_nodes: int = 0
    #: Of ``spot_nodes``, those priced on demand: the price file has no spot price for them.
    spot_at_on_demand: int = 0
    #: $ the priced nodes cost over the history in the window (``fleet_per_hour`` x hours):
    #: what the showback's $ spent add up to.
    spent: float = 0.0

    @property
    def idle_share(self) -> float | None:
        """The idle capacity's share of the fleet's $/hour."""
        return self.burning_per_hour / self.fleet_per_hour if self.fleet_per_hour > 0 else None


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """The nodes of one instance type (or node pool): how many, their whole GPUs, how many of
    those are idle or spinning, and their mean utilization over the window."""

    name: str
    nodes: int
    gpus: int
    idle: int
    spinning: int
    mean_utilization: float | None


@dataclass(frozen=True, slots=True)
class Heatmap:
    """Rows are nodes, columns GPU indices; ``z`` None where a GPU reports no utilization.
    ``idle`` marks idle GPUs (a MIG GPU: every slice idle), ``spinning`` GPUs that spin (busy
    by utilization, no work), ``mig`` says how many slices of a GPU in MIG mode are idle,
    ``absent`` the cells of a node that has no GPU of that index (a 1-GPU node's 1-7).

    At most :data:`MAX_HEATMAP_NODES` rows are drawn: the nodes with idle or spinning GPUs
    first (most first), then the least busy; ``total_nodes`` says how many there are and
    ``groups`` summarises all of them by instance type (idle first)."""

    nodes: tuple[str, ...]
    columns: tuple[str, ...]
    z: tuple[tuple[float | None, ...], ...]
    idle: tuple[tuple[bool, ...], ...]
    spinning: tuple[tuple[bool, ...], ...] = ()
    mig: tuple[tuple[str, ...], ...] = ()
    total_nodes: int = 0
    absent: tuple[tuple[bool, ...], ...] = ()
    groups: tuple[NodeGroup, ...] = ()

    @property
    def hidden_nodes(self) -> int:
        """Nodes not drawn (pick one in the node drill-down, or from a table)."""
        return max(0, self.total_nodes - len(self.nodes))


#: The rows a table is sent at first, in its order (the costliest first where it has a
#: $/hour): the page stays light in the browser whatever the fleet's state, and what a row
#: needs read from the store beyond its verdict (a straggler's evidence) is read for these
#: rows only; the rest are a click away ("Show all rows", "Download CSV").
TOP_ROWS = 50

#: Reads what the first ``n`` of a table's rows show beyond their verdict where it is not
#: read yet: the rows, and a line for the page's notes where the store failed.
RowDetails = Callable[[Sequence[Any], int], tuple[tuple[Any, ...], str | None]]
#: The tables whose rows may read more when shown, and the view's field of their rows.
_DETAILED_ROWS = {ids.STRAGGLERS_TABLE: "straggler_rows",
                  ids.SPINNING_GPUS_TABLE: "spinning_rows",
                  ids.IDLE_NODES_TABLE: "idle_rows"}


@dataclass(frozen=True, slots=True)
class FleetView:
    window: Window
    history_start: float
    kpis: Kpis
    heatmap: Heatmap
    idle_rows: tuple[IdleRow, ...]
    starved_rows: tuple[StarvedRow, ...]
    share_rows: tuple[ShareRow, ...]
    straggler_rows: tuple[StragglerRow, ...]
    workloads_checked: int
    nodes: tuple[str, ...]
    pods: tuple[str, ...]  # "namespace/pod"
    queries: int = 0
    notes: tuple[str, ...] = field(default=())
    thresholds: Thresholds = field(default_factory=Thresholds)
    spinning_rows: tuple[SpinningRow, ...] = ()
    allocated_idle_rows: tuple[AllocatedIdleRow, ...] = ()
    slice_rows: tuple[SliceRow, ...] = ()
    workloads: tuple[str, ...] = ()        # "namespace/Kind/name"
    default_workload: str | None = None     # the one the workload view opens with
    #: The cluster of the run it opens with (its straggler's or group's; None: every
    #: cluster's run of that name, or a store of one cluster): a job of one name in two
    #: clusters is two runs, and the straggler's is the one to show.
    default_workload_cluster: str | None = None
    #: The registry's own verdicts' findings, by verdict name, and what they were judged
    #: with (:mod:`gpuscope.dashboard.verdicts.page`).
    findings: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    context: PageContext | None = None
    #: Showback: each owner's cost and waste (:mod:`gpuscope.dashboard.verdicts.owners`),
    #: workloads and each cluster's unallocated row (of the namespace filtered to alone).
    owners: tuple[OwnerCost, ...] = ()
    #: Every cluster in the store ("" left out: a store of one cluster has none), and the
    #: one the page is scoped to (None: all).
    clusters: tuple[str, ...] = ()
    cluster: str | None = None
    #: The tables whose rows read from the store what they show beyond their verdict when
    #: they are shown (a straggler's evidence, ``FleetData.read_evidence``; a summarised
    #: spinning run's SM activity or power, ``FleetData.read_spinning``), by table id: each
    #: reads it for more of the table's rows (:func:`with_details`).
    row_details: Mapping[str, RowDetails] = field(default_factory=dict)

    @property
    def history_seconds(self) -> float:
        return max(0.0, self.window.end - self.history_start)


@dataclass
class _Nodes:
    """The GPU nodes as the page counts them: those sent as devices (``by_node``: their
    whole GPUs) and those the recording rules sent as numbers (``summaries``; nothing to
    flag there, so their GPUs are busy: counted and priced like the others); of the nodes
    sent with only their devices a finding names (``FleetData.partial_nodes``, the
    inventory's ``whole``) the GPUs not sent are busy too (``unlisted``)."""

    inventory: Fleet
    summaries: Mapping[str, NodeSummary]
    gpu_mean: Mapping[GpuRef, float]
    by_node: Mapping[str, list[GpuInfo]] = field(init=False)
    summarised: dict[str, int] = field(init=False)
    gpu_nodes: set[str] = field(init=False)
    unlisted: int = field(init=False)
    _utils: dict[str, tuple[float, int]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.by_node = self.inventory.by_node
        self.summarised = {n: s.gpus for n, s in self.summaries.items()
                           if n not in self.by_node and s.gpus > 0}
        self.gpu_nodes = set(self.by_node) | set(self.summarised)
        self.unlisted = self.inventory.unlisted()

    def gpus_on(self, node: str) -> int:
        """Whole GPUs on ``node``."""
        return (self.inventory.gpus_on(node) if node in self.by_node
                else self.summarised.get(node, 0))

    def node_util(self, node: str) -> tuple[float, int]:
        """The sum of the node's whole GPUs' window means, and how many reported: its
        summary's where it has one (the same for every node then: one order for the heatmap
        whichever nodes came as devices), else from its devices' means. Each node's once (the
        KPIs, the heatmap's order and its groups ask: 10^4 calls on a large fleet)."""
        found = self._utils.get(node)
        if found is not None:
            return found
        summary = self.summaries.get(node)
        if summary is not None:
            known = 0 if summary.mean is None or math.isnan(summary.mean) else summary.known
            found = (summary_mean(summary) * known, known)
        else:
            means = [m for g in self.by_node.get(node, ())
                     if (m := self.gpu_mean.get(g.ref)) is not None and not math.isnan(m)]
            found = (math.fsum(means), len(means))
        self._utils[node] = found
        return found

    def mean_of(self, nodes: Iterable[str]) -> float | None:
        """The mean of the whole GPUs' window means on ``nodes`` (None: none reported)."""
        parts = [self.node_util(n) for n in nodes]
        count = sum(c for _, c in parts)
        return math.fsum(t for t, _ in parts) / count if count else None


def _heatmap(data: FleetData, nodes: _Nodes, inventory: Fleet, states: Mapping[GpuRef, str],
             spinning: Collection[GpuRef], verdicts: Mapping[GpuRef, GpuIdle],
             per_node: Mapping[str, States] | None = None,
             ) -> tuple[Heatmap, tuple[str, ...]]:
    """The heatmap: window-mean utilization, nodes x whole-GPU indices, for the nodes an SRE
    looks at first (idle and spinning GPUs, most first; then the least busy), at most
    :data:`MAX_HEATMAP_NODES` of them; every node counted in the groups by instance type
    (``per_node``: each node's whole GPUs by state where the store's records counted them,
    else from ``states``). With the page's notes (one more where the drawn nodes' means
    could not be read)."""
    by_node, summaries = nodes.by_node, nodes.summaries

    counts: dict[str, tuple[int, int]] = {}

    def node_states(node: str) -> tuple[int, int]:
        """The node's whole GPUs idle, and spinning (each node's once: its rank and its
        group ask)."""
        found = counts.get(node)
        if found is not None:
            return found
        if per_node is not None:
            s = per_node.get(node)
            found = (s.idle, s.spinning) if s is not None else (0, 0)
        else:
            mine = [states.get(g.ref) for g in by_node.get(node, ())]
            found = (mine.count("idle"), mine.count("spinning"))
        counts[node] = found
        return found

    def node_rank(node: str) -> tuple[int, float, str]:
        wasted = sum(node_states(node))
        summary = summaries.get(node)
        if summary is not None:  # the order the data layer chose the nodes it sent by
            return (-wasted, summary_mean(summary), node)
        total, known = nodes.node_util(node)
        return (-wasted, total / known if known else 0.0, node)

    rank = {node: node_rank(node) for node in nodes.gpu_nodes}
    ranked = sorted(nodes.gpu_nodes, key=rank.__getitem__)
    node_names = tuple(ranked[:MAX_HEATMAP_NODES])  # (in rank order already)
    groups_of: dict[str, list[str]] = {}
    for node in sorted(nodes.gpu_nodes):
        info = data.nodes.get(node)
        groups_of.setdefault(info.instance_type if info and info.instance_type
                             else "unknown type", []).append(node)
    node_groups = []
    for name, members in groups_of.items():
        counted = [node_states(n) for n in members]
        node_groups.append(NodeGroup(
            name=name, nodes=len(members), gpus=sum(nodes.gpus_on(n) for n in members),
            idle=sum(i for i, _ in counted), spinning=sum(s for _, s in counted),
            mean_utilization=nodes.mean_of(members)))
    node_groups.sort(key=lambda g: (-(g.idle + g.spinning), -g.nodes, g.name))
    slices_of = {parent: [s.ref for s in parts] for parent, parts in inventory.slices.items()}
    gpu_mean = data.gpu_mean
    notes = data.notes
    # The store sent these nodes' devices without their means, or a drawn node's devices
    # with a finding alone (its busy ones are its cells too): read those drawn. A failure
    # costs the heatmap's cells, not the page (which says so).
    partial = [n for n in node_names if n in data.partial_nodes]
    unread = [n for n in node_names if n in data.partial_nodes
              or any(g.ref not in gpu_mean for g in by_node.get(n, ()))]
    if unread and data.read_devices is not None:
        try:
            means, infos = data.read_devices(unread, partial)
            gpu_mean = {**gpu_mean, **means}
            read = physical_gpus(infos)
            by_node = {**by_node, **{n: read[n] for n in partial if n in read}}
        except DataError as exc:
            notes = (*notes, f"The heatmap's utilization could not be read ({exc}): its "
                             f"cells are blank.")
    columns = tuple(sorted({g.gpu for n in node_names for g in by_node.get(n, ())},
                           key=index_key))
    z_rows, idle_cells, spin_cells, mig_cells, absent_cells = [], [], [], [], []
    for node in node_names:
        cells = {g.gpu: g.ref for g in by_node.get(node, ())}
        z_row: list[float | None] = []
        idle_row: list[bool] = []
        spin_row: list[bool] = []
        mig_row: list[str] = []
        for col in columns:
            ref = cells.get(col)
            mean = gpu_mean.get(ref) if ref is not None else None
            z_row.append(None if mean is None or math.isnan(mean) else mean)
            spin_row.append(ref in spinning)
            idle_row.append(ref is not None and states.get(ref) == "idle")
            parts = slices_of.get(ref, []) if ref is not None else []
            idle_parts = sum(1 for p in parts if (v := verdicts.get(p)) is not None and v.idle)
            mig_row.append(f"MIG: {idle_parts} of {len(parts)} slices idle" if parts else "")
        z_rows.append(tuple(z_row))
        idle_cells.append(tuple(idle_row))
        spin_cells.append(tuple(spin_row))
        mig_cells.append(tuple(mig_row))
        absent_cells.append(tuple(col not in cells for col in columns))

    heatmap = Heatmap(node_names, columns, tuple(z_rows), tuple(idle_cells),
                      tuple(spin_cells), tuple(mig_cells), total_nodes=len(nodes.gpu_nodes),
                      groups=tuple(node_groups), absent=tuple(absent_cells))
    return heatmap, notes


def build_fleet_view(
    data: FleetData,
    prices: PriceTable,
    thresholds: Thresholds | None = None,
    namespace: str | None = None,
    steps: StepAnswers | None = None,
    cluster: str | None = None,
) -> FleetView:
    """What the fleet page shows of ``data`` (of ``namespace`` where given; of ``cluster``'s
    nodes where given, :mod:`.scope`), priced by ``prices``; ``steps``: the store's answers
    to the registry's step queries
    (:func:`~gpuscope.dashboard.verdicts.registry.step_queries`; None or a query left out:
    nothing found by it). The cyclic garbage collector held off meanwhile
    (:func:`gc_paused`: the analysis of a large fleet makes 10^6 objects without cycles)."""
    with gc_paused():
        every = clusters([*data.nodes, *data.node_summaries, *(g.node for g in data.gpus)])
        if cluster is not None:
            data, steps = scoped_data(data, cluster), scoped_steps(steps or {}, cluster)
        view = _build_fleet_view(data, prices, thresholds, namespace, steps or {})
        return replace(view, clusters=every, cluster=cluster)


def page_view(source: DataSource, window_seconds: float, prices: PriceTable,
              thresholds: Thresholds | None = None, namespace: str | None = None,
              cluster: str | None = None) -> FleetView:
    """The fleet page of ``source`` over the last ``window_seconds``, as the page computes
    it: its :meth:`~DataSource.fleet` and its answers to the registry's step queries at
    ``thresholds`` (the service sends the two side by side; this asks one after the
    other)."""
    th = thresholds or Thresholds()
    window = source.window(window_seconds)
    steps = source.step_series(registry.step_queries(th), window_seconds, window)
    return build_fleet_view(source.fleet(window_seconds, namespace, window), prices, th,
                            namespace, steps, cluster)


@dataclass(frozen=True)
class _Prices:
    """Each GPU node's $/hour as the price table gives it (spot where it says so; a node
    of no known instance type: unknown), and a whole GPU's share of it."""

    node: dict[str, NodePrice]
    gpus_on: Callable[[str], int]

    @classmethod
    def of(cls, data: FleetData, prices: PriceTable, gpu_nodes: set[str],
           gpus_on: Callable[[str], int]) -> _Prices:
        node_price: dict[str, NodePrice] = {}
        for node in gpu_nodes | set(data.nodes):
            info = data.nodes.get(node)
            node_price[node] = (prices.node_price(info.instance_type, info.capacity_type)
                                if info is not None else NodePrice(None, "on-demand"))
        return cls(node_price, gpus_on)

    def per_gpu(self, node: str) -> float | None:
        """A whole GPU's share of its node's $/hour."""
        price = self.node[node].per_hour if node in self.node else None
        n = self.gpus_on(node)
        return price / n if price is not None and n > 0 else None


@dataclass(frozen=True)
class _Holding:
    """What a container holds, and its $/hour: the allocated-idle and input-starved rows'
    "holds" column. ``recorded``: each container's share of its GPU as the store
    recorded it (the run records' page); ``shares``: each MIG slice's share of its GPU;
    ``users``: who uses each device (time-slices split a GPU's price)."""

    gpus: Mapping[GpuRef, GpuInfo]
    prices: _Prices
    recorded: Mapping[ContainerRef, float]
    context: PageContext
    shares: Mapping[GpuRef, float]
    users: Mapping[GpuRef, set[ContainerRef]]

    def __call__(self, c: ContainerRef) -> tuple[str, float | None]:
        info = self.gpus.get(c.gpu)
        per_gpu = self.prices.per_gpu(c.node)
        share = self.recorded.get(c)
        if share is not None and (info is None or info.is_physical):
            n = max(1, round(1 / share)) if share > 0 else 1
            index = self.context.index(c.gpu)
            price = per_gpu * share if per_gpu is not None else None
            return (f"1 of {n} time-slices of GPU {index}" if n > 1 else f"GPU {index}",
                    price)
        if info is not None and not info.is_physical:
            share = self.shares.get(c.gpu, 0.0)
            parent = self.gpus.get(GpuRef(c.node, info.parent_uuid))
            on = f" of GPU {parent.gpu}" if parent is not None else ""
            # In the model's compute slices (7 on most, 4 on an A30 or RTX PRO 6000).
            k = slices_per_gpu(parent.model if parent is not None else info.model)
            return (f"MIG {info.mig_profile or 'slice'} ({share * k:.0f}/{k}{on})"
                    if abs(share * k - round(share * k)) < 1e-6 else
                    f"MIG {info.mig_profile or 'slice'} ({share:.0%}{on})",
                    per_gpu * share if per_gpu is not None else None)
        n = max(1, sum(1 for u in self.users.get(c.gpu, ()) if u.container))
        index = self.context.index(c.gpu)
        if n > 1:
            return (f"1 of {n} time-slices of GPU {index}",
                    per_gpu / n if per_gpu is not None else None)
        return f"GPU {index}", per_gpu


def _kpis(data: FleetData, fleet: _Nodes, prices: _Prices, report: WasteReport,
          verdicts: Mapping[GpuRef, GpuIdle], spinning: Collection[GpuRef],
          found: Found | None, *, throttled: int, allocated: Sequence[AllocatedIdleRow],
          slices: int) -> tuple[Kpis, dict[GpuRef, str]]:
    """The page's KPIs over whole GPUs (MIG slices are parts of one), and each listed
    device's state (busy, idle, spinning, no data: the heatmap's too)."""
    inventory, gpu_nodes, summarised = fleet.inventory, fleet.gpu_nodes, fleet.summarised
    whole = [info for infos in inventory.by_node.values() for info in infos]
    states = gpu_states(data.gpus, verdicts, spinning, data.reporting(), fleet=inventory)
    counts = {state: sum(1 for v in states.values() if v == state)
              for state in ("busy", "idle", "spinning", "no data")}
    priced = [p.per_hour for n, p in prices.node.items() if p.per_hour is not None
              and n in gpu_nodes]
    gpus = len(whole) + sum(summarised.values()) + fleet.unlisted
    if found is not None:  # (every whole GPU by the records' states)
        st = found.totals.states
        counts = {"idle": st.idle, "spinning": st.spinning, "no data": st.no_data,
                  "busy": gpus - st.idle - st.spinning - st.no_data}
    else:
        counts["busy"] += sum(summarised.values()) + fleet.unlisted
    return Kpis(
        gpus=gpus,
        busy=counts["busy"],
        idle=counts["idle"],
        no_data=counts["no data"],
        mean_utilization=fleet.mean_of(sorted(gpu_nodes)),
        idle_nodes=len(report.nodes),
        burning_per_hour=report.burning_per_hour,
        wasted=report.wasted,
        wasted_unallocated=report.wasted_unallocated,
        wasted_allocated=report.wasted_allocated,
        unpriced_idle_nodes=report.unpriced_nodes,
        spinning=counts["spinning"],
        throttled=throttled,
        allocated_idle=len(allocated),
        allocated_idle_per_hour=sum(r.price_per_hour or 0.0 for r in allocated),
        idle_slices=slices,
        wasted_spinning=report.wasted_spinning,
        # fsum: the same total whatever order the store listed the nodes in
        fleet_per_hour=math.fsum(priced),
        spent=_spent(data, prices, gpu_nodes),
        unpriced_nodes=tuple(sorted(n for n, p in prices.node.items()
                                    if p.per_hour is None and n in gpu_nodes)),
        spot_nodes=sum(1 for n in gpu_nodes if (i := data.nodes.get(n)) is not None
                       and i.capacity_type == "spot"),
        spot_at_on_demand=sum(1 for n, p in prices.node.items()
                              if n in gpu_nodes and p.basis == "on-demand (no spot price)"),
    ), states


def _spent(data: FleetData, prices: _Prices, gpu_nodes: set[str]) -> float:
    """The fleet's cost in the window: each node of known price at its $/hour over the
    time it was there (``FleetData.present_seconds``), those there throughout over the
    history, summed first (as the showback's nodes are charged: its owners add up to this).
    """
    whole: list[float] = []
    part: list[float] = []
    for n, p in prices.node.items():
        if p.per_hour is None or n not in gpu_nodes:
            continue
        if n in data.present:
            part.append(p.per_hour * data.present_seconds(n))
        else:
            whole.append(p.per_hour)
    return (math.fsum(whole) * data.history_seconds + math.fsum(part)) / 3600.0


def _pickers(data: FleetData, context: PageContext, straggler_rows: Sequence[StragglerRow],
             strag: StragglerReport
             ) -> tuple[list[str], list[str], str | None, str | None]:
    """The pod and workload pickers' choices (of the namespace filtered to), and the
    workload shown first: a straggler's (slow first), else a group of two devices or
    more, else the first; with the cluster of that straggler's or group's run (None for
    the first, or in a store of one cluster)."""
    wanted = context.wanted
    pod_names = sorted({f"{p.namespace}/{p.pod}" for p in data.pods.values() if wanted(p.namespace)}
                       | {f"{c.namespace}/{c.pod}" for c in data.containers if wanted(c.namespace)})
    workloads = sorted({f"{p.namespace}/{p.workload}" for p in data.pods.values()
                        if p.workload and wanted(p.namespace)})
    default_workload, cluster = next(
        ((f"{r.namespace}/{r.workload}", node_parts(r.node)[0]) for kind in ("slow", "stalled")
         for r in straggler_rows if r.kind == kind),
        next(((f"{g.key[1]}/{g.key[2]}", g.key[0]) for g in strag.groups
              if len(g.devices) >= 2 and wanted(g.key[1])),
             (workloads[0] if workloads else None, "")),
    )
    return pod_names, workloads, default_workload, cluster or None


def _build_fleet_view(
    data: FleetData,
    prices: PriceTable,
    thresholds: Thresholds | None,
    namespace: str | None,
    steps: StepAnswers,
) -> FleetView:
    th = thresholds or Thresholds()
    window, hs = data.window, data.history_start
    signals, runs = data.signals, data.runs

    inventory = fleet_of(data.gpus, data.partial_nodes)  # the passes over every device, once
    summaries = data.node_summaries
    fleet = _Nodes(inventory, summaries, data.gpu_mean)
    gpu_nodes, gpus_on = fleet.gpu_nodes, fleet.gpus_on
    # Prices: per node (spot where the price file says so), per whole GPU, per slice.
    priced = _Prices.of(data, prices, gpu_nodes, gpus_on)
    node_price, gpu_price = priced.node, priced.per_gpu
    shares = inventory.shares

    # How much of what it holds each holder used per step: the store's measure (the
    # Prometheus plan's), or measured here from the series the store sent (embedded).
    usage, usage_signal = data.held_usage, data.held_signal
    if data.held_steps is not None:
        usage, usage_signal = held_usage(
            data.held_steps.held, data.held_steps.utilization, data.held_steps.memory,
            signals.sm, signals.gpm,
            {ref for ref, info in data.gpus.items() if not info.is_physical})

    # Who uses each device (containers with a utilization series, or holding it).
    users: dict[GpuRef, set[ContainerRef]] = {}
    for c in [*data.containers, *usage, *(runs.held_idle if runs is not None else ())]:
        if c.namespace:
            users.setdefault(c.gpu, set()).add(c)
    workload_of = {(p.node, p.namespace, p.pod): p.workload for p in data.pods.values()}

    # The registry's own verdicts, on the store's answers to their queries.
    context = PageContext(
        window=window, history_start=hs, gpus=data.gpus,
        node_price={n: p.per_hour for n, p in node_price.items()},
        gpu_price={n: gpu_price(n) for n in node_price},
        price_basis={n: p.basis for n, p in node_price.items()},
        pods={ref: tuple(sorted({f"{c.namespace}/{c.pod}" for c in cs}))
              for ref, cs in users.items()},
        namespace=namespace, thresholds=th,
    )
    findings = {v.name: v.judge(steps, context) for v in registry.STEP_VERDICTS}

    spin_steps = spinning_steps(signals, th.spin_rule, runs)
    spin = spinning_gpus(signals, window, hs, rule=th.spin_rule, duration=th.spin_duration,
                         steps=spin_steps, runs=runs)
    spinning = {ref: v for ref, v in spin.items() if v.spinning}
    verdicts = idle_gpus(
        data.gpu_busy_max, window, hs, allocated=data.allocated,
        spinning=spin_steps, signal=data.idle_signal,
        known_from=spin_begins(signals, spin_steps, runs), runs=runs,
        threshold=th.idle_utilization, duration=th.idle_duration,
    )
    found = data.found if isinstance(data.found, Found) else None
    if found is not None:
        # The store's records gave the idle devices, nodes and slices (priced as here):
        # the devices read are those of the nodes the page shows.
        verdicts = {**verdicts, **found.devices.idle}
        report = found.totals.report
        slices_idle = [w.slice for w in report.slices]
    else:
        nodes_idle = idle_nodes(data.gpus, verdicts, fleet=inventory)
        slices_idle = idle_slices(data.gpus, verdicts, nodes_idle, fleet=inventory)
        report = waste(
            nodes_idle, {n: p.per_hour for n, p in node_price.items()},
            slices=slices_idle, gpus_per_node={n: gpus_on(n) for n in gpu_nodes},
        )

    spinning_rows = spinning_table(spinning, context, users, workload_of)
    row_details: dict[str, RowDetails] = {}
    problems: list[str] = []
    if data.read_spinning is not None:
        # The summarised runs' signals of the rows shown, read now; the others' when they
        # are asked for.
        row_details[ids.SPINNING_GPUS_TABLE] = work = RowWork(
            data.read_spinning, frozenset(g for g, k in (
                runs.spinning_from.items() if runs is not None else ()) if k))
        spinning_rows, problem = work(spinning_rows, TOP_ROWS)
        problems += [problem] if problem else []

    def device_price(ref: GpuRef) -> float | None:
        """A device's $/hour: a whole GPU's share of its node's price, a MIG slice's share
        of its GPU's."""
        info, per_gpu = data.gpus.get(ref), gpu_price(ref.node)
        if per_gpu is not None and info is not None and not info.is_physical:
            return per_gpu * shares.get(ref, 0.0)
        return per_gpu

    holding = _Holding(data.gpus, priced, found.shares if found is not None else {},
                       context, shares, users)

    allocated_rows = allocated_table(
        found.allocated if found is not None else
        allocated_idle(usage, usage_signal, window, hs, runs=runs,
                       threshold=th.allocated_idle_utilization,
                       duration=th.allocated_idle_duration),
        context, workload_of, holding)

    owners = showback(data.holdings,
                      {n: p.per_hour for n, p in node_price.items() if n in gpu_nodes},
                      gpus_on, shares, data.history_seconds, report,
                      step_seconds=data.holdings_step, present=data.present)
    if namespace is not None:
        owners = tuple(o for o in owners if o.namespace == namespace)

    kpis, states = _kpis(data, fleet, priced, report, verdicts, spinning, found,
                         throttled=len({t.ref for t in findings[THROTTLE.name]}),
                         allocated=allocated_rows, slices=len(slices_idle))

    idle_rows = idle_table(report, context, data.nodes)
    if found is not None and found.read_nodes is not None:
        # A row from a node's numbers: its held and spinning GPUs read when shown (the
        # first rows' nodes were read with the page).
        row_details[ids.IDLE_NODES_TABLE] = IdleGpus(found.read_nodes,
                                                      set(found.devices.nodes))
    slice_rows = slice_table(report, context)

    shares_ = timeslice_shares(
        data.containers, data.gpu_step_mean, window, hs,
        busy=th.busy_utilization, share_factor=th.share_factor,
        duration=th.starvation_duration, fair_shares=active_thread_shares(steps),
    )
    share_rows = share_table(shares_, context)
    starved = starved_table(
        shares_, input_starved(data.container_stats, low=th.input_low, high=th.input_high,
                               min_cv=th.input_min_cv, min_samples=th.input_min_samples),
        context, holding)

    strag = stragglers(data.containers, data.pods, window, hs, gpus=data.gpus,
                       node_models={n: s.model for n, s in summaries.items()},
                       signals=signals, runs=runs, factor=th.straggler_factor,
                       duration=th.straggler_duration, slow_factor=th.slow_factor,
                       slow_busy=th.slow_busy)
    # The evidence of the rows shown, read now (where the store reads it on demand; the
    # others' when they are asked for), else of every row from the evidence in hand; over
    # the history there is, as the stores read it.
    evidence = RowEvidence(strag, data.read_evidence or (lambda _nodes: data.evidence),
                           min(th.straggler_duration, window.seconds, data.history_seconds))
    straggler_rows = straggler_table(strag, context, device_price)
    straggler_rows, problem = evidence(
        straggler_rows, TOP_ROWS if data.read_evidence is not None else len(straggler_rows))
    problems += [problem] if problem else []
    if data.read_evidence is not None:
        row_details[ids.STRAGGLERS_TABLE] = evidence

    heatmap, notes = _heatmap(data, fleet, inventory, states, spinning, verdicts,
                              found.totals.per_node if found is not None else None)
    notes = (*notes, *problems)

    pod_names, workloads, default_workload, default_cluster = _pickers(
        data, context, straggler_rows, strag)
    all_nodes = tuple(sorted(gpu_nodes | set(data.nodes) | set(summaries)))
    return FleetView(
        window=window,
        history_start=hs,
        kpis=kpis,
        heatmap=heatmap,
        idle_rows=idle_rows,
        starved_rows=starved,
        share_rows=share_rows,
        straggler_rows=straggler_rows,
        workloads_checked=(strag.workloads_checked if data.workloads_checked is None
                           else data.workloads_checked),
        nodes=all_nodes,
        pods=tuple(pod_names),
        queries=data.queries,
        notes=notes,
        thresholds=th,
        spinning_rows=spinning_rows,
        allocated_idle_rows=allocated_rows,
        slice_rows=slice_rows,
        workloads=tuple(workloads),
        default_workload=default_workload,
        default_workload_cluster=default_cluster,
        findings=findings,
        context=context,
        owners=owners,
        row_details=row_details,
    )


def with_details(view: FleetView, table_id: str, first: int) -> tuple[FleetView, str | None]:
    """``view`` with what the first ``first`` rows of table ``table_id`` show beyond their
    verdict read from the store (:attr:`FleetView.row_details`), and a line where the store
    failed; ``view`` itself where nothing is left to read."""
    read = view.row_details.get(table_id)
    if read is None:
        return view, None
    name = _DETAILED_ROWS[table_id]
    before = getattr(view, name)
    rows, problem = read(before, first)
    if rows is before:
        return view, problem
    changed: dict[str, Any] = {name: rows}
    return replace(view, **changed), problem
