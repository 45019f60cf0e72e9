"""What idle nodes cost.

Waste = idle GPU-hours x (node $/hour / GPUs on the node), split into *unallocated* (no
container holds the GPU) and *allocated-idle* (a container holds it and does not use it).
A node whose instance type has no known price is reported as unpriced, never as $0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuscope.dashboard.analysis.idle import NodeIdle


@dataclass(frozen=True, slots=True)
class NodeWaste:
    """``price_per_hour`` None: unknown instance type (no dollar figures)."""

    idle: NodeIdle
    price_per_hour: float | None
    wasted: float | None
    wasted_unallocated: float | None
    wasted_allocated: float | None


@dataclass(frozen=True, slots=True)
class WasteReport:
    nodes: tuple[NodeWaste, ...]
    burning_per_hour: float          # $/hour the priced idle nodes cost right now
    wasted: float                    # $ wasted by priced idle nodes in the window
    wasted_unallocated: float
    wasted_allocated: float
    unpriced_nodes: tuple[str, ...]  # idle nodes of unknown price (not in the totals)


def waste(
    nodes: Mapping[str, NodeIdle], price_per_hour: Mapping[str, float | None]
) -> WasteReport:
    """``price_per_hour``: node -> $/hour of its instance type (None or absent: unknown)."""
    rows: list[NodeWaste] = []
    burning = total = unalloc = alloc = 0.0
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
        rows.append(NodeWaste(idle, price, w_alloc + w_unalloc, w_unalloc, w_alloc))
        burning += price
        total += w_alloc + w_unalloc
        unalloc += w_unalloc
        alloc += w_alloc
    rows.sort(key=lambda r: (r.wasted is None, -(r.wasted or 0.0), r.idle.node))
    return WasteReport(tuple(rows), burning, total, unalloc, alloc, tuple(unpriced))
