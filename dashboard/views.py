"""From :class:`~gpuscope.dashboard.series.FleetData` to what the page shows: runs the analysis and
prices the waste. Pure (no I/O), so every number on the page is testable without a browser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuscope.dashboard.analysis import Thresholds
from gpuscope.dashboard.analysis.idle import idle_gpus, idle_nodes, physical_gpus
from gpuscope.dashboard.analysis.starvation import input_starved, timeslice_shares
from gpuscope.dashboard.analysis.stragglers import stragglers
from gpuscope.dashboard.analysis.waste import waste
from gpuscope.dashboard.prices import PriceTable
from gpuscope.dashboard.series import FleetData, GpuRef, Window


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


@dataclass(frozen=True, slots=True)
class IdleRow:
    node: str
    instance_type: str
    gpus: int
    idle_since: float
    idle_seconds: float
    price_per_hour: float | None
    wasted: float | None
    wasted_unallocated: float | None
    wasted_allocated: float | None
    allocated_gpus: int
    required_seconds: float
    history_seconds: float

    @property
    def unallocated_gpus(self) -> int:
        return self.gpus - self.allocated_gpus


@dataclass(frozen=True, slots=True)
class StarvedRow:
    """``kind`` is ``time-slice`` or ``input-starved``."""

    kind: str
    namespace: str
    pod: str
    container: str
    node: str
    gpu: str
    utilization: float
    detail: str
    seconds: float | None = None
    required_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ShareRow:
    node: str
    gpu: str
    namespace: str
    pod: str
    container: str
    utilization: float
    share: float | None
    fair_share: float
    sharers: int
    gpu_utilization: float | None
    starved: bool
    starving_seconds: float
    required_seconds: float


@dataclass(frozen=True, slots=True)
class StragglerRow:
    namespace: str
    workload: str
    pods: tuple[str, ...]
    node: str
    gpu: str
    utilization: float
    median: float
    since: float
    seconds: float
    required_seconds: float
    devices: int

    @property
    def ratio(self) -> float:
        return self.utilization / self.median if self.median > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Heatmap:
    """Rows are nodes, columns GPU indices; ``z`` None where a GPU reports no utilization."""

    nodes: tuple[str, ...]
    columns: tuple[str, ...]
    z: tuple[tuple[float | None, ...], ...]
    idle: tuple[tuple[bool, ...], ...]


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

    @property
    def history_seconds(self) -> float:
        return max(0.0, self.window.end - self.history_start)


def _gpu_index(data: FleetData, ref: GpuRef) -> str:
    info = data.gpus.get(ref)
    return info.gpu if info is not None else ref.uuid[-8:]


def _index_key(index: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in index.split("/"))
    except ValueError:
        return (1 << 30,)


def build_fleet_view(
    data: FleetData,
    prices: PriceTable,
    thresholds: Thresholds | None = None,
    namespace: str | None = None,
) -> FleetView:
    th = thresholds or Thresholds()
    window, hs = data.window, data.history_start

    verdicts = idle_gpus(
        data.gpu_busy_max, window, hs, allocated=data.allocated,
        threshold=th.idle_utilization, duration=th.idle_duration,
    )
    nodes_idle = idle_nodes(data.gpus, verdicts)
    node_prices = {
        node: prices.per_hour(data.nodes[node].instance_type) if node in data.nodes else None
        for node in nodes_idle
    }
    report = waste(nodes_idle, node_prices)

    # KPIs over whole GPUs (MIG slices are parts of one).
    whole = [info for infos in physical_gpus(data.gpus).values() for info in infos]
    idle_n = sum(1 for g in whole if (v := verdicts.get(g.ref)) is not None and v.idle)
    with_data = [g for g in whole if g.ref in data.gpu_now]
    means = [data.gpu_mean[g.ref] for g in whole if g.ref in data.gpu_mean]
    kpis = Kpis(
        gpus=len(whole),
        busy=len(with_data) - idle_n,
        idle=idle_n,
        no_data=len(whole) - len(with_data),
        mean_utilization=sum(means) / len(means) if means else None,
        idle_nodes=len(nodes_idle),
        burning_per_hour=report.burning_per_hour,
        wasted=report.wasted,
        wasted_unallocated=report.wasted_unallocated,
        wasted_allocated=report.wasted_allocated,
        unpriced_idle_nodes=report.unpriced_nodes,
    )

    idle_rows = tuple(
        IdleRow(
            node=w.idle.node,
            instance_type=data.nodes[w.idle.node].instance_type if w.idle.node in data.nodes
            else "",
            gpus=w.idle.gpus,
            idle_since=w.idle.idle_since,
            idle_seconds=window.end - w.idle.idle_since,
            price_per_hour=w.price_per_hour,
            wasted=w.wasted,
            wasted_unallocated=w.wasted_unallocated,
            wasted_allocated=w.wasted_allocated,
            allocated_gpus=w.idle.allocated_gpus,
            required_seconds=w.idle.required_seconds,
            history_seconds=w.idle.history_seconds,
        )
        for w in report.nodes
    )

    def wanted(ns: str) -> bool:
        return namespace is None or ns == namespace

    shares = timeslice_shares(
        data.containers, data.gpu_step_mean, window, hs,
        busy=th.busy_utilization, share_factor=th.share_factor,
        duration=th.starvation_duration,
    )
    share_rows = tuple(
        ShareRow(
            node=s.ref.node, gpu=_gpu_index(data, s.ref.gpu), namespace=s.ref.namespace,
            pod=s.ref.pod, container=s.ref.container, utilization=s.utilization,
            share=s.share, fair_share=s.fair_share, sharers=s.sharers,
            gpu_utilization=s.gpu_utilization, starved=s.starved,
            starving_seconds=s.starved_seconds, required_seconds=s.required_seconds,
        )
        for s in shares
        if wanted(s.ref.namespace)
    )
    starved: list[StarvedRow] = [
        StarvedRow(
            kind="time-slice", namespace=r.namespace, pod=r.pod, container=r.container,
            node=r.node, gpu=r.gpu, utilization=r.utilization,
            detail=(f"share {_pct(r.share)} of the GPU's container load vs fair share "
                    f"{_pct(r.fair_share)} ({r.sharers} containers), GPU "
                    f"{_pct(r.gpu_utilization)} busy"),
            seconds=r.starving_seconds, required_seconds=r.required_seconds,
        )
        for r in share_rows if r.starved
    ]
    for s in input_starved(
        data.container_stats, low=th.input_low, high=th.input_high, min_cv=th.input_min_cv,
        min_samples=th.input_min_samples,
    ):
        if not wanted(s.ref.namespace):
            continue
        starved.append(StarvedRow(
            kind="input-starved", namespace=s.ref.namespace, pod=s.ref.pod,
            container=s.ref.container, node=s.ref.node, gpu=_gpu_index(data, s.ref.gpu),
            utilization=s.mean,
            detail=(f"mean {_pct(s.mean)}, varies strongly (CV {s.cv:.2f} over {s.samples} "
                    f"samples) while holding {s.memory_bytes / 2**30:.1f} GiB: suspected "
                    f"waiting on input"),
        ))

    strag = stragglers(data.containers, data.pods, window, hs, factor=th.straggler_factor,
                       duration=th.straggler_duration)
    straggler_rows = tuple(
        StragglerRow(
            namespace=s.namespace, workload=s.workload, pods=s.pods, node=s.gpu.node,
            gpu=_gpu_index(data, s.gpu), utilization=s.utilization, median=s.median,
            since=s.since, seconds=s.seconds, required_seconds=s.required_seconds,
            devices=s.devices,
        )
        for s in strag.stragglers if wanted(s.namespace)
    )

    # Heatmap: window-mean utilization, nodes x whole-GPU indices.
    by_node = physical_gpus(data.gpus)
    node_names = tuple(sorted(by_node))
    columns = tuple(sorted({g.gpu for infos in by_node.values() for g in infos}, key=_index_key))
    z_rows, idle_cells = [], []
    for node in node_names:
        cells = {g.gpu: g.ref for g in by_node[node]}
        z_row: list[float | None] = []
        idle_row: list[bool] = []
        for col in columns:
            ref = cells.get(col)
            mean = data.gpu_mean.get(ref) if ref is not None else None
            z_row.append(None if mean is None or math.isnan(mean) else mean)
            v = verdicts.get(ref) if ref is not None else None
            idle_row.append(bool(v and v.idle))
        z_rows.append(tuple(z_row))
        idle_cells.append(tuple(idle_row))

    pod_names = sorted({f"{p.namespace}/{p.pod}" for p in data.pods.values() if wanted(p.namespace)}
                       | {f"{c.namespace}/{c.pod}" for c in data.containers if wanted(c.namespace)})
    all_nodes = tuple(sorted(set(by_node) | set(data.nodes)))
    return FleetView(
        window=window,
        history_start=hs,
        kpis=kpis,
        heatmap=Heatmap(node_names, columns, tuple(z_rows), tuple(idle_cells)),
        idle_rows=idle_rows,
        starved_rows=tuple(starved),
        share_rows=share_rows,
        straggler_rows=straggler_rows,
        workloads_checked=strag.workloads_checked,
        nodes=all_nodes,
        pods=tuple(pod_names),
        queries=data.queries,
        notes=data.notes,
        thresholds=th,
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"
