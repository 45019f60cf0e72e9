"""HTML pieces of the page (KPI cards, tables), built from view data. Pure.

Table rows link to what they name: a node opens its drill-down, a pod its drill-down, a
workload the workload view. The links carry the view's state in the page URL
(:func:`link`), so a row's link can be pasted into an incident as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from dash import html
from dash.dash_table.DataTable import DataTable
from dash.development.base_component import Component

from gpuscope.dashboard import fmt
from gpuscope.dashboard.series import GpuRef, WorkloadDetail
from gpuscope.dashboard.verdicts import page
from gpuscope.dashboard.verdicts.owners import RunTotals
from gpuscope.dashboard.views import FleetView

# -- KPIs ------------------------------------------------------------------------------------


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

    share = k.idle_share
    # How long the idle verdict asks, as the tables say: min(D, window, history).
    idle_for = min(view.thresholds.idle_duration, view.window.seconds, view.history_seconds)
    fleet_sub = "every node of known price"
    if k.spot_nodes:
        fleet_sub += f", {k.spot_nodes} spot"
        if k.spot_at_on_demand:
            fleet_sub += (f" ({k.spot_at_on_demand} priced on demand: no spot price"
                          " in the price file)")
    if k.unpriced_nodes:
        fleet_sub += f"; {len(k.unpriced_nodes)} of unknown price left out"
    return [
        card("GPUs", str(k.gpus), f"{k.no_data} without utilization" if k.no_data else ""),
        card("Busy / idle / spinning", f"{k.busy} / {k.idle} / {k.spinning}",
             f"idle: < {fmt.pct(view.thresholds.idle_utilization)} for "
             f"{fmt.duration(idle_for)}; spinning: busy, no work"),
        card("Mean utilization", fmt.pct(k.mean_utilization), "over the window"),
        card("Fleet cost", fmt.money(k.fleet_per_hour, per_hour=True),
             f"{fmt.money(k.spent)} over the window; {fleet_sub}"),
        card("Idle cost rate", fmt.money(k.burning_per_hour, per_hour=True),
             f"{k.idle_nodes} idle node{'s' if k.idle_nodes != 1 else ''}"
             + (f" + {k.idle_slices} MIG slice{'s' if k.idle_slices != 1 else ''}"
                if k.idle_slices else "")
             + (f", {fmt.pct(share)} of the fleet's cost" if share is not None else "")
             + " (per hour, now)" + unpriced, "money"),
        card(f"Wasted, last {fmt.duration(view.window.seconds)}", fmt.money(k.wasted),
             f"accumulated over the window: {fmt.money(k.wasted_unallocated)} unallocated, "
             f"{fmt.money(k.wasted_allocated)} allocated-idle", "money"),
    ]


def history_note(view: FleetView) -> str:
    th = view.thresholds
    window, hist = view.window.seconds, view.history_seconds
    parts = [f"Window {fmt.duration(window)}, one point per {fmt.duration(view.window.step)};"
             f" times in UTC."]
    if hist + 1e-6 < window:
        parts.append(
            f"Only {fmt.duration(hist)} of history collected: every 'for at least D' verdict "
            f"rests on min(D, window, history) = idle and spinning "
            f"{fmt.duration(min(th.idle_duration, hist))}, starvation, stragglers and "
            f"throttling {fmt.duration(min(th.starvation_duration, hist))}."
        )
    else:
        parts.append(
            f"Verdicts rest on idle and spinning >= "
            f"{fmt.duration(min(th.idle_duration, window))}, starvation, stragglers and "
            f"throttling >= {fmt.duration(min(th.starvation_duration, window))}."
        )
    if view.queries:
        parts.append(f"{view.queries} queries.")
    return " ".join(parts)


def waste_total(view: FleetView) -> list[Component]:
    k = view.kpis
    spinning = (f", {fmt.money(k.wasted_spinning)} of it by spinning GPUs"
                if k.wasted_spinning > 0 else "")
    children: list[Component] = [
        html.Span(fmt.money(k.wasted), className="waste-amount"),
        html.Span(f" wasted in the last {fmt.duration(view.window.seconds)} "
                  f"({fmt.money(k.wasted_unallocated)} unallocated, "
                  f"{fmt.money(k.wasted_allocated)} allocated-idle{spinning}). "
                  f"Right now idle capacity costs "
                  f"{fmt.money(k.burning_per_hour, per_hour=True)}"
                  + (f", {fmt.pct(k.idle_share)} of the fleet's "
                     f"{fmt.money(k.fleet_per_hour, per_hour=True)}"
                     if k.idle_share is not None else "") + "."),
    ]
    if k.unpriced_idle_nodes:
        children.append(html.Span(
            f" Not included: {', '.join(k.unpriced_idle_nodes)} (instance type of unknown "
            f"price; add it with --prices).", className="warn"))
    return children


# -- tables ----------------------------------------------------------------------------------

Column = DataTable.Columns
Format = DataTable.ColumnsFormat
Row = dict[str, str | float | int | None]
State = Mapping[str, str | None]

MONEY = Format(specifier="$,.2f", nully="unknown")
PRICE = MONEY
PERCENT = Format(specifier=".0%", nully="n/a")
COUNT = Format(specifier="d")

#: Columns that hold names: never wrapped mid-name.
NAME_COLUMNS = ("node", "pod", "pods", "workload", "namespace", "container")
#: Columns of sentences: wide enough to read.
TEXT_COLUMNS = ("evidence", "why", "work", "holds", "signal", "kind")


_FORMATS: dict[str, Format] = {"money": MONEY, "percent": PERCENT, "count": COUNT,
                               "ratio": Format(specifier=".2f")}


def dash_columns(columns: Sequence[page.Column]) -> list[Column]:
    """A verdict's columns (:class:`~gpuscope.dashboard.verdicts.page.Column`) as a
    DataTable's: links as markdown, numbers formatted by kind."""
    out = []
    for c in columns:
        if c.kind == "link":
            out.append(Column(id=c.id, name=c.name, type="text", presentation="markdown"))
        elif c.kind == "text":
            out.append(Column(id=c.id, name=c.name, type="text"))
        else:
            out.append(Column(id=c.id, name=c.name, type="numeric", format=_FORMATS[c.kind]))
    return out


def count_note(n: int, singular: str, plural: str, none: str) -> str:
    if n == 0:
        return none
    return f"{n} {singular if n == 1 else plural}."


def workload_note(detail: WorkloadDetail, marks: Mapping[GpuRef, str], picked: bool,
                  totals: RunTotals | None = None) -> str:
    """The line under the workload view: what it draws, its stragglers (``marks``), whether
    it is the view's default (``picked`` False), and the run's own numbers."""
    kinds = ", ".join(sorted(set(marks.values())))
    n = len(detail.devices)
    shown = (f"{n} GPU{'s' if n != 1 else ''}" if detail.total_devices <= n
             else f"{n} of its {detail.total_devices} GPUs (the stragglers among them)")
    # The default is a straggler's workload where the view has one, else one of several
    # GPUs, else its first (views._pickers): never call that a straggler's.
    if marks:
        found = f"straggler ({kinds}) marked ★ in red." + (
            "" if picked else " Showing the first straggler's workload.")
    else:
        found = ("no straggler." if picked else
                 "no straggler in this view: a default workload (pick another above).")
    return f"{shown} of {detail.namespace}/{detail.workload}; {found}" + run_totals_note(totals)


def run_totals_note(t: RunTotals | None) -> str:
    """The workload view's line of the run's own numbers (the showback's, for one run)."""
    if t is None:
        return ""
    if t.spent == 0 and t.unpriced_gpu_hours > 0:  # all of it on nodes of unknown price
        dollars = "$ unknown spent, idle and spinning (nodes of unknown price)"
    else:
        dollars = (f"{fmt.money(t.spent)} spent, {fmt.money(t.idle)} idle "
                   f"({fmt.money(t.spinning)} spinning)")
    seen = (f"; seen {fmt.clock(t.first_seen)} to {fmt.clock(t.last_seen)}"
            if t.first_seen is not None and t.last_seen is not None else "")
    return (f" In this window: {t.gpu_hours:.2f} GPU-hours, {dollars}, "
            f"{t.stragglers} straggler{'s' if t.stragglers != 1 else ''}{seen}.")
