"""Every component id of the dashboard, in one place.

:data:`DESIGN_IDS` are the stable ids of DESIGN.md that tests, screenshots and links rely on;
every one is rendered on the main page.
"""

from __future__ import annotations

# Stable (DESIGN.md).
FLEET_KPIS = "fleet-kpis"
FLEET_HEATMAP = "fleet-heatmap"
IDLE_NODES_TABLE = "idle-nodes-table"
WASTE_TOTAL = "waste-total"
STARVED_PODS_TABLE = "starved-pods-table"
STRAGGLERS_TABLE = "stragglers-table"
SPINNING_GPUS_TABLE = "spinning-gpus-table"
THROTTLED_GPUS_TABLE = "throttled-gpus-table"
ALLOCATED_IDLE_TABLE = "allocated-idle-table"
WORKLOAD_VIEW = "workload-view"
COST_BY_OWNER = "cost-by-owner"  # the showback section (issue 30)

# Controls, and the page URL that carries their state.
URL = "page-url"
WINDOW_SELECT = "window-select"
NAMESPACE_FILTER = "namespace-filter"
CLUSTER_SELECT = "cluster-select"
REFRESH = "refresh-interval"
NODE_SELECT = "node-select"
POD_SELECT = "pod-select"
WORKLOAD_SELECT = "workload-select"
SCROLLED = "scrolled"  # a store the scroll-to-section clientside callback writes
NODE_SCROLLED = "node-scrolled"  # a store: the heatmap click last scrolled to its node
CHOICES = "choices"    # a store: which fleet view (window, namespace, cluster) the dropdowns name
TABLE_LIMITS = "table-limits"  # a store: the tables whose rows were all asked for
# Stores: what each graph shows (callbacks.redraw: a refresh of the same keeps the zoom).
HEATMAP_DRAWN = "heatmap-drawn"
WORKLOAD_DRAWN = "workload-drawn"
NODE_DRAWN = "node-drawn"
POD_DRAWN = "pod-drawn"

# Status.
BANNER = "data-banner"
LAST_UPDATED = "last-updated"
HISTORY_NOTE = "history-note"
SOURCE_LABEL = "source-label"

# Sections and secondary tables.
TIMESLICE_TABLE = "timeslice-table"
IDLE_SLICES_TABLE = "idle-slices-table"
STRAGGLERS_NOTE = "stragglers-note"
IDLE_NOTE = "idle-note"
IDLE_SLICES_NOTE = "idle-slices-note"
STARVED_NOTE = "starved-note"
TIMESLICE_NOTE = "timeslice-note"
SPINNING_NOTE = "spinning-note"
THROTTLED_NOTE = "throttled-note"
ALLOCATED_IDLE_NOTE = "allocated-idle-note"
WORKLOAD_NOTE = "workload-note"
SECTION_FLEET = "section-fleet"
SECTION_IDLE = "section-idle"
SECTION_ALLOCATED = "section-allocated-idle"
SECTION_SPINNING = "section-spinning"
SECTION_THROTTLED = "section-throttled"
SECTION_STARVATION = "section-starvation"
SECTION_STRAGGLERS = "section-stragglers"
SECTION_WORKLOAD = "section-workload"
COST_BY_CLUSTER_TABLE = "cost-by-cluster-table"
COST_BY_CLUSTER_NOTE = "cost-by-cluster-note"
COST_BY_NAMESPACE_TABLE = "cost-by-namespace-table"
COST_BY_NAMESPACE_NOTE = "cost-by-namespace-note"
COST_BY_WORKLOAD_TABLE = "cost-by-workload-table"
COST_BY_WORKLOAD_NOTE = "cost-by-workload-note"
SECTION_NODE = "section-node"
SECTION_POD = "section-pod"

# Drill-down graphs (each drill-down's graphs sit in one box, folded away while nothing is
# picked; the graphs stay on the page, so a refresh redraws their data, not their zoom).
NODE_GRAPHS = "node-graphs"
NODE_UTIL_GRAPH = "node-util-graph"
NODE_MEMORY_GRAPH = "node-memory-graph"
NODE_CONTAINERS_GRAPH = "node-containers-graph"
NODE_ACTIVITY_GRAPH = "node-activity-graph"
NODE_POWER_GRAPH = "node-power-graph"
NODE_THROTTLE_GRAPH = "node-throttle-graph"
NODE_BANNER = "node-banner"
POD_GRAPHS = "pod-graphs"
POD_UTIL_GRAPH = "pod-util-graph"
POD_MEMORY_GRAPH = "pod-memory-graph"
POD_BANNER = "pod-banner"
#: Each drill-down's graphs, in page order.
NODE_GRAPH_IDS = (NODE_UTIL_GRAPH, NODE_ACTIVITY_GRAPH, NODE_POWER_GRAPH, NODE_THROTTLE_GRAPH,
                  NODE_CONTAINERS_GRAPH, NODE_MEMORY_GRAPH)
POD_GRAPH_IDS = (POD_UTIL_GRAPH, POD_MEMORY_GRAPH)

#: DESIGN.md's stable ids. A verdict the registry judges itself holds its ids in its own
#: module (``gpu-health-table``: :mod:`gpuscope.dashboard.verdicts.health`); they are listed
#: here as the contract tests check the page against.
DESIGN_IDS = (
    FLEET_KPIS, FLEET_HEATMAP, IDLE_NODES_TABLE, WASTE_TOTAL, STARVED_PODS_TABLE,
    STRAGGLERS_TABLE, SPINNING_GPUS_TABLE, THROTTLED_GPUS_TABLE, ALLOCATED_IDLE_TABLE,
    WORKLOAD_VIEW, "gpu-health-table", COST_BY_OWNER,
)
