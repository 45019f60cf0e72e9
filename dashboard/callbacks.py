"""Thin callbacks: read the controls, ask the service, render with components/figures."""

from __future__ import annotations

from typing import Any

from dash import Dash, Input, Output, State, no_update

from gpuscope.dashboard import components, fmt, ids
from gpuscope.dashboard.figures import empty_figure, heatmap_figure, timeseries_figure
from gpuscope.dashboard.service import WINDOWS, DashboardService


# A callback request is JSON that anyone can send, whatever the page offers: a dropdown's
# value may arrive as a number, a list or an unknown key. The callbacks never raise (a bug
# shows as a banner), so inputs are narrowed to what the service takes first.
def _text(value: Any) -> str | None:
    """A text input's value, or None for anything that is not a string."""
    return value if isinstance(value, str) else None


def _window(value: Any) -> str | None:
    """A key of WINDOWS, or None (the default window) for anything else."""
    return value if isinstance(value, str) and value in WINDOWS else None


def register_callbacks(app: Dash, service: DashboardService) -> None:
    @app.callback(
        Output(ids.FLEET_KPIS, "children"),
        Output(ids.HISTORY_NOTE, "children"),
        Output(ids.FLEET_HEATMAP, "figure"),
        Output(ids.WASTE_TOTAL, "children"),
        Output(ids.IDLE_NODES_TABLE, "data"),
        Output(ids.IDLE_NOTE, "children"),
        Output(ids.STARVED_PODS_TABLE, "data"),
        Output(ids.STARVED_NOTE, "children"),
        Output(ids.TIMESLICE_TABLE, "data"),
        Output(ids.TIMESLICE_NOTE, "children"),
        Output(ids.STRAGGLERS_TABLE, "data"),
        Output(ids.STRAGGLERS_NOTE, "children"),
        Output(ids.NODE_SELECT, "options"),
        Output(ids.POD_SELECT, "options"),
        Output(ids.BANNER, "children"),
        Output(ids.BANNER, "className"),
        Output(ids.LAST_UPDATED, "children"),
        Input(ids.REFRESH, "n_intervals"),
        Input(ids.WINDOW_SELECT, "value"),
        Input(ids.NAMESPACE_FILTER, "value"),
    )
    def update_fleet(_n: int | None, window: str | None, namespace: str | None) -> tuple[Any, ...]:
        answer = service.fleet(_window(window), _text(namespace))
        banner = answer.banner or ""
        banner_class = "banner" if banner else "banner hidden"
        view = answer.view
        if view is None:
            return (*([no_update] * 14), banner, "banner error" if banner else banner_class, "")
        updated = f"updated {fmt.clock(answer.fetched_at)}" if answer.fetched_at else ""
        return (
            components.kpi_cards(view),
            components.history_note(view) + (" " + " ".join(view.notes) if view.notes else ""),
            heatmap_figure(view.heatmap),
            components.waste_total(view),
            components.idle_data(view.idle_rows),
            components.count_note(len(view.idle_rows), "idle node", "idle nodes",
                                  "No idle nodes."),
            components.starved_data(view.starved_rows),
            components.count_note(len(view.starved_rows), "starved container",
                                  "starved containers", "No starved containers."),
            components.share_data(view.share_rows),
            components.count_note(len(view.share_rows), "container on a time-sliced GPU",
                                  "containers on time-sliced GPUs",
                                  "No GPU is shared by several containers (time-slicing)."),
            components.straggler_data(view.straggler_rows),
            components.count_note(len(view.straggler_rows), "straggler", "stragglers",
                                  "No stragglers.")
            + f" {view.workloads_checked} workload(s) with two or more GPUs compared.",
            [{"label": n, "value": n} for n in view.nodes],
            [{"label": p, "value": p} for p in view.pods],
            banner,
            banner_class,
            updated,
        )

    @app.callback(
        Output(ids.NODE_SELECT, "value"),
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
        Output(ids.NODE_UTIL_GRAPH, "figure"),
        Output(ids.NODE_CONTAINERS_GRAPH, "figure"),
        Output(ids.NODE_MEMORY_GRAPH, "figure"),
        Output(ids.NODE_BANNER, "children"),
        Input(ids.NODE_SELECT, "value"),
        Input(ids.WINDOW_SELECT, "value"),
        Input(ids.REFRESH, "n_intervals"),
    )
    def update_node(node: str | None, window: str | None, _n: int | None) -> tuple[Any, ...]:
        detail, problem = service.node(_text(node), _window(window))
        if detail is None:
            message = problem or "No node selected"
            return (empty_figure(message, 120), empty_figure(message, 120),
                    empty_figure(message, 120), problem or "")
        return (
            timeseries_figure({f"GPU {k}": s for k, s in detail.utilization.items()},
                              f"{detail.node}: GPU utilization"),
            timeseries_figure(detail.containers, f"{detail.node}: utilization by container"),
            timeseries_figure({f"GPU {k}": s for k, s in detail.memory_used.items()},
                              f"{detail.node}: GPU memory used", unit="bytes"),
            "",
        )

    @app.callback(
        Output(ids.POD_UTIL_GRAPH, "figure"),
        Output(ids.POD_MEMORY_GRAPH, "figure"),
        Output(ids.POD_BANNER, "children"),
        Input(ids.POD_SELECT, "value"),
        Input(ids.WINDOW_SELECT, "value"),
        Input(ids.REFRESH, "n_intervals"),
    )
    def update_pod(pod: str | None, window: str | None, _n: int | None) -> tuple[Any, ...]:
        detail, problem = service.pod(_text(pod), _window(window))
        if detail is None:
            message = problem or "No pod selected"
            return empty_figure(message, 120), empty_figure(message, 120), problem or ""
        name = f"{detail.namespace}/{detail.pod}"
        return (
            timeseries_figure(detail.utilization, f"{name}: GPU utilization by container"),
            timeseries_figure(detail.memory_used, f"{name}: GPU memory by container",
                              unit="bytes"),
            "",
        )
