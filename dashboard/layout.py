"""The page: ``layout()`` builds it fresh for every page load (Dash calls it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dash import dcc, html
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from gpuscope.dashboard import components, ids, sections
from gpuscope.dashboard.figures import empty_figure
from gpuscope.dashboard.service import DEFAULT_WINDOW, WINDOWS
from gpuscope.dashboard.verdicts import registry
from gpuscope.dashboard.verdicts.page import Column, Section

_GRAPH_CONFIG = dcc.Graph.Config(displaylogo=False, responsive=True)


def _aria(label: str) -> dict[str, Any]:
    """An element's name for a screen reader where its text does not say enough."""
    return {"aria-label": label}


def _table(table_id: str, columns: Sequence[Column], note_id: str, name: str) -> html.Div:
    """A DataTable (one component however many rows: thousands of html cells make the
    browser crawl) with a note under it saying how many rows, or that there are none.
    Names never wrap mid-name; links open in the same tab (they carry the page's state).
    ``name``: the table's, in its buttons' names for a screen reader ("Download CSV (Idle
    nodes)": the page has a dozen of each)."""
    return html.Div([
        DataTable(
            id=table_id, columns=components.dash_columns(columns), data=[], page_size=15,
            sort_action="native",
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
        html.Div([
            html.Button("Show all rows", id=sections.more_id(table_id), n_clicks=0,
                        className="table-action", **_aria(f"Show all rows ({name})")),
            html.Button("Download CSV", id=sections.csv_id(table_id), n_clicks=0,
                        className="table-action", **_aria(f"Download CSV ({name})")),
            dcc.Download(id=f"{sections.csv_id(table_id)}-file"),
            dcc.Store(id=sections.more_answer_id(table_id)),
        ], className="table-actions"),
    ], className="table-wrap")


def _section(section_id: str, title: str, intro: str, *children: Component) -> html.Section:
    return html.Section(
        [html.H2(title), html.P(intro, className="intro"), *children],
        id=section_id, className="section",
    )


def _verdict_section(section: Section) -> html.Section:
    """A verdict's section (:mod:`gpuscope.dashboard.verdicts.registry`): its header element
    where it has one, then its tables, each after its heading."""
    children: list[Component] = []
    if section.header_id:
        children.append(html.Div(id=section.header_id, className="waste-total"))
    for i, table in enumerate(section.tables):
        if i or table.heading:
            children.append(html.H3(table.heading))
        children.append(_table(table.id, table.columns, table.note_id,
                               ", ".join(n for n in (section.title, table.heading) if n)))
    return _section(section.id, section.title, section.intro, *children)


#: A drill-down's box of graphs, shown, and folded away (nothing picked, nothing to draw):
#: no height and hidden, not ``display: none``, so its graphs keep the page's width.
GRAPHS, FOLDED = "graphs", "graphs folded"


def _graphs(box_id: str, graph_ids: Sequence[str]) -> html.Div:
    """A drill-down's graphs, folded until something is picked. They stay on the page: the
    callback sends their figures, and a refresh redraws the data of a zoomed graph, not the
    graph (:func:`gpuscope.dashboard.figures.keep_view`)."""
    return html.Div([dcc.Graph(id=g, figure=empty_figure("", 60), config=_GRAPH_CONFIG)
                     for g in graph_ids], id=box_id, className=FOLDED)


def _picked(state: Mapping[str, str], key: str) -> tuple[str | None, list[dict[str, str]]]:
    """A dropdown's value from the URL, and options that hold it until the real ones come."""
    value = state.get(key) or None
    return value, ([{"label": value, "value": value}] if value else [])


def layout(source: str = "", refresh_seconds: float = 30.0,
           state: Mapping[str, str] | None = None, search: str | None = None) -> html.Div:
    """The page, its controls in ``state`` (the URL's query: window, namespace, cluster,
    node, pod, workload; values are validated where they are used); ``search``: the
    URL's query string as the browser has it (``location.search``, "" where none; None:
    unknown)."""
    state = state or {}
    window = state.get("window")
    node, node_options = _picked(state, "node")
    pod, pod_options = _picked(state, "pod")
    workload, workload_options = _picked(state, "workload")
    cluster, cluster_options = _picked(state, "cluster")
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
            html.Label("Cluster", htmlFor=ids.CLUSTER_SELECT),
            dcc.Dropdown(id=ids.CLUSTER_SELECT, options=cluster_options, value=cluster,
                         placeholder="all", className="cluster-select"),
            html.Span("", id=ids.LAST_UPDATED, className="updated"),
        ], className="controls"),
    ])
    return html.Div([
        # The URL's query as the controls already have it: the location then has nothing
        # to change when it mounts, and the fleet's callback, which waits for the URL's,
        # is sent as soon as that one answers "nothing to do" (0.15 s sooner on a page
        # load). Where the query is unknown (a browser that sent no referrer), the URL's
        # callback sets the controls.
        dcc.Location(id=ids.URL, refresh=False, search=search),
        dcc.Store(id=ids.SCROLLED),
        dcc.Store(id=ids.NODE_SCROLLED),
        dcc.Store(id=ids.CHOICES),
        dcc.Store(id=ids.TABLE_LIMITS, data={}),
        *(dcc.Store(id=i) for i in (ids.HEATMAP_DRAWN, ids.WORKLOAD_DRAWN, ids.NODE_DRAWN,
                                    ids.POD_DRAWN)),
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
        *(_verdict_section(section) for section in registry.SECTIONS),
        _section(
            ids.SECTION_WORKLOAD, "Workload view",
            "Every GPU of one distributed run side by side over time; the straggler is marked. "
            "Opens with the first straggler's workload.",
            html.Label("Workload", htmlFor=ids.WORKLOAD_SELECT, className="sr-only"),
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
            html.Label("Node", htmlFor=ids.NODE_SELECT, className="sr-only"),
            dcc.Dropdown(id=ids.NODE_SELECT, options=node_options, value=node,
                         placeholder="Select a node"),
            html.Div("", id=ids.NODE_BANNER, className="note"),
            _graphs(ids.NODE_GRAPHS, ids.NODE_GRAPH_IDS),
        ),
        _section(
            ids.SECTION_POD, "Pod drill-down",
            "Pick a pod (or click it in a table): each container's GPU utilization and memory "
            "over time.",
            html.Label("Pod", htmlFor=ids.POD_SELECT, className="sr-only"),
            dcc.Dropdown(id=ids.POD_SELECT, options=pod_options, value=pod,
                         placeholder="Select a pod"),
            html.Div("", id=ids.POD_BANNER, className="note"),
            _graphs(ids.POD_GRAPHS, ids.POD_GRAPH_IDS),
        ),
        html.Footer("gpuscope dashboard: thresholds and definitions in docs/dashboard.md"),
    ], className="page")
