"""What idle capacity costs.

Waste = idle GPU-hours x (node $/hour / GPUs on the node), split into *unallocated* (no
container holds the GPU) and *allocated-idle* (a container holds it and does not use it);
the part of it in which GPUs spun (busy by utilization, doing no work) is reported too. A MIG
slice counts as its share of its GPU's compute slices, and an idle slice is waste even on a
node that is busy otherwise: it is capacity of its own that nothing else can use. A node
whose instance type has no known price is reported as unpriced, never as $0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuscope.dashboard.verdicts.idle import NodeIdle, SliceIdle


@dataclass(frozen=True, slots=True)
class NodeWaste:
    """``price_per_hour`` None: unknown instance type (no dollar figures)."""

    idle: NodeIdle
    price_per_hour: float | None
    wasted: float | None
    wasted_unallocated: float | None
    wasted_allocated: float | None
    wasted_spinning: float | None = None


@dataclass(frozen=True, slots=True)
class SliceWaste:
    """An idle MIG slice on a busy node; ``price_per_hour`` is the slice's share."""

    slice: SliceIdle
    price_per_hour: float | None
    wasted: float | None
    allocated: bool


@dataclass(frozen=True, slots=True)
class WasteReport:
    nodes: tuple[NodeWaste, ...]
    burning_per_hour: float          # $/hour the priced idle capacity costs right now
    wasted: float                    # $ wasted by priced idle capacity in the window
    wasted_unallocated: float
    wasted_allocated: float
    unpriced_nodes: tuple[str, ...]  # idle nodes of unknown price (not in the totals)
    slices: tuple[SliceWaste, ...] = ()
    wasted_spinning: float = 0.0     # the part of ``wasted`` in which GPUs spun


def waste(
    nodes: Mapping[str, NodeIdle],
    price_per_hour: Mapping[str, float | None],
    *,
    slices: Sequence[SliceIdle] = (),
    gpus_per_node: Mapping[str, int] | None = None,
) -> WasteReport:
    """``price_per_hour``: node -> $/hour of its instance type (None or absent: unknown);
    ``slices``: idle MIG slices on nodes that are not idle, priced at their share of a GPU
    (``gpus_per_node``: whole GPUs per node)."""
    rows: list[NodeWaste] = []
    burning = total = unalloc = alloc = spinning = 0.0
    unpriced: list[str] = []
    for name in sorted(nodes):
        idle = nodes[name]
        price = price_per_hour.get(name)
        if price is None:
            rows.append(NodeWaste(idle, None, None, None, None))
            unpriced.append(name)
            continue
        per_gpu_second = price / idle.gpus / 3600.0
        w_alloc = idle.allocated_gpu_seconds * per_gpu_second
        w_unalloc = idle.unallocated_gpu_seconds * per_gpu_second
        w_spin = idle.spinning_gpu_seconds * per_gpu_second
        rows.append(NodeWaste(idle, price, w_alloc + w_unalloc, w_unalloc, w_alloc, w_spin))
        burning += price
        total += w_alloc + w_unalloc
        unalloc += w_unalloc
        alloc += w_alloc
        spinning += w_spin
    rows.sort(key=lambda r: (r.wasted is None, -(r.wasted or 0.0), r.idle.node))

    slice_rows: list[SliceWaste] = []
    counts = gpus_per_node or {}
    for s in slices:
        node_price = price_per_hour.get(s.ref.node)
        n = counts.get(s.ref.node, 0)
        held = s.verdict.allocated_seconds > 0
        if node_price is None or n <= 0:
            slice_rows.append(SliceWaste(s, None, None, held))
            continue
        price = node_price / n * s.share
        wasted = s.verdict.idle_seconds / 3600.0 * price
        w_alloc = wasted * s.verdict.allocated_seconds / s.verdict.idle_seconds \
            if s.verdict.idle_seconds > 0 else 0.0
        slice_rows.append(SliceWaste(s, price, wasted, held))
        burning += price
        total += wasted
        alloc += w_alloc
        unalloc += wasted - w_alloc
    return WasteReport(tuple(rows), burning, total, unalloc, alloc, tuple(unpriced),
                       tuple(slice_rows), spinning)
