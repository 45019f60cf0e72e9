"""Thin callbacks: read the controls, ask the service, render with components/figures.

The page's state (window, namespace, node, pod, workload) lives in its URL too: one callback
keeps the URL and the controls in step both ways (a pasted link opens the same view), and
table rows link to ``?node=...`` and friends.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import plotly.graph_objects as go
from dash import Dash, Input, Output, Patch, State, ctx, no_update

from gpuscope.dashboard import components, fmt, ids, links, sections
from gpuscope.dashboard.figures import (
    activity_figure,
    empty_figure,
    heatmap_figure,
    keep_view,
    timeseries_figure,
    workload_figure,
)
from gpuscope.dashboard.layout import FOLDED, GRAPHS
from gpuscope.dashboard.service import (
    DEFAULT_WINDOW,
    WINDOWS,
    DashboardService,
    ReadFailed,
    describe,
)


# A callback request is JSON that anyone can send, whatever the page offers: a dropdown's
# value may arrive as a number, a list or an unknown key. The callbacks never raise (a bug
# shows as a banner), so inputs are narrowed to what the service takes first.
def _text(value: Any) -> str | None:
    """A text input's value, or None for anything that is not a string."""
    return value if isinstance(value, str) else None


def _window(value: Any) -> str | None:
    """A key of WINDOWS, or None (the default window) for anything else."""
    return value if isinstance(value, str) and value in WINDOWS else None


def _state(window: Any, namespace: Any, cluster: Any = None) -> dict[str, str | None]:
    """What a table row's link keeps of the current view."""
    ns, cl = _text(namespace), _text(cluster)
    return {"window": _window(window), "namespace": ns.strip() if ns else None,
            "cluster": cl.strip() if cl else None}


def _view(*parts: Any) -> str:
    """The key of what a figure shows (a node, pod or workload, the window, the filters):
    the user's zoom of a figure outlives a refresh of the same key, not a change of it."""
    return json.dumps([p if isinstance(p, str) else None for p in parts])


_AXIS = re.compile(r"[xy]axis\d*")


def redraw(figure: go.Figure, view: str, shown: Any) -> tuple[Any, str]:
    """A graph's ``figure`` value, and the key of what it then shows, for a figure of
    ``view`` (:func:`_view`); ``shown``: the key of what the graph shows now (the page's
    store, any JSON). A graph that shows another view, or the same view drawn another way
    (a message, not lines), gets the whole figure. One that shows this view gets a patch
    of all but its axes' ranges: dcc.Graph keeps a user's zoom in its figure, so the new
    data is drawn at the zoom the user left (a drag, a double-click back to all)."""
    key = f"{view} {'lines' if figure.data else 'message'}"
    keep_view(figure, view)  # (a legend entry hidden stays hidden too)
    if shown != key:
        return figure, key
    whole = figure.to_plotly_json()
    patch = Patch()
    patch["data"] = whole["data"]
    for name, value in whole["layout"].items():
        if _AXIS.fullmatch(name) and isinstance(value, dict):
            for attr, v in value.items():
                if attr not in ("range", "autorange"):
                    patch["layout"][name][attr] = v
        else:
            patch["layout"][name] = value
    return patch, key


#: A drill-down's line: a note (why nothing is drawn), or a banner over the charts it
#: last drew while reading them fails (:func:`last_drawn`).
NOTE, BANNER = "note", "banner"


def _folded(graph_ids: tuple[str, ...], banner: str) -> dict[str, Any]:
    """A drill-down's callback values with nothing to draw: its graphs folded away (their
    figures left as they are), one line saying why."""
    return {"box": FOLDED, "banner": banner, "banner_class": NOTE, "drawn": no_update,
            **dict.fromkeys(graph_ids, no_update)}


def _drawn(view: str, figures: dict[str, go.Figure], shown: Any, of: dict[str, str | None],
           at: float) -> dict[str, Any]:
    """A drill-down's callback values: its graphs shown (:func:`redraw`: each at the
    user's zoom where it shows ``view`` already), and what they show (its store: each
    graph's key, whose data they are, ``of``, and when they were drawn, ``at``: what
    :func:`last_drawn` says over them while reading fails)."""
    old = shown if isinstance(shown, dict) else {}
    out: dict[str, Any] = {"box": GRAPHS, "banner": "", "banner_class": NOTE,
                           "drawn": {"of": of, "at": at}}
    for graph_id, figure in figures.items():
        out[graph_id], out["drawn"][graph_id] = redraw(figure, view, old.get(graph_id))
    return out


def last_drawn(problem: str | None, shown: Any, wanted: dict[str, str | None]) -> str | None:
    """The banner over a drill-down's charts kept as they were last drawn, where ``problem``
    is a failure to read (:class:`~gpuscope.dashboard.service.ReadFailed`: the store down,
    a bug) and the drill-down has drawn something (``shown``: its store, any JSON from the
    page): the problem, when they were drawn, and whose data they are, and that they are
    not ``wanted``'s where another node, pod, workload, window or filter is picked
    ("…, of node n1, the 1h window, not node n2, the 1h window"), as the fleet view's
    banner says it. None otherwise: nothing to keep, or an answer (nothing there, not a
    name) that replaces the charts."""
    if not isinstance(problem, ReadFailed) or not isinstance(shown, dict):
        return None
    of, at = shown.get("of"), shown.get("at")
    if (not isinstance(of, dict) or isinstance(at, bool) or not isinstance(at, (int, float))
            or not 0 < at < 1e11):  # (a page's JSON: a time fmt.clock can write)
        return None
    same = {k: v or None for k, v in of.items()} == {k: v or None for k, v in wanted.items()}
    which = describe(of, wanted) + ("" if same else f", not {describe(wanted, of)}")
    stop = "" if problem.endswith(".") else "."
    return f"{problem}{stop} Showing the last data, from {fmt.clock(at)}, of {which}."


def _kept(graph_ids: tuple[str, ...], banner: str) -> dict[str, Any]:
    """A drill-down's callback values while reading fails: its graphs shown as they were
    last drawn, under ``banner`` (:func:`last_drawn`)."""
    return {"box": GRAPHS, "banner": banner, "banner_class": BANNER, "drawn": no_update,
            **dict.fromkeys(graph_ids, no_update)}


#: The most options a dropdown is sent at once: those that contain what is typed in it (all
#: of its names are searched), in the page's order. The browser builds every option it is
#: sent: a 5,000-node fleet's 13,000 names took 4 of a 5-second page load in Chromium.
MAX_OPTIONS = 100


def _options(values: Any, picked: Any, search: Any = None) -> list[dict[str, str]]:
    """A dropdown's options: the names containing ``search`` (any case; all of them when
    nothing is typed), at most :data:`MAX_OPTIONS`, with the picked value kept even when it
    is not among them (a link to a node that is gone still opens its drill-down, which says
    so)."""
    names = [v for v in values if isinstance(v, str)] if isinstance(values, list) else []
    typed = search.strip().casefold() if isinstance(search, str) else ""
    shown = [v for v in names if typed in v.casefold()] if typed else names
    out = [{"label": v, "value": v} for v in shown[:MAX_OPTIONS]]
    if isinstance(picked, str) and picked and picked not in shown[:MAX_OPTIONS]:
        label = picked if picked in names else f"{picked} (not in this window)"
        out.append({"label": label, "value": picked})
    return out


def choice_options(choices: Any, node: Any, pod: Any, workload: Any,
                   searches: Any = (None, None, None)) -> tuple[Any, ...]:
    """The drill-downs' and the workload view's options from the fleet view's names (sent
    through the page, so checked like any input), narrowed to what is typed in each
    dropdown (``searches``: node, pod, workload), keeping what is picked."""
    if not isinstance(choices, dict):
        return no_update, no_update, no_update
    typed = list(searches) if isinstance(searches, (list, tuple)) else []
    typed = [*typed, None, None, None][:3]
    return (_options(choices.get("nodes"), node, typed[0]),
            _options(choices.get("pods"), pod, typed[1]),
            _options(choices.get("workloads"), workload, typed[2]))


def sync_state(trigger: Any, search: Any, window: Any, namespace: Any, cluster: Any,
               node: Any, pod: Any, workload: Any) -> tuple[Any, ...]:
    """The URL and the controls kept in step: on page load (no trigger) or a change of the
    URL (back, forward, a pasted link) the URL sets the controls; a control's change writes
    the URL. Returns (search, window, namespace, cluster, node, pod, workload),
    ``no_update`` where nothing changes. The values are validated where they are used, like
    a typed one."""
    current = (_window(window) or DEFAULT_WINDOW, _text(namespace) or None,
               _text(cluster) or None, _text(node), _text(pod), _text(workload))
    if trigger in (None, ids.URL):
        wanted = links.parse_query(search)
        target = (_window(wanted.get("window")) or DEFAULT_WINDOW, wanted.get("namespace"),
                  wanted.get("cluster"), wanted.get("node"), wanted.get("pod"),
                  wanted.get("workload"))
        fixed: Any = no_update
        if "window" in wanted and _window(wanted["window"]) is None:
            # A window the page does not offer shows the default: the URL says so too
            # (a link copied from it then opens what was shown).
            state = dict(zip(links.URL_KEYS, target, strict=True))
            state["window"] = None
            fixed = links.query_string(state)
        return (fixed, *(t if t != c else no_update
                         for t, c in zip(target, current, strict=True)))
    state = dict(zip(links.URL_KEYS, current, strict=True))
    if state["window"] == DEFAULT_WINDOW:
        state["window"] = None
    query = links.query_string(state)
    return (query if query != (search or "") else no_update, *([no_update] * 6))


#: The most pods the pod drill-down's dropdown offers (those in a table first): a large
#: fleet has tens of thousands, and any other one opens from a link (``?pod=ns/name``).
MAX_POD_CHOICES = 2000


def _pod_choices(view: Any) -> list[str]:
    flagged = {f"{r.namespace}/{r.pod}" for rows in (
        view.starved_rows, view.allocated_idle_rows, view.share_rows) for r in rows}
    flagged |= {p for r in view.spinning_rows for p in r.pods}
    flagged |= {f"{r.namespace}/{p}" for r in view.straggler_rows for p in r.pods}
    first = sorted(p for p in view.pods if p in flagged)
    rest = [p for p in view.pods if p not in flagged]
    return [*first, *rest][:MAX_POD_CHOICES]


def choices_of(view: Any) -> dict[str, list[str]] | None:
    """The names the drill-downs and the workload view offer from a fleet view (None:
    no view)."""
    if view is None:
        return None
    return {"nodes": list(view.nodes), "pods": _pod_choices(view),
            "workloads": list(view.workloads)}


def shown_choices(service: DashboardService, shown: Any) -> dict[str, list[str]] | None:
    """The names of the view the page shows (``shown``: the page's ``choices`` store, which
    says its window, namespace and cluster; any JSON, checked like any input), from the
    service's last view: never a new computation."""
    if not isinstance(shown, dict):
        return None
    return choices_of(service.latest(_window(shown.get("window")),
                                     _text(shown.get("namespace")),
                                     _text(shown.get("cluster"))))


def _key(element: str, prop: str) -> str:
    """A fleet callback output's key: ``element.prop``."""
    return f"{element}.{prop}"


def _limits(value: Any) -> dict[str, int]:
    """The tables' row limits from the page's store (any JSON: a table id and a positive
    whole number, else left out)."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, int)
            and not isinstance(v, bool) and v > 0}


def table_more(service: DashboardService, table_id: str, clicks: Any, window: Any,
               namespace: Any, limits: Any, cluster: Any = None) -> tuple[Any, ...]:
    """"Show all rows" of one table: its rows (up to :data:`sections.MAX_ROWS`) and note from
    the view the page shows, and the page's limits with this table's raised (so a refresh
    keeps them). Returns (data, note, limits), ``no_update`` where nothing changes."""
    view = service.latest(_window(window), _text(namespace), _text(cluster))
    if not clicks or view is None:
        return no_update, no_update, no_update
    view = service.detailed(view, table_id, sections.MAX_ROWS, _window(window),
                            _text(namespace), _text(cluster))
    rows, note, _ = sections.table_rows(view, table_id, _state(window, namespace, cluster),
                                        sections.MAX_ROWS)
    return rows, note, {**_limits(limits), table_id: sections.MAX_ROWS}


def table_more_answer(service: DashboardService, table_id: str, clicks: Any, window: Any,
                      namespace: Any, limits: Any, cluster: Any = None) -> tuple[Any, Any]:
    """"Show all rows" as the page takes it: (answer, limits). The answer (:func:`table_more`'s
    rows and note) carries the view it was asked for, the window, namespace and cluster as
    the page sent them, and the page puts it in the table only while its controls still
    name that view (:data:`MORE_GATE`): a window changed before a slow answer came would
    otherwise have its rows replaced by the old window's (the fleet callback's answer for
    the new window and this one race; the later wins) until the next refresh. The limits
    are raised either way: the table was asked for whole, and a refresh keeps it so."""
    rows, note, raised = table_more(service, table_id, clicks, window, namespace, limits,
                                    cluster)
    if rows is no_update:
        return no_update, raised
    return {"for": [window, namespace, cluster], "data": rows, "note": note}, raised


#: The page's side of :func:`table_more_answer`: a "Show all rows" answer fills the table
#: and its note only where it was asked for the view the controls name now (as the page
#: sent them: compared as JSON, absent and null alike).
MORE_GATE = """function(answer, shownWindow, namespace, cluster) {
    var skip = window.dash_clientside.no_update;
    if (!answer || JSON.stringify(answer["for"])
            !== JSON.stringify([shownWindow, namespace, cluster])) {
        return [skip, skip];
    }
    return [answer.data, answer.note];
}"""


def table_csv(service: DashboardService, table_id: str, clicks: Any, window: Any,
              namespace: Any, cluster: Any = None) -> Any:
    """"Download CSV" of one table: every row of the view the page shows."""
    view = service.latest(_window(window), _text(namespace), _text(cluster))
    if not clicks or view is None:
        return no_update
    view = service.detailed(view, table_id, 1 << 30, _window(window), _text(namespace),
                            _text(cluster))
    # The window, the filters and the window's end in the name: the table's rows are that
    # view's (a 1 h and a 24 h download, or one namespace's and the fleet's, are two files).
    shown, namespace_name, cluster_name = service.view_key(_window(window), _text(namespace),
                                                           _text(cluster))
    filters = "".join(f"_{kind}-{name}" for kind, name in (("namespace", namespace_name),
                                                           ("cluster", cluster_name)) if name)
    ended = time.strftime("%Y%m%dT%H%MZ", time.gmtime(view.window.end))
    return {"content": sections.csv_text(view, table_id),
            "filename": f"{table_id}_{shown}{filters}_{ended}.csv",
            "type": "text/csv"}


def _register_table_actions(app: Dash, service: DashboardService, table_id: str,
                            note_id: str) -> None:
    @app.callback(
        Output(sections.more_answer_id(table_id), "data"),
        Output(ids.TABLE_LIMITS, "data", allow_duplicate=True),
        Input(sections.more_id(table_id), "n_clicks"),
        State(ids.WINDOW_SELECT, "value"),
        State(ids.NAMESPACE_FILTER, "value"),
        State(ids.TABLE_LIMITS, "data"),
        State(ids.CLUSTER_SELECT, "value"),
        prevent_initial_call=True,
    )
    def more(clicks: Any, window: Any, namespace: Any, limits: Any,
             cluster: Any) -> tuple[Any, ...]:
        return table_more_answer(service, table_id, clicks, window, namespace, limits,
                                 cluster)

    # The answer reaches the table in the browser, and only for the view shown now.
    app.clientside_callback(  # type: ignore[no-untyped-call]
        MORE_GATE,
        Output(table_id, "data", allow_duplicate=True),
        Output(note_id, "children", allow_duplicate=True),
        Input(sections.more_answer_id(table_id), "data"),
        State(ids.WINDOW_SELECT, "value"),
        State(ids.NAMESPACE_FILTER, "value"),
        State(ids.CLUSTER_SELECT, "value"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output(f"{sections.csv_id(table_id)}-file", "data"),
        Input(sections.csv_id(table_id), "n_clicks"),
        State(ids.WINDOW_SELECT, "value"),
        State(ids.NAMESPACE_FILTER, "value"),
        State(ids.CLUSTER_SELECT, "value"),
        prevent_initial_call=True,
    )
    def download(clicks: Any, window: Any, namespace: Any, cluster: Any) -> Any:
        return table_csv(service, table_id, clicks, window, namespace, cluster)


def fleet_values(service: DashboardService, window: Any, namespace: Any,
                 keys: list[str], limits: Any = None, cluster: Any = None,
                 heatmap_shown: Any = None) -> dict[str, Any]:
    """The fleet callback's values for ``keys`` (``element.prop``): everything when a view
    came, else only the banner (the page keeps what it shows). ``limits``: the tables whose
    rows were all asked for (the page's store); ``cluster``: the cluster picked (None:
    all); ``heatmap_shown``: what the heatmap shows (its store: :func:`redraw`)."""
    answer = service.fleet(_window(window), _text(namespace), _text(cluster))
    banner = answer.banner or ""
    banner_class = "banner" if banner else "banner hidden"
    view = answer.view
    out: dict[str, Any] = dict.fromkeys(keys, no_update)
    if view is None:
        out[_key(ids.BANNER, "children")] = banner
        out[_key(ids.BANNER, "className")] = "banner error" if banner else banner_class
        out[_key(ids.LAST_UPDATED, "children")] = ""
        return out
    state = _state(window, namespace, cluster)
    for table_id, first in _limits(limits).items():
        # A table whose rows were all asked for: what they need read from the store.
        view = service.detailed(view, table_id, min(first, sections.MAX_ROWS),
                                _window(window), _text(namespace), _text(cluster))
    heatmap, drawn = redraw(heatmap_figure(view.heatmap, view.thresholds.idle_utilization),
                            _view(_window(window), _text(namespace), _text(cluster)),
                            heatmap_shown)
    out.update({
        _key(ids.FLEET_HEATMAP, "figure"): heatmap,
        _key(ids.HEATMAP_DRAWN, "data"): drawn,
        _key(ids.CLUSTER_SELECT, "options"): _options(list(view.clusters), view.cluster),
        _key(ids.FLEET_KPIS, "children"): components.kpi_cards(view),
        _key(ids.HISTORY_NOTE, "children"): components.history_note(view)
        + (" " + " ".join(view.notes) if view.notes else ""),
        # Which view the dropdowns' names come from (read there, on the server: a large
        # fleet's names are some 0.5 MB, which the page need not carry nor send back).
        _key(ids.CHOICES, "data"): {"window": _window(window), "namespace": _text(namespace),
                                    "cluster": _text(cluster), "at": answer.fetched_at},
        _key(ids.BANNER, "children"): banner,
        _key(ids.BANNER, "className"): banner_class,
        _key(ids.LAST_UPDATED, "children"): (f"updated {fmt.clock(answer.fetched_at)}"
                                             if answer.fetched_at else ""),
    })
    out.update({_key(i, p): v
                for (i, p), v in sections.fill(view, state, _limits(limits)).items()})
    return out


def register_callbacks(app: Dash, service: DashboardService) -> None:
    # The fleet callback's outputs by id: the page's own, then every verdict section's
    # (:mod:`.sections`, from the registry). It returns a dict, never a tuple by position.
    fixed = [(ids.FLEET_KPIS, "children"), (ids.HISTORY_NOTE, "children"),
             (ids.FLEET_HEATMAP, "figure"), (ids.CHOICES, "data"), (ids.BANNER, "children"),
             (ids.BANNER, "className"), (ids.LAST_UPDATED, "children"),
             (ids.CLUSTER_SELECT, "options"), (ids.HEATMAP_DRAWN, "data")]
    fleet_outputs = {_key(i, p): Output(i, p) for i, p in [*fixed, *sections.outputs()]}

    @app.callback(
        output=fleet_outputs,
        inputs=[Input(ids.REFRESH, "n_intervals"), Input(ids.WINDOW_SELECT, "value"),
                Input(ids.NAMESPACE_FILTER, "value"), Input(ids.CLUSTER_SELECT, "value")],
        state=[State(ids.TABLE_LIMITS, "data"), State(ids.HEATMAP_DRAWN, "data")],
    )
    def update_fleet(_n: int | None, window: str | None, namespace: str | None,
                     cluster: str | None = None, limits: Any = None,
                     heatmap_shown: Any = None) -> dict[str, Any]:
        return fleet_values(service, window, namespace, list(fleet_outputs), limits, cluster,
                            heatmap_shown)

    # Each verdict table's "Show all rows" and "Download CSV", on the view the page shows
    # (never a new computation).
    for table in sections.tables():
        _register_table_actions(app, service, table.id, table.note_id)

    @app.callback(
        Output(ids.NODE_SELECT, "options"),
        Output(ids.POD_SELECT, "options"),
        Output(ids.WORKLOAD_SELECT, "options"),
        Input(ids.CHOICES, "data"),
        Input(ids.NODE_SELECT, "search_value"),
        Input(ids.POD_SELECT, "search_value"),
        Input(ids.WORKLOAD_SELECT, "search_value"),
        State(ids.NODE_SELECT, "value"),
        State(ids.POD_SELECT, "value"),
        State(ids.WORKLOAD_SELECT, "value"),
    )
    def update_choices(shown: Any, node_typed: Any, pod_typed: Any, workload_typed: Any,
                       node: Any, pod: Any, workload: Any) -> tuple[Any, ...]:
        return choice_options(shown_choices(service, shown), node, pod, workload,
                              (node_typed, pod_typed, workload_typed))

    @app.callback(
        Output(ids.URL, "search"),
        Output(ids.WINDOW_SELECT, "value"),
        Output(ids.NAMESPACE_FILTER, "value"),
        Output(ids.CLUSTER_SELECT, "value"),
        Output(ids.NODE_SELECT, "value"),
        Output(ids.POD_SELECT, "value"),
        Output(ids.WORKLOAD_SELECT, "value"),
        Input(ids.URL, "search"),
        Input(ids.WINDOW_SELECT, "value"),
        Input(ids.NAMESPACE_FILTER, "value"),
        Input(ids.CLUSTER_SELECT, "value"),
        Input(ids.NODE_SELECT, "value"),
        Input(ids.POD_SELECT, "value"),
        Input(ids.WORKLOAD_SELECT, "value"),
    )
    def sync_url(search: Any, window: Any, namespace: Any, cluster: Any, node: Any, pod: Any,
                 workload: Any) -> tuple[Any, ...]:
        return sync_state(ctx.triggered_id, search, window, namespace, cluster, node, pod,
                          workload)

    # A link's "#section" target exists only once Dash has drawn the page: scroll to it then.
    app.clientside_callback(  # type: ignore[no-untyped-call]
        """function(hash) {
            if (hash && hash.length > 1) {
                setTimeout(function() {
                    var el = document.getElementById(hash.slice(1));
                    if (el) { el.scrollIntoView(); }
                }, 400);
            }
            return hash || "";
        }""",
        Output(ids.SCROLLED, "data"),
        Input(ids.URL, "hash"),
    )

    # A heatmap cell opens its node's drill-down, pages below: bring it into view, as a
    # table's node link does.
    app.clientside_callback(  # type: ignore[no-untyped-call]
        f"""function(click) {{
            var el = document.getElementById("{ids.SECTION_NODE}");
            if (click && el) {{ el.scrollIntoView(); }}
            return window.dash_clientside.no_update;
        }}""",
        Output(ids.SCROLLED, "data", allow_duplicate=True),
        Input(ids.FLEET_HEATMAP, "clickData"),
        prevent_initial_call=True,
    )
    # And again once that node's drill-down is drawn (the page above it may have grown
    # meanwhile), once per click: a refresh redraws it without moving the page.
    app.clientside_callback(  # type: ignore[no-untyped-call]
        f"""function(drawn, click, done) {{
            var key = click ? JSON.stringify(click) : null;
            if (!key || key === done) {{ return window.dash_clientside.no_update; }}
            var el = document.getElementById("{ids.SECTION_NODE}");
            if (el) {{ el.scrollIntoView(); }}
            return key;
        }}""",
        Output(ids.NODE_SCROLLED, "data"),
        Input(ids.NODE_DRAWN, "data"),
        State(ids.FLEET_HEATMAP, "clickData"),
        State(ids.NODE_SCROLLED, "data"),
        prevent_initial_call=True,
    )

    @app.callback(
        Output(ids.NODE_SELECT, "value", allow_duplicate=True),
        Input(ids.FLEET_HEATMAP, "clickData"),
        State(ids.NODE_SELECT, "value"),
        prevent_initial_call=True,
    )
    def pick_node(click: dict[str, Any] | None, current: str | None) -> Any:
        try:
            node = click["points"][0]["y"] if click else None
        except (KeyError, IndexError, TypeError):
            node = None
        return node if isinstance(node, str) and node != current else no_update

    @app.callback(
        output={"box": Output(ids.NODE_GRAPHS, "className"),
                "banner": Output(ids.NODE_BANNER, "children"),
                "banner_class": Output(ids.NODE_BANNER, "className"),
                "drawn": Output(ids.NODE_DRAWN, "data"),
                **{g: Output(g, "figure") for g in ids.NODE_GRAPH_IDS}},
        inputs=[Input(ids.NODE_SELECT, "value"), Input(ids.WINDOW_SELECT, "value"),
                Input(ids.REFRESH, "n_intervals")],
        state=[State(ids.NODE_DRAWN, "data")],
    )
    def update_node(node: str | None, window: str | None, _n: int | None,
                    shown: Any = None) -> dict[str, Any]:
        detail, problem = service.node(_text(node), _window(window))
        wanted = {"node": _text(node), "window": _window(window) or DEFAULT_WINDOW}
        if detail is None:
            # The store down: the charts last drawn stay, under a banner saying whose.
            kept = last_drawn(problem, shown, wanted)
            if kept:
                return _kept(ids.NODE_GRAPH_IDS, kept)
            # Nothing picked (or nothing to show): no empty charts, one line saying why.
            return _folded(ids.NODE_GRAPH_IDS, problem or (
                "No node selected: pick one above, or click a node in the heatmap or in a "
                "table."))
        n = detail.node
        throttled = {k: s for k, s in detail.throttle.items() if any(v > 0 for v in s.values)}
        return _drawn(_view(n, _window(window)), {
            ids.NODE_UTIL_GRAPH: timeseries_figure(
                {f"GPU {k}": s for k, s in detail.utilization.items()},
                f"{n}: GPU utilization"),
            ids.NODE_ACTIVITY_GRAPH: activity_figure(
                detail.sm, detail.tensor, detail.dram, f"{n}: work signals (GPM)"),
            ids.NODE_POWER_GRAPH: timeseries_figure(
                {f"GPU {k}": s for k, s in detail.power_ratio.items()},
                f"{n}: power against its limit", limit_line=1.0),
            ids.NODE_THROTTLE_GRAPH: timeseries_figure(
                {f"GPU {k}": s for k, s in throttled.items()},
                f"{n}: throttling (seconds per second, by reason)", unit="per_second")
            if throttled else empty_figure(f"{n}: no throttling in this window", 80),
            ids.NODE_CONTAINERS_GRAPH: timeseries_figure(
                detail.containers, f"{n}: utilization by container"),
            ids.NODE_MEMORY_GRAPH: timeseries_figure(
                {f"GPU {k}": s for k, s in detail.memory_used.items()},
                f"{n}: GPU memory used", unit="bytes"),
        }, shown, {**wanted, "node": n}, service.now())

    @app.callback(
        output={"box": Output(ids.POD_GRAPHS, "className"),
                "banner": Output(ids.POD_BANNER, "children"),
                "banner_class": Output(ids.POD_BANNER, "className"),
                "drawn": Output(ids.POD_DRAWN, "data"),
                **{g: Output(g, "figure") for g in ids.POD_GRAPH_IDS}},
        inputs=[Input(ids.POD_SELECT, "value"), Input(ids.WINDOW_SELECT, "value"),
                Input(ids.REFRESH, "n_intervals"), Input(ids.CLUSTER_SELECT, "value")],
        state=[State(ids.POD_DRAWN, "data")],
    )
    def update_pod(pod: str | None, window: str | None, _n: int | None,
                   cluster: Any = None, shown: Any = None) -> dict[str, Any]:
        detail, problem = service.pod(_text(pod), _window(window), _text(cluster))
        wanted = {"pod": _text(pod), "window": _window(window) or DEFAULT_WINDOW,
                  "cluster": _text(cluster) or None}
        if detail is None:
            kept = last_drawn(problem, shown, wanted)
            if kept:
                return _kept(ids.POD_GRAPH_IDS, kept)
            return _folded(ids.POD_GRAPH_IDS, problem or (
                "No pod selected: pick one above, or click a pod in a table."))
        name = f"{detail.namespace}/{detail.pod}"
        if not detail.utilization and not detail.memory_used:
            return _folded(ids.POD_GRAPH_IDS, (
                f"No GPU data for pod {name} in this window: not a pod on a GPU, or one "
                f"gone for longer than the window."))
        return _drawn(_view(name, _window(window), _text(cluster)), {
            ids.POD_UTIL_GRAPH: timeseries_figure(
                detail.utilization, f"{name}: GPU utilization by container")
            if detail.utilization else empty_figure(
                # Memory and no utilization: NVML gives no per-process utilization on
                # a MIG slice, nor for an MPS client where the driver reports the MPS
                # server's samples only. Say so, and where its work shows.
                f"{name}: no per-container utilization (a MIG slice reports none, nor "
                "a CUDA MPS client where the driver reports only the MPS server; the "
                "node drill-down shows the device's activity)", 120),
            ids.POD_MEMORY_GRAPH: timeseries_figure(
                detail.memory_used, f"{name}: GPU memory by container", unit="bytes"),
        }, shown, {**wanted, "pod": name}, service.now())

    # The workload view follows the fleet view it takes its default and its marks from
    # (``choices``, which the fleet callback writes with each view): the browser asks for
    # it once the fleet's answer is in, not beside it (on a 5,000-node page its queries
    # and figure then no longer slow the fleet's answer).
    @app.callback(
        Output(ids.WORKLOAD_VIEW, "figure"),
        Output(ids.WORKLOAD_NOTE, "children"),
        Output(ids.WORKLOAD_DRAWN, "data"),
        Output(ids.WORKLOAD_NOTE, "className"),
        Input(ids.WORKLOAD_SELECT, "value"),
        Input(ids.WINDOW_SELECT, "value"),
        Input(ids.NAMESPACE_FILTER, "value"),
        Input(ids.CHOICES, "data"),
        Input(ids.CLUSTER_SELECT, "value"),
        State(ids.WORKLOAD_DRAWN, "data"),
    )
    def update_workload(workload: Any, window: Any, namespace: Any, _shown: Any,
                        cluster: Any = None, drawn: Any = None) -> tuple[Any, ...]:
        detail, marks, problem = service.workload(_text(workload), _window(window),
                                                  _text(namespace), _text(cluster))
        old = drawn if isinstance(drawn, dict) else {}
        drawn_of = old.get("of")
        drawn_of = drawn_of if isinstance(drawn_of, dict) else {}
        wanted = {
            # None picked: the default, which is the one drawn as far as the page knows.
            "workload": _text(workload) or _text(drawn_of.get("workload")),
            "window": _window(window) or DEFAULT_WINDOW,
            "namespace": _text(namespace) or None, "cluster": _text(cluster) or None}
        if detail is None:
            kept = last_drawn(problem, old, wanted)
            if kept:  # the store down: the run last drawn stays, under a banner
                return no_update, kept, no_update, BANNER
            return (empty_figure(problem or "No workload with GPUs in this window", 160),
                    problem or "", None, NOTE)
        note = components.workload_note(
            detail, marks, picked=bool(_text(workload)),
            totals=service.run_totals(detail, _window(window), _text(namespace),
                                      _text(cluster)))
        name = f"{detail.namespace}/{detail.workload}"
        figure, key = redraw(workload_figure(detail, set(marks), marks),
                             _view(name, _window(window), _text(namespace), _text(cluster)),
                             old.get("key"))
        return figure, note, {"key": key, "of": {**wanted, "workload": name},
                              "at": service.now()}, NOTE
