"""The page: ``layout()`` builds it fresh for every page load (Dash calls it)."""

from __future__ import annotations

from dash import dcc, html
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from gpuscope.dashboard import components, ids
from gpuscope.dashboard.figures import empty_figure
from gpuscope.dashboard.service import DEFAULT_WINDOW, WINDOWS

_GRAPH_CONFIG = dcc.Graph.Config(displaylogo=False, responsive=True)


def _table(table_id: str, columns: list[DataTable.Columns], note_id: str) -> html.Div:
    """A DataTable (one component however many rows: thousands of html cells make the
    browser crawl) with a note under it saying how many rows, or that there are none."""
    return html.Div([
        DataTable(
            id=table_id, columns=columns, data=[], page_size=15, sort_action="native",
            style_table={"overflowX": "auto"},
            style_cell={"textAlign": "left", "padding": "6px 8px", "fontSize": "13px",
                        "fontFamily": "inherit", "whiteSpace": "normal", "height": "auto",
                        "maxWidth": "420px"},
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


def layout(source: str = "", refresh_seconds: float = 30.0) -> html.Div:
    header = html.Header([
        html.Div([
            html.H1("gpuscope"),
            html.Span(source, id=ids.SOURCE_LABEL, className="source"),
        ], className="brand"),
        html.Div([
            html.Label("Window", htmlFor=ids.WINDOW_SELECT),
            dcc.Dropdown(
                id=ids.WINDOW_SELECT, options=[{"label": k, "value": k} for k in WINDOWS],
                value=DEFAULT_WINDOW, clearable=False, searchable=False,
                className="window-select",
            ),
            html.Label("Namespace", htmlFor=ids.NAMESPACE_FILTER),
            dcc.Input(
                id=ids.NAMESPACE_FILTER, type="text", debounce=True, placeholder="all",
                className="namespace-filter", maxLength=300,
            ),
            html.Span("", id=ids.LAST_UPDATED, className="updated"),
        ], className="controls"),
    ])
    return html.Div([
        header,
        html.Div("", id=ids.BANNER, className="banner hidden", role="alert"),
        dcc.Interval(id=ids.REFRESH, interval=int(refresh_seconds * 1000), n_intervals=0),
        _section(
            ids.SECTION_FLEET, "Fleet",
            "GPUs busy and idle, and what idle nodes cost, over the selected window.",
            html.Div(id=ids.FLEET_KPIS, className="kpis"),
            html.P("", id=ids.HISTORY_NOTE, className="note"),
            dcc.Graph(id=ids.FLEET_HEATMAP, figure=empty_figure("Loading..."),
                      config=_GRAPH_CONFIG),
        ),
        _section(
            ids.SECTION_IDLE, "Idle nodes",
            "Nodes whose every GPU has been idle (utilization below the threshold) for the "
            "required time; cost at the on-demand price of the instance type, split into "
            "GPUs no container holds (unallocated) and GPUs held but unused (allocated-idle).",
            html.Div(id=ids.WASTE_TOTAL, className="waste-total"),
            _table(ids.IDLE_NODES_TABLE, components.IDLE_COLUMNS, ids.IDLE_NOTE),
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
            "Within one workload (the pods of one job), GPUs far below the workload's median "
            "utilization: a slow rank holds back every synchronous step.",
            _table(ids.STRAGGLERS_TABLE, components.STRAGGLER_COLUMNS, ids.STRAGGLERS_NOTE),
        ),
        _section(
            ids.SECTION_NODE, "Node drill-down",
            "Pick a node (or click it in the heatmap): its GPUs and containers over time.",
            dcc.Dropdown(id=ids.NODE_SELECT, options=[], placeholder="Select a node"),
            html.Div("", id=ids.NODE_BANNER, className="note"),
            dcc.Graph(id=ids.NODE_UTIL_GRAPH, figure=empty_figure("No node selected", 120),
                      config=_GRAPH_CONFIG),
            dcc.Graph(id=ids.NODE_CONTAINERS_GRAPH, figure=empty_figure("No node selected", 120),
                      config=_GRAPH_CONFIG),
            dcc.Graph(id=ids.NODE_MEMORY_GRAPH, figure=empty_figure("No node selected", 120),
                      config=_GRAPH_CONFIG),
        ),
        _section(
            ids.SECTION_POD, "Pod drill-down",
            "Pick a pod: each container's GPU utilization and memory over time.",
            dcc.Dropdown(id=ids.POD_SELECT, options=[], placeholder="Select a pod"),
            html.Div("", id=ids.POD_BANNER, className="note"),
            dcc.Graph(id=ids.POD_UTIL_GRAPH, figure=empty_figure("No pod selected", 120),
                      config=_GRAPH_CONFIG),
            dcc.Graph(id=ids.POD_MEMORY_GRAPH, figure=empty_figure("No pod selected", 120),
                      config=_GRAPH_CONFIG),
        ),
        html.Footer("gpuscope dashboard: thresholds and definitions in docs/dashboard.md"),
    ], className="page")
