"""The page: ``layout()`` builds it fresh for every page load (Dash calls it)."""

from __future__ import annotations

from collections.abc import Mapping

from dash import dcc, html
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from gpuscope.dashboard import components, ids
from gpuscope.dashboard.figures import empty_figure
from gpuscope.dashboard.service import DEFAULT_WINDOW, WINDOWS

_GRAPH_CONFIG = dcc.Graph.Config(displaylogo=False, responsive=True)


def _table(table_id: str, columns: list[DataTable.Columns], note_id: str) -> html.Div:
    """A DataTable (one component however many rows: thousands of html cells make the
    browser crawl) with a note under it saying how many rows, or that there are none.
    Names never wrap mid-name; links open in the same tab (they carry the page's state)."""
    return html.Div([
        DataTable(
            id=table_id, columns=columns, data=[], page_size=15, sort_action="native",
            markdown_options={"link_target": "_self"},
            style_table={"overflowX": "auto"},
            style_cell={"textAlign": "left", "padding": "6px 8px", "fontSize": "13px",
                        "fontFamily": "inherit", "whiteSpace": "normal", "height": "auto",
                        "maxWidth": "420px"},
            style_cell_conditional=[
                *({"if": {"column_id": c}, "whiteSpace": "nowrap"}
                  for c in components.NAME_COLUMNS),
                *({"if": {"column_id": c}, "minWidth": "220px"}
                  for c in components.TEXT_COLUMNS),
            ],
            style_header={"backgroundColor": "#f0f2f5", "fontWeight": "600"},
            style_as_list_view=True,
        ),
        html.P("", id=note_id, className="note"),
    ], className="table-wrap")


def _section(section_id: str, title: str, intro: str, *children: Component) -> html.Section:
    return html.Section(
        [html.H2(title), html.P(intro, className="intro"), *children],
        id=section_id, className="section",
    )


def _picked(state: Mapping[str, str], key: str) -> tuple[str | None, list[dict[str, str]]]:
    """A dropdown's value from the URL, and options that hold it until the real ones come."""
    value = state.get(key) or None
    return value, ([{"label": value, "value": value}] if value else [])


def layout(source: str = "", refresh_seconds: float = 30.0,
           state: Mapping[str, str] | None = None) -> html.Div:
    """The page, its controls in ``state`` (the URL's query: window, namespace, node, pod,
    workload; values are validated where they are used)."""
    state = state or {}
    window = state.get("window")
    node, node_options = _picked(state, "node")
    pod, pod_options = _picked(state, "pod")
    workload, workload_options = _picked(state, "workload")
    header = html.Header([
        html.Div([
            html.H1("gpuscope"),
            html.Span(source, id=ids.SOURCE_LABEL, className="source"),
        ], className="brand"),
        html.Div([
            html.Label("Window", htmlFor=ids.WINDOW_SELECT),
            dcc.Dropdown(
                id=ids.WINDOW_SELECT, options=[{"label": k, "value": k} for k in WINDOWS],
                value=window if window in WINDOWS else DEFAULT_WINDOW, clearable=False,
                searchable=False,
                className="window-select",
            ),
            html.Label("Namespace", htmlFor=ids.NAMESPACE_FILTER),
            dcc.Input(
                id=ids.NAMESPACE_FILTER, type="text", debounce=True, placeholder="all",
                className="namespace-filter", maxLength=300,
                value=state.get("namespace") or None,
            ),
            html.Span("", id=ids.LAST_UPDATED, className="updated"),
        ], className="controls"),
    ])
    return html.Div([
        dcc.Location(id=ids.URL, refresh=False),
        dcc.Store(id=ids.SCROLLED),
        dcc.Store(id=ids.CHOICES),
        header,
        html.Div("", id=ids.BANNER, className="banner hidden", role="alert"),
        dcc.Interval(id=ids.REFRESH, interval=int(refresh_seconds * 1000), n_intervals=0),
        _section(
            ids.SECTION_FLEET, "Fleet",
            "GPUs busy, idle and spinning, and what idle capacity costs, over the selected "
            "window. Click a node in the heatmap to open it.",
            html.Div(id=ids.FLEET_KPIS, className="kpis"),
            html.P("", id=ids.HISTORY_NOTE, className="note"),
            dcc.Graph(id=ids.FLEET_HEATMAP, figure=empty_figure("Loading..."),
                      config=_GRAPH_CONFIG),
        ),
        _section(
            ids.SECTION_IDLE, "Idle nodes",
            "Nodes whose every GPU has been idle (utilization below the threshold) or spinning "
            "(busy by utilization, doing no work) for the required time, a GPU in MIG mode when "
            "each of its slices is; cost at the node's price (spot where your price file has "
            "one), split into GPUs no container holds (unallocated) and GPUs held but unused "
            "(allocated-idle).",
            html.Div(id=ids.WASTE_TOTAL, className="waste-total"),
            _table(ids.IDLE_NODES_TABLE, components.IDLE_COLUMNS, ids.IDLE_NOTE),
            html.H3("Idle MIG slices on busy nodes"),
            _table(ids.IDLE_SLICES_TABLE, components.SLICE_COLUMNS, ids.IDLE_SLICES_NOTE),
        ),
        _section(
            ids.SECTION_ALLOCATED, "Allocated but idle",
            "Containers on any node that hold a GPU, a MIG slice or a time-slice of a GPU and "
            "have used almost none of it for the required time, with what they hold and what "
            "that costs: the list to act on.",
            _table(ids.ALLOCATED_IDLE_TABLE, components.ALLOCATED_COLUMNS,
                   ids.ALLOCATED_IDLE_NOTE),
        ),
        _section(
            ids.SECTION_SPINNING, "Spinning GPUs",
            "GPUs at high utilization doing no work: no tensor or memory activity and few SMs "
            "active (GPM), or power far below the limit (no GPM). A job hung in a collective or "
            "a busy-wait. They count as idle in the cost above.",
            _table(ids.SPINNING_GPUS_TABLE, components.SPINNING_COLUMNS, ids.SPINNING_NOTE),
        ),
        _section(
            ids.SECTION_THROTTLED, "Throttled GPUs",
            "GPUs whose clocks have been held down by power, heat, reliability or a board limit "
            "for a good part of the time: they run slower than their peers.",
            _table(ids.THROTTLED_GPUS_TABLE, components.THROTTLED_COLUMNS, ids.THROTTLED_NOTE),
        ),
        _section(
            ids.SECTION_STARVATION, "Starved pods",
            "Containers starved by time-slicing (share of a busy shared GPU far below their "
            "fair share) and containers suspected to be waiting on input (memory held, low and "
            "strongly varying utilization).",
            _table(ids.STARVED_PODS_TABLE, components.STARVED_COLUMNS, ids.STARVED_NOTE),
            html.H3("Time-sliced GPUs: each container's share"),
            _table(ids.TIMESLICE_TABLE, components.SHARE_COLUMNS, ids.TIMESLICE_NOTE),
        ),
        _section(
            ids.SECTION_STRAGGLERS, "Stragglers",
            "Within one workload (the pods of one job, GPUs of the same model compared), the "
            "GPU that holds the others back: stalled (far below the median utilization) or "
            "slow (every GPU busy, this one doing far more work while its peers spin waiting "
            "for it), with the evidence of its cause.",
            _table(ids.STRAGGLERS_TABLE, components.STRAGGLER_COLUMNS, ids.STRAGGLERS_NOTE),
        ),
        _section(
            ids.SECTION_WORKLOAD, "Workload view",
            "Every GPU of one distributed run side by side over time; the straggler is marked. "
            "Opens with the first straggler's workload.",
            dcc.Dropdown(id=ids.WORKLOAD_SELECT, options=workload_options, value=workload,
                         placeholder="Workload (default: the first straggler's)"),
            html.Div("", id=ids.WORKLOAD_NOTE, className="note"),
            dcc.Graph(id=ids.WORKLOAD_VIEW, figure=empty_figure("Loading...", 200),
                      config=_GRAPH_CONFIG),
        ),
        _section(
            ids.SECTION_NODE, "Node drill-down",
            "Pick a node (or click it in the heatmap or a table): its GPUs and containers, "
            "their work signals, power against the limit and throttling over time.",
            dcc.Dropdown(id=ids.NODE_SELECT, options=node_options, value=node,
                         placeholder="Select a node"),
            html.Div("", id=ids.NODE_BANNER, className="note"),
            html.Div([], id=ids.NODE_GRAPHS, className="graphs"),
        ),
        _section(
            ids.SECTION_POD, "Pod drill-down",
            "Pick a pod (or click it in a table): each container's GPU utilization and memory "
            "over time.",
            dcc.Dropdown(id=ids.POD_SELECT, options=pod_options, value=pod,
                         placeholder="Select a pod"),
            html.Div("", id=ids.POD_BANNER, className="note"),
            html.Div([], id=ids.POD_GRAPHS, className="graphs"),
        ),
        html.Footer("gpuscope dashboard: thresholds and definitions in docs/dashboard.md"),
    ], className="page")
