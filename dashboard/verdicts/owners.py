"""Showback: what each owner's GPUs cost in the window, and how much of it was wasted.

An owner is a workload (``<Kind>/<name>`` of its pods' top owner, or none for a bare pod) in
a namespace in a cluster; the tables roll workloads up to namespaces and clusters. From the
store's :class:`~gpuscope.dashboard.series.Holding` of every node (who held what, in
device-seconds, a time-slice's holder ``1/n`` of its GPU) and the page's prices and idle
verdicts:

- **$ spent**: what the devices an owner held cost while it held them (a whole GPU at its
  node's $/hour over its whole GPUs, a MIG slice at its share of its GPU). A node's cost in
  the window is its $/hour over the time it was there in the history the page has
  (``history_seconds``, less the steps at which a node that came up or went away within it
  was not there: ``present``); the part no container held is its cluster's
  **(unallocated)** row, so the owners' $ spent add up to
  the fleet's cost in the window (``Kpis.spent``) to the cent. The store counts a whole
  step for each step a device was held, so over a history shorter than the steps cover (a
  store younger than a step of a long window) every held time is first scaled by the
  history over the steps' time (``step_seconds``), the same for every holder, so that what
  nobody held stays unallocated; what still counts more than the node's history (steps at
  the window's edges) is scaled down to the node's cost, and its GPU-hours to what its
  whole GPUs can hold over the history.
- **$ idle**: the idle capacity's waste (:mod:`.waste`, the page's ``Wasted`` KPI), each
  idle node's allocated-idle part shared among the node's holders by how much each held
  there, its unallocated part the cluster's (unallocated) row; an idle MIG slice's waste
  goes to its own holders likewise. The owners' $ idle add up to the KPI.
- **$ spinning**: the part of $ idle in which the GPUs spun (busy by utilization, no work),
  shared the same way.
- **Mean use**: device-seconds used over device-seconds held (the containers'
  utilization), at most 100 % (a time-slice's holder can use more than its slice), of whole
  GPUs alone: NVML gives no per-process utilization on a MIG slice, so a slice's holder has
  no measured use (its hours are left out of the mean; n/a where it held slices only), never
  0 % as if it had not worked.

A node of unknown price adds GPU-hours and no dollars (never $0 as if free).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from gpuscope.dashboard import ids, links
from gpuscope.dashboard.data.promql import node_parts
from gpuscope.dashboard.series import GpuRef, Holding, HoldingKey, Series, seconds_there
from gpuscope.dashboard.verdicts.page import Column, Row, Section, State, Table
from gpuscope.dashboard.verdicts.waste import WasteReport

#: The namespace of capacity no container held (each cluster has one such row).
UNALLOCATED = "(unallocated)"
#: A MIG slice's share of its GPU where the page has no ``gpu_info`` of it (the smallest
#: compute slice of a 7-slice GPU).
UNKNOWN_SLICE_SHARE = 1 / 7


@dataclass(frozen=True, slots=True)
class OwnerCost:
    """One owner's totals over the window: ``namespace`` :data:`UNALLOCATED` for the
    capacity no container held; ``workload`` "" for every workload of the namespace
    (:func:`rollup`) or bare pods; ``cluster`` "" in a store of one cluster. Hours are
    device-hours (whole-GPU equivalents); the dollars are of the priced nodes alone."""

    cluster: str
    namespace: str
    workload: str
    gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    spent: float = 0.0
    idle: float = 0.0
    spinning: float = 0.0
    unpriced_gpu_hours: float = 0.0  # of ``gpu_hours``, on nodes of unknown price
    #: Of ``gpu_hours``, those whose use is measured (whole GPUs: a MIG slice's holder has
    #: no per-container utilization).
    measured_gpu_hours: float = 0.0

    @property
    def mean_use(self) -> float | None:
        """Device-seconds used over held where use is measured, at most 1 (a time-slice's
        holder that used more than its slice used all of it); None: it held nothing whose
        use is measured (MIG slices only)."""
        return (min(1.0, self.used_gpu_hours / self.measured_gpu_hours)
                if self.measured_gpu_hours > 0 else None)


def showback(
    holdings: Mapping[HoldingKey, Holding],
    node_price: Mapping[str, float | None],
    gpus_on: Callable[[str], int],
    slice_share: Mapping[GpuRef, float],
    history_seconds: float,
    report: WasteReport,
    step_seconds: float | None = None,
    present: Mapping[str, float] | None = None,
) -> tuple[OwnerCost, ...]:
    """Every owner's :class:`OwnerCost` (workloads, and each cluster's unallocated row),
    costliest waste first. ``node_price``: every node the page prices (None: unknown);
    ``gpus_on``: whole GPUs per node; ``slice_share``: each MIG slice's share of its GPU;
    ``history_seconds``: how much of the window each node is charged for; ``report``: the
    page's idle waste; ``step_seconds``: the window's step, at which the store counted the
    held time (None: the held time is the history's); ``present``: how long each node
    that was not there for the whole history was there (``FleetData.present``), the time
    it is charged for (a node not in it: ``history_seconds``)."""
    if step_seconds and step_seconds > 0 and history_seconds > 0:
        # The steps that cover the history, each counted whole: a device held throughout is
        # counted that long, not the history's length. Scaled alike, before any cap, the
        # holders keep their shares of the node and the rest stays unallocated.
        covered = step_seconds * math.ceil(history_seconds / step_seconds - 1e-9)
        if covered > history_seconds:
            fit = history_seconds / covered
            holdings = {k: Holding(h.held * fit, h.used * fit) for k, h in holdings.items()}
    # Each owner's terms by column, summed at the end (``fsum``: the same totals whatever
    # order the nodes come in).
    acc: dict[tuple[str, str, str], list[list[float]]] = {}

    def add(node: str, namespace: str, workload: str, *values: float) -> None:
        """Adds (gpu-hours, used hours, spent, idle, spinning, unpriced hours, measured
        hours) from the start."""
        terms = acc.get((cluster := node_parts(node)[0], namespace, workload))
        if terms is None:
            terms = acc[(cluster, namespace, workload)] = [[] for _ in range(7)]
        for i, v in enumerate(values):
            if v:
                terms[i].append(v)

    def weight_of(key: HoldingKey) -> float:
        return 1.0 if not key.uuid else slice_share.get(
            GpuRef(key.node, key.uuid), UNKNOWN_SLICE_SHARE)

    # What a node's whole GPUs can hold over the history, against what the store counted
    # (more at a long window's coarse steps over a younger store): the hours' scale.
    counted: dict[str, float] = {}
    for key, h in holdings.items():
        counted[key.node] = counted.get(key.node, 0.0) + h.held * weight_of(key)
    fits = {node: min(1.0, gpus_on(node) * history_seconds / seconds)
            for node, seconds in counted.items() if seconds > 0 and gpus_on(node) > 0}

    # Each node's holders, by device-seconds weighted to whole GPUs (a slice by its share).
    on_node: dict[str, dict[tuple[str, str], float]] = {}
    on_slice: dict[GpuRef, dict[tuple[str, str], float]] = {}
    for key, h in holdings.items():
        weight = weight_of(key)
        owner = (key.namespace, key.workload)
        held = on_node.setdefault(key.node, {})
        held[owner] = held.get(owner, 0.0) + h.held * weight
        fit = fits.get(key.node, 1.0)
        hours = h.held * weight * fit / 3600.0
        add(key.node, *owner, hours, h.used * weight * fit / 3600.0, 0.0, 0.0, 0.0,
            hours if node_price.get(key.node) is None else 0.0,
            0.0 if key.uuid else hours)  # a slice's use is not measured
        if key.uuid:
            mine = on_slice.setdefault(GpuRef(key.node, key.uuid), {})
            mine[owner] = mine.get(owner, 0.0) + h.held

    # $ spent: each priced node's cost in the window, to its holders and the rest unallocated.
    for node, price in node_price.items():
        n = gpus_on(node)
        if price is None or n <= 0:
            continue
        # Its price over the time it was there (a node that came up or went away within
        # the window is not charged for the rest of the history).
        cost = price * seconds_there(present or {}, node, history_seconds) / 3600.0
        held = on_node.get(node, {})
        per_second = price / n / 3600.0
        total = math.fsum(held.values()) * per_second
        scale = min(1.0, cost / total) if total > 0 else 0.0
        for owner, seconds in held.items():
            add(node, *owner, 0.0, 0.0, seconds * per_second * scale)
        add(node, UNALLOCATED, "", 0.0, 0.0, cost - math.fsum(
            s * per_second * scale for s in held.values()))

    def share_out(node: str, amount: float, holders: Mapping[tuple[str, str], float],
                  column: int) -> None:
        """``amount`` to ``holders`` by how much each held; unallocated where none did."""
        total = math.fsum(holders.values())
        if total <= 0:
            add(node, UNALLOCATED, "", *([0.0] * column), amount)
            return
        for owner, seconds in holders.items():
            add(node, *owner, *([0.0] * column), amount * seconds / total)

    for w in report.nodes:
        node = w.idle.node
        if w.wasted is None:
            continue
        holders = on_node.get(node, {})
        add(node, UNALLOCATED, "", 0.0, 0.0, 0.0, w.wasted_unallocated or 0.0)
        share_out(node, w.wasted_allocated or 0.0, holders, 3)
        share_out(node, w.wasted_spinning or 0.0, holders, 4)
    for s in report.slices:
        if s.wasted is None:
            continue
        v = s.slice.verdict
        allocated = s.wasted * v.allocated_seconds / v.idle_seconds if v.idle_seconds > 0 \
            else 0.0
        node = s.slice.ref.node
        add(node, UNALLOCATED, "", 0.0, 0.0, 0.0, s.wasted - allocated)
        share_out(node, allocated, on_slice.get(s.slice.ref, {}), 3)

    rows = [OwnerCost(cluster, namespace, workload, *(math.fsum(t) for t in terms))
            for (cluster, namespace, workload), terms in acc.items()]
    return tuple(sorted(rows, key=_order))


def _order(row: OwnerCost) -> tuple[float, float, str, str, str]:
    return (-row.idle, -row.spent, row.cluster, row.namespace, row.workload)


def rollup(rows: Iterable[OwnerCost], by_namespace: bool) -> tuple[OwnerCost, ...]:
    """``rows`` summed per cluster and namespace (``by_namespace``) or per cluster, costliest
    waste first."""
    acc: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        key = (r.cluster, r.namespace if by_namespace else "")
        sums = acc.setdefault(key, [0.0] * 7)
        for i, v in enumerate((r.gpu_hours, r.used_gpu_hours, r.spent, r.idle, r.spinning,
                               r.unpriced_gpu_hours, r.measured_gpu_hours)):
            sums[i] += v
    return tuple(sorted((OwnerCost(c, ns, "", *sums) for (c, ns), sums in acc.items()),
                        key=_order))


# -- on the page -----------------------------------------------------------------------------

def _columns(*first: Column) -> tuple[Column, ...]:
    return (*first,
            Column("gpu_hours", "GPU-hours held", "ratio"),
            Column("mean_use", "Mean use", "percent"),
            Column("spent", "$ spent", "money"),
            Column("idle", "$ idle", "money"),
            Column("spinning", "$ spinning", "money"),
            Column("waste_share", "Share of the waste", "percent"))


CLUSTER_COLUMNS = _columns(Column("cluster", "Cluster"))
NAMESPACE_COLUMNS = _columns(Column("cluster", "Cluster"), Column("namespace", "Namespace"))
WORKLOAD_COLUMNS = _columns(Column("cluster", "Cluster"), Column("namespace", "Namespace"),
                            Column("workload", "Workload", "link"))

SECTION = Section(
    id=ids.COST_BY_OWNER, title="Cost by owner",
    intro="Who spends what: what the GPUs each workload held cost in the window ($ spent: a "
          "whole GPU at its node's price over its GPUs, a MIG slice at its share, a "
          "time-sliced GPU split among its holders), how much of that was idle capacity "
          "($ idle, as in the idle cost above: an idle node's held GPUs to their holders) and "
          "of it spinning, and each owner's share of the fleet's waste; by cluster, then "
          "namespace, then workload. Capacity nobody held is each cluster's "
          f"{UNALLOCATED} row, so the rows add up to the fleet's cost and idle cost.",
    tables=(
        Table(ids.COST_BY_CLUSTER_TABLE, ids.COST_BY_CLUSTER_NOTE, CLUSTER_COLUMNS,
              heading="By cluster", order="idle"),
        Table(ids.COST_BY_NAMESPACE_TABLE, ids.COST_BY_NAMESPACE_NOTE, NAMESPACE_COLUMNS,
              heading="By namespace", order="idle"),
        Table(ids.COST_BY_WORKLOAD_TABLE, ids.COST_BY_WORKLOAD_NOTE, WORKLOAD_COLUMNS,
              heading="By workload", order="idle"),
    ),
)


def owner_rows(rows: Iterable[OwnerCost], total_idle: float, state: State) -> list[Row]:
    """Table rows of ``rows`` (each level's own columns are read from them): a workload
    links to the workload view."""
    out: list[Row] = []
    for r in rows:
        # Unknown, not $0, where everything it held was of unknown price: its spent, idle
        # and spinning dollars alike (an idle node of unknown price wastes unknown dollars).
        unknown = r.unpriced_gpu_hours >= r.gpu_hours > 0 and r.spent == 0
        out.append({
            "cluster": r.cluster or "(this store)",
            "namespace": r.namespace,
            "workload": (links.workload_link(r.namespace, r.workload,
                                              links.in_cluster(state, r.cluster))
                         if r.workload
                         else "(bare pods)" if r.namespace != UNALLOCATED else ""),
            "gpu_hours": r.gpu_hours,
            "mean_use": r.mean_use,
            "spent": None if unknown else r.spent,
            "idle": None if unknown else r.idle,
            "spinning": None if unknown else r.spinning,
            "waste_share": r.idle / total_idle if total_idle > 0 and not unknown else None,
        })
    return out


@dataclass(frozen=True, slots=True)
class RunTotals:
    """One workload's (one distributed run's) own numbers over the window, for the workload
    view: its :class:`OwnerCost` summed over clusters (or the picked cluster's), the
    stragglers found in it, and when its GPUs reported first and last in the window (epoch
    seconds; None: no series)."""

    gpu_hours: float
    spent: float
    idle: float
    spinning: float
    unpriced_gpu_hours: float
    stragglers: int
    first_seen: float | None
    last_seen: float | None


def run_totals(rows: Iterable[OwnerCost], namespace: str, workload: str, stragglers: int,
               series: Iterable[Series], step: float = 0.0, began: float | None = None
               ) -> RunTotals | None:
    """:class:`RunTotals` of ``namespace/workload`` from the page's owners, its stragglers'
    count and its devices' series (None: the page has no such owner). A series' point is
    the mean of the ``step`` before it: the run was first seen at the start of its first
    step, but not before ``began`` (the page's history, or its window's start)."""
    mine = [r for r in rows if (r.namespace, r.workload) == (namespace, workload)]
    if not mine:
        return None
    times = [t for s in series for t in (s.times[:1] + s.times[-1:])]
    first = min(times) - step if times else None
    if first is not None and began is not None:
        first = max(first, min(began, min(times)))
    return RunTotals(
        gpu_hours=math.fsum(r.gpu_hours for r in mine), spent=math.fsum(r.spent for r in mine),
        idle=math.fsum(r.idle for r in mine), spinning=math.fsum(r.spinning for r in mine),
        unpriced_gpu_hours=math.fsum(r.unpriced_gpu_hours for r in mine),
        stragglers=stragglers, first_seen=first, last_seen=max(times) if times else None)
