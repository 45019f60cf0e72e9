"""Every component id of the dashboard, in one place.

The first six are the stable ids of DESIGN.md that tests and screenshots rely on.
"""

from __future__ import annotations

# Stable (DESIGN.md).
FLEET_KPIS = "fleet-kpis"
FLEET_HEATMAP = "fleet-heatmap"
IDLE_NODES_TABLE = "idle-nodes-table"
WASTE_TOTAL = "waste-total"
STARVED_PODS_TABLE = "starved-pods-table"
STRAGGLERS_TABLE = "stragglers-table"

# Controls.
WINDOW_SELECT = "window-select"
NAMESPACE_FILTER = "namespace-filter"
REFRESH = "refresh-interval"
NODE_SELECT = "node-select"
POD_SELECT = "pod-select"

# Status.
BANNER = "data-banner"
LAST_UPDATED = "last-updated"
HISTORY_NOTE = "history-note"
SOURCE_LABEL = "source-label"

# Sections and secondary tables.
TIMESLICE_TABLE = "timeslice-table"
STRAGGLERS_NOTE = "stragglers-note"
IDLE_NOTE = "idle-note"
STARVED_NOTE = "starved-note"
TIMESLICE_NOTE = "timeslice-note"
SECTION_FLEET = "section-fleet"
SECTION_IDLE = "section-idle"
SECTION_STARVATION = "section-starvation"
SECTION_STRAGGLERS = "section-stragglers"
SECTION_NODE = "section-node"
SECTION_POD = "section-pod"

# Drill-down graphs.
NODE_UTIL_GRAPH = "node-util-graph"
NODE_MEMORY_GRAPH = "node-memory-graph"
NODE_CONTAINERS_GRAPH = "node-containers-graph"
NODE_BANNER = "node-banner"
POD_UTIL_GRAPH = "pod-util-graph"
POD_MEMORY_GRAPH = "pod-memory-graph"
POD_BANNER = "pod-banner"

DESIGN_IDS = (
    FLEET_KPIS, FLEET_HEATMAP, IDLE_NODES_TABLE, WASTE_TOTAL, STARVED_PODS_TABLE,
    STRAGGLERS_TABLE,
)
