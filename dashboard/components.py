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
from gpuscope.dashboard.evidence import StragglerEvidence
from gpuscope.dashboard.links import node_link, pod_link, workload_link
from gpuscope.dashboard.verdicts import page
from gpuscope.dashboard.verdicts.owners import RunTotals
from gpuscope.dashboard.views import (
    AllocatedIdleRow,
    FleetView,
    IdleRow,
    ShareRow,
    SliceRow,
    SpinningRow,
    StarvedRow,
    StragglerRow,
)

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
    fleet_sub = "every node of known price"
    if k.spot_nodes:
        fleet_sub += f", {k.spot_nodes} spot"
    if k.unpriced_nodes:
        fleet_sub += f"; {len(k.unpriced_nodes)} of unknown price left out"
    return [
        card("GPUs", str(k.gpus), f"{k.no_data} without utilization" if k.no_data else ""),
        card("Busy / idle / spinning", f"{k.busy} / {k.idle} / {k.spinning}",
             f"idle: < {fmt.pct(view.thresholds.idle_utilization)} for "
             f"{fmt.duration(view.thresholds.idle_duration)}; spinning: busy, no work"),
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


def _since(ts: float, seconds: float, history: float) -> str:
    return (f"{fmt.clock(ts)} or earlier" if seconds >= history - 1e-3 else fmt.clock(ts))


def _for(seconds: float, required: float) -> str:
    return f"{fmt.duration(seconds)} (needs {fmt.duration(required)})"




def idle_data(rows: Sequence[IdleRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "node": node_link(r.node, state),
            "instance_type": r.instance_type or "unknown",
            "gpus": r.gpus,
            "idle_since": _since(r.idle_since, r.idle_seconds, r.history_seconds),
            "idle_for": fmt.duration(r.idle_seconds),
            "price": r.price_per_hour,
            "price_basis": r.price_basis if r.price_per_hour is not None else "no price",
            "wasted": r.wasted,
            "unallocated": r.unallocated_gpus,
            "wasted_unallocated": r.wasted_unallocated,
            "allocated": r.allocated_gpus,
            "wasted_allocated": r.wasted_allocated,
            "spinning": r.spinning_gpus,
            "evidence": (f"needs {fmt.duration(r.required_seconds)}; history "
                         f"{fmt.duration(r.history_seconds)}"
                         + (f"; {r.mig_gpus} GPU(s) in MIG mode, judged by their slices"
                            if r.mig_gpus else "")
                         + ("; spinning GPUs count as idle: busy by utilization, no work"
                            if r.spinning_gpus else "")),
        }
        for r in rows
    ]



SIGNALS = {
    "utilization": "utilization", "sm": "SM activity (GPM)", "process": "no process (no GPM)",
    "gpm": "SM, tensor, DRAM activity (GPM)", "power": "power vs limit (no GPM)",
}


def slice_data(rows: Sequence[SliceRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "node": node_link(r.node, state), "gpu": r.gpu, "profile": r.profile,
            "share": r.share, "idle_for": _for(r.idle_seconds, r.required_seconds),
            "held": "yes" if r.allocated else "no", "price": r.price_per_hour,
            "wasted": r.wasted, "signal": SIGNALS.get(r.signal, r.signal),
        }
        for r in rows
    ]




def _pods(pods: Sequence[str], state: State) -> str:
    links = []
    for p in pods:
        namespace, _, pod = p.partition("/")
        links.append(pod_link(namespace, pod, state))
    return ", ".join(links) or "(no pod)"


def spinning_data(rows: Sequence[SpinningRow], state: State | None = None) -> list[Row]:
    state = state or {}
    out: list[Row] = []
    for r in rows:
        if r.signal == "gpm":
            work = (f"SM {fmt.pct(r.sm)}, tensor {fmt.pct(r.tensor)}, "
                    f"DRAM {fmt.pct(r.dram)}")
        else:
            work = f"power {fmt.pct(r.power_ratio)} of its limit"
        out.append({
            "node": node_link(r.node, state), "gpu": r.gpu, "pods": _pods(r.pods, state),
            "workload": ", ".join(workload_link(w.partition("/")[0], w.partition("/")[2], state)
                                  for w in r.workloads),
            "utilization": r.utilization, "work": work,
            "for": _for(r.seconds, r.required_seconds), "price": r.price_per_hour,
            "signal": SIGNALS.get(r.signal, r.signal)
            + ("" if r.price_basis == "on-demand" else f"; priced {r.price_basis}"),
        })
    return out




def allocated_data(rows: Sequence[AllocatedIdleRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "namespace": r.namespace, "pod": pod_link(r.namespace, r.pod, state),
            "container": r.container,
            "workload": workload_link(r.namespace, r.workload, state),
            "node": node_link(r.node, state), "holds": r.holds, "usage": r.usage,
            "for": _for(r.seconds, r.required_seconds), "price": r.price_per_hour,
            "signal": SIGNALS.get(r.signal, r.signal)
            + ("" if r.price_basis == "on-demand" else f"; priced {r.price_basis}"),
        }
        for r in rows
    ]




def starved_data(rows: Sequence[StarvedRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "kind": "time-slice starved" if r.kind == "time-slice" else
                    "input-starved (suspected)",
            "namespace": r.namespace, "pod": pod_link(r.namespace, r.pod, state),
            "container": r.container, "node": node_link(r.node, state),
            "gpu": r.gpu, "utilization": r.utilization,
            "for": (_for(r.seconds, r.required_seconds)
                    if r.seconds is not None and r.required_seconds is not None else "window"),
            "why": r.detail, "price": r.price_per_hour,
        }
        for r in rows
    ]




def share_data(rows: Sequence[ShareRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "node": node_link(r.node, state), "gpu": r.gpu, "gpu_busy": r.gpu_utilization,
            "container": f"{r.namespace}/{r.pod}/{r.container}", "utilization": r.utilization,
            "share": r.share, "fair_share": r.fair_share,
            "starved": (f"yes, {fmt.duration(r.starving_seconds)}" if r.starved else
                        f"starving {fmt.duration(r.starving_seconds)} of "
                        f"{fmt.duration(r.required_seconds)}" if r.starving_seconds else "no"),
        }
        for r in rows
    ]



_MEASURES = {"utilization": "utilization", "sm": "SM activity", "power": "power"}


def _measure(signal: str, value: float) -> str:
    return f"{value:.0f} W" if signal == "power" else fmt.pct(value)


#: Throttle reasons in the order a cause is named; ``app_clocks`` ("any of those") and
#: ``base_clocks`` only sum the others up, and ``low_utilization`` is idle clocks.
CAUSES = ("thermal", "sw_thermal", "hw_thermal", "power", "hw_power_brake", "reliability",
          "board_limit", "sync_boost")
_CAUSE_NAMES = {"thermal": "heat", "sw_thermal": "heat", "hw_thermal": "heat",
                "power": "power cap", "hw_power_brake": "power brake",
                "reliability": "reliability limit", "board_limit": "board limit",
                "sync_boost": "sync boost"}


def evidence_text(e: StragglerEvidence) -> str:
    """Its cause, as the throttling by reason, SM clock and temperature show it against the
    workload's median: ``throttled by heat: thermal 50% of the time (median 0%), ...``."""
    parts = []
    throttled = sorted(
        ((r, c) for r, c in e.throttle.items()
         if r in CAUSES and (c.own or 0.0) >= 0.05 and (c.own or 0.0) - (c.median or 0.0) >= 0.05),
        key=lambda rc: (-(rc[1].own or 0.0), CAUSES.index(rc[0])))[:3]
    if throttled:
        cause = _CAUSE_NAMES[throttled[0][0]]
        parts.append(f"throttled by {cause}: " + ", ".join(
            f"{r} {fmt.pct(c.own)} of the time (median {fmt.pct(c.median)})"
            for r, c in throttled))
    else:
        parts.append("not throttled more than its peers")
    clock, temp = e.sm_clock_hertz, e.temperature_celsius
    if clock.own is not None:
        parts.append(f"SM clock {clock.own / 1e9:.2f} GHz"
                     + (f" (median {clock.median / 1e9:.2f})" if clock.median else ""))
    if temp.own is not None:
        parts.append(f"{temp.own:.0f} °C"
                     + (f" (median {temp.median:.0f} °C)" if temp.median is not None else ""))
    return "; ".join(parts) + (f" (last {fmt.duration(e.seconds)})" if e.seconds else "")


def straggler_data(rows: Sequence[StragglerRow], state: State | None = None) -> list[Row]:
    state = state or {}
    return [
        {
            "kind": ("slow: its peers wait for it" if r.kind == "slow"
                     else "stalled: waits while its peers work"),
            "workload": workload_link(r.namespace, r.workload, state),
            "namespace": r.namespace,
            "pods": ", ".join(pod_link(r.namespace, p, state) for p in r.pods),
            "node": node_link(r.node, state), "gpu": r.gpu,
            "measure": _MEASURES.get(r.signal, r.signal) + (f" ({r.model})" if r.model else ""),
            "value": _measure(r.signal, r.value), "median": _measure(r.signal, r.median),
            "ratio": r.ratio,
            "for": _for(r.seconds, r.required_seconds),
            "evidence": evidence_text(r.evidence),
            "devices": r.devices, "price": r.price_per_hour,
        }
        for r in rows
    ]


def count_note(n: int, singular: str, plural: str, none: str) -> str:
    if n == 0:
        return none
    return f"{n} {singular if n == 1 else plural}."


def run_totals_note(t: RunTotals | None) -> str:
    """The workload view's line of the run's own numbers (the showback's, for one run)."""
    if t is None:
        return ""
    spent = ("unknown ($ of unknown price)" if t.spent == 0 and t.unpriced_gpu_hours > 0
             else fmt.money(t.spent))
    seen = (f"; seen {fmt.clock(t.first_seen)} to {fmt.clock(t.last_seen)}"
            if t.first_seen is not None and t.last_seen is not None else "")
    return (f" In this window: {t.gpu_hours:.2f} GPU-hours, {spent} spent, "
            f"{fmt.money(t.idle)} idle ({fmt.money(t.spinning)} spinning), "
            f"{t.stragglers} straggler{'s' if t.stragglers != 1 else ''}{seen}.")
