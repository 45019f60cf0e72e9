"""HTML pieces of the page (KPI cards, tables), built from view data. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from dash import html
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from gpuscope.dashboard import fmt
from gpuscope.dashboard.views import FleetView, IdleRow, ShareRow, StarvedRow, StragglerRow


def kpi_cards(view: FleetView) -> list[Component]:
    k = view.kpis
    unpriced = (f" (+{len(k.unpriced_idle_nodes)} idle node"
                f"{'s' if len(k.unpriced_idle_nodes) != 1 else ''} of unknown price)"
                if k.unpriced_idle_nodes else "")

    def card(label: str, value: str, sub: str = "", cls: str = "") -> html.Div:
        return html.Div(
            [html.Div(label, className="kpi-label"), html.Div(value, className="kpi-value"),
             html.Div(sub, className="kpi-sub")],
            className=f"kpi {cls}".strip(),
        )

    return [
        card("GPUs", str(k.gpus), f"{k.no_data} without utilization" if k.no_data else ""),
        card("Busy / idle", f"{k.busy} / {k.idle}",
             f"idle: < {fmt.pct(view.thresholds.idle_utilization)} for "
             f"{fmt.duration(view.thresholds.idle_duration)}"),
        card("Mean utilization", fmt.pct(k.mean_utilization), "over the window"),
        card("Idle nodes", str(k.idle_nodes), "every GPU idle"),
        card("Burning idle", fmt.money(k.burning_per_hour, per_hour=True),
             "on-demand price of idle nodes" + unpriced, "money"),
        card("Wasted in window", fmt.money(k.wasted),
             f"{fmt.money(k.wasted_unallocated)} unallocated, "
             f"{fmt.money(k.wasted_allocated)} allocated-idle", "money"),
    ]


def history_note(view: FleetView) -> str:
    th = view.thresholds
    window, hist = view.window.seconds, view.history_seconds
    parts = [f"Window {fmt.duration(window)}, one point per {fmt.duration(view.window.step)}."]
    if hist + 1e-6 < window:
        parts.append(
            f"Only {fmt.duration(hist)} of history collected: every 'for at least D' verdict "
            f"rests on min(D, window, history) = idle {fmt.duration(min(th.idle_duration, hist))}"
            f", starvation/stragglers {fmt.duration(min(th.starvation_duration, hist))}."
        )
    else:
        parts.append(
            f"Verdicts rest on idle >= {fmt.duration(min(th.idle_duration, window))}, "
            f"starvation and stragglers >= {fmt.duration(min(th.starvation_duration, window))}."
        )
    if view.queries:
        parts.append(f"{view.queries} queries.")
    return " ".join(parts)


def waste_total(view: FleetView) -> list[Component]:
    k = view.kpis
    children: list[Component] = [
        html.Span(fmt.money(k.wasted), className="waste-amount"),
        html.Span(f" wasted by idle nodes in the last {fmt.duration(view.window.seconds)}, "
                  f"burning {fmt.money(k.burning_per_hour, per_hour=True)} now "
                  f"({fmt.money(k.wasted_unallocated)} unallocated, "
                  f"{fmt.money(k.wasted_allocated)} allocated-idle)."),
    ]
    if k.unpriced_idle_nodes:
        children.append(html.Span(
            f" Not included: {', '.join(k.unpriced_idle_nodes)} (instance type of unknown "
            f"price; add it with --prices).", className="warn"))
    return children


Column = DataTable.Columns
Format = DataTable.ColumnsFormat
Row = dict[str, str | float | int | None]

MONEY = Format(specifier="$,.2f", nully="unknown")
PRICE = Format(specifier="$,.3~f", nully="unknown")
PERCENT = Format(specifier=".0%", nully="n/a")
COUNT = Format(specifier="d")


def _col(cid: str, name: str, number: Format | None = None) -> Column:
    if number is None:
        return Column(id=cid, name=name, type="text")
    return Column(id=cid, name=name, type="numeric", format=number)


IDLE_COLUMNS = [
    _col("node", "Node"), _col("instance_type", "Instance type"), _col("gpus", "GPUs", COUNT),
    _col("idle_since", "Idle since"), _col("idle_for", "Idle for"),
    _col("price", "$/hour", PRICE), _col("wasted", "$ wasted", MONEY),
    _col("unallocated", "Unallocated GPUs", COUNT),
    _col("wasted_unallocated", "$ unallocated", MONEY),
    _col("allocated", "Allocated-idle GPUs", COUNT),
    _col("wasted_allocated", "$ allocated-idle", MONEY), _col("evidence", "Evidence"),
]


def idle_data(rows: Sequence[IdleRow]) -> list[Row]:
    return [
        {
            "node": r.node,
            "instance_type": r.instance_type or "unknown",
            "gpus": r.gpus,
            "idle_since": (f"{fmt.clock(r.idle_since)} or earlier"
                           if r.idle_seconds >= r.history_seconds - 1e-3
                           else fmt.clock(r.idle_since)),
            "idle_for": fmt.duration(r.idle_seconds),
            "price": r.price_per_hour,
            "wasted": r.wasted,
            "unallocated": r.unallocated_gpus,
            "wasted_unallocated": r.wasted_unallocated,
            "allocated": r.allocated_gpus,
            "wasted_allocated": r.wasted_allocated,
            "evidence": f"needs {fmt.duration(r.required_seconds)}; history "
                        f"{fmt.duration(r.history_seconds)}",
        }
        for r in rows
    ]


STARVED_COLUMNS = [
    _col("kind", "Kind"), _col("namespace", "Namespace"), _col("pod", "Pod"),
    _col("container", "Container"), _col("node", "Node"), _col("gpu", "GPU"),
    _col("utilization", "Utilization", PERCENT), _col("for", "For"), _col("why", "Why"),
]


def starved_data(rows: Sequence[StarvedRow]) -> list[Row]:
    return [
        {
            "kind": "time-slice starved" if r.kind == "time-slice" else
                    "input-starved (suspected)",
            "namespace": r.namespace, "pod": r.pod, "container": r.container, "node": r.node,
            "gpu": r.gpu, "utilization": r.utilization,
            "for": (f"{fmt.duration(r.seconds)} (needs {fmt.duration(r.required_seconds)})"
                    if r.seconds is not None else "window"),
            "why": r.detail,
        }
        for r in rows
    ]


SHARE_COLUMNS = [
    _col("node", "Node"), _col("gpu", "GPU"), _col("gpu_busy", "GPU busy", PERCENT),
    _col("container", "Container"), _col("utilization", "Utilization", PERCENT),
    _col("share", "Share", PERCENT), _col("fair_share", "Fair share", PERCENT),
    _col("starved", "Starved"),
]


def share_data(rows: Sequence[ShareRow]) -> list[Row]:
    return [
        {
            "node": r.node, "gpu": r.gpu, "gpu_busy": r.gpu_utilization,
            "container": f"{r.namespace}/{r.pod}/{r.container}", "utilization": r.utilization,
            "share": r.share, "fair_share": r.fair_share,
            "starved": (f"yes, {fmt.duration(r.starving_seconds)}" if r.starved else
                        f"starving {fmt.duration(r.starving_seconds)} of "
                        f"{fmt.duration(r.required_seconds)}" if r.starving_seconds else "no"),
        }
        for r in rows
    ]


STRAGGLER_COLUMNS = [
    _col("workload", "Workload"), _col("namespace", "Namespace"), _col("pods", "Pod"),
    _col("node", "Node"), _col("gpu", "GPU"), _col("utilization", "Utilization", PERCENT),
    _col("median", "Workload median", PERCENT),
    _col("ratio", "Ratio", Format(specifier=".2f")), _col("for", "For"),
    _col("devices", "GPUs in workload", COUNT),
]


def straggler_data(rows: Sequence[StragglerRow]) -> list[Row]:
    return [
        {
            "workload": r.workload, "namespace": r.namespace, "pods": ", ".join(r.pods),
            "node": r.node, "gpu": r.gpu, "utilization": r.utilization, "median": r.median,
            "ratio": r.ratio,
            "for": f"{fmt.duration(r.seconds)} (needs {fmt.duration(r.required_seconds)})",
            "devices": r.devices,
        }
        for r in rows
    ]


def count_note(n: int, singular: str, plural: str, none: str) -> str:
    if n == 0:
        return none
    return f"{n} {singular if n == 1 else plural}."
